"""The crossing kinds' torch runner (``send_across``, ``fan_out``), and the world's part of a
cross-mesh call: each round one batch of point-to-point messages on the world's context,
one byte buffer per pair of ranks holding every tensor's pieces (a joint call's crossings,
``PACKED["across"]``), packed in an order both sides derive from their own ``CrossPieces``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from lowering.cross_mesh import Box, CrossProgram, Transfer, cut, fill
from lowering.kinds import rank_pieces
from lowering.kinds.across import CrossPieces
from lowering.kinds.base import flat_offset, numel, own_pieces
from lowering.planner import compile_gradient
from lowering.program import Program, Step
from spec_lang.ir import Mesh
from torch_backend import collectives, comm, local_steps, uneven_steps  # noqa: F401 - each registers its runners
from torch_backend.dtypes import check_reductions, to_torch_dtype
from torch_backend.groups import MeshContext, context, subset_context
from torch_backend.packed import PACKED
from torch_backend.runners import Pieces, pieces_as, runs

Held = list[tuple[Box, torch.Tensor]]


def crossing(program: Program) -> CrossProgram:
    """A cross-mesh program's view, every reduction on its source mesh one torch can add."""
    p = CrossProgram(program)
    if p.finish is not None:
        check_reductions(p.finish)
    return p


def cross_backward_program(p: CrossProgram) -> CrossProgram:
    """The gradient's move: ``dual(dst)`` on the destination mesh back to ``dual(src)``."""
    return crossing(compile_gradient(p.program))


def finish_groups(p: CrossProgram, timeout: timedelta | None, backend: str) -> MeshContext | None:
    """This rank's context of the groups of ``p``'s finish on its source mesh (None off it),
    made alike on every rank of the world."""
    f = p.finish
    if f is None:
        return None
    axes = [s.axes for s in f.steps if s.is_collective]
    return subset_context(f.mesh, p.src_mesh.global_ranks, axes, timeout=timeout, backend=backend)


def world(timeout: timedelta | None) -> MeshContext:
    """The default group's world as a one-axis mesh: where a cross-mesh call's agreement and messages run."""
    return context(Mesh(("world",), (dist.get_world_size(),)), timeout=timeout)


def world_sum(flags: torch.Tensor, me: int, timeout: timedelta | None, what: str) -> list[int]:
    """The sum of ``flags`` over the world, as ints (a failure names who is at fault)."""
    ctx = world(timeout)
    group = ctx.group(ctx.mesh.names, me)
    try:
        comm.all_reduce(ctx, flags, "sum", group)
    except RuntimeError as e:
        raise comm.failed(ctx, f"rank {me}: {what}", e, group.members, ctx.mesh.names) from e
    return flags.tolist()


@dataclass(frozen=True)
class Packed:

    i: int
    box: Box
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Message:
    peer: int
    pieces: tuple[Packed, ...]
    nbytes: int


@dataclass(frozen=True)
class Round:
    sends: tuple[Message, ...]
    recvs: tuple[Message, ...]


def _messages(per_tensor: Sequence[tuple[Transfer, ...]], peer_of: Any, items: Sequence[int]) -> tuple[Message, ...]:
    """One message per peer, every tensor's boxes for it packed, largest items first (each
    piece starts aligned for its dtype), then by tensor and box, as on the other side."""
    by_peer: dict[int, list[tuple[int, int, Box]]] = {}
    for i, transfers in enumerate(per_tensor):
        for t in transfers:
            if numel(_extent(t.box)):
                by_peer.setdefault(peer_of(t), []).append((-items[i], i, t.box))
    out = []
    for peer in sorted(by_peer):
        pieces, at = [], 0
        for neg_item, i, box in sorted(by_peer[peer]):
            n = numel(_extent(box)) * -neg_item
            pieces.append(Packed(i, box, at, n))
            at += n
        out.append(Message(peer, tuple(pieces), at))
    return tuple(out)


def rounds(programs: Sequence[CrossProgram], me: int) -> tuple[Round, ...]:
    return _rounds([crossing_pieces(p.crossing, p.src_mesh, me) for p in programs],
                   [to_torch_dtype(p.src.dtype).itemsize for p in programs])


def crossing_pieces(step: Step, src_mesh: Mesh, me: int) -> CrossPieces:
    return own_pieces(CrossPieces, [rank_pieces(step, src_mesh, me)])[0]


def _rounds(pieces: Sequence[CrossPieces], items: Sequence[int]) -> tuple[Round, ...]:
    """Round k holds every crossing's k-th round (cached by the pieces, which the lowering caches)."""
    key = tuple(id(p) for p in pieces)
    hit = _ROUNDS.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], pieces, strict=True)):
        return hit[1]
    out = []
    for k in range(max(len(p.rounds) for p in pieces)):
        step = [p.rounds[k] if k < len(p.rounds) else ((), ()) for p in pieces]
        out.append(Round(_messages([s for s, _ in step], lambda t: t.receiver, items),
                         _messages([r for _, r in step], lambda t: t.sender, items)))
    if len(_ROUNDS) > 256:
        _ROUNDS.clear()
    _ROUNDS[key] = (tuple(pieces), tuple(out))
    return tuple(out)


