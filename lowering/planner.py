"""The redistribute compiler: the cheapest flat program of collectives src -> dst.

Passes, in the spirit of Shardy's reshard-to-collectives:

1. *check*: same shape and dtype, every axis on the mesh, the partial conversions
   allowed by the SPMD type system (no P(op) -> P(other op), convert(S,P) only for
   sum, V axes untouched). Only these refusals raise: every other pair compiles.
2. *search*: first the normal form of Rink et al. alone (slice first, size-preserving
   exchange or the one reduction, gather last), kept when provably cheapest; else a
   best-first search, within a deterministic work budget, from the cheapest
   constructive route (``lowering.fallback``) as its first incumbent, over erased states (``lowering.moves``): local slices,
   all_gathers of minor suffixes (flattened over several axes, one dim or several),
   all_to_alls that move a suffix between dims, direct exact exchanges to the goal and
   to the normal form, reduce_scatter / all_reduce of pending partial axes (flattened
   or per axis, onto one dim or several), and the free converts into new partial axes.
   Each move is priced exactly on every rank with the layout algebra (uneven sizes
   included), under the ring model; collectives over spare axes (replicated on both
   ends) carry the cost model's latency charge.
3. *assemble*: steps get their exact per-rank shapes, and the R/I annotations of the
   user's types are restored on the first and last state.

An integer average is finished in one step over all its pending axes (integer division
truncates: docs/planner.md, "Reductions"); a destination that keeps it pending over some
of them is planned without its P axes, then reinterpreted into them.

The result is cached per (src, dst, mesh, cost model, budget, gap); ``Program.optimal``
says whether the search proved it cheapest, and ``Program.gap_bytes`` how close it proved
it where it did not (None: the budget ran out first).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import os
import time
from collections.abc import Mapping
from typing import Any, overload

import numpy as np

from lowering.caching import MIB, cached
from lowering.checks import (
    check_budget,
    check_gap_bytes,
    check_partial_conversion,
    check_same_global,
    resolve,
)
from lowering.cost import DEFAULT_COST_MODEL, SPARE_AXIS_BYTES, CostModel, as_cost_model
from lowering.cross_mesh import check_cross_types, cross_best, cross_program, finished_types
from lowering.fallback import fallback_routes
from lowering.kinds import COLLECTIVE_KINDS, LAUNCHES, dual_kind, kind_of, make_step, priced_step
from lowering.kinds.base import drop_unit_axes, replicated_axes, splits_integer_average
from lowering.labels import (
    Label,
    SearchContext,
    class_floor,
    dominated,
    move_bytes,
)
from lowering.moves import Move, erase, moves
from lowering.program import Program, Step, check_program, program_cost
from lowering.uneven_planner import plan_uneven
from spec_lang.dual import check_differentiable, dual_type
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType

_MAX_LABELS = 2
DEFAULT_BUDGET_S = 0.05
# The search's cut-off is a count of priced moves, not the clock, so that every rank
# compiles the same program: ``budget_s`` buys ``budget_s * _MOVES_PER_S`` of them on a
# 64-rank mesh, scaled with the world (``work_budget``), the fallback's collectives
# included. The rate was measured in CPU time on a 2-core machine, loaded and idle
# (100-200 us per priced move at 64 ranks, moves generated and labels kept included),
# and set with a margin, so the count runs out inside the budget. The clock is only a
# safety net, at ``_CLOCK_FACTOR`` times the budget, for a machine far slower than that
# (or a first call that pays for imports): where it fires, ranks may disagree.
_MOVES_PER_S = 4_000
_CLOCK_FACTOR = 100
# The bytes-first search sets aside a path that could save no more than its gap in bytes
# (busiest rank) on its best program and needs at least as many collectives. The gap is
# 1/64 of what the model charges for one collective's latency (``spare_axis_bytes``):
# 1 KiB by default, about 80 ns on a 12.5 GB/s link against a 5 us latency. A tiny
# tensor's plans all cost about that latency, and proving which of them sends 4 B less
# can take the whole budget. A pure bytes model (no charge) gets no gap.
_GAP_SHARE = 64
DEFAULT_GAP_BYTES = SPARE_AXIS_BYTES // _GAP_SHARE
# The gap applies only once the search has generated this many moves (about one
# expansion of the start): a search that proves its program cheapest right away, as
# most do on tensors of model size, keeps the exact proof.
_EXACT_MOVES = 16


@overload
def compile(src: TensorType | str, dst: TensorType | str, mesh: Mesh | str, *,
            cost_model: CostModel | Mapping[str, Any] | str | os.PathLike[str] | None = None,
            budget_s: float = DEFAULT_BUDGET_S, gap_bytes: int | None = None, dst_mesh: None = None) -> Program: ...


@overload
def compile(src: TensorType | str, dst: TensorType | str, mesh: Mesh | str, *,
            cost_model: CostModel | Mapping[str, Any] | str | os.PathLike[str] | None = None,
            budget_s: float = DEFAULT_BUDGET_S, gap_bytes: int | None = None,
            dst_mesh: Mesh | str) -> Program: ...


def compile(
    src: TensorType | str,
    dst: TensorType | str,
    mesh: Mesh | str,
    *,
    cost_model: CostModel | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    gap_bytes: int | None = None,
    dst_mesh: Mesh | str | None = None,
) -> Program:
    """Compile ``src -> dst`` on ``mesh`` into the cheapest Program found within ``budget_s``.

    With ``dst_mesh``, ``dst`` is laid out on ``dst_mesh`` instead, and the result is a
    Program over the union of the two meshes' global ranks (``Mesh.ranks``): pending sums
    finished on ``mesh``, then a step that crosses to ``dst_mesh`` in point-to-point rounds
    (``send_across`` or ``fan_out``; docs/cross_mesh.md; ``lowering.CrossProgram`` views it
    in the crossing's terms).

    Always answers for a pair the checks accept: where the search runs out of its budget,
    the cheapest program found so far (at worst a constructive route through the normal
    form) comes back with ``Program.optimal`` False and ``Program.gap_bytes`` None. The
    budget is a deterministic count of planner work calibrated to seconds (see
    docs/planner.md), so every rank compiles the same program.

    ``gap_bytes`` (bytes-first model): the search does not spend its budget on plans
    that could save at most this many bytes on the busiest rank and need as many
    collectives; where it set one aside, the program comes back proven within what it
    could save (``Program.gap_bytes``) rather than ``optimal``. 0 proves the cheapest
    outright; None is 1/64 of the model's ``spare_axis_bytes`` (``DEFAULT_GAP_BYTES``,
    1 KiB, for the default model; 0 for a pure bytes model).

    ``cost_model``: a CostModel, its JSON dict, or the path of a JSON file (what
    ``shardc calibrate --out`` writes); None is the default bytes-first model.
    """
    s, m = resolve(src, mesh)
    d, dm = resolve(dst, m if dst_mesh is None else dst_mesh)
    check_same_global(s, d, src if isinstance(src, str) else None, dst if isinstance(dst, str) else None)
    if dst_mesh is not None:
        check_cross_types(s, d, src if isinstance(src, str) else None, dst if isinstance(dst, str) else None)
    cost_model = as_cost_model(cost_model, m)
    if cost_model is not None and cost_model.spare_axis_bytes < 0:
        raise SpecError(f"spare_axis_bytes must be >= 0, got {cost_model.spare_axis_bytes}",
                        hint=f"use 0 for a pure bytes-first model, or the default {SPARE_AXIS_BYTES}")
    for name in sorted(cost_model.axis_names()) if cost_model else ():
        if name not in m:
            raise SpecError(f"the cost model names axis {name!r}, which is not on the mesh {m}",
                            hint=f"use the mesh axes {', '.join(m.names)} (a calibrated model fits the mesh "
                            "it was calibrated on)")
    model = cost_model or DEFAULT_COST_MODEL
    gap = model.spare_axis_bytes // _GAP_SHARE if gap_bytes is None else check_gap_bytes(gap_bytes, DEFAULT_GAP_BYTES)
    # a timed model prices each collective's latency in its time already: its search has no gap
    budget, gap = check_budget(budget_s, DEFAULT_BUDGET_S), gap if model.bytes_first else 0
    if dst_mesh is not None:
        return _compile_cross(s, d, m, dm, model, budget, gap)
    return _compile(s, d, m, model, budget, gap)


def compile_gradient(program: Program, cost_model: CostModel | None = None) -> Program:
    """The program of ``program``'s gradient: ``compile(dual(dst), dual(src))``.

    The SPMD type system's duality (R and P swap; I, V and sharded dims stay) makes the
    gradient of a redistribution another redistribution, planned like any other; every
    engine (torch's autograd, JAX's ``custom_vjp``) binds this one rule. A pending max/min
    has no gradient (a SpecError: it needs the arg-max, which no type carries).

    A cross-mesh program's gradient crosses back: from ``dual(dst)`` on its destination
    mesh to ``dual(src)`` on its source mesh.
    """
    check_program(program)
    check_differentiable(program.src, program.dst)
    if program.crosses_meshes:
        return compile(dual_type(program.dst), dual_type(program.src), program.dst_mesh, cost_model=cost_model,
                       dst_mesh=program.mesh)
    return compile(dual_type(program.dst), dual_type(program.src), program.mesh, cost_model=cost_model)


@cached(maxsize=1024, max_bytes=32 * MIB)
def _compile_cross(src: TensorType, dst: TensorType, mesh: Mesh, dst_mesh: Mesh, model: CostModel,
                   budget_s: float, gap_bytes: int) -> Program:
    """Pending sums finished on the source mesh by an ordinary program, then the crossing."""
    if not src.partial_axes:
        return cross_program(src, dst, mesh, dst_mesh, None, model)
    finishes = [_compile(src, mid, mesh, model, budget_s, gap_bytes) for mid in finished_types(src)]
    return cross_best(src, dst, mesh, dst_mesh, finishes, model)


@cached(maxsize=8192, max_bytes=32 * MIB)
def _compile(src: TensorType, dst: TensorType, mesh: Mesh, model: CostModel,
             budget_s: float = DEFAULT_BUDGET_S, gap_bytes: int = DEFAULT_GAP_BYTES) -> Program:
    t0 = time.perf_counter()
    op = check_partial_conversion(src, dst)
    finished = _average_finished(src, dst, mesh)
    if finished is not None:
        return _then_reinterpret(_compile(src, finished, mesh, model, budget_s, gap_bytes), dst, model)
    if src.is_uneven or dst.is_uneven:
        return _annotated(plan_uneven(src, dst, mesh, model), src, dst, mesh, model, (True, 0))
    # axes of size 1 move nothing: layouts equal up to them are one state (no 0-byte collective)
    start, goal = erase(drop_unit_axes(src, mesh)), erase(drop_unit_axes(dst, mesh))
    proof: Proof
    path, proof = _normal_form(start, goal, mesh, op, model), (True, 0)
    if path is None:
        path, proof = _search(start, goal, mesh, op, model, budget_s, gap_bytes, t0)
    return _assemble(path, src, dst, mesh, model, proof)


def _assemble(path: list[tuple[TensorType, Move]], src: TensorType, dst: TensorType, mesh: Mesh,
              model: CostModel, proof: Proof) -> Program:
    """The Program of ``path``; ``proof`` gives its ``optimal`` and ``gap_bytes``."""
    return _annotated([_price(mv_src, mv, mesh) for mv_src, mv in path], src, dst, mesh, model, proof)


def _annotated(steps: list[Step], src: TensorType, dst: TensorType, mesh: Mesh, model: CostModel,
               proof: Proof) -> Program:
    """The Program of ``steps`` from ``src`` to ``dst``, the user's R/I annotations restored."""
    steps = _restore_annotations(steps, src, dst, mesh)
    return Program(mesh, src, dst, tuple(steps), program_cost(steps, src, mesh, model), *proof)


