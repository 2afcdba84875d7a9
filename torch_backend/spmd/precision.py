"""``op_dtype``/``out_dtype`` on the collectives (docs/spmd_types.md, "Reducing in another
dtype"). NCCL and gloo add in the wire's dtype, so a reduction in a wider ``op_dtype`` runs
as an all_to_all of each rank's n pieces in x's dtype, the local reduction in ``op_dtype``
and (all_reduce) an all_gather of the results; with one no wider, x is cast before the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lowering.program import Program
from lowering.spmd.programs import gradient_program, routed_program
from lowering.spmd.rules import BACKWARD
from spec_lang.dual import check_differentiable
from spec_lang.errors import SpecError
from spec_lang.ir import canonical_dtype
from spec_lang.local_type import LocalType, R, V
from torch_backend.api import bound_program
from torch_backend.dtypes import dtype_name, to_torch_dtype
from torch_backend.groups import MeshContext

REDUCING = ("all_reduce", "reduce_scatter")


def as_dtype(d: Any, what: str) -> torch.dtype | None:
    """A torch dtype from itself or its name (``"fp32"`` is not one: ``"f32"``, ``"float32"``)."""
    if d is None or isinstance(d, torch.dtype):
        return d
    if isinstance(d, str):
        return to_torch_dtype(canonical_dtype(d) or d)
    raise SpecError(f"{what} takes a torch dtype or its name, got {type(d).__name__}",
                    hint=f"e.g. {what}=torch.float32 or {what}='f32'")


def wire_dtype(routed: str, x_dtype: torch.dtype, op_dtype: torch.dtype | None,
               out_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype the program of ``routed`` sends: ``op_dtype`` unless a reduction's is wider than
    x's; else, for a move that adds nothing, the narrower of x's and ``out_dtype`` (fewer bytes)."""
    if op_dtype is not None and (routed not in REDUCING or op_dtype.itemsize <= x_dtype.itemsize):
        return op_dtype
    if routed not in REDUCING and out_dtype is not None and out_dtype.itemsize < x_dtype.itemsize:
        return out_dtype
    return x_dtype


def check_options(op: str, routed: str, src: LocalType, x: torch.Tensor, op_dtype: torch.dtype | None,
                  inplace: bool) -> None:
    if inplace:
        raise SpecError(f"spmd.{op}(..., inplace=True) keeps the buffer's dtype: it takes no op_dtype or "
                        "out_dtype", hint="drop inplace=True, or the dtype options")
    acc = op_dtype or x.dtype
    if src.op == "avg" and not acc.is_floating_point and not acc.is_complex:
        raise SpecError(f"spmd.{op}: an integer P('avg') reduced in {acc} would truncate the average",
                        hint="pass a floating op_dtype (e.g. op_dtype=torch.float32)")


def _gradient(g: torch.Tensor, how: tuple, program: Program) -> torch.Tensor:
    check_differentiable(program.src, program.dst)  # no gradient through a pending max/min
    routed, src, dst, group, mesh_ctx, at, op_dtype, out_dtype, in_dtype = how
    g = g.to(in_dtype).contiguous()
    if routed == "all_reduce" and dst.kind == "I":  # backward reinterpret(I, R): nothing sent
        return g
    if routed == "all_reduce":  # backward all_reduce(P, R) (a sum, as the plain call's), options mirrored
        return reduce_in(routed, g, LocalType("P"), R, group, mesh_ctx, at, op_dtype, in_dtype, program)
    # backward of reduce_scatter: all_gather(V|S(i), R) in x's dtype (nothing to add)
    size = None if dst.dim is None else g.shape[dst.dim] * mesh_ctx.mesh.group_size(group)  # S(dim): the whole dim
    gather = routed_program("all_gather", dst, R, group, tuple(g.shape), dtype_name(in_dtype), mesh_ctx.mesh, size, at)
    return bound_program(gather, mesh_ctx, gradient_program).run_one(g)


