"""Prepared redistributions: everything about a call that does not depend on the tensor,
done once, so that a training loop's hundreds of calls per step pay only for the data.

    f = torch_backend.redistributor("f32[8@dp,16]", "f32[8,16]", "dp=2,tp=4")
    y = f(x)   # == redistribute(x, "f32[8@dp,16]", "f32[8,16]", "dp=2,tp=4"), bit for bit
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import partial
from typing import Any

import torch

from lowering.cross_mesh import CrossProgram
from lowering.program import Program
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType
from torch_backend import mesh_transfer, traced
from torch_backend.api import (
    Door,
    agreed_bound,
    agreeing,
    async_entries,
    bound_for,
    through_door,
)
from torch_backend.bound import BoundCall


class Redistributor:
    """A compiled, bound redistribution; call it on this rank's block."""

    def __init__(self, bound: BoundCall, agree: bool | None = None) -> None:
        self._bound = bound
        self._agree = agree

    @property
    def program(self) -> Program:
        return self._bound.program

    @property
    def src(self) -> TensorType:
        return self._bound.program.src

    @property
    def dst(self) -> TensorType:
        return self._bound.program.dst

    def __call__(self, x: torch.Tensor, *, async_op: bool = False) -> Any:
        """This rank's block of the destination (with ``async_op``, a handle whose ``wait()`` gives it)."""
        return through_door(PREPARED, x, self, None, None, None, self._agree, async_op, None, self._bound)

    # a constant of a compiled region (``torch_backend.traced``), guarded on identity
    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"Redistributor({self.src} -> {self.dst} on {self.program.mesh})"


traced.entry("prepared")(lambda prepared, x: prepared(x))
async_entries("prepared", lambda prepared: prepared._bound)
torch.utils._pytree.register_constant(Redistributor)


def _compiled(x: Any, prepared: Redistributor, _: None, __: None, *, async_op: bool, **___: Any) -> Any:
    from torch_backend import trace_marks

    return trace_marks.call("prepared", prepared, x, async_op=async_op)


# a Redistributor stands as its own source type (its bound call holds the types and the mesh);
# its fast path is api.redistribute's without the lookup
PREPARED = Door(_compiled, lambda x, _, __, ___, bound: bound.hot(x),
                lambda x, _, __, ___, bound: ([x], (bound.program.src,), (bound.program.dst,), bound.program.mesh))


def redistributor(src: TensorType | str, dst: TensorType | str, mesh: Mesh | str | Any, *,
                  timeout: timedelta | float | None = None, agree: bool | None = None,
                  dst_mesh: Mesh | str | Any | None = None, requires_grad: bool = False) -> Any:
    """Prepare ``redistribute(x, src, dst, mesh)`` for many calls: every check that does not
    depend on the tensor runs here (and, with ``agree``, the agreement, before the groups are
    made); each call checks only the tensor and runs, the backward bound at the first backward.

    ``dst_mesh=``: a ``CrossRedistributor`` moving the tensor to ``dst`` on another mesh
    (``redistribute(..., dst_mesh=)``; its ranks always agree, here, over the world).
    ``requires_grad=True`` (alike on every rank; cross-mesh only): its calls in grad mode
    carry a gradient, whose groups are made now (see ``mesh_transfer.prepare``).
    """
    if dst_mesh is not None:
        return CrossRedistributor(mesh_transfer.prepare([src], [dst], mesh, dst_mesh, timeout, requires_grad))
    if requires_grad is not False:
        raise SpecError("requires_grad= is for a move across meshes (with dst_mesh=)",
                        hint="drop it: a call on one mesh carries a gradient whenever its tensor requires grad")
    bound = agreed_bound(None, (src,), (dst,), mesh, timeout)[0] if agreeing(agree) else \
        bound_for((src,), (dst,), mesh, timeout)
    return Redistributor(bound.prepared(), agree)


class CrossRedistributor:
    """Compiled cross-mesh moves (one tensor, or several where ``many``), bound once; call it
    on this rank's block(s), None off the source mesh. Agreed when prepared, each call checks
    its blocks on its own rank only (an all_reduce over the world per call would cost more
    than the move: 8 ranks on 2 cores, 20 ms)."""

    def __init__(self, bounds: list[BoundCall], many: bool = False) -> None:
        self._bounds, self.many = bounds, many  # without a gradient, and (requires_grad) with one

    @property
    def programs(self) -> tuple[CrossProgram, ...]:
        return tuple(CrossProgram(p) for p in self._bounds[0].programs)

    @property
    def program(self) -> CrossProgram:
        return self.programs[0]

    def __call__(self, x: Any) -> Any:
        bound = self._bounds[-1] if torch.is_grad_enabled() else self._bounds[0]
        return through_door(CROSS_MANY if self.many else CROSS, x, self, None, None, None, False, False, None, bound)

    def __repr__(self) -> str:
        moves = ", ".join(f"{p.src} on {p.src_mesh} -> {p.dst} on {p.dst_mesh}" for p in self.programs)
        return f"CrossRedistributor({moves})"


def _cross_many(xs: Any, prepared: CrossRedistributor, _: None, __: None,
                bound: BoundCall) -> tuple[list[Any], tuple[Any, ...], tuple[Any, ...], Any]:
    n = len(bound.programs)
    if isinstance(xs, torch.Tensor) or not isinstance(xs, Sequence) or len(xs) != n:
        raise SpecError(f"expected a sequence of {n} blocks (None off the source mesh)",
                        hint="pass one block per tensor the redistributor was prepared for")
    return list(xs), (), (), None


# a prepared cross-mesh call: its bound chosen by grad mode, the blocks checked, then their gradient
CROSS = Door(None, None, lambda x, *_: ([x], (), (), None), check=partial(mesh_transfer.check_prepared_grad, many=False))
CROSS_MANY = Door(None, None, _cross_many, one=False, check=partial(mesh_transfer.check_prepared_grad, many=True))


def redistributor_many(srcs: Sequence[TensorType | str], dsts: Sequence[TensorType | str], mesh: Mesh | str | Any,
                       dst_mesh: Mesh | str | Any, *, timeout: timedelta | float | None = None) -> CrossRedistributor:
    """``redistribute_many(..., dst_mesh=)`` prepared for many calls (a weight sync after
    every update): the programs compiled and the world agreed now, every rank alike."""
    return CrossRedistributor(mesh_transfer.prepare(srcs, dsts, mesh, dst_mesh, timeout, False), many=True)