def _average_finished(src: TensorType, dst: TensorType, mesh: Mesh) -> TensorType | None:
    """Where ``dst`` keeps an integer P(avg) of ``src`` pending over some axes and finishes
    it over others: ``dst`` with no pending reduction, to plan to first. No step may divide
    by part of the group (``kinds.base.splits_integer_average``), so the program finishes
    the average over every axis at once and then reinterprets the copies as P(avg) (equal
    copies average to the copy). None for every other pair."""
    if not splits_integer_average(src, dst, mesh):
        return None
    return dst.replace(axis_types=tuple((a, at) for a, at in dst.axis_types if at.kind != "P"))


def _then_reinterpret(program: Program, dst: TensorType, model: CostModel) -> Program:
    """``program`` (to ``dst`` without its P axes) and the free reinterpret into them."""
    mesh = program.mesh
    sig = kind_of("reinterpret").infer(program.dst, dst, mesh, None)
    steps = (*program.steps, priced_step("reinterpret", program.dst, dst, mesh, sig.axes, sig.dims))
    return Program(mesh, program.src, dst, steps, program_cost(list(steps), program.src, mesh, model),
                   program.optimal, program.gap_bytes)


def fallback_program(src: TensorType, dst: TensorType, mesh: Mesh,
                     model: CostModel = DEFAULT_COST_MODEL) -> Program:
    """The cheapest constructive route alone (what the search starts from), never searched:
    for tests and benchmarks of the fallback."""
    finished = _average_finished(src, dst, mesh)
    if finished is not None:
        return _then_reinterpret(fallback_program(src, finished, mesh, model), dst, model)
    op = check_partial_conversion(src, dst)
    start, goal = erase(drop_unit_axes(src, mesh)), erase(drop_unit_axes(dst, mesh))
    routes = fallback_routes(start, goal, mesh, op)
    best = min(routes, key=SearchContext(start, goal, mesh, model).path_key)
    return _assemble(best, src, dst, mesh, model, (False, None))


