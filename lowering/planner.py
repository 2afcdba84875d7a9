"""The redistribute compiler: the cheapest flat program of collectives src -> dst.

Passes, in the spirit of Shardy's reshard-to-collectives:

1. *check*: same shape and dtype, every axis on the mesh, the partial conversions
   allowed by seed 004 (no P(op) -> P(other op), convert(S,P) only for sum, V axes
   untouched).
2. *search*: first the normal form of Rink et al. alone (slice first, size-preserving
   exchange or the one reduction, gather last), kept when provably cheapest; else a
   best-first search over erased states (``lowering.moves``): local slices,
   all_gathers of minor suffixes (flattened over several axes, one dim or several),
   all_to_alls that move a suffix between dims, direct exact exchanges to the goal and
   to the normal form, reduce_scatter / all_reduce of pending partial axes (flattened
   or per axis, onto one dim or several), and the free converts into new partial axes.
   Each move is priced exactly on every rank with the layout algebra (uneven sizes
   included), under the ring model; collectives over spare axes (replicated on both
   ends) carry the cost model's latency charge.
3. *assemble*: steps get their exact per-rank shapes, and the R/I annotations of the
   user's types are restored on the first and last state.

The result is cached per (src, dst, mesh, cost model).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from lowering.caching import MIB, cached
from lowering.checks import check_same_global, resolve
from lowering.cost import DEFAULT_COST_MODEL, SPARE_AXIS_BYTES, CostModel
from lowering.kinds import kind_of, priced_step
from lowering.layout import local_numel
from lowering.moves import Move, erase, moves
from lowering.program import COLLECTIVE_KINDS, Program, Step, program_cost
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType

_MAX_EXPANSIONS = 4000
_MAX_LABELS = 2


def compile(  # noqa: A001 - the public name the issue asks for
    src: TensorType | str,
    dst: TensorType | str,
    mesh: Mesh | str,
    *,
    cost_model: CostModel | None = None,
) -> Program:
    """Compile ``src -> dst`` on ``mesh`` into the cheapest Program found."""
    s, m = resolve(src, mesh)
    d, _ = resolve(dst, m)
    check_same_global(s, d, src if isinstance(src, str) else None, dst if isinstance(dst, str) else None)
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise SpecError(
            f"cost_model must be a lowering.CostModel, got {type(cost_model).__name__}",
            hint="build one with CostModel.make(alpha={'dp': 5e-6}, beta={'dp': 1e-10})",
        )
    if cost_model is not None and cost_model.spare_axis_bytes < 0:
        raise SpecError(f"spare_axis_bytes must be >= 0, got {cost_model.spare_axis_bytes}",
                        hint=f"use 0 for a pure bytes-first model, or the default {SPARE_AXIS_BYTES}")
    for name, _ in (cost_model.alpha + cost_model.beta) if cost_model else ():
        if name not in m:
            raise SpecError(f"the cost model names axis {name!r}, which is not on the mesh {m}",
                            hint=f"use the mesh axes {', '.join(m.names)}")
    return _compile(s, d, m, cost_model or DEFAULT_COST_MODEL)


@cached(maxsize=8192, max_bytes=32 * MIB)
def _compile(src: TensorType, dst: TensorType, mesh: Mesh, model: CostModel) -> Program:
    op = check_partial_conversion(src, dst)
    start, goal = erase(src), erase(dst)
    path = _normal_form(start, goal, mesh, op, model)
    if path is None:
        path = _search(start, goal, mesh, op, model)
    steps = [_price(mv_src, mv, mesh) for mv_src, mv in path]
    steps = _restore_annotations(steps, src, dst, mesh)
    return Program(mesh, src, dst, tuple(steps), program_cost(steps, src, mesh, model))


def check_partial_conversion(src: TensorType, dst: TensorType) -> str:
    """The reduce op in play; SpecError where seed 004 defines no conversion."""
    sv, dv = set(src.axes_of_kind("V")), set(dst.axes_of_kind("V"))
    if sv != dv:
        raise SpecError(
            f"varying axes differ: source {sorted(sv)}, destination {sorted(dv)}",
            text=str(dst), pos=str(dst).find("{"),
            hint="a V axis has no global value to preserve; keep V axes the same on both sides "
            "(reinterpret them in local code instead)",
        )
    sop, dop = src.partial_op, dst.partial_op
    if sop and dop and sop != dop:
        raise SpecError(
            f"cannot turn a pending {sop} into a pending {dop}",
            text=str(dst), pos=str(dst).find("{"),
            hint=f"reduce the source first (redistribute to a type without P({sop})), then convert",
        )
    for a in dst.partial_axes:
        if a in src.partial_axes:
            continue
        if src.dim_of(a) is not None and dop != "sum":
            raise SpecError(
                f"no conversion from a dim sharded on {a!r} to P({dop}) on {a!r}",
                text=str(dst), pos=str(dst).find(a, str(dst).find("{")),
                hint="the SPMD type system defines convert(S, P) only for sum (zero padding, docs/planner.md); "
                "gather the dim first, then convert R to P(" + str(dop) + ")",
            )
    return sop or dop or "sum"


def _normal_form(start: TensorType, goal: TensorType, mesh: Mesh, op: str,
                 model: CostModel) -> list[tuple[TensorType, Move]] | None:
    """The Rink normal form, kept only when provably cheapest.

    Slices first (only of axes the goal shards); then, for Shard/Replicate moves, one
    exchange to the goal's dims plus the axes still to gather (kept minor on their dim)
    and one gather per dim; or, with a pending reduction, the one reduce_scatter (onto
    the dims the goal shards with the pending axes) or all_reduce that finishes it.
    It is returned without a search when it is free, or one collective that provably
    sends the fewest bytes: no more than the sent-side floor (the mean over ranks of the
    bytes any plan must send, rounded up), or a direct exchange between two layouts that
    shard over every axis (each element has one holder and one needer). Only a free
    plan has fewer collectives.
    """
    if goal.partial_axes or not model.bytes_first:
        return None
    from lowering.moves import exchange_move, replicated, with_dims, with_partial

    path: list[tuple[TensorType, Move]] = []
    state = start
    dims = [list(d.axes) for d in state.dims]
    for k, d in enumerate(goal.dims):
        for a in d.axes:
            if a in replicated(state, mesh):
                dims[k].append(a)
                nxt = with_dims(state, [tuple(x) for x in dims])
                path.append((state, Move("slice", (a,), (k,), nxt)))
                state = nxt
    pending = [a for a in mesh.names if a in start.partial_axes]
    if pending:
        wants = [(k, tuple(a for a in g.axes if a in pending)) for k, g in enumerate(goal.dims)]
        wants = [(k, w) for k, w in wants if w]
        axes = tuple(a for _, w in wants for a in w)
        nd = [d.axes for d in state.dims]
        for k, w in wants:
            nd[k] = nd[k] + w
        if not axes:
            path.append((state, Move("all_reduce", tuple(pending), (), with_partial(state, set(), op, mesh))))
        elif set(axes) == set(pending):
            path.append((state, Move("reduce_scatter", axes, tuple(k for k, _ in wants),
                                     with_partial(with_dims(state, nd), set(), op, mesh))))
        else:
            return None
        state = path[-1][1].dst
    else:
        goal_axes = set(goal.sharded_axes)
        nf = [tuple(g.axes) + tuple(a for a in d.axes if a not in goal_axes) for g, d in zip(goal.dims, state.dims)]
        target = with_dims(state, nf)
        if target != state:
            mv = exchange_move(state, target, mesh)
            if mv is None:
                return None
            path.append((state, mv))
            state = target
        for k, d in enumerate(state.dims):
            extra = d.axes[len(goal.dims[k].axes):]
            if extra:
                nd = [x.axes for x in state.dims]
                nd[k] = d.axes[: len(goal.dims[k].axes)]
                nxt = with_dims(state, nd)
                path.append((state, Move("all_gather", extra, (k,), nxt)))
                state = nxt
    if state != goal:
        return None
    colls = sum(1 for _, mv in path if mv.kind in COLLECTIVE_KINDS)
    if colls == 0:
        return path
    if colls > 1:
        return None
    sent = int(sum((move_bytes(s, mv, mesh) for s, mv in path), np.zeros(mesh.size, dtype=np.int64)).max())
    if sent == 0:  # a collective that moves nothing: a free plan may exist, let the search see
        return None
    if not pending and not replicated(start, mesh) and not replicated(goal, mesh):
        # every element has one holder and one needer: any plan makes each rank send all
        # it holds but keeps, which is exactly what the one direct exchange sends
        return path
    if sent * start.itemsize <= _sent_floor(start, goal, mesh):
        return path
    return None


@cached(maxsize=4096)
def _sent_floor(start: TensorType, goal: TensorType, mesh: Mesh) -> int:
    """Bytes the busiest rank sends in any plan, at least: the lower bound's ``sent_avg``
    rounded up (every needed element arrives, so total sends cover the transfers). The
    receive side of the lower bound is no floor for *sent* bytes on uneven layouts."""
    from lowering.bounds import lower_bound_detail

    return int(np.ceil(lower_bound_detail(start, goal, mesh)["sent_avg_bytes"] - 1e-9))


def _search(start: TensorType, goal: TensorType, mesh: Mesh, op: str,
            model: CostModel) -> list[tuple[TensorType, Move]]:
    """Best-first search with up to ``_MAX_LABELS`` labels per state (see ``_search_labels``);
    where that runs out of expansions, once more with one label per state, which always
    ends (a plain A* over states)."""
    path = _search_labels(start, goal, mesh, op, model, _MAX_LABELS)
    if path is None:
        path = _search_labels(start, goal, mesh, op, model, 1)
    if path is None:
        raise SpecError(
            f"no program reaches {goal} from {start} on mesh {mesh}",
            hint="check that every partial axis of the destination can be produced from the source "
            "(the SPMD type system's conversions, docs/planner.md)",
        )
    return path


def _search_labels(start: TensorType, goal: TensorType, mesh: Mesh, op: str,
                   model: CostModel, max_labels: int) -> list[tuple[TensorType, Move]] | None:
    """Best-first search from ``start`` to ``goal``; see ``_key`` for the order.

    A path's cost is a vector (bytes each rank has sent), so two paths to one state can
    each be the better start for some ending. A state is therefore expanded once per
    *label* (sent vector, time, collectives, peak, spare-axis charge) that no label
    already expanded there dominates, not just once: with an estimate that never
    overshoots, the first goal popped is then the cheapest plan in the search space, as
    long as no state needs more than ``max_labels`` labels. None when the expansion
    budget runs out first.
    """
    if start == goal:
        return []
    tie = itertools.count()
    zero = np.zeros(mesh.size, dtype=np.int64)
    peak0 = int((local_numel(start, mesh) * start.itemsize).max())

    def future(state: TensorType) -> float:
        return _future(state, goal, mesh) if model.bytes_first else 0.0

    spare = set(spare_axes(start, goal, mesh))
    charge = model.spare_axis_bytes if model.bytes_first else 0
    expanded: dict[TensorType, list[_Label]] = {}
    # spare-axis collectives so far, and whether a spare axis was sliced: a sliced spare axis
    # must be gathered back (the goal replicates it), so its charge is due from the slice on,
    # which keeps the search from exploring split plans the charge will rule out
    first = _Label(zero, 0.0, 0, peak0, 0, 0, False)
    frontier = [(_key(model, 0.0, zero, 0, peak0, future(start)), next(tie), start, first, None)]
    expansions = 0
    while frontier:
        _, _, state, lab, node = heapq.heappop(frontier)
        seen = expanded.setdefault(state, [])
        if len(seen) >= max_labels or _dominated(seen, lab):
            continue
        seen.append(lab)
        if state == goal:
            return _unwind(node)
        expansions += 1
        if expansions > _MAX_EXPANSIONS:
            break
        for mv in _moves(state, goal, mesh, op):
            step_sent = move_bytes(state, mv, mesh) * state.itemsize
            coll = mv.kind in COLLECTIVE_KINDS
            live = (local_numel(state, mesh) + local_numel(mv.dst, mesh)) * state.itemsize
            on_spare = bool(spare.intersection(mv.axes))
            n_spare = lab.spare_colls + int(coll and on_spare)
            sliced = lab.spare_sliced or (on_spare and not coll)
            lab2 = _Label(
                lab.sent + step_sent, lab.time + model.step_time(mv.axes, int(step_sent.max()), coll),
                lab.colls + int(coll), max(lab.peak, int(live.max())),
                charge * max(n_spare, int(sliced)), n_spare, sliced,
            )
            seen = expanded.get(mv.dst, ())
            if len(seen) >= max_labels or _dominated(seen, lab2):
                continue
            key2 = _key(model, lab2.time, lab2.sent, lab2.colls, lab2.peak, future(mv.dst), lab2.charge)
            heapq.heappush(frontier, (key2, next(tie), mv.dst, lab2, (state, mv, node)))
    return None


class _Label(NamedTuple):
    """What a path to a state has cost so far."""

    sent: np.ndarray  # (world,) bytes sent per rank
    time: float
    colls: int
    peak: int
    charge: int  # spare-axis charge due (bytes-first model)
    spare_colls: int
    spare_sliced: bool


def _dominated(labels: Sequence[_Label], lab: _Label) -> bool:
    """Whether some label is no worse than ``lab`` in every term (so ``lab`` can be dropped)."""
    return any(
        u.time <= lab.time and u.colls <= lab.colls and u.peak <= lab.peak and u.charge <= lab.charge
        and bool((u.sent <= lab.sent).all())
        for u in labels
    )


def _key(model: CostModel, time: float, sent: np.ndarray, colls: int, peak: int, future: float,
         extra: int = 0) -> tuple:
    """Search key: (bytes estimate, bytes, collectives, peak) for the bytes-first model,
    else (time, bytes, collectives, peak). The bytes estimate is an A* term that never
    overshoots: the final max over ranks is at least the mean over ranks of what was
    sent plus the transfers still needed (the lower bound's ``sent_avg`` from here).
    ``extra`` is the latency charge for collectives over spare axes (bytes-first only);
    it only grows along a path, so the estimate stays a lower bound."""
    total = int(sent.max())
    if not model.bytes_first:
        return (time, total, colls, peak)
    estimate = max(total, -(-int(sent.sum() + future) // len(sent)))
    return (estimate + extra, total + extra, colls, peak)


def spare_axes(src: TensorType, dst: TensorType, mesh: Mesh) -> tuple[str, ...]:
    """Mesh axes that both types replicate (not sharded, not P, not V): no data must cross them."""
    used = set(src.sharded_axes) | set(dst.sharded_axes)
    used |= {a for t in (src, dst) for a, at in t.axis_types if at.kind in ("P", "V")}
    return tuple(a for a in mesh.names if a not in used)


def spare_collectives(program: Program) -> int:
    """How many of ``program``'s collectives run over a spare axis of its two end types."""
    spare = set(spare_axes(program.src, program.dst, program.mesh))
    return sum(1 for s in program.steps if s.is_collective and spare.intersection(s.axes))


@cached(maxsize=16384)  # keys hold search states: keep their count modest
def _future(state: TensorType, goal: TensorType, mesh: Mesh) -> float:
    """Bytes every rank together must still send to reach ``goal`` (a lower bound)."""
    from lowering.bounds import lower_bound_detail

    return float(lower_bound_detail(state, goal, mesh)["sent_avg_bytes"]) * mesh.size


def _unwind(node: tuple | None) -> list[tuple[TensorType, Move]]:
    path = []
    while node is not None:
        state, mv, node = node
        path.append((state, mv))
    return path[::-1]


@cached(maxsize=65536, max_bytes=24 * MIB)
def move_bytes(state: TensorType, mv: Move, mesh: Mesh) -> np.ndarray:
    """(world,) elements each rank sends in this move (read-only; cached, since a state
    expanded under a second label prices the same moves again)."""
    out = kind_of(mv.kind).price(state, mv.dst, mesh, mv.axes)
    out.setflags(write=False)
    return out


@cached(maxsize=2048)  # values hold new states (types): a few searches' worth
def _moves(state: TensorType, goal: TensorType, mesh: Mesh, op: str) -> tuple[Move, ...]:
    return tuple(moves(state, goal, mesh, op))


def _price(state: TensorType, mv: Move, mesh: Mesh) -> Step:
    return priced_step(mv.kind, state, mv.dst, mesh, mv.axes, mv.dims, state.partial_op)


def _annotate(state: TensorType, src: TensorType, dst: TensorType, mesh: Mesh) -> TensorType:
    """Give a replicated axis of an intermediate state dst's R/I type (or src's)."""
    used = set(state.sharded_axes) | {a for a, _ in state.axis_types}
    extra = []
    for a in mesh.names:
        if a in used:
            continue
        for t in (dst, src):
            if t.dim_of(a) is None and t.axis_type(a).kind == "R":
                extra.append((a, t.axis_type(a)))
                break
            if t.dim_of(a) is None and t.axis_type(a).kind == "I":
                break
    return state.replace(axis_types=state.axis_types + tuple(extra))


def _restore_annotations(steps: list[Step], src: TensorType, dst: TensorType, mesh: Mesh) -> list[Step]:
    if not steps:
        if src != dst:  # R <-> I only: no data moves, but the backward differs
            changed = tuple(a for a in mesh.names if src.axis_type(a) != dst.axis_type(a))
            return [priced_step("reinterpret", src, dst, mesh, changed, ())]
        return []
    out = []
    for i, s in enumerate(steps):
        a = src if i == 0 else _annotate(s.src, src, dst, mesh)
        b = dst if i == len(steps) - 1 else _annotate(s.dst, src, dst, mesh)
        out.append(Step(s.kind, s.axes, s.dims, a, b, s.op, s.in_shapes, s.out_shapes, s.bytes_sent, s.padded))
    return out

