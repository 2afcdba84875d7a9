"""Regenerate ``bench/cases/{redistribute,layouts}.jsonl`` from the live anchors.

The case definitions (mesh, types, DTensor placements, JAX PartitionSpecs, notes) live in
``bench/cases/*_inputs.jsonl``. Everything else in the output files is measured here,
now, by the anchors themselves:

* **DTensor** (torch's ``_redistribute`` planners on the fake process group, through
  ``bench.dtensor_planners``): the default and the min-cost plan, priced per rank, and
  whether running that plan under ``LocalTensorMode`` gives every rank its dst block.
* **JAX/XLA** (16 CPU devices, as many as the largest mesh): each rank's slices from ``devices_indices_map``; the
  collectives in the compiled HLO of a jitted reshard, priced with the cost model below,
  and whether the executable's output is right.
* **The byte lower bound**, counted element by element (on the cells that the src and
  dst boxes cut the tensor into), from the chunk rule written out here once more,
  independently of ``lowering``.

Cost model (bytes *sent* per rank, summed over steps, max over ranks; b: a rank's
input block, B: the whole operand of the collective on one rank)::

    all_gather (n-1)*b    reduce_scatter (n-1)/n*B    all_reduce 2(n-1)/n*B
    all_to_all (n-1)/n*B  collective-permute: the operand, when the rank moves data

Run from the repo root (about a minute per 10 cases on a busy 2-core machine)::

    python bench/regen_cases.py                      # everything
    python bench/regen_cases.py --only rd-pub-001    # some cases (the rest of the file is kept)
    python bench/regen_cases.py --what layouts --limit 5
"""

from __future__ import annotations

import os

_FLAGS = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _FLAGS:  # before jax is imported anywhere
    os.environ["XLA_FLAGS"] = (_FLAGS + " --xla_force_host_platform_device_count=16").strip()

import argparse  # noqa: E402
import ast  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spec_lang.ir import Mesh, TensorType  # noqa: E402
from spec_lang.parser import parse, parse_mesh  # noqa: E402

CASES_DIR = Path(__file__).resolve().parent / "cases"
EXECUTE_MAX_NUMEL = 65536  # larger cases are priced only, never executed
LB_DEFINITION = (
    "max(lb_recv_max, lb_sent_avg) x dtype bytes: lb_recv_max = max over ranks of dst-local elements "
    "missing from its src-local box (all dst-local elements if a reduction is pending); lb_sent_avg = "
    "total required element transfers / world size ((k-1)+(needers-1) per element for a k-way pending "
    "reduction). Data-movement bound, chunk-rule layouts; 0 when dst is partial on an axis src is not."
)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- the chunk rule, written out once more ------------------------------------------------


