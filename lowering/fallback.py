"""Constructive routes ``start -> goal`` that exist for every pair the checks accept.

The search may run out of its budget; these routes are its first incumbent, so the
planner always answers. Each route goes through the normal form, one phase at a time:

1. slice every axis the goal shards and the state replicates onto its goal dim (free,
   and it shrinks what the reduction and the exchange carry);
2. finish the pending reduction: one ``reduce_scatter`` onto the dims the goal shards
   with the pending axes, then one ``all_reduce`` of the rest; or the rest onto the
   longest dim in the same ``reduce_scatter`` (gathered back later); or all of them
   onto one dim (each dim in turn); or one ``all_reduce`` of them all, as in::

       +[A0, A1]      [A0+B0]                 +A
       +[B0, B1]  =>  [A1+B1]   (then)        +B  =>  A + B
   2'. slice the axes the reduction freed that the goal shards;
3. rearrange to the goal's dims without its new partial axes: one exact exchange to the
   normal form (the goal's dims plus the axes still to be gathered, kept minor) and one
   gather of those; or one gather of the minor axes the goal does not shard and one
   exchange to the goal; or one exchange straight to the goal (the fewest collectives);
   or gather every axis past each dim's common prefix with the goal and slice the goal's
   axes back (valid for every pair, at a price), after phase 1 or, with nothing to reduce,
   instead of it (a gather of the unsliced blocks sends less where the slices would
   scatter what must be gathered);
4. convert into the goal's new partial axes (``zero_fill`` for sum, a ``reinterpret``
   otherwise; local), or, for a new P(sum) axis, keep it sharded (minor on its dim, where
   the source shards it) or slice it onto the longest dim (where the source replicates it),
   so that each of its ranks receives a part of the block, and ``zero_pad`` it at the end.

Every state is erased (R and I look alike), as in ``lowering.moves``. The planner prices
the routes with its own pricing and keeps the cheapest.
"""

from __future__ import annotations

from collections.abc import Callable

from lowering.kinds.base import replicated_axes, splits_integer_average
from lowering.moves import Move, balanced_exchange_move, exchange_move, with_dims, with_partial
from spec_lang.ir import Mesh, TensorType

Path = list[tuple[TensorType, Move]]
# a route's builder: takes the move (kind, axes, dims, next state), returns the next state
Go = Callable[[str, tuple[str, ...], tuple[int, ...], TensorType], TensorType]


def fallback_routes(start: TensorType, goal: TensorType, mesh: Mesh, op: str) -> list[Path]:
    """Up to 60 routes (up to six ways to reduce, five to rearrange, zero_pad or not),
    each ending exactly at ``goal``; the gather-then-slice ones always exist, except for an
    integer average that the goal keeps pending over some of its axes and finishes over
    others (no route is exact: the planner plans to the goal without P first)."""
    out = []
    # a new P(sum) axis can shard the block (where the source shards it, or sliced onto the
    # longest dim where it replicates it) and be zero-padded at the end
    pads = (False, True) if (goal.partial_op or op) == "sum" and any(
        a not in start.partial_axes for a in goal.partial_axes) else (False,)
    for pad in pads:
        for scatter in ("goal", "all", None, *range(start.ndim)):
            for path in _routes(start, goal, mesh, op, scatter=scatter,
                                exchanges=("first", "last", "direct", None, "unsliced"), pad=pad):
                if path is not None and path not in out:
                    out.append(path)
            if not any(a in start.partial_axes and a not in goal.partial_axes for a in mesh.names):
                break  # nothing to reduce: the two reduction variants are the same route
    # an integer average is finished in one step: the routes that split it are no programs
    return [p for p in out if not any(splits_integer_average(s, mv.dst, mesh) for s, mv in p)]


