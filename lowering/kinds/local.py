"""Local steps: no bytes on the wire, each rank rewrites its own block.

``slice``        keep this rank's dst block of its src block (convert(R|I, S))::

                            [A0]
                [A0,A1,A2]  =>  [A1]
                            [A2]

``zero_fill``    convert(R|I, P(sum)): ranks off coordinate 0 on ``axes`` become zeros::

                        +[A]
                [A]  => +[0]
                        +[0]

``zero_pad``     convert(S(d), P(sum)): the block is placed in a zero block the size of its
                 parent (``axes`` no longer shard d, they are P)::

                [A]      +[A, 0, 0]
                [B]  =>  +[0, B, 0]
                [C]      +[0, 0, C]

``divide``       convert(R|I, P(sum)) as DTensor's ``Partial`` partitions a value: every
                 rank holds its share ``v/n`` (``n`` the size of ``axes``' group); not
                 planned, the DTensor engine builds it to give DTensor's local values::

                        +[A/3]
                [A]  => +[A/3]
                        +[A/3]

``reinterpret``  no local tensor changes (R <-> I, and R|I -> P(avg|max|min), whose
                 reduction of equal copies is the copy itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lowering.kinds.base import (
    RankPieces,
    Signature,
    Slices,
    StepKind,
    box_shape,
    erase,
    own_pieces,
    refuse,
    register,
    rel,
    replicated_axes,
    same_except,
)
from lowering.layout import boxes, local_shapes
from spec_lang.ir import INTEGER_DTYPES, Mesh, TensorType

if TYPE_CHECKING:
    from lowering.program import Step


@dataclass(frozen=True, kw_only=True)
class RegionPieces(RankPieces):
    region: Slices  # slice: the kept part of the input; zero_pad: where the input lands


@dataclass(frozen=True, kw_only=True)
class FillPieces(RankPieces):
    keep: bool  # zero_fill: this rank keeps its values (else zeros)


def keeps_values(mesh: Mesh, axes: Sequence[str], rank: int) -> bool:
    """Under convert(R, P(sum)) the value stays on coordinate 0 of ``axes``; other ranks hold 0.

    The one place this rule lives: zero_fill steps and ``distribute`` of a P(sum) type use it.
    """
    c = mesh.coords(rank)
    return all(c[mesh.index(a)] == 0 for a in axes)


def _given(axes: tuple[str, ...] | None, derived: tuple[str, ...], kind: str, src: TensorType,
           dst: TensorType) -> tuple[str, ...]:
    if axes is not None and set(axes) != set(derived):
        raise refuse(kind, src, dst, f"the types change axes {list(derived)}, not {list(axes)}",
                     f"pass axes={derived!r}, or leave axes out")
    return derived if axes is None else tuple(axes)


@register
class Slice(StepKind):
    name = "slice"
    # convert(I, S) <- all_gather(S, I); convert(R, S) <- convert(S, P) (zero padding)
    duals = {("I", "S"): "all_gather", ("R", "S"): "zero_pad"}

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        same_except(self.name, src, dst, "slicing never changes V axes")
        es, ed = erase(src), erase(dst)
        if set(es.axis_types) != set(ed.axis_types):
            raise refuse(self.name, src, dst, "partial axes must stay the same", "reduce or convert separately")
        free = set(replicated_axes(src, mesh))
        added: list[str] = []
        dims: list[int] = []
        for k, (a, b) in enumerate(zip(src.dims, dst.dims)):
            if b.axes[: len(a.axes)] != a.axes:
                raise refuse(self.name, src, dst, f"dim {k} must keep its axes {list(a.axes)} as a prefix",
                             "a slice adds mesh axes to the minor end of a dim")
            new = b.axes[len(a.axes):]
            for x in new:
                if x not in free:
                    raise refuse(self.name, src, dst, f"mesh axis {x!r} is not replicated in the source",
                                 "only an R or I axis can be sliced onto a dim")
            if new:
                added += new
                dims.append(k)
        if not added:
            raise refuse(self.name, src, dst, "no dim gains a mesh axis", "the types are already equal")
        return Signature(_given(axes, tuple(added), self.name, src, dst), tuple(dims))

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        a, b = boxes(step.src, mesh)[rank], boxes(step.dst, mesh)[rank]
        return RegionPieces(kind=self.name, rank=rank, in_shape=box_shape(a), out_shape=box_shape(b),
                            members=(rank,), region=rel(b, a))

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.array(x[p.region], copy=True) for p, x in zip(own_pieces(RegionPieces, pieces), xs)]


@register
class ZeroFill(StepKind):
    name = "zero_fill"
    # convert(R, P) <- convert(R, P); convert(I, P) <- reinterpret(R, I)
    duals = {("R", "P"): "zero_fill", ("I", "P"): "reinterpret"}

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        new = _new_partial(self.name, src, dst, mesh)
        if dst.partial_op != "sum":
            raise refuse(self.name, src, dst, "zero filling makes a pending sum, not a pending "
                         f"{dst.partial_op}", "use reinterpret for P(avg|max|min): equal copies reduce to the copy")
        return Signature(_given(axes, new, self.name, src, dst), ())

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        shape = box_shape(boxes(step.src, mesh)[rank])
        return FillPieces(kind=self.name, rank=rank, in_shape=shape, out_shape=shape, members=(rank,),
                          keep=keeps_values(mesh, step.axes, rank))

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.array(x, copy=True) if p.keep else np.zeros_like(x)
                for p, x in zip(own_pieces(FillPieces, pieces), xs)]


@dataclass(frozen=True, kw_only=True)
class SharePieces(RankPieces):
    divisor: int  # divide: the group's size, each rank's share of the value


@register
class Divide(StepKind):
    name = "divide"
    planned = False
    # convert(R, P) <- convert(R, P) (the gradient's share of each rank); convert(I, P) <- reinterpret(R, I)
    duals = {("R", "P"): "divide", ("I", "P"): "reinterpret"}

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        new = _new_partial(self.name, src, dst, mesh)
        if dst.partial_op != "sum":
            raise refuse(self.name, src, dst, f"dividing makes a pending sum, not a pending {dst.partial_op}",
                         "use reinterpret for P(avg|max|min): equal copies reduce to the copy")
        if dst.dtype in INTEGER_DTYPES or dst.dtype == "bool":
            raise refuse(self.name, src, dst, f"{dst.dtype} cannot hold a share v/n exactly",
                         "use zero_fill, which keeps the value on one rank")
        return Signature(_given(axes, new, self.name, src, dst), ())

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        shape = box_shape(boxes(step.src, mesh)[rank])
        return SharePieces(kind=self.name, rank=rank, in_shape=shape, out_shape=shape, members=(rank,),
                           divisor=mesh.group_size(step.axes))

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [(x / p.divisor).astype(x.dtype) for p, x in zip(own_pieces(SharePieces, pieces), xs)]


def _new_partial(kind: str, src: TensorType, dst: TensorType, mesh: Mesh) -> tuple[str, ...]:
    """The axes a convert into P adds; everything else must stay as it is."""
    same_except(kind, src, dst, "a convert never changes V axes")
    if src.dims != dst.dims:
        raise refuse(kind, src, dst, "the dims' sharding must stay the same", "slice or gather separately")
    sp, dp = set(src.partial_axes), set(dst.partial_axes)
    if not sp <= dp or (sp and src.partial_op != dst.partial_op):
        raise refuse(kind, src, dst, "pending reductions of the source must stay pending",
                     "reduce them in a separate step")
    free = set(replicated_axes(src, mesh))
    new = tuple(a for a in mesh.names if a in dp - sp)
    if not new or not set(new) <= free:
        raise refuse(kind, src, dst, "it turns replicated (R or I) axes into partial ones",
                     "name the R/I axes that become P in the destination")
    return new


@register
class ZeroPad(StepKind):
    name = "zero_pad"
    duals = {("S", "P"): "slice"}  # convert(S, P) <- convert(R, S)

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        same_except(self.name, src, dst, "a convert never changes V axes")
        if dst.partial_op not in (None, "sum") or (src.partial_op and src.partial_op != dst.partial_op):
            raise refuse(self.name, src, dst, "zero padding makes a pending sum", "convert S to P(sum) only")
        removed: list[str] = []
        dims: list[int] = []
        for k, (a, b) in enumerate(zip(src.dims, dst.dims)):
            if a.axes[: len(b.axes)] != b.axes:
                raise refuse(self.name, src, dst, f"dim {k} must keep a prefix of its axes",
                             "zero padding removes mesh axes from the minor end of a dim")
            gone = a.axes[len(b.axes):]
            if gone:
                removed += gone
                dims.append(k)
        new = set(dst.partial_axes) - set(src.partial_axes)
        if not removed or set(removed) != new:
            raise refuse(self.name, src, dst, "the axes removed from the dims must become P(sum) axes",
                         "write the removed axes as {U:axis} in the destination")
        return Signature(_given(axes, tuple(removed), self.name, src, dst), tuple(dims))

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        a, b = boxes(step.src, mesh)[rank], boxes(step.dst, mesh)[rank]
        return RegionPieces(kind=self.name, rank=rank, in_shape=box_shape(a), out_shape=box_shape(b),
                            members=(rank,), region=rel(a, b))

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = []
        for p, x in zip(own_pieces(RegionPieces, pieces), xs):
            y = np.zeros(p.out_shape, dtype=x.dtype)
            y[p.region] = x
            out.append(y)
        return out


class Relabel(StepKind):
    """A local kind that changes types only: every rank keeps its tensor as it is."""

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        shape = local_shapes(step.src, mesh)[rank]  # uneven types too: a relabel moves nothing
        return RankPieces(kind=self.name, rank=rank, in_shape=shape, out_shape=shape, members=(rank,))

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.array(x, copy=True) for x in xs]


@register
class Reinterpret(Relabel):
    name = "reinterpret"
    # reinterpret(R, I) <- convert(I, P); reinterpret(I, R) <- all_reduce(I);
    # reinterpret(R|I, P(op)) <- convert(R|I, P) (the gradient of P(op) is R)
    duals = {("I", "R"): "all_reduce", ("R", "I"): "zero_fill", ("R", "P"): "zero_fill", ("I", "P"): "zero_fill"}

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        same_except(self.name, src, dst, "reinterpret V in local code, outside a redistribution")
        if src.dims != dst.dims:
            raise refuse(self.name, src, dst, "the dims' sharding must stay the same", "slice or gather separately")
        changed = []
        for a in mesh.names:
            s, d = src.axis_type(a), dst.axis_type(a)
            if s == d or src.dim_of(a) is not None:
                continue
            if s.kind in ("R", "I") and (d.kind in ("R", "I") or (d.kind == "P" and d.op != "sum")):
                changed.append(a)
                continue
            raise refuse(self.name, src, dst, f"axis {a!r} goes from {s.code} to {d.code}, which changes the value",
                         "reinterpret keeps every local tensor: it turns R into I (or back), or R into "
                         "P(avg|max|min); use zero_fill for R -> P(sum) and a collective to leave P")
        if not changed:
            raise refuse(self.name, src, dst, "no axis changes its type", "the types are already equal")
        return Signature(_given(axes, tuple(changed), self.name, src, dst), ())
