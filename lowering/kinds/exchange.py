"""``all_to_all`` and ``permute``: exact box exchange within a group.

Rank r's dst block is assembled from the pieces (src block of q) ∩ (dst block of r) of
its group members q, whose src blocks are disjoint. Covers S(i) -> S(j) and any
reordering of mesh axes inside a dim::

    [A0, A1, A2]      [A0, B0, C0]
    [B0, B1, B2]  =>  [A1, B1, C1]
    [C0, C1, C2]      [A2, B2, C2]

A ``permute`` is an all_to_all in which every rank hears from at most one peer
(``8@(dp,tp)`` -> ``8@(tp,dp)``): point-to-point sends on a real group. Each is its own
gradient, run the other way.
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
    numel,
    own_pieces,
    pieces_of,
    refuse,
    register,
    rel,
    same_except,
)
from lowering.kinds.copies import (
    Copy,
    as_run,
    back_to_back,
    box_view,
    boxes_to_runs,
    plan_copies,
    runs_to_boxes,
)
from lowering.kinds.exchange_geometry import exchange_bytes, max_senders_per_receiver, received_elems
from lowering.layout import box_numel, boxes, local_numel, overlap, own_overlap_numel
from spec_lang.ir import Mesh, TensorType

if TYPE_CHECKING:
    from lowering.program import Step


@dataclass(frozen=True, kw_only=True)
class ExchangePieces(RankPieces):
    send: tuple[Piece, ...]  # per member (process-group order); the own piece is empty
    recv: tuple[Piece, ...]
    self_piece: Piece  # what this rank keeps, copied locally

    # copy plans, built on first use (the simulator never needs them)
    @cached_property
    def pack_copies(self) -> tuple[Copy, ...]:
        """Input block -> flat send buffer (the send pieces back to back)."""
        return boxes_to_runs(self.send, back_to_back(self.send), self.in_shape)

    @cached_property
    def unpack_copies(self) -> tuple[Copy, ...]:
        """Flat receive buffer -> output block."""
        return runs_to_boxes(self.recv, back_to_back(self.recv), self.out_shape)

    @cached_property
    def self_copies(self) -> tuple[Copy, ...]:
        """Input block -> output block: the piece this rank keeps."""
        sp = self.self_piece
        if not sp.numel:  # an empty piece has no slices
            return ()
        return plan_copies([(box_view(sp.src, self.in_shape), box_view(sp.dst, self.out_shape))])

    @property
    def send_elems(self) -> int:
        return self.wire_elems

    @cached_property
    def send_run(self) -> int | None:
        """Where the send pieces lie back to back in the input (the send buffer is a view)."""
        return as_run(self.pack_copies, self.send_elems)

    @cached_property
    def recv_run(self) -> int | None:
        """Where the received pieces lie back to back in the output (received straight there)."""
        return as_run(self.unpack_copies, self.recv_elems, into=True)

    @cached_property
    def recv_elems(self) -> int:
        return sum(p.numel for p in self.recv)


def involved_axes(a: TensorType, b: TensorType, mesh: Mesh) -> tuple[str, ...]:
    """Axes whose block position differs between a and b (past each dim's common prefix)."""
    out: set[str] = set()
    for da, db in zip(a.dims, b.dims):
        p = 0
        while p < min(len(da.axes), len(db.axes)) and da.axes[p] == db.axes[p]:
            p += 1
        out.update(da.axes[p:])
        out.update(db.axes[p:])
    return tuple(x for x in mesh.names if x in out)


@register
class AllToAll(StepKind):
    name = "all_to_all"
    collective = True
    # the group shards the source; the destination may replicate some of it (a partial gather)
    duals = {("S", "S"): "all_to_all", ("S", "R"): "all_to_all", ("S", "I"): "all_to_all"}

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        same_except(self.name, src, dst, "an exchange never changes V axes")
        if set(erase(src).axis_types) != set(erase(dst).axis_types):
            raise refuse(self.name, src, dst, "pending reductions must stay the same",
                         "reduce with all_reduce or reduce_scatter instead")
        moved = involved_axes(src, dst, mesh)
        if not moved:
            raise refuse(self.name, src, dst, "no block moves", "the layouts are already equal")
        group = moved if axes is None else tuple(axes)
        if not set(moved) <= set(group) or not set(group) <= set(src.sharded_axes):
            raise refuse(self.name, src, dst, f"the group must cover the moved axes {list(moved)} "
                         "and shard the source (the members' blocks must be disjoint)",
                         f"pass axes={moved!r}, or leave axes out; gather an axis the source replicates")
        have = received_elems(src, dst, mesh, group)
        if (have != box_numel(boxes(dst, mesh))).any():
            raise refuse(self.name, src, dst, "the group's source blocks do not tile every destination block",
                         "a rank would need data from outside the group: add the axes it comes over")
        dims = tuple(k for k, (a, b) in enumerate(zip(src.dims, dst.dims)) if a.axes != b.axes)
        return Signature(group, dims)

    def refine(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> str:
        return "permute" if max_senders_per_receiver(src, dst, mesh, axes) <= 1 else self.name

    def price(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        """Exactly the elements leaving each rank."""
        return exchange_bytes(src, dst, mesh, axes)

    def received(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
                 padded: bool = True) -> np.ndarray:
        """Its destination block less what it keeps (the group tiles every destination block)."""
        return local_numel(dst, mesh) - own_overlap_numel(src, dst, mesh)

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        src_b, dst_b = boxes(step.src, mesh), boxes(step.dst, mesh)
        me_in, me_out = src_b[rank], dst_b[rank]
        peers = np.asarray(members, dtype=np.int64)
        send = list(pieces_of(members, overlap(me_in[None], dst_b[peers]), me_in, "src"))
        recv = list(pieces_of(members, overlap(src_b[peers], me_out[None]), me_out, "dst"))
        i = members.index(rank)  # the own piece is copied locally, not sent
        send[i] = Piece(rank, (), (), send[i].shape, 0)
        recv[i] = Piece(rank, (), (), recv[i].shape, 0)
        own = overlap(me_in, me_out)
        self_piece = Piece(rank, rel(own, me_in), rel(own, me_out), box_shape(own), numel(box_shape(own)))
        return ExchangePieces(kind=step.kind, rank=rank, in_shape=box_shape(me_in), out_shape=box_shape(me_out),
                              members=members, wire_elems=sum(p.numel for p in send),
                              wire_in_elems=sum(p.numel for p in recv), send=tuple(send),
                              recv=tuple(recv), self_piece=self_piece)

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = []
        own = own_pieces(ExchangePieces, pieces)
        for p in own:
            y = np.zeros(p.out_shape, dtype=xs[p.rank].dtype)
            sp = p.self_piece
            y[sp.dst] = xs[p.rank][sp.src]
            filled = sp.numel
            for pc in p.recv:
                if pc.numel:
                    sent = own[pc.peer].send[p.me]
                    y[pc.dst] = xs[pc.peer][sent.src]
                    filled += pc.numel
            if filled != y.size:
                raise AssertionError(f"{step.describe()}: rank {p.rank} got {filled} of {y.size} elements")
            out.append(y)
        return out


@register
class Permute(AllToAll):
    """An all_to_all with at most one sender per receiver (priced and simulated alike)."""

    name = "permute"

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        sig = super().infer(src, dst, mesh, axes)
        if max_senders_per_receiver(src, dst, mesh, sig.axes) > 1:
            raise refuse(self.name, src, dst, "some rank hears from more than one peer", "use all_to_all")
        return sig

    def refine(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> str:
        return self.name
