"""A pair of DTensor specs as shardc's program on the DeviceMesh's root mesh, or the named
reason shardc does not take it (the engine then hands the call to DTensor's own path).

A DeviceMesh may be a root mesh, a submesh (``mesh["tp"]``) or a flattened one
(``mesh["dp", "tp"]._flatten()``), named or not. Each of its dims is a run of its root
mesh's dims (read from the layouts: a dim's stride and size pick the run), so a spec on
it is a shardc type on the root mesh: a dim ``Shard``-ed over a flattened dim is split
over that run of axes, major to minor; a ``Partial`` over it is pending over each; a
root dim the DeviceMesh does not span is Varying (V: each of its groups holds its own
tensor), which every rank plays alike, under LocalTensorMode too. An unnamed mesh's
dims get names here (``d0``, ``d1``, ...).
"""

from __future__ import annotations

import itertools
import math
import weakref
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

import lowering
from lowering.cost import CostModel
from lowering.kinds import kind_of
from lowering.kinds.rows import group_rows
from lowering.layout import local_numel
from lowering.placements import from_placements
from lowering.program import Step
from spec_lang.errors import SpecError
from spec_lang.ir import INTEGER_DTYPES, AxisType, Dim, Mesh, TensorType
from spec_lang.local_type import REDUCE_OPS
from torch_backend.groups import MeshContext, context

# Every reason a redistribution goes DTensor's own way (docs/running.md lists them).
REASONS = {
    "cross_mesh": "the source and destination DeviceMeshes differ (DTensor refuses it too)",
    "rank_off_mesh": "this rank is not on the DeviceMesh (DTensor returns the local tensor as it is)",
    "mesh_layout": "the DeviceMesh's layout is no run of its root mesh's dims shardc can read",
    "mesh_ranks": "under LocalTensorMode, the root mesh does not list the simulated ranks in order",
    "placement": "a placement shardc has no type for (e.g. _MaskPartial, a custom Placement)",
    "partial_op": "a Partial reduce op shardc does not reduce (product, bitwise ops)",
    "mixed_partial": "Partials of different reduce ops in one spec, or a Partial changing op (DTensor refuses both)",
    "strided_shard_view": "a _StridedShard in a spec that does not read _StridedShard as a shard order",
    "strided_shard_order": "_StridedShard placements that decode to no shard order",
    "dtype": "a dtype shardc's types do not name",
    "flattened_uneven": "a dim Shard-ed over a flattened mesh dim of root dims that are not adjacent, "
                        "which its axes' nested chunks would cut otherwise",
    "refused": "shardc's planner or binding refuses the pair (e.g. a reduction of a dtype torch cannot add)",
    "layout": "placements or a shard_order shardc's checks refuse",
}


@dataclass(frozen=True)
class Geometry:
    """A DeviceMesh's dims as runs of its root mesh's axes: ``sub`` (the DeviceMesh's own
    dims, named), ``root`` (shardc's mesh the programs run on), ``axes`` (each of ``sub``'s
    dims' root axes, major to minor), ``varying`` (root axes the DeviceMesh does not span)."""

    sub: Mesh
    root: Mesh
    axes: tuple[tuple[str, ...], ...]
    varying: tuple[str, ...]
    to_global: tuple[int, ...]  # root mesh rank (row-major) -> global rank


@dataclass(frozen=True)
class SpecPair:
    program: Any  # lowering.Program
    ctx: MeshContext


# DeviceMesh (weakly) -> Geometry or a reason
_GEOMETRY: weakref.WeakKeyDictionary[Any, Geometry | str] = weakref.WeakKeyDictionary()
# DeviceMesh (weakly) -> MeshContext, for meshes over other ranks than the world's
_CONTEXTS: weakref.WeakKeyDictionary[Any, MeshContext] = weakref.WeakKeyDictionary()