def _normal_form(start: TensorType, goal: TensorType, mesh: Mesh, op: str,
                 model: CostModel) -> list[tuple[TensorType, Move]] | None:
    """The Rink normal form, kept only when provably cheapest.

    Slices first (only of axes the goal shards); then, for Shard/Replicate moves, one
    exchange to the goal's dims plus the axes still to gather (kept minor on their dim)
    and one gather per dim; or, with a pending reduction, the one reduce_scatter (onto
    the dims the goal shards with the pending axes) or all_reduce that finishes it.
    It is returned without a search when it is free, or one collective that provably
    costs the fewest bytes: no more than the floor of every plan (``_floor``), or a direct
    exchange between two layouts that shard over every axis (each element has one holder
    and one needer). Only a free plan has fewer collectives.
    """
    if goal.partial_axes or not model.bytes_first:
        return None
    from lowering.moves import exchange_move, with_dims, with_partial

    path: list[tuple[TensorType, Move]] = []
    state = start
    dims = [list(d.axes) for d in state.dims]
    for k, d in enumerate(goal.dims):
        for a in d.axes:
            if a in replicated_axes(state, mesh):
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
    colls = sum(LAUNCHES[mv.kind] for _, mv in path)
    if colls == 0:
        return path
    if colls > 1:
        return None
    moved = int(sum((move_bytes(s, mv, mesh) for s, mv in path), np.zeros(mesh.size, dtype=np.int64)).max())
    if moved == 0:  # a collective that moves nothing: a free plan may exist, let the search see
        return None
    if not pending and not replicated_axes(start, mesh) and not replicated_axes(goal, mesh):
        # every element has one holder and one needer: any plan makes each rank send all
        # it holds but keeps and receive all it lacks, which is exactly what the one direct
        # exchange sends and receives
        return path
    if moved * start.itemsize <= _floor(start, goal, mesh):
        return path
    return None


