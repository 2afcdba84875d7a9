"""The moves the planner searches over: each one is a typed step ``state -> state``.

States are *erased* TensorTypes: R and I look the same here (they differ only in
their gradient), so a state keeps just its dims, its P axes and its V axes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import NamedTuple

from lowering.bounds import bound_bytes
from lowering.caching import cached
from lowering.kinds.base import erase, kind_of, replicated_axes, splits_integer_average
from lowering.kinds.exchange import involved_axes
from lowering.kinds.relay import MAX_PARTS, relay_parts
from lowering.kinds.uneven_exchange import group_axes, is_gather
from spec_lang.ir import AxisType, Dim, Mesh, TensorType

# the largest world on which the search offers relays (their routes are chosen per group
# pattern by a loop over the group's parts)
_RELAY_WORLD = 256

__all__ = ["Move", "balanced_exchange_move", "erase", "exchange_move", "involved_axes", "moves", "relay_moves",
           "with_dims", "with_partial"]


class Move(NamedTuple):
    """A candidate step before it is priced: kind, group axes, dims and the next state (a
    named tuple: the search builds and hashes thousands)."""

    kind: str
    axes: tuple[str, ...]
    dims: tuple[int, ...]
    dst: TensorType


def with_dims(t: TensorType, axes_per_dim: list[tuple[str, ...]]) -> TensorType:
    """``t`` with new dim axes; an axis put on a dim loses its local type (a type lists
    each axis once), so a move that would drop a pending P is caught by its P check.
    The search's states are even: a dim that changes is built without a split."""
    on_dims = set().union(*axes_per_dim)
    # a dim that keeps its axes keeps its object (cheaper to build, hash and compare)
    dims = tuple([d if d.axes == ax and d.split is None else _dim(d.size, ax) for d, ax in zip(t.dims, axes_per_dim)])
    types = tuple([(a, at) for a, at in t.axis_types if a not in on_dims]) if t.axis_types else ()
    if len(on_dims) != sum(map(len, axes_per_dim)):
        return t.replace(dims=dims, axis_types=types)  # the constructor says what is wrong
    return t.derive(dims, types)  # no axis twice: valid, as ``t`` is


@cached(maxsize=4096)
def _dim(size: int, axes: tuple[str, ...]) -> Dim:
    """One shared Dim per (size, axes): the search builds the same dims over and over."""
    return Dim(size, axes)


@cached(maxsize=16)
def _partial(op: str) -> AxisType:
    return AxisType("P", op)


def with_partial(t: TensorType, axes: set[str], op: str, mesh: Mesh) -> TensorType:
    keep = [(a, at) for a, at in t.axis_types if at.kind != "P"]
    p = _partial(op)
    keep += [(a, p) for a in mesh.names if a in axes]
    if any(a in axes for a in t.sharded_axes) or any(a in axes and at.kind != "P" for a, at in t.axis_types):
        return t.replace(axis_types=tuple(keep))  # the constructor says what is wrong
    return t.derive(t.dims, tuple(keep))  # one op, each axis once: valid, as ``t`` is


def exchange_move(a: TensorType, b: TensorType, mesh: Mesh) -> Move | None:
    """An exact box exchange from a to b, if one is valid (group blocks disjoint in a)."""
    if a == b or set(a.partial_axes) != set(b.partial_axes):
        return None
    group = involved_axes(a, b, mesh)
    if not group or not set(group) <= set(a.sharded_axes):
        return None
    dims = tuple(i for i, (da, db) in enumerate(zip(a.dims, b.dims)) if da.axes != db.axes)
    return Move("all_to_all", group, dims, b)


def balanced_exchange_move(a: TensorType, b: TensorType, mesh: Mesh) -> Move | None:
    """An exact exchange from a to b over the axes whose role changes, some of which
    replicate a (so ``exchange_move`` has none): ``all_to_allv``, whose replicas split the
    sending (balanced sources). None where a has a pending sum or the step is a gather."""
    if a == b or a.partial_axes or b.partial_axes:
        return None
    group = group_axes(a, b, mesh)
    if not group or set(group) <= set(a.sharded_axes) or is_gather(a, b, group):
        return None
    dims = tuple(i for i, (da, db) in enumerate(zip(a.dims, b.dims)) if da.axes != db.axes)
    return Move("all_to_allv", group, dims, b)


