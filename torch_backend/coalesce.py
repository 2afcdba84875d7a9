"""``redistribute_many``: many tensors redistributed at once, their collectives packed.

    ys = torch_backend.redistribute_many(params, ["f32[1024@dp,64]", ...], ["f32[1024,64]", ...], mesh)

The set is compiled jointly (``lowering.compile_many``): in each round, the steps of one
kind over one axis set, reduce op and dtype run as one collective on one packed buffer
(``torch_backend.packed``); the tensors may differ in shape and dtype (one collective per
dtype). Every check runs before the first collective; differentiable, with the joint
program of the gradients' programs as the backward.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from lowering.coalesce import JointProgram, plan_jointly
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType
from torch_backend.api import _ranks_at_fault, bound_call, check_tensor
from torch_backend.autograd import backward_program
from torch_backend.comm import rank_map
from torch_backend.executor import _aliases, build_pieces
from torch_backend.groups import MeshContext
from torch_backend.packed import PACKED
from torch_backend.runners import RUNNERS, Pieces


@dataclass(eq=False)
class JointBound:
    """A joint program bound to its context: every program's pieces on this process."""

    joint: JointProgram
    ctx: MeshContext
    pieces: list[list[Pieces]]
    _backward: JointBound | None = None

    def run(self, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        ys = list(xs)
        for rnd in self.joint.rounds:
            for g in rnd:
                if not g.packed:
                    j, i = g.members[0]
                    step = self.joint.programs[j].steps[i]
                    ys[j] = RUNNERS[step.kind](self.ctx, step, self.pieces[j][i], ys[j])
                    continue
                steps = [self.joint.step(ref) for ref in g.members]
                outs = PACKED[g.kind](self.ctx, steps, [self.pieces[j][i] for j, i in g.members],
                                      [ys[j] for j, _ in g.members])
                for (j, _), y in zip(g.members, outs):
                    ys[j] = y
        for j, (x, y) in enumerate(zip(xs, ys)):
            if _aliases(self.ctx, y, x):
                ys[j] = rank_map(self.ctx, lambda r, t: t.clone(memory_format=torch.contiguous_format), y)
        return ys

    def backward(self) -> JointBound:
        if self._backward is None:
            self._backward = bind_joint(plan_jointly([backward_program(p) for p in self.joint.programs]), self.ctx)
        return self._backward


def bind_joint(joint: JointProgram, ctx: MeshContext) -> JointBound:
    return JointBound(joint, ctx, [build_pieces(p, ctx) for p in joint.programs])


class _Many(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, bound: JointBound, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        ctx.bound = bound
        return tuple(bound.run(xs))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:  # type: ignore[override]
        bound: JointBound = ctx.bound
        filled = [g if g is not None else _zeros(bound, j) for j, g in enumerate(grads)]
        return (None, *bound.backward().run(filled))


def _zeros(bound: JointBound, j: int) -> torch.Tensor:
    """A zero gradient for an output autograd did not use (its dual type's blocks)."""
    from lowering.layout import local_shapes
    from torch_backend.dtypes import to_torch_dtype

    p = bound.joint.programs[j]
    shapes = local_shapes(p.dst, p.mesh)
    dt = to_torch_dtype(p.dst.dtype)
    return rank_map(bound.ctx, lambda r: torch.zeros(shapes[r], dtype=dt))


def redistribute_many(xs: Sequence[torch.Tensor], srcs: Sequence[TensorType | str],
                      dsts: Sequence[TensorType | str], mesh: Mesh | str | Any, *,
                      timeout: timedelta | float | None = None, agree: bool | None = None) -> list[torch.Tensor]:
    """Redistribute ``xs[i]`` from ``srcs[i]`` to ``dsts[i]``, all on ``mesh``, jointly.

    Returns the new blocks in order; the inputs are never modified. See the module docstring.
    """
    if isinstance(xs, torch.Tensor) or not isinstance(xs, Sequence):
        raise SpecError("redistribute_many takes a sequence of tensors",
                        hint="pass a list, e.g. redistribute_many([x, y], [src_x, src_y], [dst_x, dst_y], mesh)")
    if not (len(xs) == len(srcs) == len(dsts)) or not xs:
        raise SpecError(f"got {len(xs)} tensors, {len(srcs)} source types and {len(dsts)} destination types",
                        hint="pass one source and one destination type per tensor (at least one)")
    bound = prepare_many(srcs, dsts, mesh, timeout=timeout)
    checked = _check_all(xs, bound, agree)
    if torch.is_grad_enabled() and any(x.requires_grad for x in checked):
        return list(_Many.apply(bound, *checked))
    return bound.run(checked)


def prepare_many(srcs: Sequence[TensorType | str], dsts: Sequence[TensorType | str], mesh: Mesh | str | Any, *,
                 timeout: timedelta | float | None = None) -> JointBound:
    """The tensor-independent part of ``redistribute_many``: checked, compiled and bound."""
    bounds = [bound_call(s, d, mesh, timeout=timeout) for s, d in zip(srcs, dsts)]
    return JointBound(plan_jointly([b.program for b in bounds]), bounds[0].ctx, [b.pieces for b in bounds])


def _check_all(xs: Sequence[torch.Tensor], bound: JointBound, agree: bool | None) -> list[torch.Tensor]:
    """Every tensor against its source type; with ``agree``, one all_reduce for all of them."""
    ctx = bound.ctx
    if agree is None:
        agree = os.environ.get("SHARDC_AGREE", "") not in ("", "0")
    error, out = None, []
    for i, (x, p) in enumerate(zip(xs, bound.joint.programs)):
        try:
            out.append(check_tensor(x, p.src, ctx, False))
        except SpecError as e:
            error = error or SpecError(f"tensor {i}: {e.message}", text=e.text, pos=e.pos, hint=e.hint)
    if agree and not ctx.is_local:
        bad = _ranks_at_fault(ctx, error is not None)
        if error is None and bad:
            raise SpecError(f"rank(s) {bad} passed tensors that do not match their source types",
                            hint="see the error on those ranks")
    if error is not None:
        raise error
    return out