@cached(maxsize=4096)
def _floor(start: TensorType, goal: TensorType, mesh: Mesh) -> int:
    """Bytes the busiest rank moves in any plan, at least: the lower bound (what the
    neediest rank must receive, and the transfers over the world, rounded up), or the
    per-class floor (``class_floor``) where that is higher."""
    from lowering.bounds import lower_bound_detail

    return max(int(lower_bound_detail(start, goal, mesh)["bytes"]),
               class_floor(np.zeros(mesh.size, dtype=np.int64), start, goal, mesh))


def _search(start: TensorType, goal: TensorType, mesh: Mesh, op: str, model: CostModel,
            budget_s: float, gap: int, t0: float) -> tuple[list[tuple[TensorType, Move]], Proof]:
    """The cheapest path found within the budget, and what the search proved of it: whether
    it is the cheapest, and the bytes a cheaper one could save at most (None: the budget
    ran out first).

    The constructive fallback (``lowering.fallback``) is the first incumbent, so there is
    always an answer; the search replaces it with any cheaper complete path it finds. The
    routes are priced in turn, each only until a prefix already costs more than the
    cheapest so far."""
    routes = fallback_routes(start, goal, mesh, op)
    if not routes:  # the checks accepted a pair no route reaches: a planner bug, said plainly
        raise SpecError(
            f"no program reaches {goal} from {start} on mesh {mesh}",
            hint="this pair passed the checks, so this is a planner bug: please report it",
        )
    ctx = SearchContext(start, goal, mesh, model)
    best_key, best = None, routes[0]
    for route in routes:
        key = ctx.path_key(route, best_key)
        if key is not None:
            best_key, best = key, route
    assert best_key is not None  # the first route is priced in full
    priced = len({(s, mv) for route in routes for s, mv in route if mv.kind in COLLECTIVE_KINDS})
    return _search_labels(ctx, start, op, _MAX_LABELS, best, best_key, work=work_budget(budget_s, mesh) - priced,
                          deadline=t0 + _CLOCK_FACTOR * budget_s, gap=gap)