_ROUNDS: dict[tuple[int, ...], tuple[tuple[CrossPieces, ...], tuple[Round, ...]]] = {}


@runs("send_across", "fan_out")
def run_crossing(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    return cross(ctx, [pieces_as(CrossPieces, pieces)[ctx.rank]], [x])[0]


def cross(ctx: MeshContext, pieces: Sequence[CrossPieces], xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Crossings of several tensors jointly (``pieces``: each one's on this rank), each output
    filled from the pieces held. A rank off a mesh passes, or gets, an empty tensor."""
    held: list[Held] = [[(p.src_box, x)] if p.src_box is not None else [] for p, x in zip(pieces, xs, strict=True)]
    outs = [None if p.dst_box is None else (p.dst_box, torch.empty(p.out_shape, dtype=x.dtype, device=x.device))
            for p, x in zip(pieces, xs, strict=True)]
    placed: list[set[Box]] = [set() for _ in pieces]
    dtypes = [x.dtype for x in xs]
    for k, rnd in enumerate(_rounds(pieces, [x.element_size() for x in xs])):
        for i, piece, in_place in _round(ctx, k, held, outs, rnd, dtypes, xs[0].device):
            held[i].append(piece)
            if in_place:
                placed[i].add(piece[0])
    for h, out, done in zip(held, outs, placed, strict=True):
        if out is not None:
            fill(out[1], out[0], h, done)
    return [x.new_empty(0) if out is None else out[1] for x, out in zip(xs, outs, strict=True)]


def _across(ctx: MeshContext, steps: Sequence[Step], pieces: Sequence[Pieces], xs: Sequence[torch.Tensor],
            launch_only: bool = False) -> list[torch.Tensor]:
    return cross(ctx, [pieces_as(CrossPieces, p)[ctx.rank] for p in pieces], xs)


PACKED["across"] = _across


def _round(ctx: MeshContext, k: int, held: list[Held], outs: Sequence[tuple[Box, torch.Tensor] | None], rnd: Round,
           dtypes: Sequence[torch.dtype], device: torch.device) -> list[tuple[int, tuple[Box, torch.Tensor], bool]]:
    """One batched round: the pieces this rank received (and whether each landed in its output:
    a message of one piece goes without a copy where it can, either side)."""
    sends, recvs, incoming = [], [], []
    for m in rnd.sends:
        if len(m.pieces) == 1 and (t := cut(held[m.pieces[0].i], m.pieces[0].box)).is_contiguous():
            buf = t.reshape(-1).view(torch.uint8)
        else:
            buf = torch.empty(m.nbytes, dtype=torch.uint8, device=device)
            for pc in m.pieces:
                _view(buf, pc, dtypes[pc.i]).copy_(cut(held[pc.i], pc.box))
        sends.append((buf, m.peer))
    for m in rnd.recvs:
        run = output_run(outs[m.pieces[0].i], m.pieces[0].box) if len(m.pieces) == 1 else None
        buf = torch.empty(m.nbytes, dtype=torch.uint8, device=device) if run is None else run.view(torch.uint8)
        recvs.append((buf, m.peer))
        incoming.append((m, buf, run is not None))
    if sends or recvs:
        group = ctx.group(ctx.mesh.names, ctx.rank)
        try:
            comm.p2p(ctx, sends, recvs, group)
        except RuntimeError as e:
            # the peers of this round are the ones to ask: the other ranks may be done
            peers = sorted({ctx.rank, *(m.peer for m in rnd.sends), *(m.peer for m in rnd.recvs)})
            raise comm.failed(ctx, f"rank {ctx.rank}: round {k} of the cross-mesh messages (with ranks "
                              f"{[q for q in peers if q != ctx.rank]})", e, peers) from e
    return [(pc.i, (pc.box, _view(buf, pc, dtypes[pc.i])), in_place)
            for m, buf, in_place in incoming for pc in m.pieces]


def output_run(out: tuple[Box, torch.Tensor] | None, box: Box) -> torch.Tensor | None:
    """The flat run of the output that the global ``box`` fills, where it is one run."""
    if out is None:
        return None
    at, t = out
    if not all(olo <= lo and hi <= ohi for (lo, hi), (olo, ohi) in zip(box, at, strict=True)):
        return None
    off = flat_offset(tuple(slice(lo - olo, hi - olo) for (lo, hi), (olo, _) in zip(box, at, strict=True)),
                      _extent(at))
    return None if off is None else t.view(-1)[off:off + numel(_extent(box))]


def _extent(box: Box) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in box)


def _view(buf: torch.Tensor, pc: Packed, dtype: torch.dtype) -> torch.Tensor:
    return buf[pc.offset:pc.offset + pc.nbytes].view(dtype).view(_extent(pc.box))
