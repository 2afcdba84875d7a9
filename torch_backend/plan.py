"""Per-rank data-movement plans for a Step: which slices go to which peer, read off the boxes.

Pure python + numpy (no torch): a :class:`StepPlan` says, for one rank, exactly which
piece of its input block each peer receives and where each received piece lands in
its output block, in *process-group rank order* (``members``), plus the ring order
(the step's group order, ``listed``) for the uneven all_gather. Plans are cached per
(step, mesh, rank, members), so a program replayed many times plans once.

``wire_elems`` is what this rank puts on the wire with the method the real-backend
executor uses; it equals the planner's ``bytes_sent / itemsize`` for every step the
planner emits (tests check all corpus programs), which is how "never more bytes than
the cost says" is enforced. (A hand-built uneven reduce_scatter with ``padded=False``
sends total - own piece, never more than the padded price.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lowering.caching import MIB, cached
from lowering.layout import boxes, group_ranks, overlap
from lowering.program import Step
from spec_lang.ir import Mesh

Slices = tuple[slice, ...]


@dataclass(frozen=True)
class Piece:
    """A box moved between two ranks: ``src`` slices the sender's input block, ``dst``
    slices the receiver's output block (the one not relevant to a side is unused)."""

    peer: int
    src: Slices
    dst: Slices
    shape: tuple[int, ...]
    numel: int


@dataclass(frozen=True)
class StepPlan:
    """One rank's share of one step (fields unused by a kind keep their defaults)."""

    kind: str
    rank: int
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    members: tuple[int, ...] = ()  # process-group rank order (mesh ranks)
    listed: tuple[int, ...] = ()  # the step's group order (row-major over axes as listed)
    send: tuple[Piece, ...] = ()  # per member, process-group order (all_gather: per member's block)
    recv: tuple[Piece, ...] = ()
    self_piece: Piece | None = None
    chunk: int = 0  # equal (or padded) per-member element count on the wire
    even: bool = True
    direct: bool = False  # the collective's flat buffer *is* the output (or input) tensor
    keep: bool = True  # zero_fill: this rank keeps its values
    region: Slices = ()  # slice: kept part of the input; zero_pad: where the input goes
    wire_elems: int = 0
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def n(self) -> int:
        return len(self.members)

    @property
    def me(self) -> int:
        """This rank's process-group rank."""
        return self.members.index(self.rank)


def _rel(piece: np.ndarray, base: np.ndarray) -> Slices:
    return tuple(slice(int(p[0] - b[0]), int(p[1] - b[0])) for p, b in zip(piece, base))


def _shape(box: np.ndarray) -> tuple[int, ...]:
    return tuple(int(hi - lo) for lo, hi in box)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def flat_offset(sl: Slices, shape: tuple[int, ...]) -> int | None:
    """Row-major offset of sub-box ``sl`` of a ``shape`` tensor if it is one contiguous run.

    A box is one run when every dim before its last partial dim pins a single index.
    """
    ext = [s.stop - s.start for s in sl]
    if any(e == 0 for e in ext):
        return 0
    partial = [d for d in range(len(shape)) if ext[d] != shape[d]]
    if partial and any(ext[d] != 1 for d in range(partial[-1])):
        return None
    off, stride = 0, 1
    for d in reversed(range(len(shape))):
        off += sl[d].start * stride
        stride *= shape[d]
    return off


def _is_run(pieces: list[tuple[Slices, int]], shape: tuple[int, ...], chunk: int | None) -> bool:
    """Pieces (slices, numel) lie back to back in a ``shape`` buffer (each at i*chunk if given)."""
    pos = 0
    for i, (sl, n) in enumerate(pieces):
        at = i * chunk if chunk is not None else pos
        if n and flat_offset(sl, shape) != at:
            return False
        pos += n
    return True


