"""The collective steps: pack -> one collective on flat contiguous buffers -> unpack.

Each runner takes the step, every played rank's pieces (``lowering.kinds``) and the
current block, and returns the next block (a LocalTensor under LocalTensorMode). See
``torch_backend.executor`` for what each kind puts on the wire.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate
from typing import Any

import torch

from lowering.kinds.base import Piece, PiecesT, RankPieces, flat_offset, numel
from lowering.kinds.exchange import ExchangePieces
from lowering.kinds.gather import GatherPieces
from lowering.kinds.reduce import ScatterPieces
from lowering.kinds.uneven_exchange import ExchangeVPieces
from lowering.program import Step
from torch_backend import comm
from torch_backend.comm import finish_avg, rank_map, tied
from torch_backend.groups import GroupHandle, MeshContext
from torch_backend.runners import Failed, FastRunner, Pieces, fast, pieces_as, runs
from torch_backend.scratch import buffer
from torch_backend.strided import contiguous, flat, nothing_of, run_copies

Launched = tuple[Any, Callable[[], torch.Tensor]]  # (the work to wait for, what finishes the step)


def first_plan(plans: Mapping[int, PiecesT]) -> PiecesT:
    return next(iter(plans.values()))


def step_group(ctx: MeshContext, step: Step) -> GroupHandle:
    return ctx.group(step.axes, ctx.ranks[0])


def _place(ctx: MeshContext, plan: GatherPieces, parts: list[tuple[Piece, torch.Tensor]]) -> torch.Tensor:
    """A new output block assembled from (piece, tensor of piece.shape) pairs."""
    y = parts[0][1].new_empty(plan.out_shape)
    for piece, t in parts:
        if piece.numel:
            y[piece.dst].copy_(t.view(piece.shape))
    if any(piece.numel for piece, _ in parts):
        return y
    return tied(ctx, y, *(t for _, t in parts))


def _straight(step: Step, p: RankPieces) -> bool:
    """Whether ``step``'s collective writes its output block itself: an even all_gather or
    reduce_scatter whose blocks lie back to back, an all_reduce (on a contiguous copy)."""
    return ((isinstance(p, GatherPieces) and p.even and p.direct) or (isinstance(p, ScatterPieces) and p.direct)
            or step.kind == "all_reduce")


def _issue(ctx: MeshContext, step: Step, p: RankPieces) -> Callable[[torch.Tensor, bool], Launched]:
    """A ``_straight`` step on one rank's block as ``issue(x, launch_only) -> (work, finish)``."""
    g, op, n = ctx.group(step.axes, ctx.ranks[0]), step.op or "sum", p.n
    if isinstance(p, (GatherPieces, ScatterPieces)):
        gather, shape = isinstance(p, GatherPieces), p.out_shape
        big, small = (shape, p.in_shape) if gather else (p.in_shape, shape)
        # the whole block is n of the other along dim 0: c10d takes the tensors as they are
        # (its concatenated form, the same bytes as the flat one), and no view is made per call
        stacked = len(big) == len(small) >= 1 and big[0] == n * small[0] and big[1:] == small[1:]

        def issue(x: torch.Tensor, launch_only: bool) -> Launched:
            y = x.new_empty(shape)
            out, inp = (y, contiguous(x)) if stacked else (y.view(-1), flat(x))
            if gather:
                return comm.all_gather(ctx, out, inp, g, launch_only), lambda: y
            return comm.reduce_scatter(ctx, out, inp, op, g, launch_only), lambda: finish_avg(y, op, n)

        return issue

    def reduce(x: torch.Tensor, launch_only: bool) -> Launched:
        buf = x.clone(memory_format=torch.contiguous_format)
        return comm.all_reduce(ctx, buf, op, g, launch_only), lambda: finish_avg(buf, op, n)

    return reduce


@fast("all_gather", "reduce_scatter", "all_reduce")
def straight_fast(ctx: MeshContext, step: Step, p: RankPieces, failed: Failed) -> FastRunner | None:
    """A ``_straight`` step as one function (a failure raised named, as by the runner path)."""
    if not _straight(step, p):
        return None
    issue = _issue(ctx, step, p)

    def collective(x: torch.Tensor) -> torch.Tensor:
        try:
            _, finish = issue(x, False)
        except RuntimeError as e:
            failed(e)
        return finish()

    return collective


