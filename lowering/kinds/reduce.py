"""The reductions: ``reduce_scatter`` and ``all_reduce`` finish a pending P(op).

``reduce_scatter`` over ``axes``: reduce the group's blocks and keep this rank's piece;
the axes leave P and shard dims (appended minor)::

    +[A0, A1, A2]      [A0+B0+C0]
    +[B0, B1, B2]  =>  [A1+B1+C1]
    +[C0, C1, C2]      [A2+B2+C2]

``all_reduce`` over ``axes``: the axes leave P and become R or I::

    +A
    +B  =>  A + B + C
    +C

Gradients: ``reduce_scatter(P, S)`` is ``all_gather(S, R)`` backwards; ``all_reduce(P, R)``
is itself backwards, and ``all_reduce(P, I)`` is ``reinterpret(I, R)``.

On the wire: a ring reduce_scatter sends (n-1)/n of its input; uneven pieces are padded
to the largest (``padded``, the price) or, in a hand-built step with ``padded=False``,
exchanged exactly and reduced locally. A ring all_reduce sends 2(n-1)/n of its block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from lowering.kinds.base import (
    Piece,
    RankPieces,
    Signature,
    StepKind,
    box_shape,
    check_whole_average,
    is_run,
    numel,
    own_pieces,
    pieces_of,
    reduce_arrays,
    refuse,
    register,
    same_except,
)
from lowering.kinds.copies import Copy, boxes_to_runs
from lowering.kinds.rows import group_rows, per_rank
from lowering.layout import box_numel, boxes, local_numel
from spec_lang.ir import Mesh, TensorType

if TYPE_CHECKING:
    from lowering.program import Step


@dataclass(frozen=True, kw_only=True)
class ScatterPieces(RankPieces):
    send: tuple[Piece, ...]  # per member (process-group order): the piece of this rank's input it keeps
    chunk: int  # the largest piece: the per-member chunk on the wire when padded
    even: bool
    direct: bool  # the pieces lie at i*chunk in the input: reduce straight from it

    @cached_property
    def pack_copies(self) -> tuple[Copy, ...]:
        """Input block -> the send buffer (member i's piece at i*chunk)."""
        return boxes_to_runs(self.send, [i * self.chunk for i in range(len(self.send))], self.in_shape)


def _reduced(kind: str, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> tuple[str, ...]:
    """The partial axes a reduction finishes (checked against ``axes`` when given)."""
    same_except(kind, src, dst, "a reduction never changes V axes")
    sp, dp = set(src.partial_axes), set(dst.partial_axes)
    if not sp or not dp <= sp:
        raise refuse(kind, src, dst, "it finishes pending reductions of the source (P axes)",
                     "the source needs {U:axis} (or P(op)) on the axes to reduce")
    if dp and dst.partial_op != src.partial_op:
        raise refuse(kind, src, dst, "the remaining pending reductions must keep their op", "keep P(op) as it is")
    gone = tuple(a for a, _ in src.axis_types if a in sp - dp)
    if axes is not None and set(axes) != set(gone):
        raise refuse(kind, src, dst, f"the types reduce axes {list(gone)}, not {list(axes)}",
                     f"pass axes={gone!r}, or leave axes out")
    check_whole_average(kind, src, dst, mesh)
    for a in gone:
        if dst.axis_type(a).kind in ("V",):
            raise refuse(kind, src, dst, f"axis {a!r} cannot become V", "reduce to R, I or a sharded dim")
    return gone if axes is None else tuple(axes)


@register
class ReduceScatter(StepKind):
    name = "reduce_scatter"
    collective = True
    reduces = True
    duals = {("P", "S"): "all_gather"}

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        gone = _reduced(self.name, src, dst, mesh, axes)
        added: list[str] = []
        dims: list[int] = []
        for k, (a, b) in enumerate(zip(src.dims, dst.dims)):
            if b.axes[: len(a.axes)] != a.axes:
                raise refuse(self.name, src, dst, f"dim {k} must keep its axes {list(a.axes)} as a prefix",
                             "a reduce_scatter appends the reduced axes to the minor end of dims")
            new = b.axes[len(a.axes):]
            if new:
                added += new
                dims.append(k)
        if set(added) != set(gone):
            raise refuse(self.name, src, dst, "every reduced axis must shard a dim of the destination",
                         "use all_reduce to reduce to R or I")
        return Signature(gone if axes is not None else tuple(added), tuple(dims), src.partial_op)

    def price(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        """A ring: (n-1) chunks of the largest piece when padded; unpadded, every piece
        but the rank's own (sent to its reducer)."""
        rows = group_rows(mesh, axes)
        pieces = local_numel(dst, mesh)[rows]
        if padded:
            return per_rank(mesh, rows, (rows.shape[1] - 1) * pieces.max(axis=1, keepdims=True))
        return per_rank(mesh, rows, pieces.sum(axis=1, keepdims=True) - pieces)

    def received(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
                 padded: bool = True) -> np.ndarray:
        """Its own piece from every other member (a chunk of the largest piece when padded)."""
        rows = group_rows(mesh, axes)
        pieces = local_numel(dst, mesh)[rows]
        if padded:
            pieces = np.broadcast_to(pieces.max(axis=1, keepdims=True), pieces.shape)
        return per_rank(mesh, rows, (rows.shape[1] - 1) * pieces)

    def moved(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        if padded:  # (n-1) chunks out, (n-1) chunks in
            return self.price(src, dst, mesh, axes, padded)
        return super().moved(src, dst, mesh, axes, padded)

    def padded(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> bool:
        pieces = box_numel(boxes(dst, mesh)[group_rows(mesh, axes)])
        return bool((pieces != pieces.max(axis=1, keepdims=True)).any())

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        dst_b = boxes(step.dst, mesh)
        me_in = boxes(step.src, mesh)[rank]
        in_shape = box_shape(me_in)
        send = pieces_of(members, dst_b[np.asarray(members, dtype=np.int64)], me_in, "src")
        sizes = [p.numel for p in send]
        n, chunk, even = len(members), max(sizes), len(set(sizes)) == 1
        if even or step.padded:
            direct = even and is_run([(p.src, p.numel) for p in send], in_shape, chunk)
            wire = wire_in = (n - 1) * chunk
        else:  # exact pieces: an all_to_all of the pieces, then a local reduction
            direct = False
            wire = sum(sizes) - sizes[members.index(rank)]
            wire_in = (n - 1) * sizes[members.index(rank)]
        return ScatterPieces(kind=self.name, rank=rank, in_shape=in_shape, out_shape=box_shape(dst_b[rank]),
                             members=members, wire_elems=wire, wire_in_elems=wire_in, send=tuple(send), chunk=chunk, even=even,
                             direct=direct)

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = []
        own = own_pieces(ScatterPieces, pieces)
        for p in own:
            at = p.me
            parts = [xs[q][own[q].send[at].src] for q in p.members]
            out.append(reduce_arrays(parts, step.op or "sum").astype(xs[p.rank].dtype))
        return out


@register
class AllReduce(StepKind):
    name = "all_reduce"
    collective = True
    reduces = True
    duals = {("P", "R"): "all_reduce", ("P", "I"): "reinterpret"}

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        gone = _reduced(self.name, src, dst, mesh, axes)
        if src.dims != dst.dims:
            raise refuse(self.name, src, dst, "the dims' sharding must stay the same",
                         "use reduce_scatter to reduce onto a sharded dim")
        return Signature(gone, (), src.partial_op)

    def price(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        """A ring all_reduce: 2(n-1)/n of the block, rounded up."""
        n = mesh.group_size(axes)
        return -(-(2 * (n - 1) * local_numel(src, mesh)) // n)

    def received(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
                 padded: bool = True) -> np.ndarray:
        """As much as it sends."""
        return self.price(src, dst, mesh, axes, padded)

    def moved(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        return self.price(src, dst, mesh, axes, padded)

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        shape = box_shape(boxes(step.src, mesh)[rank])
        n = len(members)
        wire = -(-(2 * (n - 1) * numel(shape)) // n)
        return RankPieces(kind=self.name, rank=rank, in_shape=shape, out_shape=shape, members=members,
                          wire_elems=wire, wire_in_elems=wire)

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [reduce_arrays([xs[q] for q in p.members], step.op or "sum").astype(xs[p.rank].dtype)
                for p in pieces]