def _names(dm: Any, n: int, stem: str) -> tuple[str, ...]:
    names = tuple(getattr(dm, "mesh_dim_names", None) or ())
    if len(names) == n:
        try:
            Mesh(names, (1,) * n)
            return names
        except (SpecError, TypeError, ValueError):
            pass
    return tuple(f"{stem}{i}" for i in range(n))


def _modes(axis: Any) -> list[tuple[int, int]] | None:
    shape, stride = axis.shape, axis.stride
    if isinstance(shape, int):
        shape, stride = (shape,), (stride,)
    if not all(isinstance(v, int) for v in (*shape, *stride)):
        return None
    return list(zip(shape, stride))


def geometry(dm: Any) -> Geometry | str:
    """``dm``'s Geometry (read once per DeviceMesh), or ``"mesh_layout"``."""
    try:
        return _GEOMETRY[dm]
    except KeyError:
        pass
    got = _read(dm)
    _GEOMETRY[dm] = got
    return got


def _read(dm: Any) -> Geometry | str:
    from torch.utils._python_dispatch import _disable_current_modes

    root = dm._get_root_mesh()
    roots = [_modes(a) for a in root._layout]
    if any(m is None or len(m) > 1 for m in roots):
        return "mesh_layout"
    # a size-1 dim's layout has no mode (torch drops it): size 1, at no stride
    rsizes = tuple(m[0][0] if m else 1 for m in roots if m is not None)
    rstrides = tuple(m[0][1] if m else 0 for m in roots if m is not None)
    rnames = _names(root, len(rsizes), "d")
    with _disable_current_modes():  # the root's rank map, real even under the trace's modes
        rank_map = tuple(int(g) for g in root._rank_map.flatten().tolist())
    to_global = _ranks([[(z, t)] for z, t in zip(rsizes, rstrides)], rank_map)
    axes: list[tuple[str, ...]] = []
    spans: list[list[tuple[int, int]]] = []
    for axis in dm._layout:
        modes = _modes(axis)
        if modes is None:
            return "mesh_layout"
        spans.append([m for m in modes if m[0] > 1])
        run: list[int] = []
        for size, stride in modes:
            if size == 1:
                continue
            found = _run(size, stride, rsizes, rstrides)
            if found is None:
                return "mesh_layout"
            run.extend(found)
        if len(set(run)) != len(run):
            return "mesh_layout"
        axes.append(tuple(rnames[i] for i in run))
    used = {a for run_ in axes for a in run_}
    if len(used) != sum(len(r) for r in axes):
        return "mesh_layout"
    sizes = tuple(math.prod(rsizes[rnames.index(a)] for a in run_) for run_ in axes)
    sub = Mesh(_names(dm, len(axes), "s"), sizes)
    varying = tuple(a for a, z in zip(rnames, rsizes) if a not in used and z > 1)
    if not varying:
        # the DeviceMesh spans its root (a root, a flattened or a reordered one): its own dims
        # are the mesh, each a group of ranks that torch.chunk's rule cuts as one
        return Geometry(sub, sub, tuple((n,) for n in sub.names), (), _ranks(spans, to_global))
    rnames, rsizes, axes = _merged(rnames, rsizes, axes)
    return Geometry(sub, Mesh(rnames, rsizes), tuple(axes), varying, to_global)


def _merged(rnames: tuple[str, ...], rsizes: tuple[int, ...], axes: list[tuple[str, ...]]
            ) -> tuple[tuple[str, ...], tuple[int, ...], list[tuple[str, ...]]]:
    """The root mesh with each flattened dim's run of adjacent root dims as one axis (the
    same ranks in the same row-major order), so a dim Shard-ed over it is cut by
    torch.chunk's rule over the whole group, as DTensor cuts it, not chunk by chunk over
    its axes. A run over dims that are not adjacent stays a run of axes."""
    names, sizes = list(rnames), list(rsizes)
    out = list(axes)
    for k, run in enumerate(axes):
        if len(run) < 2:
            continue
        at = [names.index(a) for a in run]
        gaps = [i for i in range(at[0], at[-1] + 1) if names[i] not in run]  # size 1 only: no rank between
        name = "_".join(run)
        if at != sorted(at) or any(sizes[i] != 1 for i in gaps) or name in names:
            continue
        sizes[at[0]] = math.prod(sizes[i] for i in at)
        names[at[0]] = name
        for i in reversed(at[1:]):
            del names[i], sizes[i]
        out[k] = (name,)
    return tuple(names), tuple(sizes), out