def _routes(start: TensorType, goal: TensorType, mesh: Mesh, op: str, *, scatter: str | int | None,
            exchanges: tuple[str | None, ...], pad: bool = False) -> list[Path | None]:
    """One route per way to rearrange in ``exchanges`` (None where it fails), all through
    the same slices and reduction (built once)."""
    path: Path = []

    def go(kind: str, axes: tuple[str, ...], dims: tuple[int, ...], nxt: TensorType) -> TensorType:
        path.append((path[-1][1].dst if path else start, Move(kind, axes, dims, nxt)))
        return nxt

    goal_p = set(goal.partial_axes)
    pending = [a for a in mesh.names if a in start.partial_axes and a not in goal_p]
    new_p = tuple(a for a in mesh.names if a in goal_p and a not in start.partial_axes)
    # the goal with its new partial axes replicated: they are converted last, from R; with
    # ``pad``, those the source shards stay minor on their dim, to be zero-padded
    target = with_partial(goal, goal_p - set(new_p), goal.partial_op or op, mesh)
    padded = [a for a in start.sharded_axes if a in new_p] if pad else []
    # (only where data must move: a free convert needs no split)
    moving = pending or any(d.axes != g.axes for d, g in zip(start.dims, goal.dims))
    spread = [a for a in new_p if a in replicated_axes(start, mesh)] if pad and moving and start.ndim else []
    if padded or spread:
        widest = max(range(start.ndim), key=lambda k: start.dims[k].size) if start.ndim else -1
        target = with_dims(target, [g.axes + tuple(a for a in d.axes if a in padded) + (tuple(spread) if k == widest else ())
                                    for k, (g, d) in enumerate(zip(target.dims, start.dims))])
        padded += spread

    state = _slice_goal_axes(start, target, mesh, go)
    if pending:
        left = list(pending)
        if isinstance(scatter, int):  # all of them onto one dim, where the pieces may be even
            dims = [d.axes for d in state.dims]
            dims[scatter] = dims[scatter] + tuple(left)
            state = go("reduce_scatter", tuple(left), (scatter,),
                       with_partial(with_dims(state, dims), set(state.partial_axes) - set(left), op, mesh))
            left = []
        elif scatter is not None:
            dims = [d.axes for d in state.dims]
            on = []
            for k, g in enumerate(target.dims):
                want = tuple(a for a in g.axes if a in left)
                if want:
                    dims[k] = dims[k] + want
                    on.append((k, want))
            if scatter == "all" and left and not all(a in (x for _, w in on for x in w) for a in left):
                # the rest onto the longest dim too: a smaller block to rearrange, and the
                # gather back joins the last gather
                rest = tuple(a for a in left if not any(a in w for _, w in on))
                longest = max(range(state.ndim), key=lambda i: state.dims[i].size) if state.ndim else None
                if longest is not None:
                    dims[longest] = dims[longest] + rest
                    on = [(i, w + rest) if i == longest else (i, w) for i, w in on]
                    if all(i != longest for i, _ in on):
                        on = sorted(on + [(longest, rest)])
            if on:
                axes = tuple(a for _, w in on for a in w)
                left = [a for a in left if a not in axes]
                unreduced = set(state.partial_axes) - set(axes)
                state = go("reduce_scatter", axes, tuple(k for k, _ in on),
                           with_partial(with_dims(state, dims), unreduced, op, mesh))
        if left:
            state = go("all_reduce", tuple(left), (), with_partial(state, set(state.partial_axes) - set(left), op, mesh))
        state = _slice_goal_axes(state, target, mesh, go)
    prefix, reduced = list(path), state
    goal_op = goal.partial_op or op
    out: list[Path | None] = []
    for exchange in exchanges:
        path[:] = prefix
        if exchange == "unsliced":  # nothing to reduce: gather before slicing (smaller sends)
            if pending or not prefix:
                out.append(None)
                continue
            path[:] = []
            rearranged = _rearrange(start, target, mesh, go, None)
        else:
            rearranged = _rearrange(reduced, target, mesh, go, exchange)
        if rearranged is None:
            out.append(None)
            continue
        state = rearranged
        for k, d in enumerate(target.dims):
            for a in reversed(d.axes):  # minor first: zero_pad takes the minor axis of a dim
                if a not in padded:
                    break
                dims = [x.axes for x in state.dims]
                dims[k] = dims[k][:-1]
                state = go("zero_pad", (a,), (k,), with_partial(with_dims(state, dims), set(state.partial_axes) | {a},
                                                               goal_op, mesh))
        converts = tuple(a for a in new_p if a not in state.partial_axes)
        if converts:
            kind = "zero_fill" if goal_op == "sum" else "reinterpret"
            state = go(kind, converts, (), with_partial(state, set(state.partial_axes) | set(converts), goal_op, mesh))
        out.append(list(path) if state == goal else None)
    return out