def chunk_boxes(t: TensorType, mesh: Mesh) -> list[list[tuple[int, int]]]:
    """Each rank's [start, stop) per dim: torch.chunk one axis at a time, major to minor."""
    out = []
    for r in range(mesh.size):
        coords = dict(zip(mesh.names, mesh.coords(r)))
        box = []
        for d in t.dims:
            lo, hi = 0, d.size
            for a in d.axes:
                n, length = mesh.axis_size(a), hi - lo
                c = -(-length // n) if length else 0
                lo, hi = min(lo + coords[a] * c, hi), min(lo + (coords[a] + 1) * c, hi)
            box.append((lo, hi))
        out.append(box)
    return out


def lower_bound(src: TensorType, dst: TensorType, mesh: Mesh) -> dict[str, Any]:
    """The data-movement bound, counted on the cells cut by every src and dst box edge."""
    item = src.itemsize
    sp, dp = set(src.partial_axes), set(dst.partial_axes)
    sb, db = chunk_boxes(src, mesh), chunk_boxes(dst, mesh)
    if dp - sp:
        return {"bytes": 0, "definition": LB_DEFINITION, "lb_recv_max_bytes": 0, "lb_sent_avg_bytes": 0}
    cuts = [sorted({0, s, *(b[i][j] for b in sb + db for j in (0, 1))}) for i, s in enumerate(src.shape)]
    cells = list(itertools.product(*[list(zip(c[:-1], c[1:])) for c in cuts]))

    def inside(cell: tuple, box: list[tuple[int, int]]) -> bool:
        return all(lo <= a and b <= hi and b > a for (a, b), (lo, hi) in zip(cell, box))

    size = [math.prod(b - a for a, b in cell) for cell in cells]
    reduced = sorted(sp - dp)
    recv = [0] * mesh.size
    transfers = 0
    if reduced:
        k = math.prod(mesh.axis_size(a) for a in reduced)
        kept = [mesh.index(a) for a in sorted(dp)]
        for r in range(mesh.size):
            recv[r] = math.prod(hi - lo for lo, hi in db[r])
        for cell, n in zip(cells, size):
            needers: dict[tuple, int] = {}
            for r in range(mesh.size):
                if inside(cell, db[r]):
                    key = tuple(mesh.coords(r)[i] for i in kept)
                    needers[key] = needers.get(key, 0) + 1
            transfers += n * sum(k - 1 + c - 1 for c in needers.values())
    else:
        for cell, n in zip(cells, size):
            for r in range(mesh.size):
                if inside(cell, db[r]) and not inside(cell, sb[r]):
                    recv[r] += n
        transfers = sum(recv)
    recv_b, sent_b = max(recv) * item, transfers * item / mesh.size
    sent_b = int(sent_b) if sent_b == int(sent_b) else sent_b
    return {"bytes": max(recv_b, math.ceil(sent_b)), "definition": LB_DEFINITION,
            "lb_recv_max_bytes": recv_b, "lb_sent_avg_bytes": sent_b}


# ---- DTensor ----------------------------------------------------------------------------


def _src_blocks(src: TensorType, mesh: Mesh, full: np.ndarray) -> list[np.ndarray]:
    """Every rank's src block; a pending reduction holds the value on coordinate 0 (sum)
    or everywhere (avg, max, min), so that it reduces to ``full``."""
    part = [mesh.index(a) for a in src.partial_axes]
    out = []
    for r, box in enumerate(chunk_boxes(src, mesh)):
        b = full[tuple(slice(lo, hi) for lo, hi in box)].copy()
        if part and src.partial_op == "sum" and any(mesh.coords(r)[i] for i in part):
            b[...] = 0
        out.append(b)
    return out


def _reduced(dst: TensorType, mesh: Mesh, got: list[np.ndarray], r: int) -> np.ndarray:
    """What rank r's dst block stands for: its pending reduction carried out."""
    part = [mesh.index(a) for a in dst.partial_axes]
    if not part:
        return got[r]
    c = mesh.coords(r)
    peers = [q for q in range(mesh.size)
             if all(mesh.coords(q)[i] == c[i] for i in range(mesh.ndim) if i not in part)]
    s = np.stack([got[q] for q in peers])
    op = dst.partial_op
    return s.sum(0) if op == "sum" else s.mean(0) if op == "avg" else s.max(0) if op == "max" else s.min(0)


def dtensor_runs_right(planners: Any, case: dict[str, Any], planner: str) -> dict[str, Any]:
    """Run DTensor's plan under LocalTensorMode; check every rank's (reduced) dst block."""
    import torch
    import torch.distributed.tensor._redistribute as R
    from torch.distributed._local_tensor import LocalTensor, LocalTensorMode

    src_spec, dst_spec, s, m = planners.case_specs(case)
    d = parse(case["dst"])
    full = np.arange(s.numel, dtype=np.float64).reshape(s.shape) % 251
    blocks = _src_blocks(s, m, full)
    with LocalTensorMode(m.size) as lm:
        with lm.disable():
            x = LocalTensor({r: torch.tensor(b) for r, b in enumerate(blocks)})
        # DTensor's plan cache is not keyed by the planner: clear it, so the plan that runs
        # is the one priced
        R.clear_redistribute_planner_cache()
        R._gen_transform_infos.cache_clear()
        with R.use_min_cost_redistribution_plan(planner == "min_cost"):
            y = R.redistribute_local_tensor(x, src_spec, dst_spec)
        with lm.disable():
            got = [y._local_tensors[r].numpy() for r in range(m.size)]
    wrong = []
    for r, box in enumerate(chunk_boxes(d, m)):
        want = full[tuple(slice(lo, hi) for lo, hi in box)]
        have = _reduced(d, m, got, r)
        if have.shape != want.shape or not np.allclose(have, want):
            wrong.append(r)
    return {"correct": not wrong, **({"wrong_ranks": wrong} if wrong else {})}


def dtensor_anchor(planners: Any, case: dict[str, Any], planner: str) -> dict[str, Any]:
    plan = planners.plan(case, planner)
    if plan.error:
        return {"planner": planner, "error": plan.error, "correct": None}
    out: dict[str, Any] = {
        "planner": plan.algorithm, "bytes_sent_max": plan.bytes_sent_max,
        "bytes_sent_max_unpadded": plan.bytes_sent_max_unpadded, "collectives": plan.collectives,
        "steps": [{"op": st.op, "axes": list(st.axes), "n": st.n, "from": st.src, "to": st.dst,
                   "flattened": st.flattened, "bytes_max": st.bytes_max, "state_after": st.state_after}
                  for st in plan.steps],
        "correct": None,
    }
    if parse(case["src"]).numel <= EXECUTE_MAX_NUMEL:
        try:
            out.update(dtensor_runs_right(planners, case, planner))
        except Exception as e:  # noqa: BLE001 - a run that fails is a result
            out.update(correct=False, error=f"{type(e).__name__}: {e}")
    return out


# ---- JAX / XLA --------------------------------------------------------------------------

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
        if jax_slices(t, m, case["anchor_inputs"]["jax"][side]) != _norm_boxes(chunk_boxes(t, m)):
            return (f"uneven multi-axis dim: XLA's pad-at-tail tiling of {case[side]} differs from the chunk-rule "
                    "layout, so XLA's reshard is between different layouts")
    return None


def _norm_boxes(boxes: list[list[tuple[int, int]]]) -> list[Any]:
    return [["empty"] if any(hi <= lo for lo, hi in b) else [list(x) for x in b] for b in boxes]


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
    return _norm_boxes(out)


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


# ---- drivers ------------------------------------------------------------------------------


def redistribute_case(planners: Any, case: dict[str, Any], with_xla: bool) -> dict[str, Any]:
    s, d, m = parse(case["src"]), parse(case["dst"]), parse_mesh(case["mesh"])
    out = {k: case[k] for k in ("id", "mesh", "src", "dst", "dtype_bytes", "note", "tags")}
    out["lower_bound"] = lower_bound(s, d, m)
    out["dtensor_default"] = dtensor_anchor(planners, case, "default")
    out["dtensor_min_cost"] = dtensor_anchor(planners, case, "min_cost")
    if with_xla:
        try:
            out["xla"], reason = xla_anchor(case)
        except Exception as e:  # noqa: BLE001 - recorded, never hidden
            out["xla"], reason = None, f"XLA run failed: {type(e).__name__}: {e}"
        if reason:
            out["xla_reason"] = reason
    out["anchor_inputs"] = case["anchor_inputs"]
    return out


def layout_case(planners: Any, case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    t, m = parse(case["type"]), parse_mesh(case["mesh"])
    chunk = _norm_boxes(chunk_boxes(t, m))
    even = all(not d.axes or d.size % math.prod(m.axis_size(a) for a in d.axes) == 0 for d in t.dims)
    jax_boxes = jax_slices(t, m)
    out: dict[str, Any] = {"id": case["id"], "mesh": case["mesh"], "type": case["type"]}
    if even:
        if jax_boxes != chunk:
            raise AssertionError(f"{case['id']}: JAX and the chunk rule disagree on an even layout")
        out.update(slices=jax_boxes, source="jax.devices_indices_map")
    else:
        out.update(slices=[[list(x) for x in b] for b in chunk_boxes(t, m)], source="chunk-rule (uneven)",
                   xla_pad_rule_agrees=jax_boxes == chunk)
    inp = case["dtensor"]
    spec = planners.spec(m, t, inp["placements"], inp["shard_order"])
    strided = None
    if inp["shard_order"]:
        strided_pl = DTensorSpec._convert_shard_order_to_StridedShard(spec.shard_order, spec.placements, spec.mesh)
        strided = _placements_text(strided_pl)
    used = strided or inp["placements"]
    used_spec = planners.spec(m, t, used)
    full = torch.arange(float(t.numel)).reshape(t.shape)
    with LocalTensorMode(m.size) as lm:
        dt = distribute_tensor(full, used_spec.mesh, list(used_spec.placements), src_data_rank=None)
        with lm.disable():
            got = [dt.to_local()._local_tensors[r] for r in range(m.size)]
    matches = all(
        torch.equal(g, full[tuple(slice(lo, hi) for lo, hi in box)])
        for g, box in zip(got, chunk_boxes(t, m))
    )
    out["dtensor"] = {**inp, "strided_placements": strided, "placements_used": used, "matches": matches}
    return out


def _placements_text(placements: Sequence[Any]) -> str:
    from torch.distributed.tensor.placement_types import Partial, Shard, _StridedShard

    parts = []
    for p in placements:
        if isinstance(p, _StridedShard):
            parts.append(f"_S({p.dim},{p.split_factor})")
        elif isinstance(p, Shard):
            parts.append(f"S({p.dim})")
        elif isinstance(p, Partial):
            parts.append("P" if p.reduce_op == "sum" else f"P({p.reduce_op})")
        else:
            parts.append("R")
    return ",".join(parts)


def _merge(path: Path, fresh: list[dict[str, Any]], order: list[str]) -> None:
    """Write ``fresh`` over the matching ids of ``path``, in input order."""
    old = {c["id"]: c for c in read_jsonl(path)} if path.is_file() else {}
    old.update({c["id"]: c for c in fresh})
    path.write_text("".join(json.dumps(old[i]) + "\n" for i in order if i in old))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", choices=("all", "redistribute", "layouts"), default="all")
    ap.add_argument("--only", nargs="*", metavar="ID", help="only these case ids")
    ap.add_argument("--limit", type=int, help="only the first N cases of each file")
    ap.add_argument("--no-xla", action="store_true", help="keep XLA out (its fields are dropped)")
    ap.add_argument("--out", type=Path, default=CASES_DIR, help="where to write the jsonl files")
    args = ap.parse_args(argv)
    from bench.dtensor_planners import DTensorPlanners

    def pick(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
        chosen = [c for c in cases if not args.only or c["id"] in args.only]
        return chosen[:args.limit] if args.limit else chosen

    args.out.mkdir(parents=True, exist_ok=True)
    with DTensorPlanners() as planners:
        for what in ("redistribute", "layouts"):
            if args.what not in ("all", what):
                continue
            inputs = read_jsonl(CASES_DIR / f"{what}_inputs.jsonl")
            fresh = []
            for case in pick(inputs):
                t0 = time.monotonic()
                fresh.append(redistribute_case(planners, case, not args.no_xla) if what == "redistribute"
                             else layout_case(planners, case))
                print(f"{case['id']}: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
            _merge(args.out / f"{what}.jsonl", fresh, [c["id"] for c in inputs])
    return 0


if __name__ == "__main__":
    sys.exit(main())