def relay_moves(a: TensorType, b: TensorType, mesh: Mesh, direct: Move,
                unspread: frozenset[str] = frozenset()) -> Iterator[Move]:
    """Two-phase relays from a to b (``lowering.kinds.relay``), where the one-phase exchange
    ``direct`` keeps its holders busier than its receivers (few hold what many need): over
    the exchange's axes, and over those plus the axes both ends replicate (spare axes,
    whose replicas can share the sending and relaying; but not ``unspread``, as ``moves``)."""
    if a.partial_axes or b.partial_axes or a.is_uneven or b.is_uneven or mesh.size > _RELAY_WORLD:
        return
    spec = kind_of(direct.kind)
    most = int(spec.moved(a, b, mesh, direct.axes).max(initial=0))
    if most <= int(spec.received(a, b, mesh, direct.axes).max(initial=0)):
        return  # the busiest rank is a receiver: no route receives less
    if most * a.itemsize <= bound_bytes(a, b, mesh):
        return  # the exchange is at the bound already
    spare = set(replicated_axes(a, mesh)) & set(replicated_axes(b, mesh))
    group = group_axes(a, b, mesh)
    wider = tuple(x for x in mesh.names if x in group or (x in spare and x not in unspread and mesh.axis_size(x) > 1))
    for axes in dict.fromkeys((group, wider)):
        if mesh.group_size(axes) > 2 and relay_parts(a, b, mesh, axes) <= MAX_PARTS:
            yield Move("relay", axes, direct.dims, b)


def moves(t: TensorType, goal: TensorType, mesh: Mesh, op: str, unspread: frozenset[str] = frozenset(),
          relays: bool = True) -> Iterator[Move]:
    """Every move the search considers from state ``t`` towards ``goal`` (both erased);
    ``unspread``: axes not to slice onto a dim the goal does not shard with them (the
    planner's spare axes, where no plan that pays their charge can win); ``relays``:
    whether to offer two-phase relays (the search offers them where nothing was sent yet)."""
    dims = [d.axes for d in t.dims]
    goal_dim = {a: i for i, d in enumerate(goal.dims) for a in d.axes}
    goal_p = set(goal.partial_axes)
    cur_p = set(t.partial_axes)
    pending = [a for a in mesh.names if a in cur_p and a not in goal_p]
    repl = replicated_axes(t, mesh)
    repl_goal = set(replicated_axes(goal, mesh))
    goal_op = goal.partial_op or op
    # the goal's new P(sum) axes: each of their ranks may hold a part of the values and zeros
    # elsewhere, which splits what must still arrive (where anything must: dims to change)
    moving = pending or any(d.axes != g.axes for d, g in zip(t.dims, goal.dims))
    new_sum = goal_p - cur_p if goal_op == "sum" and moving else set()

    # local slices: shard a replicated axis onto the dim the goal wants it on, or onto any
    # dim while a reduction is pending (to split the reduction's work) or where the goal
    # has a new P(sum) over it (to split what must arrive, zero_pad at the end)
    for a in repl:
        spread = (a in repl_goal or a in new_sum) and mesh.axis_size(a) > 1 and a not in unspread
        onto = [goal_dim[a]] if a in goal_dim else (range(t.ndim) if spread else [])
        for k in onto:
            nd = list(dims)
            nd[k] = nd[k] + (a,)
            yield Move("slice", (a,), (k,), with_dims(t, nd))

    # all_gather a minor suffix of one dim (several axes: one flattened collective)
    for k, ax in enumerate(dims):
        for n in range(1, len(ax) + 1):
            nd = list(dims)
            nd[k] = ax[:-n]
            yield Move("all_gather", ax[-n:], (k,), with_dims(t, nd))

    # all_gather minor suffixes of several dims at once: one flattened collective whose
    # members' blocks tile the gathered block (the bytes of gathering the dims one by
    # one when the blocks are even, in one collective instead of several)
    if sum(1 for ax in dims if ax) > 1:
        for cut in itertools.product(*(range(len(ax) + 1) for ax in dims)):
            if sum(1 for n in cut if n) < 2:
                continue
            group = tuple(a for ax, n in zip(dims, cut) if n for a in ax[len(ax) - n:])
            nd = [ax[: len(ax) - n] for ax, n in zip(dims, cut)]
            yield Move("all_gather", group, tuple(k for k, n in enumerate(cut) if n), with_dims(t, nd))

    # all_to_all a minor suffix of dim i onto the minor end of dim j
    for i, ax in enumerate(dims):
        for n in range(1, len(ax) + 1):
            for j in range(t.ndim):
                if j == i:
                    continue
                nd = list(dims)
                nd[i] = ax[:-n]
                nd[j] = nd[j] + ax[-n:]
                m = exchange_move(t, with_dims(t, nd), mesh)
                if m is not None:
                    yield m

    # direct exchanges: to the goal's dims, and to the normal form (the goal's dims
    # plus the axes still to be gathered, kept minor on their current dim or moved)
    goal_dims = [d.axes for d in goal.dims]
    extra = [a for a in t.sharded_axes if a not in goal_dim]
    targets = [goal_dims]
    if extra:
        nf = [tuple(g) + tuple(a for a in dims[k] if a in extra) for k, g in enumerate(goal_dims)]
        targets.append(nf)
        for k in range(t.ndim):
            alt = [tuple(g) for g in goal_dims]
            alt[k] = alt[k] + tuple(extra)
            targets.append(alt)
    for nd in targets:
        target = with_dims(t, list(nd))
        m = exchange_move(t, target, mesh) or balanced_exchange_move(t, target, mesh)
        if m is not None:
            yield m
            if relays and nd is goal_dims:  # relays straight to the goal's dims (each prices a greedy)
                yield from relay_moves(t, target, mesh, m, unspread)

    # reductions of the pending partial axes (an integer average only over all of them at once)
    if pending:
        yield from (mv for mv in _reductions(t, goal, mesh, op, dims, pending, cur_p)
                    if not splits_integer_average(t, mv.dst, mesh))

    # converts into the goal's new partial axes (free, local)
    # mesh order, not set order: every rank must compile the same program, and set
    # iteration order of strings changes with each process's hash seed
    new_p = [x for x in mesh.names if x in goal_p and x not in cur_p]
    kind = "zero_fill" if goal_op == "sum" else "reinterpret"
    fillable = tuple(a for a in new_p if a in repl)
    if len(fillable) > 1:  # one local step for all of them (tried first: ties keep it)
        yield Move(kind, fillable, (), with_partial(t, cur_p | set(fillable), goal_op, mesh))
    for a in new_p:
        if a in repl:
            yield Move(kind, (a,), (), with_partial(t, cur_p | {a}, goal_op, mesh))
        elif goal_op == "sum":
            for k, ax in enumerate(dims):
                if ax and ax[-1] == a:
                    nd = list(dims)
                    nd[k] = ax[:-1]
                    yield Move("zero_pad", (a,), (k,), with_partial(with_dims(t, nd), cur_p | {a}, goal_op, mesh))


