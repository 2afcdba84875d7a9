"""Local steps of the SPMD type system that change what the blocks *denote*.

``pcast``  no local tensor changes, but the denotation does (JAX's ``pcast``): the
           SPMD type system's reinterpret(R,V), reinterpret(V,P), reinterpret(R,P)::

               reinterpret(R,V)         reinterpret(V,P)       reinterpret(R,P)
                      A                 A      +A                     +A
               A  =>  A                 B  =>  +B              A  =>  +A     (= nA)
                      A                 C      +C                     +A

           Each is another pcast backwards: (R,V) <-> (V,P), and (R,P) is its own.

``stack``  V <-> S(d) of a new dim: the varying blocks of a group, stacked on a new
           dim ``d`` of the group's size, are that dim sharded by the group (a local
           ``unsqueeze(d)``); the other direction is a local ``squeeze(d)``::

               A                       [A]
               B  =>  [A, B, C]   ==   [B]    (each rank: A -> [A])
               C   (dim d sharded)     [C]

           Its dual is ``stack`` the other way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from lowering.kinds.base import RankPieces, Signature, StepKind, box_shape, refuse, register
from lowering.kinds.local import Relabel
from lowering.layout import boxes
from spec_lang.ir import Dim, Mesh, TensorType

if TYPE_CHECKING:
    from lowering.program import Step

# (from, to) local types a pcast takes; the second letter's gradient is the first's dual
PCASTS = {("R", "V"), ("V", "P"), ("R", "P")}


def _same_shell(kind: str, src: TensorType, dst: TensorType) -> None:
    if src.dtype != dst.dtype or src.dims != dst.dims:
        raise refuse(kind, src, dst, "dtype, shape and dim sharding must stay the same",
                     "a pcast only retypes mesh axes that shard no dim")


@register
class Pcast(Relabel):
    name = "pcast"
    planned = False
    duals = {("R", "V"): "pcast", ("V", "P"): "pcast", ("R", "P"): "pcast"}

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        _same_shell(self.name, src, dst)
        changed = []
        for a in mesh.names:
            s, d = src.axis_type(a), dst.axis_type(a)
            if s == d or src.dim_of(a) is not None:
                continue
            if (s.kind, d.kind) not in PCASTS or (d.kind == "P" and d.op != "sum"):
                raise refuse(self.name, src, dst, f"axis {a!r} goes from {s.code} to {d.code}",
                             "a pcast takes R to V, V to P or R to P (a pending sum); use reinterpret "
                             "for R <-> I, a collective to leave P")
            changed.append(a)
        if not changed:
            raise refuse(self.name, src, dst, "no axis changes its type", "the types are already equal")
        if axes is not None and set(axes) != set(changed):
            raise refuse(self.name, src, dst, f"the types change axes {changed}, not {list(axes)}",
                         f"pass axes={tuple(changed)!r}, or leave axes out")
        return Signature(tuple(changed) if axes is None else tuple(axes), ())


def stacked_dim(src: TensorType, dst: TensorType, mesh: Mesh) -> tuple[int, tuple[str, ...]] | None:
    """(d, group axes) when ``dst`` is ``src``'s V axes stacked on a new dim d, else None."""
    if dst.ndim != src.ndim + 1 or src.dtype != dst.dtype:
        return None
    for d, dim in enumerate(dst.dims):
        group = dim.axes
        if not group or dim.size != mesh.group_size(group) or dst.dims[:d] + dst.dims[d + 1:] != src.dims:
            continue
        if any(src.axis_type(a).kind != "V" for a in group):
            continue
        rest = tuple((a, t) for a, t in src.axis_types if a not in group)
        if set(rest) == set(dst.axis_types):
            return d, group
    return None


@register
class Stack(StepKind):
    name = "stack"
    planned = False
    duals = {("V", "S"): "stack", ("S", "V"): "stack"}

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        found = stacked_dim(src, dst, mesh) or stacked_dim(dst, src, mesh)
        if found is None:
            raise refuse(self.name, src, dst, "one side must be the other's V axes stacked on a new dim "
                         "of the group's size, sharded by exactly those axes",
                         "write the stacked side as f32[n@axes,...] with n the group size")
        d, group = found
        if axes is not None and tuple(axes) != group:
            raise refuse(self.name, src, dst, f"the types stack over {list(group)}, not {list(axes)}",
                         f"pass axes={group!r}, or leave axes out")
        return Signature(group, (d,))

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        return RankPieces(kind=self.name, rank=rank, in_shape=box_shape(boxes(step.src, mesh)[rank]),
                          out_shape=box_shape(boxes(step.dst, mesh)[rank]), members=(rank,))

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.array(x, copy=True).reshape(p.out_shape) for p, x in zip(pieces, xs)]


def stacked(t: TensorType, d: int, group: tuple[str, ...], mesh: Mesh) -> TensorType:
    """``t`` (V on ``group``) with its group stacked on a new dim ``d``."""
    dims = t.dims[:d] + (Dim(mesh.group_size(group), tuple(group)),) + t.dims[d:]
    return t.replace(dims=dims, axis_types=tuple((a, x) for a, x in t.axis_types if a not in group))
