"""The steps that cross from one mesh to another: a tensor on a source mesh moved to a
layout on a destination mesh over other (or overlapping) global ranks (``Mesh.ranks``).

A crossing is the last step of a cross-mesh Program (``lowering.cross_mesh`` plans it; its
``Step.dst_mesh`` names where ``dst`` lives). Its ranks are the global ranks of the world
``0 .. max rank`` of the two meshes; a rank off a mesh holds nothing of a type on it::

    send_across   one round: each piece a destination rank lacks, from one holder of it
                  (the holders of a replicated piece take turns)

        src mesh [0,1]: A | B         dst mesh [2,3]: AB | AB
        0 --A--> 2, 0 --A--> 3, 1 --B--> 2, 1 --B--> 3

    fan_out       two rounds: a piece wanted by k ranks crosses once, cut in k parts, one
                  to each (the scatter across), then each sends its part to the other
                  k-1 (the all_gather among them)

        0 --A0--> 2, 0 --A1--> 3;  then 2 --A0--> 3, 3 --A1--> 2

Type rule: the values are the same on every holder (R, I, or P finished before the
crossing) on both sides, one block a rank. Price: the bytes each world rank sends and
receives in each round (the plan's, ``CrossStep.bytes_sent``/``bytes_recv``: a crossing is
priced when it is planned, its messages depend on both meshes). Pieces: one rank's sends
and receives per round, rebuilt from its own blocks (``cross_mesh.rank_part``). Dual: the
crossing back, from ``dual(dst)`` on the destination mesh to ``dual(src)`` on the source,
planned by the one gradient rule (``lowering.planner.compile_gradient``), so ``duals`` is
empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from lowering.cross_mesh import (
    Box,
    CrossStep,
    Transfer,
    as_box,
    check_cross_types,
    cut,
    dst_block,
    one_block_each,
    rank_part,
    world_of,
)
from lowering.kinds.base import RankPieces, Signature, StepKind, numel, own_pieces, refuse, register
from spec_lang.ir import Mesh, TensorType

if TYPE_CHECKING:
    from lowering.program import Step


@dataclass(frozen=True, kw_only=True)
class CrossPieces(RankPieces):
    """One world rank's share of a crossing: per round, (what it sends, what it receives),
    and the global boxes of its source and destination blocks (None off that mesh)."""

    rounds: tuple[tuple[tuple[Transfer, ...], tuple[Transfer, ...]], ...]
    src_box: Box | None
    dst_box: Box | None


@register
class SendAcross(StepKind):
    name = "send_across"
    collective = True
    planned = False  # planned by lowering.cross_mesh, not by the one-mesh search
    crosses = True
    launches: ClassVar[int] = 1

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        if src.dtype != dst.dtype or src.shape != dst.shape:
            raise refuse(self.name, src, dst, "dtype and global shape must stay the same",
                         "a crossing moves the tensor's blocks, it changes no value")
        if src.partial_axes:
            raise refuse(self.name, src, dst, "the source is pending a sum",
                         "finish it on the source mesh first (lowering.compile(..., dst_mesh=) plans that)")
        check_cross_types(src, dst)
        return Signature((), ())

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        crossing = _crossing(step)
        assert crossing.dst_mesh is not None
        part = rank_part(crossing, mesh, rank)
        src_box = _own_box(step.src, mesh, rank)
        dst_box = _own_box(step.dst, crossing.dst_mesh, rank)
        return CrossPieces(
            kind=self.name, rank=rank, members=(rank,),
            in_shape=() if src_box is None else _extent(src_box),
            out_shape=() if dst_box is None else _extent(dst_box),
            wire_elems=sum(numel(_extent(t.box)) for sends, _ in part for t in sends),
            wire_in_elems=sum(numel(_extent(t.box)) for _, recvs in part for t in recvs),
            rounds=part, src_box=src_box, dst_box=dst_box)

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``xs`` and the result one per world rank: a rank off the source (destination)
        mesh holds nothing, an empty array. Each round's pieces are all cut before any lands."""
        ps = own_pieces(CrossPieces, pieces)
        held: list[list[tuple[Box, np.ndarray]]] = [
            [(p.src_box, x)] if p.src_box is not None else [] for p, x in zip(ps, xs, strict=True)]
        dtype = next((x.dtype for p, x in zip(ps, xs, strict=True) if p.src_box is not None), np.dtype(np.float32))
        for k in range(len(_crossing(step).rounds)):
            arrived = [(p.rank, t.box, cut(held[t.sender], t.box)) for p in ps for t in p.rounds[k][1]]
            for r, b, x in arrived:
                held[r].append((b, x))
        return [np.empty(0, dtype=dtype) if p.dst_box is None else
                dst_block(held[p.rank], p.dst_box, p.out_shape, step.dst.dtype, dtype) for p in ps]


@register
class FanOut(SendAcross):
    name = "fan_out"
    launches: ClassVar[int] = 2


def world_ranks(step: Step, mesh: Mesh) -> int:
    """How many world ranks the crossing ``step`` from ``mesh`` runs over."""
    crossing = _crossing(step)
    assert crossing.dst_mesh is not None
    return world_of(mesh, crossing.dst_mesh)


def _crossing(step: Step) -> CrossStep:
    if not isinstance(step, CrossStep):
        raise TypeError(f"a {step.kind} step is a crossing planned by lowering.compile(..., dst_mesh=), "
                        f"got a {type(step).__name__}")
    return step


def _own_box(t: TensorType, mesh: Mesh, rank: int) -> Box | None:
    ranks = mesh.global_ranks
    if rank not in ranks:
        return None
    return as_box(one_block_each(t, mesh)[ranks.index(rank)])


def _extent(box: Box) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in box)