def _reductions(t: TensorType, goal: TensorType, mesh: Mesh, op: str, dims: list[tuple[str, ...]],
                pending: list[str], cur_p: set[str]) -> Iterator[Move]:
    """The reduce_scatters and all_reduces of the pending axes: all of them flattened, one at
    a time, and those the goal shards each dim with (onto that dim or onto several)."""
    groups: list[tuple[str, ...]] = [tuple(pending)] + [(a,) for a in pending] if len(pending) > 1 else [
        tuple(pending)
    ]
    for k in range(t.ndim):
        want = tuple(a for a in goal.dims[k].axes if a in pending)
        for x in ([want] if want else []) + groups:
            nd = list(dims)
            nd[k] = nd[k] + x
            yield Move("reduce_scatter", x, (k,), with_partial(with_dims(t, nd), cur_p - set(x), op, mesh))
    # one reduce_scatter onto several dims, as the goal shards them (a flattened group
    # whose members' pieces tile the block: the bytes of one dim after another)
    wants = [(k, tuple(a for a in goal.dims[k].axes if a in pending)) for k in range(t.ndim)]
    wants = [(k, w) for k, w in wants if w]
    if len(wants) > 1:
        nd = list(dims)
        for k, w in wants:
            nd[k] = nd[k] + w
        x = tuple(a for _, w in wants for a in w)
        yield Move("reduce_scatter", x, tuple(k for k, _ in wants),
                   with_partial(with_dims(t, nd), cur_p - set(x), op, mesh))
    for x in groups:
        yield Move("all_reduce", x, (), with_partial(t, cur_p - set(x), op, mesh))