def _ranks(spans: list[list[tuple[int, int]]], rank_map: tuple[int, ...]) -> tuple[int, ...]:
    """The global rank of each of a mesh's coordinates (row-major), its dims' modes (size,
    stride, major first) indexing the root's rank map."""
    offsets = [0]
    for modes in spans:
        for size, stride in modes:
            offsets = [o + i * stride for o in offsets for i in range(size)]
    return tuple(rank_map[o] for o in offsets)


def _run(size: int, stride: int, rsizes: tuple[int, ...], rstrides: tuple[int, ...]) -> list[int] | None:
    """The root dims (major to minor) a mode of ``size`` elements at ``stride`` spans."""
    for b, (z, t) in enumerate(zip(rsizes, rstrides)):
        if z > 1 and t == stride:
            run, prod, step = [b], z, t * z
            k = b
            while prod < size:
                k -= 1
                while k >= 0 and rsizes[k] == 1:
                    k -= 1
                if k < 0 or rstrides[k] != step:
                    return None
                run.insert(0, k)
                prod *= rsizes[k]
                step *= rsizes[k]
            return run if prod == size else None
    return None


def spec_type(spec: Any, g: Geometry) -> TensorType | str:
    """A DTensorSpec as shardc's type on the root mesh, or the reason it has none."""
    placements = spec.placements
    kinds = [type(p).__name__ for p in placements]
    if any(k not in ("Shard", "Replicate", "Partial", "_StridedShard") for k in kinds):
        return "placement"
    ops = {str(p.reduce_op) for p, k in zip(placements, kinds) if k == "Partial"}
    if ops - set(REDUCE_OPS):
        return "partial_op"
    if len(ops) > 1:
        return "mixed_partial"
    strided = "_StridedShard" in kinds
    order: dict[int, list[int]] | None = None
    if strided and not spec.use_strided_shard_as_shard_order:
        return "strided_shard_view"
    if not strided:
        order = {int(e.tensor_dim): [int(i) for i in e.mesh_dims]
                 for e in (spec.shard_order or ()) if len(e.mesh_dims) > 1}
    meta = spec.tensor_meta
    try:
        t = from_placements(placements, g.sub, tuple(meta.shape), meta.dtype, shard_order=order or None)
    except SpecError as e:
        if "dtype" in str(e):
            return "dtype"
        return "strided_shard_order" if strided else "layout"
    subs = g.sub.names
    for d in t.dims:
        runs = [g.axes[subs.index(s)] for s in d.axes]
        if any(len(r) > 1 for r in runs) and _leaves(d.size, [_size(g, r) for r in runs]) != _leaves(
                d.size, [_size(g, (a,)) for r in runs for a in r]):
            return "flattened_uneven"
    dims = tuple(Dim(d.size, tuple(a for s in d.axes for a in g.axes[subs.index(s)])) for d in t.dims)
    annotated = [(a, at) for s, at in t.axis_types for a in g.axes[subs.index(s)]]
    annotated += [(a, AxisType("V")) for a in g.varying]
    return TensorType(t.dtype, dims, tuple(annotated))


def _size(g: Geometry, run: tuple[str, ...]) -> int:
    return math.prod(g.root.axis_size(a) for a in run)