@cached(maxsize=4096, max_bytes=16 * MIB)
def plan_step(step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> StepPlan:
    """``rank``'s plan for ``step``; ``members`` is its group in process-group order."""
    src_b = boxes(step.src, mesh)
    dst_b = boxes(step.dst, mesh)
    me_in, me_out = src_b[rank], dst_b[rank]
    in_shape, out_shape = _shape(me_in), _shape(me_out)
    base = {"kind": step.kind, "rank": rank, "in_shape": in_shape, "out_shape": out_shape}
    listed = group_ranks(mesh, step.axes, rank) if step.axes else (rank,)
    kind = step.kind
    if kind == "slice":
        return StepPlan(**base, region=_rel(me_out, me_in))
    if kind == "zero_pad":
        return StepPlan(**base, region=_rel(me_in, me_out))
    if kind == "zero_fill":
        c = mesh.coords(rank)
        return StepPlan(**base, keep=all(c[mesh.index(a)] == 0 for a in step.axes))
    if kind == "reinterpret":
        return StepPlan(**base)
    n = len(members)
    if kind == "all_reduce":
        numel = _numel(in_shape)
        return StepPlan(**base, members=members, listed=listed, wire_elems=-(-(2 * (n - 1) * numel) // n))
    if kind == "all_gather":
        return _plan_all_gather(step, base, src_b, me_out, out_shape, members, listed)
    if kind == "reduce_scatter":
        return _plan_reduce_scatter(step, base, dst_b, me_in, in_shape, members, listed, rank)
    if kind in ("all_to_all", "permute"):
        return _plan_exchange(base, src_b, dst_b, members, listed, rank)
    raise ValueError(f"unknown step kind {kind!r}")


def _plan_all_gather(step: Step, base: dict, src_b: np.ndarray, me_out: np.ndarray,
                     out_shape: tuple[int, ...], members: tuple[int, ...], listed: tuple[int, ...]) -> StepPlan:
    def piece(q: int) -> Piece:
        sl = _rel(src_b[q], me_out)
        shape = _shape(src_b[q])
        return Piece(q, (), sl, shape, _numel(shape))

    by_member = tuple(piece(q) for q in members)
    numels = [p.numel for p in by_member]
    n = len(members)
    if len(set(numels)) == 1:
        chunk = numels[0]
        direct = _is_run([(p.dst, p.numel) for p in by_member], out_shape, chunk)
        return StepPlan(**base, members=members, listed=listed, recv=by_member, chunk=chunk, even=True,
                        direct=direct, wire_elems=(n - 1) * chunk)
    # uneven: an exact ring in the step's group order (the cost model's ring), no padding
    ring = tuple(piece(q) for q in listed)
    i = listed.index(base["rank"])
    total = sum(numels)
    direct = _is_run([(p.dst, p.numel) for p in ring], out_shape, None)
    return StepPlan(**base, members=members, listed=listed, recv=by_member, chunk=max(numels), even=False,
                    direct=direct, wire_elems=total - ring[(i + 1) % n].numel, extra={"ring": ring})


def _plan_reduce_scatter(step: Step, base: dict, dst_b: np.ndarray, me_in: np.ndarray,
                         in_shape: tuple[int, ...], members: tuple[int, ...], listed: tuple[int, ...],
                         rank: int) -> StepPlan:
    pieces = []
    for q in members:
        sl = _rel(dst_b[q], me_in)
        shape = _shape(dst_b[q])
        pieces.append(Piece(q, sl, (), shape, _numel(shape)))
    numels = [p.numel for p in pieces]
    n = len(members)
    chunk = max(numels)
    even = len(set(numels)) == 1
    own = numels[members.index(rank)]
    if even or step.padded:
        direct = even and _is_run([(p.src, p.numel) for p in pieces], in_shape, chunk)
        wire = (n - 1) * chunk
    else:  # exact pieces: an all_to_all of the pieces, then a local reduction
        direct = False
        wire = sum(numels) - own
    return StepPlan(**base, members=members, listed=listed, send=tuple(pieces), chunk=chunk, even=even,
                    direct=direct, wire_elems=wire)


def _plan_exchange(base: dict, src_b: np.ndarray, dst_b: np.ndarray, members: tuple[int, ...],
                   listed: tuple[int, ...], rank: int) -> StepPlan:
    me_in, me_out = src_b[rank], dst_b[rank]
    send, recv = [], []
    for q in members:
        out_box = overlap(me_in, dst_b[q])
        in_box = overlap(src_b[q], me_out)
        so, si = _shape(out_box), _shape(in_box)
        if q == rank:
            send.append(Piece(q, (), (), so, 0))
            recv.append(Piece(q, (), (), si, 0))
            continue
        send.append(Piece(q, _rel(out_box, me_in), (), so, _numel(so)))
        recv.append(Piece(q, (), _rel(in_box, me_out), si, _numel(si)))
    own = overlap(me_in, me_out)
    own_shape = _shape(own)
    self_piece = Piece(rank, _rel(own, me_in), _rel(own, me_out), own_shape, _numel(own_shape))
    out_shape = base["out_shape"]
    got = sum(p.numel for p in recv) + self_piece.numel
    if got != _numel(out_shape):
        raise ValueError(
            f"{base['kind']}: rank {rank} would receive {got} of its {_numel(out_shape)} output elements "
            "(the step's group blocks do not tile the output)"
        )
    return StepPlan(**base, members=members, listed=listed, send=tuple(send), recv=tuple(recv),
                    self_piece=self_piece, wire_elems=sum(p.numel for p in send))


def wire_bytes(step: Step, mesh: Mesh, itemsize: int) -> tuple[int, ...]:
    """Per rank, the bytes the real-backend executor sends for ``step`` (sorted groups)."""
    out = []
    for r in range(mesh.size):
        members = tuple(sorted(group_ranks(mesh, step.axes, r))) if step.axes else (r,)
        out.append(plan_step(step, mesh, r, members).wire_elems * itemsize)
    return tuple(out)