def work_budget(budget_s: float, mesh: Mesh) -> int:
    """The moves the planner may price within ``budget_s`` on ``mesh`` (deterministic): a
    move's numpy work grows with the world, less than linearly, and is all overhead on a
    few ranks, hence the scale (64 / ranks)^0.75, at most 4."""
    return int(budget_s * _MOVES_PER_S * min(4.0, (64 / mesh.size) ** 0.75))


def _search_labels(ctx: SearchContext, start: TensorType, op: str, max_labels: int,
                   incumbent: list[tuple[TensorType, Move]], best_key: tuple, work: int,
                   deadline: float, gap: int = 0) -> tuple[list[tuple[TensorType, Move]], Proof]:
    """Best-first search from ``start`` to ``goal``; see ``_key`` for the order.

    A path's cost is a vector (bytes each rank has moved), so two paths to one state can
    each be the better start for some ending. A state is therefore expanded once per
    *label* (moved vector, time, collectives, peak, spare-axis charge) that no label
    already expanded there dominates, not just once: with an estimate that never
    overshoots, the first goal popped is then the cheapest plan in the search space, as
    long as no state needs more than ``max_labels`` labels.

    ``incumbent`` is a complete path, ``best_key`` its key (``ctx.path_key``): nothing
    whose key reaches it is pushed, and the search ends, proving it cheapest, once
    nothing cheaper is left. ``work`` bounds
    the moves priced (a deterministic cut-off: every rank stops at the same point);
    ``deadline`` (``time.perf_counter()``) is a safety net for a machine far slower than
    the calibration. Cut off, the search returns the cheapest complete path it has seen
    (the incumbent at worst) and ``(False, None)``; else the path and what it proved
    (``_proof``).

    ``gap`` (bytes-first keys only; 0 for none): once the first ``_EXACT_MOVES`` moves
    are generated, a path whose bytes floor lies within ``gap`` below the best's, and
    that needs at least as many collectives, is set aside. The test runs on a popped
    path's bound, on a priced move's, and before a move is priced at all, from the floor
    its path already has (``SearchContext.floor_before``) and the collective still due after it:
    most moves out of a state are set aside unpriced once the best plan is that close.
    A path whose floor ties the best's bytes is left to the exact rules (it may need
    less memory).
    """
    goal, mesh = ctx.goal, ctx.mesh
    if start == goal:
        return [], (True, 0)
    # a path that slices a spare axis pays its charge; where the incumbent already costs
    # less, no such path can win (the incumbent only gets cheaper): those slices are not generated
    unspread = frozenset(ctx.spare) if ctx.charge and best_key[0] < ctx.charge else frozenset()
    aside: int | None = None  # the lowest bytes floor of a path the gap alone set aside
    exact = work - _EXACT_MOVES  # the gap applies once the work left is below this

    def set_aside(floor: int, colls: int) -> bool:
        """Whether the gap sets aside a path with these floors (and notes its bytes floor)."""
        nonlocal aside
        if not gap or work >= exact or not best_key[0] - gap <= floor < best_key[0] or colls < best_key[1]:
            return False
        aside = floor if aside is None else min(aside, floor)
        return True
    best: tuple | None = None  # a pushed goal node cheaper than the incumbent
    tie = itertools.count()
    expanded: dict[TensorType, list[Label]] = {}
    first = ctx.first
    start_keys = ctx.keys(first, start)
    floor = start_keys[1][0]  # the bytes floor of every path
    # (order, bound, tie, state, label, node): a node is (state, move, parent node) or None
    frontier: list[tuple[tuple, tuple, int, TensorType, Label, tuple | None]] = [(*start_keys, next(tie), start, first, None)]
    while frontier:
        key, bound, _, state, lab, node = heapq.heappop(frontier)
        if key >= best_key:
            break  # nothing left beats the best complete path
        if bound >= best_key:
            continue  # this one cannot (the incumbent improved since it was pushed)
        if set_aside(bound[0], bound[1]):
            continue
        seen = expanded.setdefault(state, [])
        if len(seen) >= max_labels or dominated(seen, lab):
            continue
        seen.append(lab)
        if state == goal:
            return _unwind(node), _proof(bound, aside, floor)
        if work <= 0 or time.perf_counter() > deadline:
            return (incumbent if best is None else _unwind(best)), (False, None)
        # relays from states that nothing was sent to reach (the start, after local slices):
        # where a relay pays, it is the first exchange; offering it later costs compile time
        nexts = _moves(state, goal, mesh, op, unspread, lab.moved_max == 0)
        work -= len(nexts)
        for mv in nexts:
            held = expanded.get(mv.dst, ())
            if len(held) >= max_labels:
                continue
            if gap and work < exact and ctx.future(mv.dst) > 0:  # a collective is still due after it
                before = ctx.floor_before(lab, mv)
                if before > best_key[0] or set_aside(before, lab.colls + LAUNCHES[mv.kind] + 1):
                    continue  # (above the best, the exact bound would drop it too)
            lab2 = ctx.extend(lab, state, mv, best_key)
            if lab2 is None or dominated(held, lab2):
                continue
            keys = ctx.keys(lab2, mv.dst, best_key)
            if keys is None:
                continue
            key2, bound2 = keys
            if mv.dst != goal and set_aside(bound2[0], bound2[1]):
                continue
            node2 = (state, mv, node)
            if mv.dst == goal:
                best_key, best = bound2, node2
            heapq.heappush(frontier, (key2, bound2, next(tie), mv.dst, lab2, node2))
    return (incumbent if best is None else _unwind(best)), _proof(best_key, aside, floor)