def _leaves(n: int, levels: list[int]) -> list[int]:
    """Each rank's length of a dim of ``n`` cut by torch.chunk's rule over ``levels`` in turn
    (each chunk cut again by the next), ranks in row-major order."""
    sizes = [n]
    for k in levels:
        nxt: list[int] = []
        for m in sizes:
            c = -(-m // k) if m else 0
            nxt.extend(max(0, min(c, m - i * c)) for i in range(k))
        sizes = nxt
    return sizes


def plan_pair(src: Any, dst: Any, lm: Any) -> SpecPair | str:
    """``src -> dst``'s program and the context it runs in, or the reason it goes DTensor's way."""
    dm = src.mesh
    if dst.mesh is not dm and dst.mesh != dm:
        return "cross_mesh"
    if not dm._is_current_rank_part_of_mesh():
        return "rank_off_mesh"
    g = geometry(dm)
    if isinstance(g, str):
        return g
    s, d = spec_type(src, g), spec_type(dst, g)
    if isinstance(s, str):
        return s
    if isinstance(d, str):
        return d
    sops = {at.op for _, at in s.axis_types if at.kind == "P"}
    dops = {at.op for _, at in d.axis_types if at.kind == "P"}
    if sops and dops and sops != dops:
        return "mixed_partial"
    ctx = _context(dm, g, lm)
    if isinstance(ctx, str):
        return ctx
    try:
        program = _program(s, d, g, _shared_dims(src, dst, d), _dtensor_chain(src, dst, g))
    except SpecError:
        return "refused"
    return SpecPair(program, ctx)


def _dtensor_chain(src: Any, dst: Any, g: Geometry) -> list[TensorType] | None:
    """The types DTensor's own plan for ``src -> dst`` passes through, ``src``'s first and
    ``dst``'s last: one per transform DTensor runs (one mesh dim, or a flattened group of
    them, changes its placement), read off DTensor's planner as it plans the call (its
    transforms, merged onto flattened meshes as it runs them), or None where a state is no
    shardc type (the candidate is then left out)."""
    from torch.distributed.tensor import _redistribute
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._redistribute import (
        DTensorRedistributePlanner,
        _gen_transform_infos_non_cached,
        _optimize_transform_infos,
        _update_shard_order_and_placements,
    )

    first, last = spec_type(src, g), spec_type(dst, g)
    if isinstance(first, str) or isinstance(last, str):
        return None
    chain = [first]
    # DTensor warns (once per pair) where its gathers cannot merge: about its own run, which
    # this plan need not be; kept quiet and unrecorded, so DTensor's path still warns
    log, quiet, warned = _redistribute.logger, _redistribute.logger.disabled, set(_redistribute._warned_flatten_issues)
    log.disabled = True
    try:
        infos = _optimize_transform_infos(_gen_transform_infos_non_cached(src, dst), src.mesh,
                                          src.placements, dst.placements)
        strided = bool(src.use_strided_shard_as_shard_order)
        placements, order = DTensorSpec._normalize_placements_into_shard_order(src.placements, src.mesh, strided)
        current = list(placements)
        orders = DTensorRedistributePlanner._ShardOrder_to_dict(order if strided else src.shard_order)
        for info in infos:
            _update_shard_order_and_placements(info, current, orders)
            spec = DTensorSpec(src.mesh, tuple(current), tensor_meta=src.tensor_meta,
                               shard_order=DTensorRedistributePlanner._dict_to_ShardOrder(orders))
            t = spec_type(spec, g)
            if isinstance(t, str):
                return None
            chain.append(t)
    except Exception:  # DTensor's planner or a state it passes refused: no candidate, shardc's plans stand
        return None
    finally:
        log.disabled = quiet
        _redistribute._warned_flatten_issues.intersection_update(warned)
    return chain if chain[-1] == last else None


def _shared_dims(src: Any, dst: Any, d: TensorType) -> list[int]:
    """The DeviceMesh dims where DTensor partitions a Replicate value into a pending sum,
    giving each rank its share ``v/n`` (``Partial._partition_value``): a dtype that holds
    the share only (DTensor's own answer for an integer changes the dtype: the engine keeps
    the value on one rank, exact)."""
    if d.partial_op != "sum" or d.dtype in INTEGER_DTYPES or d.dtype == "bool":
        return []
    return [i for i, (p, q) in enumerate(zip(src.placements, dst.placements))
            if p.is_replicate() and q.is_partial()]


def _program(s: TensorType, d: TensorType, g: Geometry, shared: list[int],
             chain: list[TensorType] | None = None) -> Any:
    """``s -> d`` planned by shardc (``chain``: the types DTensor's own plan passes through,
    a candidate); a Replicate DTensor dim that becomes a pending sum ends as DTensor's
    ``divide`` step (each rank ``v/n``), one per DeviceMesh dim in its order, where shardc's
    own plan would keep the value on one rank (``zero_fill``)."""
    runs = [g.axes[i] for i in shared if g.axes[i]]  # a size-1 dim's share is the value
    if not runs:
        return _planned(s, d, g.root, chain)

    def short_of(pending: set[str]) -> TensorType:  # ``d`` with the axes still to divide replicated (I)
        return TensorType(d.dtype, d.dims, tuple((a, at) for a, at in d.axis_types if a not in pending))

    pending = {a for run in runs for a in run}
    mid = short_of(pending)
    steps = list(_planned(s, mid, g.root).steps)
    for run in runs:
        pending -= set(run)
        nxt = short_of(pending)
        steps.append(lowering.make_step("divide", mid, nxt, g.root, axes=run))
        mid = nxt
    return lowering.make_program(steps, g.root, src=s)


# a collective's latency in bytes, per backend, where shardc's default (64 KiB: a few us at
# NVLink-class bandwidth) undercharges it: a gloo collective costs ms on CPU
_SPARE_AXIS_BYTES = {"gloo": 1 << 20}


def _engine_model() -> CostModel | None:
    """The bytes-first model with a spare-axis charge for this world's backend.

    shardc splits a pending reduction over an axis both ends replicate (slice, reduce on
    part of the data, all_gather back) where the bytes saved pay for the collective added,
    priced ``spare_axis_bytes``. On gloo a collective costs a millisecond or more, so a
    split that saves 256 KiB for one more collective is slower there than DTensor's one
    reduce_scatter."""
    charge = _SPARE_AXIS_BYTES.get(str(dist.get_backend())) if dist.is_initialized() else None
    return None if charge is None else CostModel(spare_axis_bytes=charge)


def _group_size(mesh: Mesh, axes: tuple[str, ...]) -> int:
    return math.prod(mesh.axis_size(a) for a in axes)


def _rounds(step: Any, mesh: Mesh) -> int:
    """The rounds of messages ``step`` passes in turn as the engine runs it: a ring over a
    group of n ranks (an all_gather, an exact uneven one too) n-1; an all_reduce's ring
    2(n-1), and a reduce_scatter's too (gloo reduces the whole block: over 2 ranks it takes
    as long as an all_reduce); a permute (one peer each) one per launch; an exchange (all_to_all, the
    exact all_to_allv, a relay's phase) log2(n) per launch: its messages to every peer go
    out together, but each peer costs (on 8 gloo ranks, an all_to_all over 4 ranks took
    about 2.4x one over 2, and one over 8 a third of a ring all_gather's 7 rounds)."""
    n = _group_size(mesh, step.axes)
    if step.kind in ("all_gather", "all_gatherv"):  # all_gatherv: n-1 rounds of point-to-point
        return n - 1
    if step.kind in ("all_reduce", "reduce_scatter"):
        return 2 * (n - 1)
    if step.kind == "permute":
        return int(step.launches)
    return int(step.launches) * max(1, math.ceil(math.log2(n)))


def _ring_steps(program: Any) -> int:
    """``program``'s latency in ring steps: a collective over a group of n ranks passes its
    data on n-1 times (an all_gather's ring), a permute once."""
    mesh = program.mesh
    return sum(s.launches * (1 if s.kind == "permute" else _group_size(mesh, s.axes) - 1)
               for s in program.steps if s.is_collective)


def _ring_model(mesh: Mesh) -> CostModel:
    """Bytes first, then ring steps: an alpha per ring step far below one byte's beta."""
    names, sizes = mesh.names, mesh.sizes
    groups = tuple((tuple(names[i] for i in comb), (math.prod(sizes[i] for i in comb) - 1) * _STEP_ALPHA, 1e-10)
                   for k in range(2, len(names) + 1) for comb in itertools.combinations(range(len(names)), k))
    return CostModel(tuple((n, (z - 1) * _STEP_ALPHA) for n, z in sorted(zip(names, sizes))), (), 0.0, 1e-10,
                     groups=groups)


_STEP_ALPHA = 1e-16  # a ring step's latency in the ring model: below any byte's 1e-10 s


def _fewer_ring_steps(s: TensorType, d: TensorType, mesh: Mesh, program: Any) -> Any:
    """The plan of ``program``'s bytes in fewer ring steps, where there is one (else None).

    shardc's bytes-first planner merges a collective over several mesh axes into one over
    their flattened group where the bytes tie (one collective fewer). A ring over all n
    ranks of the group takes n-1 steps, where one ring per axis takes the sum of each
    axis's size less one: on 2x4, ``all_gather(tp,dp)`` passes 7 times, ``all_gather(dp)``
    then ``all_gather(tp)`` 1 + 3 times, the same bytes."""
    if not any(st.is_collective and len(st.axes) > 1 for st in program.steps):
        return None
    other = lowering.compile(s, d, mesh, cost_model=_ring_model(mesh))
    if other.cost.bytes_max == program.cost.bytes_max and _ring_steps(other) < _ring_steps(program):
        return other
    return None


def _one_call(step: Any, mesh: Mesh) -> Any:
    """``step``, or, for a gather of uneven blocks, the exact exchange that moves them in one
    call (``all_to_allv``: one ``all_to_all_single`` with each peer's exact split).

    shardc runs an uneven all_gather exactly as n-1 rounds of point-to-point around the
    ring (at the byte bound whatever the skew), and DTensor as one all_gather padded to the
    largest block. Where a call costs milliseconds (gloo on CPU), the n-1 rounds are the
    slowest of the three: on 8 gloo ranks, 262140 f32 gather in 52 ms as a ring, 15 ms
    padded, 5.6 ms as the exact exchange. Every rank sends its own block to each peer, so
    the exchange never moves more than DTensor's padded gather."""
    if step.kind != "all_gatherv" and not (step.kind == "all_gather" and _uneven(step, mesh)):
        return step
    kind = kind_of("all_to_allv")
    try:
        sig = kind.infer(step.src, step.dst, mesh, step.axes)
    except SpecError:  # a size-1 axis changes its place or ends a sum: the gather stays as planned
        return step
    item = step.src.itemsize
    sent = tuple(int(b) * item for b in kind.price(step.src, step.dst, mesh, sig.axes))
    got = tuple(int(b) * item for b in kind.received(step.src, step.dst, mesh, sig.axes))
    return Step(kind.name, sig.axes, sig.dims, step.src, step.dst, None, step.in_shapes, step.out_shapes, sent,
                collective=True, bytes_recv=got)


def _uneven(step: Any, mesh: Mesh) -> bool:
    """Whether some group of ``step`` holds blocks of different sizes."""
    sizes = local_numel(step.src, mesh)[group_rows(mesh, step.axes)]
    return bool((sizes != sizes[:, :1]).any())


# the engine's alpha-beta price of a plan as it runs it: a latency per call and per round of
# messages (gloo on CPU: about a millisecond each), then its bytes
_CALL_S, _BYTE_S = 1e-3, 1e-9
# how far above the fewest bytes a plan may go for fewer calls and rounds
_NEAR = 1 / 8


def _engine_time(model: CostModel, step: Any, mesh: Any, bytes_max: int) -> float:
    return _CALL_S * (step.launches + _rounds(step, mesh)) + _BYTE_S * bytes_max


_TIMED = CostModel(default_alpha=_CALL_S, default_beta=_BYTE_S, engine_time=_engine_time)


def _dtensor_plan(chain: list[TensorType], mesh: Mesh) -> Any:
    """DTensor's own plan run by shardc: each of its transforms (``chain``'s hops) planned
    by shardc, one collective or a local slice each, never more bytes than DTensor's own
    (an uneven gather exact, not padded); None where shardc refuses a hop."""
    model = _engine_model()
    steps: list[Any] = []
    try:
        for a, b in itertools.pairwise(chain):
            steps.extend(lowering.compile(a, b, mesh, cost_model=model).steps)
        return lowering.make_program(steps, mesh, src=chain[0])
    except SpecError:
        return None


def _planned(s: TensorType, d: TensorType, mesh: Mesh, chain: list[TensorType] | None = None) -> Any:
    """``s -> d`` as the engine plans it: shardc's bytes-first plan under this backend's
    model and, where it merges a collective over several axes, the plan of its bytes in
    fewer ring steps, and DTensor's own plan (``chain``, its states) run by shardc's steps;
    each with its uneven gathers as one call (``_one_call``); of those within ``_NEAR`` of
    the fewest bytes or within DTensor's plan's bytes (what DTensor would move anyway),
    the one the engine's alpha-beta price (``_engine_time``: a latency per call and per
    round) makes fastest. On 2x2x2, ``bf16[6@dp,8736,5@cp]{U:tp} -> bf16[6@dp,8736,5]``:
    DTensor's all_reduce(tp), then one exact exchange within each cp pair (two calls), not
    three calls of the same bytes, nor reduce_scatter(tp) and an exchange over (tp, cp);
    ``bf16[32768,8@tp] -> bf16[32768@(tp,dp,cp),8]``: DTensor's swap of the dim within
    each tp pair (one exchange) and local slices, not shardc's relay at the byte bound (two
    exchanges over all 8 ranks)."""
    first = lowering.compile(s, d, mesh, cost_model=_engine_model())
    own = None if chain is None else _dtensor_plan(chain, mesh)
    plans = [p for p in (first, _fewer_ring_steps(s, d, mesh, first), own) if p is not None]
    runs = [lowering.make_program([_one_call(st, mesh) for st in p.steps], mesh, cost_model=_TIMED, src=s)
            for p in plans]
    least = min(p.cost.bytes_max for p in runs)
    cap = max(least + int(least * _NEAR), 0 if own is None else runs[-1].cost.bytes_max)
    near = [i for i, p in enumerate(runs) if p.cost.bytes_max <= cap]
    best = min(near, key=lambda i: (runs[i].cost.time_s, runs[i].cost.bytes_max))
    # a plan the engine runs as planned stays shardc's Program (its proof and its price)
    return plans[best] if runs[best].steps == plans[best].steps else runs[best]


def _context(dm: Any, g: Geometry, lm: Any) -> MeshContext | str:
    identity = g.to_global == tuple(range(len(g.to_global)))
    if lm is not None:
        if not identity or len(g.to_global) != len(lm.ranks):
            return "mesh_ranks"
        return context(g.root)
    if identity and dist.get_world_size() == len(g.to_global):
        return context(g.root)
    ctx = _CONTEXTS.get(dm)
    if ctx is None:
        me = dist.get_rank()
        if me not in g.to_global:
            return "rank_off_mesh"
        ctx = MeshContext(g.root, (g.to_global.index(me),), g.to_global, backend=str(dist.get_backend()))
        _CONTEXTS[dm] = ctx
    return ctx

