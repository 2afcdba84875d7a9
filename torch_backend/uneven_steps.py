"""Torch execution of the uneven kinds (``lowering.kinds.uneven_exchange``): ``all_to_allv``
and ``reduce_scatterv``, one ``all_to_all_single`` with each peer's exact split (never
padded), unpacked by copies or by accumulating each contribution into the output; and
``all_gatherv``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from lowering.kinds.copies import Copy
from lowering.kinds.uneven_exchange import ExchangeVPieces, GatherVPieces
from lowering.program import Step
from torch_backend import comm
from torch_backend.collectives import exchange, first_plan, gather_a2a, ring_gather, step_group
from torch_backend.comm import finish_avg, rank_map, tied
from torch_backend.groups import MeshContext
from torch_backend.runners import Pieces, pieces_as, runs
from torch_backend.scratch import buffer
from torch_backend.strided import contiguous, nothing_of, run_copies


def _exchange(ctx: MeshContext, step: Step, plans: Mapping[int, ExchangeVPieces],
              x: torch.Tensor) -> torch.Tensor:
    """The flat receive buffer of every played rank (empty, drawn from ``x``, when nothing
    leaves any rank)."""
    p = first_plan(plans)
    if step.bytes_sent_max == 0 or p.n == 1:
        return rank_map(ctx, lambda r, t: nothing_of(t), x)
    recv = buffer(p, "recv", p.recv_elems, x) if comm.one_block(ctx) else None
    return exchange(ctx, step_group(ctx, step), plans, x, recv)


@runs("all_to_allv", "slicev")
def all_to_allv(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    """Each rank's exact pieces to each peer (uneven sizes, any block order)::

        r0 [a a a]      [a a]
        r1 [b]      =>  [a b c c]      (sizes 3,1,4 -> 2,4,2)
        r2 [c c c c]    [c c]
    """
    plans = pieces_as(ExchangeVPieces, pieces)

    def finish(r: int, t: torch.Tensor, recv: torch.Tensor) -> torch.Tensor:
        p = plans[r]
        # a new pending sum keeps the value on one coordinate: the others hold zeros
        y = t.new_zeros(p.out_shape) if p.fills else t.new_empty(p.out_shape)
        if p.self_copies:
            run_copies(p.self_copies, contiguous(t), y)
        if p.unpack_copies:
            run_copies(p.unpack_copies, contiguous(recv), y)
        elif not p.self_copies:
            return tied(ctx, y, t, recv)
        return y

    return rank_map(ctx, finish, x, _exchange(ctx, step, plans, x))


def _identity(op: str, like: torch.Tensor) -> float | int | bool:
    if op in ("sum", "avg"):
        return 0
    if like.dtype == torch.bool:
        return op == "min"
    if like.dtype.is_floating_point or like.dtype.is_complex:
        return float("-inf") if op == "max" else float("inf")
    info = torch.iinfo(like.dtype)
    return info.min if op == "max" else info.max


_ACCUMULATE: dict[str, Callable[..., torch.Tensor]] = {"sum": torch.add, "avg": torch.add, "max": torch.maximum,
                                                       "min": torch.minimum}


def _accumulate(copies: Sequence[Copy], src: torch.Tensor, dst: torch.Tensor, op: str) -> None:
    so, do = src.storage_offset(), dst.storage_offset()
    for c in copies:
        d = dst.as_strided(c.dst.size, c.dst.stride, do + c.dst.offset)
        s = src.as_strided(c.src.size, c.src.stride, so + c.src.offset)
        _ACCUMULATE[op](d, s, out=d)  # on bool, add is a logical or


@runs("reduce_scatterv")
def reduce_scatterv(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    """Each contribution straight to the rank that holds the sum, reduced there::

        +A +A +A  =>  r0 [A0]  r1 [A1 A2]  r2 [A3]   (sizes 1,2,1)
    """
    plans = pieces_as(ExchangeVPieces, pieces)
    op = step.op or "sum"

    def finish(r: int, t: torch.Tensor, recv: torch.Tensor) -> torch.Tensor:
        p = plans[r]
        y = torch.full(p.out_shape, _identity(op, t), dtype=t.dtype, device=t.device)
        _accumulate(p.self_copies, contiguous(t), y, op)
        _accumulate(p.unpack_copies, contiguous(recv), y, op)
        if not (p.self_copies or p.unpack_copies):
            y = tied(ctx, y, t, recv)
        return finish_avg(y, op, p.divide)

    return rank_map(ctx, finish, x, _exchange(ctx, step, plans, x))


@runs("all_gatherv")
def all_gatherv(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    """Every member's exact segment to every rank, never padded::

        r0 [a a a]                                    [a a a b c c c c]
        r1 [b]      =>  a, b, c each to the others =>  (on every rank)
        r2 [c c c c]

    n-1 rounds of point-to-point around the ring (``ring_gather``), or one exact
    ``all_to_all_single`` where the implementation has no point-to-point (``gather_a2a``;
    docs/running.md, "torch.compile").
    """
    plans = pieces_as(GatherVPieces, pieces)
    p0 = first_plan(plans)
    if p0.n == 1 or not step.bytes_sent_max:  # every other segment is empty: the own one is all
        return rank_map(ctx, lambda r, t: _unpack(ctx, plans[r], _own_segment(plans[r], t)), x)
    g = step_group(ctx, step)
    if comm.has_p2p(ctx):  # the ring, every segment in one buffer
        i, offs, segs = p0.position, p0.offsets, p0.segments
        buf = buffer(p0, "ring", sum(segs), x)
        run_copies(p0.pack_copies, contiguous(x), buf[offs[i]:offs[i] + segs[i]])
        ring_gather(ctx, g, buf, segs, i, p0.members)
        return _unpack(ctx, p0, buf)
    own = rank_map(ctx, lambda r, t: _own_segment(plans[r], t), x)
    got = gather_a2a(ctx, g, own, {r: p.segments for r, p in plans.items()},
                     {r: p.position for r, p in plans.items()})

    def finish(r: int, o: torch.Tensor, recv: torch.Tensor) -> torch.Tensor:
        at = plans[r].offsets[plans[r].position]
        return _unpack(ctx, plans[r], torch.cat([recv[:at], o, recv[at:]]))

    return rank_map(ctx, finish, own, got)


def _own_segment(p: GatherVPieces, t: torch.Tensor) -> torch.Tensor:
    n = p.segments[p.position]
    if n == 0:
        return nothing_of(t)
    return run_copies(p.pack_copies, contiguous(t), t.new_empty(n))


def _unpack(ctx: MeshContext, p: GatherVPieces, buf: torch.Tensor) -> torch.Tensor:
    """The output block from every segment back to back."""
    y = run_copies(p.unpack_copies, buf, buf.new_empty(p.out_shape))
    return y if p.unpack_copies else tied(ctx, y, buf)