Proof = tuple[bool, "int | None"]  # (proven cheapest, bytes a cheaper program could save at most)


def _proof(key: tuple, aside: int | None, floor: int) -> Proof:
    """What a finished search proved of the path of ``key``: cheapest where the gap set
    nothing aside; else that a path set aside saves at most its key's bytes less the
    lowest floor set aside, or ``floor`` (the start's, of every path) where that is higher
    (0: none sends fewer bytes, though one with as many collectives may need less memory)."""
    if aside is None:
        return True, 0
    return False, max(0, key[0] - max(aside, floor))


def _unwind(node: tuple | None) -> list[tuple[TensorType, Move]]:
    path = []
    while node is not None:
        state, mv, node = node
        path.append((state, mv))
    return path[::-1]


@cached(maxsize=2048)  # values hold new states (types): a few searches' worth
def _moves(state: TensorType, goal: TensorType, mesh: Mesh, op: str,
           unspread: frozenset[str] = frozenset(), relays: bool = True) -> tuple[Move, ...]:
    # the same move can come from two generators (a suffix all_to_all that is also the
    # direct exchange): price it once, first place kept
    return tuple(dict.fromkeys(moves(state, goal, mesh, op, unspread, relays)))


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
        # R <-> I only (no data moves, but the backward differs); on an axis of size 1 the
        # two are the same (and a P over it), so layouts equal up to those need no step
        changed = tuple(a for a in mesh.names if src.axis_type(a) != dst.axis_type(a) and mesh.axis_size(a) > 1)
        if changed:
            return [priced_step("reinterpret", src, dst, mesh, changed, ())]
        return []
    out = []
    for i, s in enumerate(steps):
        a = src if i == 0 else _annotate(s.src, src, dst, mesh)
        b = dst if i == len(steps) - 1 else _annotate(s.dst, src, dst, mesh)
        out.append(dataclasses.replace(s, src=a, dst=b))
    return out


def dual_steps(step: Step, mesh: Mesh) -> tuple[Step, ...]:
    """The gradient steps of ``step``, from dual(dst) to dual(src): one step of the kind its
    kind names (``lowering.kinds.dual_kind``) where that kind's rule takes the pair, else the
    planner's program between them."""
    src, dst = dual_type(step.dst), dual_type(step.src)
    kind = dual_kind(step)
    if kind is not None:
        try:
            return (make_step(kind, src, dst, mesh, axes=step.axes),)
        except SpecError:
            pass
    return compile(src, dst, mesh).steps

