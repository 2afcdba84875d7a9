"""Differentiable redistribute: the backward of ``src -> dst`` is ``compile(dual(dst), dual(src))``.

The SPMD type system's forward/backward table on the types (``spec_lang.dual``): the gradient of Replicate is Partial,
of Partial is Replicate, of Invariant Invariant, of Varying Varying, and a dim sharded
by an axis stays sharded by it. So the gradient of a redistribution is again a
redistribution, between the dual types, and the compiler plans it like any other::

    forward                      backward (compile(dual(dst), dual(src)))
    f32[8@dp] -> f32[8]          f32[8]        -> f32[8@dp]      slice      (convert(I,S))
    f32[8@dp] -> f32[8]{R:dp}    f32[8]{U:dp}  -> f32[8@dp]      reduce_scatter
    f32[8]{U:dp} -> f32[8]{R:dp} f32[8]{U:dp}  -> f32[8]{R:dp}   all_reduce
    f32[8]{U:dp} -> f32[8]       f32[8]        -> f32[8]{R:dp}   reinterpret(I,R)
    f32[8]{R:dp} -> f32[8]       f32[8]        -> f32[8]{U:dp}   zero_fill  (convert(I,P))

Gradients are *global*: the tensors flowing backward are blocks of the dual type whose
denotation is the gradient of the forward value's denotation (what the SPMD type
system's tables and DTensor both use). Hence the adjoint identity the tests check exactly,
``<F x, y>_dst == <x, B y>_src``, with ``<a, b>_T`` the inner product of denotations:
the sum over ranks of local inner products, divided by the size of every I axis (the
value and its gradient are both replicated there, and count once).

Reduce ops other than sum:

* ``P(avg)``: the dual is R, as in DTensor (``Partial('avg') -> Replicate`` keeps the
  gradient replicated, unscaled): the gradient of the mean's denotation, G, is held by
  every rank. (The per-rank derivative would be G/n; the global convention keeps one
  gradient value, as for I.)
* ``P(max)`` / ``P(min)``: the reduction is not linear and its gradient needs the arg-max,
  which no type carries; backward raises a SpecError (forward works, and so does a
  backward-free use under ``torch.no_grad``).
"""

from __future__ import annotations

from typing import Any

import torch

import lowering
from lowering.program import Program, check_program
from spec_lang.dual import check_differentiable, dual_type
from torch_backend.executor import BoundProgram, Pending, bind
from torch_backend.groups import MeshContext
from torch_backend.type_tags import typed_output


def backward_program(program: Program) -> Program:
    """The program that computes ``program``'s gradient (compiled, cached by the planner)."""
    check_program(program)
    check_differentiable(program.src, program.dst)
    return lowering.compile(dual_type(program.dst), dual_type(program.src), program.mesh)


class Redistribute(torch.autograd.Function):
    """A bound program's run, with the bound dual program as its backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bound: BoundProgram) -> torch.Tensor:  # type: ignore[override]
        ctx.bound = bound
        return bound.run(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return dual_run(ctx.bound, grad), None


def dual_run(bound: BoundProgram, grad: torch.Tensor) -> torch.Tensor:
    """The bound dual program on ``grad``. Where autograd records the backward itself
    (``create_graph=True``: a gradient penalty, a Hessian-vector product) it runs as a
    ``Redistribute`` too, so the gradient has its own backward (the dual of the dual is
    the forward program) instead of silently counting as a constant."""
    back = bound.backward(backward_program)
    if grad.requires_grad and torch.is_grad_enabled():
        return Redistribute.apply(grad, back)
    return back.run(grad)


def apply(program: Program, x: torch.Tensor, mesh_ctx: MeshContext, bound: BoundProgram | None = None) -> torch.Tensor:
    """Run ``program`` differentiably when autograd is recording ``x``, plainly otherwise
    (``bound``: the program already bound to ``mesh_ctx``, as a prepared call keeps it)."""
    bound = bound if bound is not None else bind(program, mesh_ctx)
    y = Redistribute.apply(x, bound) if x.requires_grad and torch.is_grad_enabled() else bound.run(x)
    return typed_output(y, x, bound.tags)


class _Finish(torch.autograd.Function):
    """The end of an async redistribution, on autograd's tape from ``x``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, pending: Pending) -> torch.Tensor:  # type: ignore[override]
        ctx.bound = pending.bound
        return pending.result()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return dual_run(ctx.bound, grad), None


class Handle:
    """What ``redistribute(..., async_op=True)`` returns: ``wait()`` gives the result (the
    same tensor on every call), differentiable when the input requires grad."""

    def __init__(self, pending: Pending, x: torch.Tensor) -> None:
        self._pending, self._x, self._out = pending, x, None

    def wait(self) -> torch.Tensor:
        if self._out is None:
            if torch.is_grad_enabled() and self._x.requires_grad:
                y = _Finish.apply(self._x, self._pending)
            else:
                y = self._pending.result()
            self._out = typed_output(y, self._x, self._pending.bound.tags)
        return self._out


def apply_async(program: Program, x: torch.Tensor, mesh_ctx: MeshContext, bound: BoundProgram | None = None) -> Handle:
    """Start ``program`` on ``x`` and return its handle (see ``executor.Pending``)."""
    bound = bound if bound is not None else bind(program, mesh_ctx)
    return Handle(Pending(bound, x.detach() if x.requires_grad else x), x)