def _slice_goal_axes(state: TensorType, target: TensorType, mesh: Mesh, go: Go) -> TensorType:
    """Slice, one axis at a time in the goal's order, every axis ``target`` shards and
    ``state`` replicates (appended minor on the goal's dim)."""
    free = set(replicated_axes(state, mesh))
    for k, g in enumerate(target.dims):
        for a in g.axes:
            if a in free:
                dims = [d.axes for d in state.dims]
                dims[k] = dims[k] + (a,)
                state = go("slice", (a,), (k,), with_dims(state, dims))
    return state


def _rearrange(state: TensorType, target: TensorType, mesh: Mesh, go: Go, exchange: str | None) -> TensorType | None:
    """Shard/Replicate moves ``state -> target`` (same partial axes, every axis ``target``
    shards already sharded in ``state``): an exchange to the normal form, then gathers
    (``exchange="first"``); gathers of the minor axes ``target`` does not shard, then an
    exchange to ``target`` (``"last"``: cheaper where those axes cut small blocks); one
    exchange straight to ``target``, gathering on the way (``"direct"``: the fewest
    collectives, where the state's blocks tile the target's); or gathers past each dim's
    common prefix, then slices (None: always valid)."""
    if state == target:
        return state
    if exchange == "direct":
        mv = exchange_move(state, target, mesh) or balanced_exchange_move(state, target, mesh)
        return None if mv is None else go(mv.kind, mv.axes, mv.dims, mv.dst)
    cur = [d.axes for d in state.dims]
    want = [d.axes for d in target.dims]
    if exchange == "last":
        wanted = set(target.sharded_axes)
        cut = []
        for c in cur:
            n = 0
            while n < len(c) and c[len(c) - 1 - n] not in wanted:
                n += 1
            cut.append(n)
        if any(cut):
            group = tuple(a for c, n in zip(cur, cut) if n for a in c[len(c) - n:])
            state = go("all_gather", group, tuple(k for k, n in enumerate(cut) if n),
                       with_dims(state, [c[: len(c) - n] for c, n in zip(cur, cut)]))
        if state != target:
            mv = exchange_move(state, target, mesh)
            if mv is None:
                return None
            state = go(mv.kind, mv.axes, mv.dims, mv.dst)
        return state
    if exchange == "first":
        wanted = set(target.sharded_axes)
        nf = [w + tuple(a for a in c if a not in wanted) for c, w in zip(cur, want)]
        if nf != cur:
            mv = exchange_move(state, with_dims(state, nf), mesh)
            if mv is None:
                return None
            state = go(mv.kind, mv.axes, mv.dims, mv.dst)
        keep = [len(w) for w in want]
    else:
        keep = []
        for c, w in zip(cur, want):
            p = 0
            while p < min(len(c), len(w)) and c[p] == w[p]:
                p += 1
            keep.append(p)
    cur = [d.axes for d in state.dims]
    cut = [len(c) - n for c, n in zip(cur, keep)]
    if any(cut):
        group = tuple(a for c, n in zip(cur, cut) if n for a in c[len(c) - n:])
        state = go("all_gather", group, tuple(k for k, n in enumerate(cut) if n),
                   with_dims(state, [c[: len(c) - n] for c, n in zip(cur, cut)]))
    return _slice_goal_axes(state, target, mesh, go)
