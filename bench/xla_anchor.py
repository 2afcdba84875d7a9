"""The JAX/XLA anchor: each rank's slices under XLA's tiling, and the collectives XLA
compiles for a redistribution, read off the HLO of a jitted reshard and priced per rank.

jax must see enough CPU devices before it is imported: the importer sets
``--xla_force_host_platform_device_count`` (``bench/regen_cases.py`` does).
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

import numpy as np

from bench.chunk_rule import chunk_boxes, norm_boxes
from spec_lang.ir import Mesh, TensorType
from spec_lang.parser import parse, parse_mesh

EXECUTE_MAX_NUMEL = 65536  # larger cases are priced only, never executed

_COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_HLO_OP = re.compile(r"=\s*(?P<result>\(.*?\)|\w+\[[\d,]*\](?:\{[\d,]*\})?)\s+(?P<op>" +
                     "|".join(_COLLECTIVES) + r")(?:-start)?\(")
_SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")


def _jax_mesh(mesh: Mesh, explicit: bool) -> Any:
    import jax
    from jax.sharding import AxisType
    from jax.sharding import Mesh as JaxMesh

    kind = AxisType.Explicit if explicit else AxisType.Auto
    # rank r is device r, at its row-major coordinate (no topology-aware reordering)
    devices = np.array(jax.devices()[:mesh.size]).reshape(mesh.sizes)
    return JaxMesh(devices, mesh.names, axis_types=(kind,) * mesh.ndim)


def partition_spec(text: str) -> Any:
    """``P(('dp','tp'), None, unreduced={'tp'})`` -> a PartitionSpec (literals only)."""
    from jax.sharding import PartitionSpec

    call = ast.parse(text, mode="eval").body
    assert isinstance(call, ast.Call)
    args = [ast.literal_eval(a) for a in call.args]
    kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    return PartitionSpec(*args, **kw)


def _group_size(line: str) -> int:
    m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", line)
    if m:
        sizes = {k.strip("' "): int(v) for k, v in (kv.split("=") for kv in m.group(1).split(","))}
        # an axis, or a piece of one: 'axis_0':(2)2 is the size-2 sub-axis after a size-2 major part
        return math.prod(int(a.split(")")[-1]) if ":" in a else sizes[a.strip("' ")]
                         for a in m.group(2).split(",") if a.strip())
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
    if m:
        return int(m.group(2))
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    if m:
        return len(m.group(1).split(","))
    raise ValueError(f"no replica groups in HLO line: {line[:200]}")


def hlo_collectives(hlo: str, itemsize: int) -> list[dict[str, Any]]:
    """Every collective of a compiled HLO module, priced at ``itemsize`` bytes per element
    (the CPU backend computes bf16 collectives in f32; the case's dtype is what counts)."""
    steps = []
    for line in hlo.splitlines():
        m = _HLO_OP.search(line)
        if not m:
            continue
        op = m.group("op")
        elems = sum(math.prod(int(x) for x in dims.split(",") if x) for _, dims in _SHAPE.findall(m.group("result")))
        b = elems * itemsize
        step: dict[str, Any] = {"op": op, "result": m.group("result")}
        if op == "collective-permute":
            pairs = re.findall(r"\{(\d+),(\d+)\}", line.split("source_target_pairs=", 1)[1].split("}}")[0] + "}")
            moving = sum(1 for s, t in pairs if s != t)
            step.update(n=None, moving_pairs=moving, bytes_max=b if moving else 0)
        else:
            n = _group_size(line)
            step["n"] = n
            step["bytes_max"] = {"all-gather": (n - 1) * b // n if n else 0, "reduce-scatter": (n - 1) * b,
                                 "all-reduce": math.ceil(2 * (n - 1) * b / n),
                                 "all-to-all": math.ceil((n - 1) * b / n)}[op]
        steps.append(step)
    return steps


def _xla_refusal(case: dict[str, Any], s: TensorType, d: TensorType, m: Mesh) -> str | None:
    """Why XLA cannot run this case as the same redistribution (None when it can)."""
    if case["anchor_inputs"].get("jax") is None:
        op = s.partial_op or d.partial_op
        return f"JAX unreduced is a pending SUM only; Partial({op}) has no JAX equivalent"
    import jax

    uneven = any(dm.axes and dm.size % math.prod(m.axis_size(a) for a in dm.axes)
                 for t in (s, d) for dm in t.dims)
    if uneven and (s.partial_axes or d.partial_axes):
        return (f"uneven + unreduced is not expressible in JAX {jax.__version__} "
                "(Explicit mode, needed for unreduced, rejects uneven dims)")
    for t, side in ((s, "src"), (d, "dst")):
        if jax_slices(t, m, case["anchor_inputs"]["jax"][side]) != norm_boxes(chunk_boxes(t, m)):
            return (f"uneven multi-axis dim: XLA's pad-at-tail tiling of {case[side]} differs from the chunk-rule "
                    "layout, so XLA's reshard is between different layouts")
    return None


def jax_slices(t: TensorType, m: Mesh, spec_text: str | None = None) -> list[Any]:
    """Each rank's slices under XLA's tiling, from ``NamedSharding.devices_indices_map``.

    An uneven dim is tiled by XLA as its padded size (ceil(D/T)*T for T tiles), the tail
    cut off: the map is taken on the padded shape and clipped (empty boxes as 'empty')."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    spec = partition_spec(spec_text) if spec_text else PartitionSpec(
        *[(d.axes if len(d.axes) > 1 else d.axes[0]) if d.axes else None for d in t.dims])
    spec = PartitionSpec(*spec.partitions)  # where values live does not depend on a pending sum
    padded = []
    for d in t.dims:
        tiles = math.prod(m.axis_size(a) for a in d.axes)
        padded.append(-(-d.size // tiles) * tiles)
    idx = NamedSharding(_jax_mesh(m, explicit=False), spec).devices_indices_map(tuple(padded))
    out = []
    for dev in jax.devices()[:m.size]:
        box = []
        for sl, n, size in zip(idx[dev], padded, t.shape):
            lo, hi, _ = sl.indices(n)
            box.append((min(lo, size), min(hi, size)))
        out.append(box)
    return norm_boxes(out)


def xla_anchor(case: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(the XLA record, or None and the reason)."""
    import jax
    from jax.sharding import NamedSharding

    s, d, m = parse(case["src"]), parse(case["dst"]), parse_mesh(case["mesh"])
    why = _xla_refusal(case, s, d, m)
    if why:
        return None, why
    specs = case["anchor_inputs"]["jax"]
    even = not any(dm.axes and dm.size % math.prod(m.axis_size(a) for a in dm.axes) for t in (s, d) for dm in t.dims)
    jm = _jax_mesh(m, explicit=even)
    src_sh, dst_sh = NamedSharding(jm, partition_spec(specs["src"])), NamedSharding(jm, partition_spec(specs["dst"]))
    dtype = {"bfloat16": jax.numpy.bfloat16}.get(s.dtype, np.dtype(s.dtype))
    full = (np.arange(s.numel) % 251).reshape(s.shape).astype(dtype)
    wsc = jax.lax.with_sharding_constraint
    if not even:  # an uneven array cannot be placed as is: constrain a replicated one to src, then dst
        x = jax.device_put(full, NamedSharding(jm, jax.sharding.PartitionSpec()))
        fn = jax.jit(lambda v: wsc(wsc(v, src_sh), dst_sh))
    elif s.partial_axes:  # unreduced: the data on coordinate 0 of the summed axes, zeros elsewhere
        part = [m.index(a) for a in s.partial_axes]
        idx = NamedSharding(jm, jax.sharding.PartitionSpec(*src_sh.spec.partitions)).devices_indices_map(s.shape)
        arrays = [jax.device_put(full[idx[dev]] * (0 if any(m.coords(r)[i] for i in part) else 1), dev)
                  for r, dev in enumerate(jax.devices()[:m.size])]
        x = jax.make_array_from_single_device_arrays(s.shape, src_sh, arrays)
        fn = jax.jit(lambda v: jax.sharding.reshard(v, dst_sh))
    else:
        x = jax.device_put(full, src_sh)
        fn = jax.jit(lambda v: jax.sharding.reshard(v, dst_sh))
    compiled = fn.lower(x).compile()
    steps = hlo_collectives(compiled.as_text(), s.itemsize)
    if not even:
        # an uneven result leaves the jit replicated: drop the collectives that a lone
        # replicated -> dst constraint also compiles to (the gather of the output)
        tail = hlo_collectives(jax.jit(lambda v: wsc(v, dst_sh)).lower(x).compile().as_text(), s.itemsize)
        for st in tail:
            same = [i for i, mine in enumerate(steps) if (mine["op"], mine["result"]) == (st["op"], st["result"])]
            if same:
                steps.pop(same[-1])
    correct = None
    if s.numel <= EXECUTE_MAX_NUMEL and not d.partial_axes:
        y = compiled(x)
        same = np.array_equal(np.asarray(y).astype(np.float64), np.asarray(full).astype(np.float64))
        correct = bool(same and (not even or y.sharding.is_equivalent_to(dst_sh, s.ndim)))
    return {"method": "reshard" if even else "internal", "bytes_sent_max": sum(st["bytes_max"] for st in steps),
            "collectives": len(steps), "steps": steps, "correct": correct}, None
