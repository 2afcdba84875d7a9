"""Torch execution of the exact exchanges between uneven layouts (``all_to_allv``,
``reduce_scatterv``; their definitions are in ``lowering.kinds.uneven_exchange``).

Both are one ``all_to_all_single`` with each peer's exact split (never padded): the
pieces are packed by strided copies, and unpacked by copies (``all_to_allv``) or by
accumulating each contribution into the output (``reduce_scatterv``)::

    +A +A +A  =>  r0 [A0]  r1 [A1 A2]  r2 [A3]   (sizes 1,2,1; each the sum)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lowering.kinds.copies import Copy
from lowering.program import Step
from torch_backend import comm
from torch_backend.collectives import Plans
from torch_backend.collectives import first_plan as _first
from torch_backend.collectives import pack_exchange as _pack_exchange
from torch_backend.collectives import step_group as _group
from torch_backend.comm import finish_avg, rank_map
from torch_backend.groups import MeshContext
from torch_backend.runners import runs
from torch_backend.scratch import buffer
from torch_backend.strided import contiguous, run_copies


def _exchange(ctx: MeshContext, step: Step, plans: Plans, x: torch.Tensor) -> torch.Tensor | None:
    """The flat receive buffer of every played rank (None when nothing leaves any rank)."""
    if step.bytes_sent_max == 0 or _first(plans).n == 1:
        return None
    send_splits = {r: [pc.numel for pc in p.send] for r, p in plans.items()}  # type: ignore[attr-defined]
    recv_splits = {r: [pc.numel for pc in p.recv] for r, p in plans.items()}  # type: ignore[attr-defined]
    send = rank_map(ctx, lambda r, t: _pack_exchange(plans[r], t), x)
    g = _group(ctx, step)
    if comm.of(ctx).per_rank:
        return comm.all_to_all(ctx, send, send_splits, recv_splits, g)
    p = _first(plans)
    recv = buffer(p, "recv", p.recv_elems, x)  # type: ignore[attr-defined]
    return comm.all_to_all(ctx, send, send_splits, recv_splits, g, out=recv)


@runs("all_to_allv", "slicev")
def all_to_allv(ctx: MeshContext, step: Step, plans: Plans, x: torch.Tensor) -> torch.Tensor:
    """Each rank's exact pieces to each peer (uneven sizes, any block order)::

        r0 [a a a]      [a a]
        r1 [b]      =>  [a b c c]      (sizes 3,1,4 -> 2,4,2)
        r2 [c c c c]    [c c]
    """
    got = _exchange(ctx, step, plans, x)

    def finish(r: int, t: torch.Tensor, recv: torch.Tensor | None) -> torch.Tensor:
        p = plans[r]
        # a new pending sum keeps the value on one coordinate: the others hold zeros
        y = t.new_zeros(p.out_shape) if p.fills else t.new_empty(p.out_shape)  # type: ignore[attr-defined]
        if p.self_copies:  # type: ignore[attr-defined]
            run_copies(p.self_copies, contiguous(t), y)  # type: ignore[attr-defined]
        if recv is not None and p.unpack_copies:  # type: ignore[attr-defined]
            run_copies(p.unpack_copies, contiguous(recv), y)  # type: ignore[attr-defined]
        return y

    if got is None:
        return rank_map(ctx, lambda r, t: finish(r, t, None), x)
    return rank_map(ctx, finish, x, got)


def _identity(op: str, like: torch.Tensor) -> float | int | bool:
    if op in ("sum", "avg"):
        return 0
    if like.dtype == torch.bool:
        return op == "min"
    if like.dtype.is_floating_point or like.dtype.is_complex:
        return float("-inf") if op == "max" else float("inf")
    info = torch.iinfo(like.dtype)
    return info.min if op == "max" else info.max


def _accumulate(copies: Sequence[Copy], src: torch.Tensor, dst: torch.Tensor, op: str) -> None:
    so, do = src.storage_offset(), dst.storage_offset()
    for c in copies:
        d = dst.as_strided(c.dst.size, c.dst.stride, do + c.dst.offset)
        s = src.as_strided(c.src.size, c.src.stride, so + c.src.offset)
        if op in ("sum", "avg"):
            if d.dtype == torch.bool:
                d.logical_or_(s)
            else:
                d.add_(s)
        elif op == "max":
            torch.maximum(d, s, out=d)
        else:
            torch.minimum(d, s, out=d)


@runs("reduce_scatterv")
def reduce_scatterv(ctx: MeshContext, step: Step, plans: Plans, x: torch.Tensor) -> torch.Tensor:
    """Each contribution straight to the rank that holds the sum, reduced there::

        +A +A +A  =>  r0 [A0]  r1 [A1 A2]  r2 [A3]   (sizes 1,2,1)
    """
    op = step.op or "sum"
    got = _exchange(ctx, step, plans, x)

    def finish(r: int, t: torch.Tensor, recv: torch.Tensor | None) -> torch.Tensor:
        p = plans[r]
        y = torch.full(p.out_shape, _identity(op, t), dtype=t.dtype, device=t.device)
        _accumulate(p.self_copies, contiguous(t), y, op)  # type: ignore[attr-defined]
        if recv is not None:
            _accumulate(p.unpack_copies, contiguous(recv), y, op)  # type: ignore[attr-defined]
        return finish_avg(y, op, p.divide)  # type: ignore[attr-defined]

    if got is None:
        return rank_map(ctx, lambda r, t: finish(r, t, None), x)
    return rank_map(ctx, finish, x, got)


@runs("all_gatherv")
def all_gatherv(ctx: MeshContext, step: Step, plans: Plans, x: torch.Tensor) -> torch.Tensor:
    """Uneven pieces gathered around the ring, each forwarded once at its exact size::

        r0 [a a a]      round 1: a->r1 b->r2 c->r0     [a a a b c c c c]
        r1 [b]      =>  round 2: c->r1 a->r2 b->r0  => (on every rank)
        r2 [c c c c]

    Point-to-point on a real group; under LocalTensorMode (no p2p) each round is an
    all_to_all whose only non-empty split is the successor's, so the bytes are the same.
    """
    def start(r: int, t: torch.Tensor) -> torch.Tensor:
        p = plans[r]
        buf = buffer(p, "ring", sum(p.segments), t)  # type: ignore[attr-defined]
        i = p.position  # type: ignore[attr-defined]
        o, n = p.offsets[i], p.segments[i]  # type: ignore[attr-defined]
        # packed apart, then copied in: a compiled region cannot write through as_strided
        # views of a slice (functionalization), and the extra copy is of the rank's own piece
        own = run_copies(p.pack_copies, contiguous(t), t.new_empty(n))  # type: ignore[attr-defined]
        buf[o:o + n].copy_(own)
        return buf

    buf = rank_map(ctx, start, x)
    p0 = _first(plans)
    n = p0.n
    if n > 1 and step.bytes_sent_max:
        g = _group(ctx, step)
        for k in range(n - 1):
            _ring_round(ctx, g, plans, buf, k)

    def finish(r: int, b: torch.Tensor) -> torch.Tensor:
        p = plans[r]
        return run_copies(p.unpack_copies, b, b.new_empty(p.out_shape))  # type: ignore[attr-defined]

    return rank_map(ctx, finish, buf)


def _ring_round(ctx: MeshContext, g: Any, plans: Plans, buf: torch.Tensor, k: int) -> None:
    """Round k: position i sends segment (i-k) to its successor, receives (i-k-1) from its
    predecessor (empty segments skipped on both sides)."""
    def seg(p: Any, j: int) -> tuple[int, int]:
        j %= p.n
        return p.offsets[j], p.segments[j]

    if comm.of(ctx).p2p:
        p = _first(plans)
        i = p.position
        so, sn = seg(p, i - k)
        ro, rn = seg(p, i - k - 1)
        succ, pred = p.members[(i + 1) % p.n], p.members[(i - 1) % p.n]
        comm.p2p(ctx, [(buf[so:so + sn], succ)] if sn else [], [(buf[ro:ro + rn], pred)] if rn else [], g)
        return
    send_splits, recv_splits = {}, {}
    for r, p in plans.items():
        i = p.position  # type: ignore[attr-defined]
        send_splits[r] = [seg(p, i - k)[1] if j == (i + 1) % p.n else 0 for j in range(p.n)]
        recv_splits[r] = [seg(p, i - k - 1)[1] if j == (i - 1) % p.n else 0 for j in range(p.n)]
    send = rank_map(ctx, lambda r, b: (lambda o, c: b[o:o + c])(*seg(plans[r], plans[r].position - k)), buf)
    got = comm.all_to_all(ctx, send, send_splits, recv_splits, g)

    def land(r: int, b: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        off, cnt = seg(plans[r], plans[r].position - k - 1)
        b[off:off + cnt].copy_(o)
        return b

    rank_map(ctx, land, buf, got)
