"""``all_gather``: every member of the group ends up with the union of the members' blocks.

Over ``axes`` (one flattened group when there are several), the minor suffix of each
dim's axis list that lies in ``axes`` is dropped; each member's block lands at its place
in the gathered block, which the members' blocks tile::

    [A]
    [B]  =>  [A, B, C]
    [C]

The gathered axes become R or I. Gradient: ``all_gather(S, R)`` is
``reduce_scatter(P, S)`` backwards; ``all_gather(S, I)`` is a local slice backwards.

On the wire: equal blocks go as one ``all_gather_single`` ((n-1)*b per rank); uneven
blocks as an exact ring in the step's group order (total - b(successor)), never padded.
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
    erase,
    is_run,
    own_pieces,
    pieces_of,
    refuse,
    register,
    same_except,
)
from lowering.kinds.copies import Copy, back_to_back, runs_to_boxes
from lowering.kinds.rows import group_rows, per_rank
from lowering.layout import boxes, group_ranks, local_numel
from spec_lang.ir import Mesh, TensorType

if TYPE_CHECKING:
    from lowering.program import Step


@dataclass(frozen=True, kw_only=True)
class GatherPieces(RankPieces):
    recv: tuple[Piece, ...]  # per member (process-group order): its block and where it lands
    ring: tuple[Piece, ...]  # per member in the step's group order (the uneven ring)
    listed: tuple[int, ...]  # the step's group order
    chunk: int  # the largest member block
    even: bool
    direct: bool  # the members' blocks lie back to back in the output: gather straight into it

    @cached_property
    def place_copies(self) -> tuple[Copy, ...]:
        """The even gather's buffer (member i at i*chunk) -> output block."""
        return runs_to_boxes(self.recv, [i * self.chunk for i in range(len(self.recv))], self.out_shape)

    @cached_property
    def ring_copies(self) -> tuple[Copy, ...]:
        """The ring's buffer (blocks back to back in the group order) -> output block."""
        return runs_to_boxes(self.ring, back_to_back(self.ring), self.out_shape)


@register
class AllGather(StepKind):
    name = "all_gather"
    collective = True
    duals = {("S", "R"): "reduce_scatter", ("S", "I"): "slice"}

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        same_except(self.name, src, dst, "a gather never changes V axes")
        if set(erase(src).axis_types) != set(erase(dst).axis_types):
            raise refuse(self.name, src, dst, "pending reductions must stay the same",
                         "reduce with all_reduce or reduce_scatter instead")
        removed: list[str] = []
        dims: list[int] = []
        for k, (a, b) in enumerate(zip(src.dims, dst.dims)):
            if a.axes[: len(b.axes)] != b.axes:
                raise refuse(self.name, src, dst, f"dim {k} must keep a prefix of its axes {list(a.axes)}",
                             "an all_gather removes mesh axes from the minor end of a dim; "
                             "use all_to_all to move them")
            gone = a.axes[len(b.axes):]
            if gone:
                removed += gone
                dims.append(k)
        if not removed:
            raise refuse(self.name, src, dst, "no dim loses a mesh axis", "nothing to gather")
        if axes is not None and set(axes) != set(removed):
            raise refuse(self.name, src, dst, f"the types gather axes {removed}, not {list(axes)}",
                         f"pass axes={tuple(removed)!r}, or leave axes out")
        return Signature(tuple(removed) if axes is None else tuple(axes), tuple(dims))

    def price(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        """A ring over the group: each rank sends every block but its successor's."""
        rows = group_rows(mesh, axes)
        pieces = local_numel(src, mesh)[rows]  # (G, n)
        successor = np.concatenate((pieces[:, 1:], pieces[:, :1]), axis=1)
        return per_rank(mesh, rows, pieces.sum(axis=1, keepdims=True) - successor)

    def received(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
                 padded: bool = True) -> np.ndarray:
        """Every block of the group but its own."""
        rows = group_rows(mesh, axes)
        pieces = local_numel(src, mesh)[rows]
        return per_rank(mesh, rows, pieces.sum(axis=1, keepdims=True) - pieces)

    def moved(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        """The group's total less the smaller of its own block and its successor's."""
        rows = group_rows(mesh, axes)
        pieces = local_numel(src, mesh)[rows]
        successor = np.concatenate((pieces[:, 1:], pieces[:, :1]), axis=1)
        return per_rank(mesh, rows, pieces.sum(axis=1, keepdims=True) - np.minimum(pieces, successor))

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        src_b = boxes(step.src, mesh)
        me_out = boxes(step.dst, mesh)[rank]
        out_shape = box_shape(me_out)
        listed = group_ranks(mesh, step.axes, rank) if members != (rank,) else (rank,)

        recv = pieces_of(members, src_b[np.asarray(members, dtype=np.int64)], me_out, "dst")
        by_peer = {p.peer: p for p in recv}
        ring = tuple(by_peer[q] for q in listed)
        sizes = [p.numel for p in recv]
        even = len(set(sizes)) == 1
        if even:
            direct = is_run([(p.dst, p.numel) for p in recv], out_shape, sizes[0])
            wire = (len(members) - 1) * sizes[0]
        else:
            direct = is_run([(p.dst, p.numel) for p in ring], out_shape, None)
            i = listed.index(rank)
            wire = sum(sizes) - ring[(i + 1) % len(ring)].numel
        return GatherPieces(kind=self.name, rank=rank, in_shape=box_shape(src_b[rank]), out_shape=out_shape,
                            members=members, wire_elems=wire, wire_in_elems=sum(sizes) - sizes[members.index(rank)], recv=recv, ring=ring, listed=listed,
                            chunk=max(sizes), even=even, direct=direct)

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = []
        for p in own_pieces(GatherPieces, pieces):
            y = np.zeros(p.out_shape, dtype=xs[p.rank].dtype)
            filled = 0
            for pc in p.recv:
                if pc.numel:
                    y[pc.dst] = xs[pc.peer].reshape(pc.shape)
                    filled += pc.numel
            if filled != y.size:
                raise AssertionError(f"{step.describe()}: rank {p.rank} got {filled} of {y.size} elements")
            out.append(y)
        return out