def launchable(ctx: MeshContext, step: Step, plans: Pieces) -> bool:
    """Whether ``launch`` leaves ``step``'s collective on the wire (see there)."""
    p0 = first_plan(plans)
    return comm.launches(ctx) and p0.n > 1 and step.bytes_sent_max > 0 and _straight(step, p0)


def launch(ctx: MeshContext, step: Step, plans: Pieces, x: torch.Tensor) -> Launched | None:
    """Start ``step``'s collective and return its work and finish, where the result lands
    straight in its output (``_straight``) on a real group; None where the step must run
    synchronously."""
    if not launchable(ctx, step, plans):
        return None
    return _issue(ctx, step, first_plan(plans))(x, True)


@runs("all_gather")
def all_gather(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    """Concat the group's blocks (each placed by its box, so any dim and group order)::

        [A]
        [B]  =>  [A, B, C]
        [C]

    Equal blocks: one ``all_gather_single``. Uneven: the exact ring (where the implementation
    has point-to-point) or an exact all_to_all.
    """
    plans = pieces_as(GatherPieces, pieces)
    p0, g = first_plan(plans), step_group(ctx, step)
    if p0.n == 1:  # a group of one: a local copy
        return rank_map(ctx, lambda r, t: _place(ctx, plans[r], [(plans[r].recv[0], t)]), x)
    # under LocalTensorMode one call serves every group, and some may be even while
    # others are not: take the exact path unless all of them are even
    if not all(p.even for p in plans.values()):
        return _gather_ring(ctx, g, p0, x) if comm.has_p2p(ctx) else _gather_a2a(ctx, g, plans, x)
    if p0.direct and len(plans) == 1:  # one played rank: its block straight into the output
        return _issue(ctx, step, p0)(x, False)[1]()
    send = rank_map(ctx, lambda r, t: flat(t), x)
    # chunk sizes are per rank: under LocalTensorMode, groups may hold blocks of different sizes
    out = rank_map(ctx, lambda r, t: buffer(plans[r], "gathered", plans[r].n * plans[r].chunk, t), x)
    comm.all_gather(ctx, out, send, g)

    def place(r: int, o: torch.Tensor) -> torch.Tensor:
        y = run_copies(plans[r].place_copies, o, o.new_empty(plans[r].out_shape))
        return y if plans[r].place_copies else tied(ctx, y, o)  # an empty block

    return rank_map(ctx, place, out)


def ring_gather(ctx: MeshContext, g: GroupHandle, buf: torch.Tensor, sizes: Sequence[int], i: int,
                members: Sequence[int]) -> None:
    """Fill ``buf``, every member's segment back to back (``sizes``, in ``members``' order;
    this rank's, at position ``i``, in place already), in n-1 rounds of p2p around the group.

    Round k: position i sends segment (i-k) to its successor and receives segment (i-k-1)
    from its predecessor, so it sends every segment but its successor's, exactly once (the
    cost model's ``total - b(succ)``). Empty segments are skipped on both sides.
    """
    n, offs = len(members), [0, *accumulate(sizes)]
    succ, pred = members[(i + 1) % n], members[(i - 1) % n]
    for k in range(n - 1):
        s, r = (i - k) % n, (i - k - 1) % n
        comm.p2p(ctx, [(buf[offs[s]:offs[s + 1]], succ)] if sizes[s] else [],
                 [(buf[offs[r]:offs[r + 1]], pred)] if sizes[r] else [], g)


def _gather_ring(ctx: MeshContext, g: GroupHandle, plan: GatherPieces, x: torch.Tensor) -> torch.Tensor:
    """Uneven all_gather as a ring around the step's group order (``ring_gather``)."""
    sizes = [p.numel for p in plan.ring]
    i = plan.listed.index(plan.rank)
    y = x.new_empty(plan.out_shape)
    buf = y.view(-1) if plan.direct else buffer(plan, "ring", sum(sizes), x)
    if sizes[i]:
        at = sum(sizes[:i])
        buf[at:at + sizes[i]].view(plan.ring[i].shape).copy_(x)
    ring_gather(ctx, g, buf, sizes, i, plan.listed)
    return y if plan.direct else run_copies(plan.ring_copies, buf, y)


def gather_a2a(ctx: MeshContext, g: GroupHandle, own: torch.Tensor, sizes: Mapping[int, Sequence[int]],
               at: Mapping[int, int]) -> torch.Tensor:
    """Each played rank's segment ``own`` to every peer in one exact all_to_all (split 0
    to itself; ``sizes[r]``: the segments of rank r's group, ``at[r]``: r's position): the
    other members' segments back to back (LocalTensorMode and torch.compile: no p2p)."""
    send_splits = {r: [0 if j == at[r] else s[at[r]] for j in range(len(s))] for r, s in sizes.items()}
    recv_splits = {r: [0 if j == at[r] else n for j, n in enumerate(s)] for r, s in sizes.items()}
    send = rank_map(ctx, lambda r, o: flat(o).repeat(len(sizes[r]) - 1), own)
    return comm.all_to_all(ctx, send, send_splits, recv_splits, g)


def _gather_a2a(ctx: MeshContext, g: GroupHandle, plans: Mapping[int, GatherPieces],
                x: torch.Tensor) -> torch.Tensor:
    """Uneven all_gather as an exact all_to_all (``gather_a2a``)."""
    at = {r: next(i for i, pc in enumerate(p.recv) if pc.peer == r) for r, p in plans.items()}
    got = gather_a2a(ctx, g, x, {r: [pc.numel for pc in p.recv] for r, p in plans.items()}, at)

    def unpack(r: int, t: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        parts: list[tuple[Piece, torch.Tensor]] = []
        off = 0
        for pc in plans[r].recv:
            if pc.peer == r:
                parts.append((pc, t))
            else:
                parts.append((pc, o[off:off + pc.numel]))
                off += pc.numel
        return _place(ctx, plans[r], parts)

    return rank_map(ctx, unpack, x, got)


@runs("reduce_scatter")
def reduce_scatter(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    """Reduce the group's equal blocks; keep this rank's piece (its dst box)::

        +[A0, A1, A2]      [A0+B0+C0]
        +[B0, B1, B2]  =>  [A1+B1+C1]
        +[C0, C1, C2]      [A2+B2+C2]

    The pieces are packed in process-group order (padded to the largest when uneven and
    ``step.padded``) for ``reduce_scatter_single``; with an even dim-0 layout the input
    and output tensors are the buffers themselves.
    """
    plans = pieces_as(ScatterPieces, pieces)
    p0 = first_plan(plans)
    if p0.n == 1:  # a group of one: a local copy
        return rank_map(ctx, lambda r, t: t[plans[r].send[0].src].clone(), x)
    op, g = step.op or "sum", step_group(ctx, step)
    if not (p0.even or step.padded):
        return _reduce_scatter_exact(ctx, step, g, plans, x)
    if p0.direct and len(plans) == 1:  # one played rank: its block straight into the output
        return _issue(ctx, step, p0)(x, False)[1]()
    least = comm.least_chunk(ctx)

    def chunk(r: int) -> int:
        return max(plans[r].chunk, least)

    def pack(r: int, t: torch.Tensor) -> torch.Tensor:
        p, c = plans[r], chunk(r)
        # padding is zero from the start and no call writes it
        buf = buffer(p, "send", p.n * c, t, zero=not p.even or c != p.chunk)
        if not p.pack_copies:  # every piece is empty: all padding, tied to t (see nothing_of)
            return torch.cat([buf, nothing_of(t)])
        return run_copies(p.pack_copies, contiguous(t), buf)  # c != chunk only where every piece is empty

    send = rank_map(ctx, pack, x)
    out = rank_map(ctx, lambda r, t: t.new_empty(chunk(r)), x)
    comm.reduce_scatter(ctx, out, send, op, g)
    y = rank_map(ctx, lambda r, o: o[:numel(plans[r].out_shape)].view(plans[r].out_shape), out)
    return finish_avg(y, op, p0.n)


def _reduce_scatter_exact(ctx: MeshContext, step: Step, g: GroupHandle, plans: Mapping[int, ScatterPieces],
                          x: torch.Tensor) -> torch.Tensor:
    """Uneven pieces without padding: all_to_all the pieces, reduce locally."""
    op = step.op or "sum"
    send_splits = {r: [0 if pc.peer == r else pc.numel for pc in p.send] for r, p in plans.items()}
    recv_splits = {r: [0 if q == r else numel(p.out_shape) for q in p.members] for r, p in plans.items()}

    def pack(r: int, t: torch.Tensor) -> torch.Tensor:
        parts = [flat(t[pc.src]) for pc in plans[r].send if pc.peer != r]
        return torch.cat(parts) if parts else nothing_of(t)

    got = comm.all_to_all(ctx, rank_map(ctx, pack, x), send_splits, recv_splits, g)

    def reduce(r: int, t: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        p = plans[r]
        k = numel(p.out_shape)
        parts: list[torch.Tensor] = []
        off = 0
        for pc in p.send:
            if pc.peer == r:
                parts.append(t[pc.src].reshape(-1))
            else:
                parts.append(o[off:off + k])
                off += k
        return local_reduce(parts, op).view(p.out_shape)

    return finish_avg(rank_map(ctx, reduce, x, got), op, first_plan(plans).n)


def local_reduce(parts: list[torch.Tensor], op: str) -> torch.Tensor:
    """Reduce same-shape tensors with a seed reduce op (avg: the sum; divide afterwards)."""
    s = torch.stack(parts)
    if s.dtype == torch.bool:
        return s.all(0) if op == "min" else s.any(0)
    if op == "max":
        return s.amax(0)
    if op == "min":
        return s.amin(0)
    return s.sum(0, dtype=s.dtype)


@runs("all_reduce")
def all_reduce(ctx: MeshContext, step: Step, plans: Pieces, x: torch.Tensor) -> torch.Tensor:
    """``+A, +B, +C => A + B + C`` on every rank, on a contiguous copy of the input."""
    return all_reduce_into(ctx, step, plans, rank_map(ctx, lambda r, t: t.clone(memory_format=torch.contiguous_format), x))


def all_reduce_into(ctx: MeshContext, step: Step, plans: Pieces, buf: torch.Tensor) -> torch.Tensor:
    """The all_reduce step on ``buf`` itself (contiguous), in place; returns ``buf`` (a group
    of one has nothing to reduce)."""
    n = first_plan(plans).n
    if n > 1:
        op = step.op or "sum"
        comm.all_reduce(ctx, buf, op, step_group(ctx, step))
        finish_avg(buf, op, n)
    return buf


def pack_exchange(plan: ExchangePieces | ExchangeVPieces, t: torch.Tensor) -> torch.Tensor:
    """The send pieces back to back: a view of the input where they already lie so."""
    t = contiguous(t)
    n = plan.send_elems
    if n == 0:
        return nothing_of(t)
    off = plan.send_run
    if off is not None:
        return t.view(-1)[off:off + n]
    return run_copies(plan.pack_copies, t, buffer(plan, "send", n, t))


def exchange(ctx: MeshContext, g: GroupHandle, plans: Mapping[int, ExchangePieces | ExchangeVPieces],
             x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Every played rank's pieces to their peers in one exact all_to_all: the flat receive
    (``out``, where given: see ``comm.all_to_all``)."""
    send = rank_map(ctx, lambda r, t: pack_exchange(plans[r], t), x)
    return comm.all_to_all(ctx, send, {r: [pc.numel for pc in p.send] for r, p in plans.items()},
                           {r: [pc.numel for pc in p.recv] for r, p in plans.items()}, g, out=out)


def _unpack_exchange(plan: ExchangePieces, t: torch.Tensor, recv: torch.Tensor,
                     y: torch.Tensor | None = None) -> torch.Tensor:
    """The own piece copied in and the received ones unpacked, into a new output block, or
    into ``y`` (``_receive_into``'s), where they may have landed in place already."""
    landed = y is not None and plan.recv_run is not None
    y = t.new_empty(plan.out_shape) if y is None else y
    if plan.self_copies:
        run_copies(plan.self_copies, contiguous(t), y)
    if plan.unpack_copies and not landed:
        run_copies(plan.unpack_copies, contiguous(recv), y)
    return y


def _unpacked(ctx: MeshContext, plan: ExchangePieces, t: torch.Tensor, recv: torch.Tensor) -> torch.Tensor:
    """``_unpack_exchange``, drawn from ``t`` and ``recv`` where no copy reads them (``comm.tied``)."""
    y = _unpack_exchange(plan, t, recv)
    return y if plan.self_copies or plan.unpack_copies else tied(ctx, y, t, recv)


def _receive_into(plan: ExchangePieces, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A new output block, and where a real group's receive lands: a view of that block
    where the received pieces lie in it back to back, else a (reused) buffer."""
    y = x.new_empty(plan.out_shape)
    n, off = plan.recv_elems, plan.recv_run
    return y, (y.view(-1)[off:off + n] if off is not None else buffer(plan, "recv", n, x))


@runs("all_to_all", "permute")
def all_to_all(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    """Exact box exchange (also ``permute``): rank r's dst block from (src of q) ∩ (dst of r)::

        [A0, A1, A2]      [A0, B0, C0]
        [B0, B1, B2]  =>  [A1, B1, C1]
        [C0, C1, C2]      [A2, B2, C2]

    One ``all_to_all_single`` with exact per-peer splits (the own piece is copied
    locally, split 0); a permute on a real group uses ``batch_isend_irecv`` instead.
    """
    plans = pieces_as(ExchangePieces, pieces)
    if step.bytes_sent_max == 0 or first_plan(plans).n == 1:  # nothing leaves any rank: each keeps its own piece
        return rank_map(ctx, lambda r, t: _unpacked(ctx, plans[r], t, nothing_of(t)), x)
    g = step_group(ctx, step)
    if step.kind == "permute" and comm.has_p2p(ctx):
        return _permute(ctx, g, first_plan(plans), x)
    if len(plans) > 1:
        return rank_map(ctx, lambda r, t, o: _unpacked(ctx, plans[r], t, o), x, exchange(ctx, g, plans, x))
    # one played rank: received straight into its output where the pieces lie there back to back
    plan = first_plan(plans)
    y, recv = _receive_into(plan, x)
    exchange(ctx, g, plans, x, recv)
    y = _unpack_exchange(plan, x, recv, y)
    # received into a buffer and nothing unpacked or kept: y holds nothing of x or recv
    if plan.recv_run is None and not (plan.self_copies or plan.unpack_copies):
        return tied(ctx, y, x, recv)
    return y


def _permute(ctx: MeshContext, g: GroupHandle, plan: ExchangePieces, x: torch.Tensor) -> torch.Tensor:
    """Point-to-point: send/receive straight from/into the blocks where a piece is one run."""
    y = x.new_empty(plan.out_shape)
    sp = plan.self_piece
    if sp is not None and sp.numel:
        y[sp.dst].copy_(x[sp.src])
    xf = x.view(-1) if x.is_contiguous() else None
    yf = y.view(-1)
    sends, recvs, later = [], [], []
    for p in plan.send:
        if p.numel:
            off = flat_offset(p.src, plan.in_shape) if xf is not None else None
            part = xf[off:off + p.numel] if xf is not None and off is not None else x[p.src].contiguous()
            sends.append((part, p.peer))
    for p in plan.recv:
        if p.numel:
            off = flat_offset(p.dst, plan.out_shape)
            if off is not None:
                recvs.append((yf[off:off + p.numel], p.peer))
            else:
                tmp = buffer(plan, f"recv{p.peer}", p.numel, x).view(p.shape)
                recvs.append((tmp, p.peer))
                later.append((p, tmp))
    comm.p2p(ctx, sends, recvs, g)
    for p, tmp in later:
        y[p.dst].copy_(tmp)
    return y