def _reduce(x: torch.Tensor, routed: str, src: LocalType, dst: LocalType, group: tuple[str, ...],
            ctx: MeshContext, at: int, op_dtype: torch.dtype, out_dtype: torch.dtype,
            in_dtype: torch.dtype) -> torch.Tensor:
    """The forward: n pieces to their ranks in x's dtype, reduced in op_dtype, rounded to out_dtype."""
    n = ctx.mesh.group_size(group)
    shape = tuple(x.shape)
    if routed == "all_reduce":
        flat = x.reshape(-1)
        pad = (-flat.numel()) % n
        pieces = torch.cat([flat, flat.new_zeros(pad)]).view(n, -1) if pad else flat.view(n, -1)
    elif dst.dim is not None:  # S(dim)
        pieces = x.unflatten(dst.dim, (n, shape[dst.dim] // n)).movedim(dst.dim, 0)
    else:
        pieces = x.movedim(at, 0)
    pieces = pieces.contiguous()
    a2a = routed_program("all_to_all", V, V, group, tuple(pieces.shape), dtype_name(x.dtype), ctx.mesh)
    got = bound_program(a2a, ctx, gradient_program).run_one(pieces).to(op_dtype)  # row j: the piece rank j sent here
    op = src.op
    acc = got.sum(0) if op in ("sum", "avg") else got.amax(0) if op == "max" else got.amin(0)
    if op == "avg":
        acc = acc / n
    mine = acc.to(out_dtype)
    if routed == "reduce_scatter":
        return mine
    gather = routed_program("all_gather", V, R, group, tuple(mine.shape), dtype_name(out_dtype), ctx.mesh)
    whole = bound_program(gather, ctx, gradient_program).run_one(mine.contiguous()).reshape(-1)
    return whole[: x.numel()].view(shape)


def reduce_in(routed: str, x: torch.Tensor, src: LocalType, dst: LocalType, group: tuple[str, ...],
              ctx: MeshContext, at: int, op_dtype: torch.dtype | None, out_dtype: torch.dtype | None,
              program: Program) -> torch.Tensor:
    """``routed`` (all_reduce or reduce_scatter) of ``x`` with the dtype options, differentiable
    (``program``: the plain call's, checked)."""
    n = ctx.mesh.group_size(group)
    if routed == "reduce_scatter":
        d = dst.dim if dst.kind == "S" else at
        if d is None or x.shape[d] % n:
            raise SpecError(f"spmd.reduce_scatter with op_dtype: dim {d} of the local tensor ({list(x.shape)}) "
                            f"must split into {n} equal pieces", hint="pad that dim to a multiple of the group's "
                            "size, or drop op_dtype (an uneven reduce_scatter then follows torch.chunk)")
    how = (routed, src, dst, group, ctx, at, op_dtype or x.dtype, out_dtype or x.dtype, x.dtype)
    if torch.is_grad_enabled() and x.requires_grad:  # the gradient: the table's backward, options mirrored
        return with_backward(x, lambda t: _reduce(t, *how), lambda g: _gradient(g, how, program))
    return _reduce(x, *how)


def backward_dtypes(op: str, routed: str, src: LocalType, dst: LocalType, options: Any, inplace: bool,
                    ragged: bool) -> tuple[torch.dtype | None, torch.dtype | None]:
    """``backward_options`` read and checked: the dtypes of the table's backward collective."""
    if not isinstance(options, dict) or not set(options) <= {"op_dtype", "out_dtype"}:
        got = ", ".join(sorted(map(repr, options))) if isinstance(options, dict) else type(options).__name__
        raise SpecError(f"spmd.{op}: backward_options takes a dict with the keys 'op_dtype' and 'out_dtype', got "
                        f"{got}", hint="e.g. backward_options={'op_dtype': torch.float32}")
    if inplace or ragged:
        raise SpecError(f"spmd.{op}: backward_options goes with a differentiable call of even blocks, not "
                        f"{'inplace=True' if inplace else 'split sizes'}", hint="drop backward_options")
    if (routed, src.kind, dst.kind) not in BACKWARD or src.op != "sum":
        raise SpecError(f"spmd.{op}(src={src!r}, dst={dst!r}) has no one backward collective to give "
                        "backward_options to (a composition through R, or a pending reduction other than a sum)",
                        hint="drop backward_options, or call the steps one by one")
    return as_dtype(options.get("op_dtype"), "backward_options op_dtype"), as_dtype(
        options.get("out_dtype"), "backward_options out_dtype")


class _WithBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward: Callable[[torch.Tensor], torch.Tensor],
                gradient: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        ctx.gradient = gradient
        return forward(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.gradient(g.contiguous()), None, None


def with_backward(x: torch.Tensor, forward: Callable[[torch.Tensor], torch.Tensor],
                  gradient: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``forward(x)``, whose gradient is ``gradient(g)``."""
    return _WithBackward.apply(x, forward, gradient)
