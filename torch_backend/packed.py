"""Packed collectives: several tensors' steps of one kind over one group as ONE collective.

Each function takes the steps' pieces (per tensor: mesh rank -> pieces) and blocks, and
returns the next blocks. Every tensor's part sits at a fixed offset inside each member's
segment of one flat buffer, so a member's segment is the concatenation of its parts::

    all_gather  [a0 b0] [a1 b1] [a2 b2]  =>  every rank: [a0 b0 | a1 b1 | a2 b2]

Preconditions (``lowering.joint.packing_key``): equal blocks for an all_gather, equal
or padded pieces for a reduce_scatter, one reduce op and one dtype per packed collective.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from lowering.kinds.base import numel
from lowering.kinds.exchange import ExchangePieces
from lowering.kinds.gather import GatherPieces
from lowering.kinds.reduce import ScatterPieces
from lowering.program import Step
from torch_backend import comm
from torch_backend.comm import finish_avg, rank_map
from torch_backend.groups import MeshContext
from torch_backend.runners import Pieces, pieces_as
from torch_backend.strided import flat, nothing_of


def _stack(ctx: MeshContext, xs: Sequence[torch.Tensor]) -> dict[int, list[torch.Tensor]]:
    """Per played rank, the plain local blocks of every tensor."""
    return {r: [comm.local_of(x, r) for x in xs] for r in ctx.ranks}


def _finished(ctx: MeshContext, work: Any, mine: Callable[[int], list[torch.Tensor]], count: int,
              launch_only: bool) -> Any:
    """The next blocks once ``work`` is done, ``mine(rank)`` being the ``count`` tensors'
    blocks of each played rank (plain per-rank ops; LocalTensors when simulating); with
    ``launch_only``, ``(work, unpack)`` for an async caller."""

    def unpack() -> list[torch.Tensor]:
        with comm.plain(ctx):
            outs = {r: mine(r) for r in ctx.ranks}
        return [rank_map(ctx, lambda r, j=j: outs[r][j]) for j in range(count)]

    if launch_only:
        return work, unpack
    comm.wait(ctx, work)
    return unpack()


def all_gather(ctx: MeshContext, steps: Sequence[Step], pieces: Sequence[Pieces],
               xs: Sequence[torch.Tensor], launch_only: bool = False) -> Any:
    gathers = [pieces_as(GatherPieces, p) for p in pieces]
    blocks = _stack(ctx, xs)
    sizes = {r: [p[r].chunk for p in gathers] for r in ctx.ranks}
    send = rank_map(ctx, lambda r: torch.cat([flat(b) for b in blocks[r]]))
    out = rank_map(ctx, lambda r: blocks[r][0].new_empty(gathers[0][r].n * sum(sizes[r])))
    work = comm.all_gather(ctx, out, send, ctx.group(steps[0].axes, ctx.ranks[0]), launch_only=True)

    def mine(r: int) -> list[torch.Tensor]:
        o, total = comm.local_of(out, r), sum(sizes[r])
        ys, off = [], 0
        for j, p in enumerate(gathers):
            y = blocks[r][j].new_empty(p[r].out_shape)
            for i, pc in enumerate(p[r].recv):
                if pc.numel:
                    y[pc.dst].copy_(o[i * total + off:i * total + off + pc.numel].view(pc.shape))
            off += sizes[r][j]
            ys.append(y)
        return ys

    return _finished(ctx, work, mine, len(xs), launch_only)


def reduce_scatter(ctx: MeshContext, steps: Sequence[Step], pieces: Sequence[Pieces],
                   xs: Sequence[torch.Tensor], launch_only: bool = False) -> Any:
    scatters = [pieces_as(ScatterPieces, p) for p in pieces]
    blocks = _stack(ctx, xs)
    op = steps[0].op or "sum"
    sizes = {r: [p[r].chunk for p in scatters] for r in ctx.ranks}
    total = {r: max(sum(sizes[r]), comm.least_chunk(ctx)) for r in ctx.ranks}

    def pack(r: int) -> torch.Tensor:
        n = scatters[0][r].n
        buf = blocks[r][0].new_zeros(n * total[r])
        off, copied = 0, False
        for j, p in enumerate(scatters):
            for i, pc in enumerate(p[r].send):
                if pc.numel:
                    start = i * total[r] + off
                    buf[start:start + pc.numel].view(pc.shape).copy_(blocks[r][j][pc.src])
                    copied = True
            off += sizes[r][j]
        # all padding: tied to the blocks all the same (see strided.nothing_of)
        return buf if copied else torch.cat([buf, *(nothing_of(b) for b in blocks[r])])

    send = rank_map(ctx, pack)
    out = rank_map(ctx, lambda r: blocks[r][0].new_empty(total[r]))
    work = comm.reduce_scatter(ctx, out, send, op, ctx.group(steps[0].axes, ctx.ranks[0]), launch_only=True)

    def mine(r: int) -> list[torch.Tensor]:
        o, off, ys = comm.local_of(out, r), 0, []
        for j, p in enumerate(pieces):
            k = numel(p[r].out_shape)
            ys.append(finish_avg(o[off:off + k].clone().view(p[r].out_shape), op, p[r].n))
            off += sizes[r][j]
        return ys

    return _finished(ctx, work, mine, len(xs), launch_only)


def all_reduce(ctx: MeshContext, steps: Sequence[Step], pieces: Sequence[Pieces],
               xs: Sequence[torch.Tensor], launch_only: bool = False) -> Any:
    blocks = _stack(ctx, xs)
    op = steps[0].op or "sum"
    buf = rank_map(ctx, lambda r: torch.cat([flat(b) for b in blocks[r]]))
    work = comm.all_reduce(ctx, buf, op, ctx.group(steps[0].axes, ctx.ranks[0]), launch_only=True)

    def mine(r: int) -> list[torch.Tensor]:
        o, off, ys = comm.local_of(buf, r), 0, []
        for j, b in enumerate(blocks[r]):
            ys.append(finish_avg(o[off:off + b.numel()].view(b.shape), op, pieces[j][r].n))
            off += b.numel()
        return ys

    return _finished(ctx, work, mine, len(xs), launch_only)


def exchange(ctx: MeshContext, steps: Sequence[Step], given: Sequence[Pieces],
             xs: Sequence[torch.Tensor], launch_only: bool = False) -> Any:
    """all_to_all and permute: per member, every tensor's piece for it, back to back
    (``launch_only``: the exchange has finished, nothing stays on the wire: no work)."""
    pieces = [pieces_as(ExchangePieces, p) for p in given]
    blocks = _stack(ctx, xs)
    members = {r: pieces[0][r].members for r in ctx.ranks}
    send_splits = {r: [sum(p[r].send[i].numel for p in pieces) for i in range(len(members[r]))] for r in ctx.ranks}
    recv_splits = {r: [sum(p[r].recv[i].numel for p in pieces) for i in range(len(members[r]))] for r in ctx.ranks}

    def pack(r: int) -> torch.Tensor:
        parts = [flat(blocks[r][j][p[r].send[i].src]) for i in range(len(members[r]))
                 for j, p in enumerate(pieces) if p[r].send[i].numel]
        return torch.cat(parts) if parts else nothing_of(blocks[r][0])

    send = rank_map(ctx, pack)
    got = comm.all_to_all(ctx, send, send_splits, recv_splits, ctx.group(steps[0].axes, ctx.ranks[0]))

    def mine(r: int) -> list[torch.Tensor]:
        o = comm.local_of(got, r)
        ys = [blocks[r][j].new_empty(p[r].out_shape) for j, p in enumerate(pieces)]
        for j, p in enumerate(pieces):
            sp = p[r].self_piece
            if sp.numel:
                ys[j][sp.dst].copy_(blocks[r][j][sp.src])
        off = 0
        for i in range(len(members[r])):
            for j, p in enumerate(pieces):
                pc = p[r].recv[i]
                if pc.numel:
                    ys[j][pc.dst].copy_(o[off:off + pc.numel].view(pc.shape))
                    off += pc.numel
        # a block that no copy wrote (see comm.tied)
        return [y if p[r].self_piece.numel or any(pc.numel for pc in p[r].recv) else comm.tied(ctx, y, blocks[r][j], o)
                for j, (y, p) in enumerate(zip(ys, pieces, strict=True))]

    return _finished(ctx, None, mine, len(xs), launch_only)


class PackedRun(Protocol):
    """A packed collective: the next blocks, or with ``launch_only`` (work, unpack)."""

    def __call__(self, ctx: MeshContext, steps: Sequence[Step], pieces: Sequence[Pieces],
                 xs: Sequence[torch.Tensor], /, launch_only: bool = False) -> Any: ...


PACKED: dict[str, PackedRun] = {"all_gather": all_gather, "reduce_scatter": reduce_scatter,
                                "all_reduce": all_reduce, "exchange": exchange}
# launch_only leaves their collective on the wire (an exchange has finished when it returns)
LAUNCHABLE = frozenset({"all_gather", "reduce_scatter", "all_reduce"})
