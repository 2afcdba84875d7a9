"""``all_gatherv``: every rank of a group gathers the group's uneven pieces, around a ring.

A gather (the group's axes shard the source and replicate the destination) sent directly
makes a rank send its piece to every peer: (n-1) times its piece, the most for the rank
with the biggest piece. Around a ring each rank forwards what it received, so it sends
every piece but its successor's once, whatever the skew, and receives exactly what it
lacks (the byte bound)::

    r0 [a a a]        round 1: r0->r1 a, r1->r2 b, r2->r0 c     [a a a b c c c c]
    r1 [b]        =>  round 2: r0->r1 c, r1->r2 a, r2->r0 b  => [a a a b c c c c]
    r2 [c c c c]                                                 [a a a b c c c c]

Each piece travels at its exact size, never padded. ``slicev`` is the exchange in which
no rank sends anything (a replicated source cut to an uneven split): local.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lowering.kinds.base import RankPieces, Signature, refuse, register
from lowering.kinds.copies import Copy, View, plan_copies, run_view
from lowering.kinds.uneven_exchange import AllToAllV, _meet, _numel, _simulate, _view
from lowering.layout import _groups, meet_numel, rank_layout, stacked_blocks
from spec_lang.ir import Mesh, TensorType

if TYPE_CHECKING:
    from lowering.program import Step


def is_gather(src: TensorType, dst: TensorType, axes: tuple[str, ...]) -> bool:
    """Every group axis shards the source and replicates the destination (no pending sums):
    every member then needs the same pieces, the group's whole share of the destination."""
    return bool(axes) and all(
        src.dim_of(a) is not None and dst.dim_of(a) is None
        and a not in src.partial_axes and a not in dst.partial_axes for a in axes
    )


@dataclass(frozen=True, kw_only=True)
class GatherVPieces(RankPieces):
    """One rank's ring: every member's segment size (process-group order), how to pack its
    own segment, and how to unpack the gathered buffer (all segments back to back)."""

    segments: tuple[int, ...]
    pack_copies: tuple[Copy, ...]  # input -> own segment (a flat run from 0)
    unpack_copies: tuple[Copy, ...]  # ring buffer -> output

    @property
    def send_elems(self) -> int:
        return self.wire_elems

    @property
    def recv_elems(self) -> int:
        """Every segment but its own: exactly what it lacks."""
        return sum(self.segments) - self.segments[self.position]

    @property
    def position(self) -> int:
        return self.members.index(self.rank)

    @property
    def offsets(self) -> tuple[int, ...]:
        out, o = [], 0
        for s in self.segments:
            out.append(o)
            o += s
        return tuple(out)


def _segment(step: Step, mesh: Mesh, q: int) -> list[tuple[int, int, np.ndarray]]:
    """Member q's segment: its source blocks met with the (shared) destination blocks."""
    return _meet(rank_layout(step.src, mesh, q), rank_layout(step.dst, mesh, q))


def _ring_price(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """Per rank: every segment of its group but its successor's."""
    seg = meet_numel(stacked_blocks(src, mesh), stacked_blocks(dst, mesh)).astype(np.int64)
    out = np.zeros(mesh.size, dtype=np.int64)
    for members in _groups(mesh, axes)[1]:
        ranks = np.sort(members)  # process-group order
        s = seg[ranks]
        out[ranks] = s.sum() - np.roll(s, -1)
    return out


@register
class AllGatherV(AllToAllV):
    name = "all_gatherv"

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        sig = super().infer(src, dst, mesh, axes)
        if not is_gather(src, dst, sig.axes):
            raise refuse(self.name, src, dst, "the group's axes must shard the source and replicate the destination",
                         "use all_to_allv")
        return sig

    def refine(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> str:
        return self.name

    def price(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        return _ring_price(src, dst, mesh, axes)

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        out_lay = rank_layout(step.dst, mesh, rank)
        in_lay = rank_layout(step.src, mesh, rank)
        segments, unpack = [], []
        base = 0
        pack: list[tuple[View, View]] = []
        for q in members:
            n = 0
            src_q = rank_layout(step.src, mesh, q)
            for i, j, box in _meet(src_q, out_lay):
                shape = tuple(int(x) for x in box[:, 1] - box[:, 0])
                unpack.append((run_view(base + n, shape), _view(out_lay, j, box)))
                if q == rank:
                    pack.append((_view(in_lay, i, box), run_view(n, shape)))
                n += _numel(box)
            segments.append(n)
            base += n
        i = members.index(rank)
        wire = base - segments[(i + 1) % len(members)] if len(members) > 1 else 0
        return GatherVPieces(kind=step.kind, rank=rank, in_shape=in_lay.shape, out_shape=out_lay.shape,
                             members=members, wire_elems=wire, segments=tuple(segments),
                             pack_copies=plan_copies(pack), unpack_copies=plan_copies(unpack))

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        from lowering.kinds.uneven_exchange import _apply

        own = {}
        for p in pieces:
            x = np.ascontiguousarray(xs[p.rank]).reshape(-1)
            seg = np.zeros(p.segments[p.position], dtype=x.dtype)  # type: ignore[attr-defined]
            _apply(p.pack_copies, x, seg, None)  # type: ignore[attr-defined]
            own[p.rank] = seg
        out = []
        for p in pieces:
            buf = np.concatenate([own[q] for q in p.members])
            y = np.zeros(int(np.prod(p.out_shape)), dtype=buf.dtype)
            _apply(p.unpack_copies, buf, y, None)  # type: ignore[attr-defined]
            out.append(y.reshape(p.out_shape))
        return out


@register
class SliceV(AllToAllV):
    """An exchange in which nothing leaves any rank: each keeps (or zero-fills) its part."""

    name = "slicev"
    collective = False

    def refine(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> str:
        return self.name

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        sig = super().infer(src, dst, mesh, axes)
        if AllToAllV.price(self, src, dst, mesh, sig.axes).any():
            raise refuse(self.name, src, dst, "some rank must receive data", "use all_to_allv")
        return sig

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return _simulate(step, pieces, xs, None, 1)


def refine_exchange(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...], sent: np.ndarray) -> str:
    """The kind an exchange runs as: local when nothing moves, a ring for a gather."""
    if not sent.any():
        return SliceV.name
    if is_gather(src, dst, axes):
        return AllGatherV.name
    return AllToAllV.name

