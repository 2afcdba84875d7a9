"""``redistribute_many``: many tensors redistributed at once, their collectives packed.

    ys = torch_backend.redistribute_many(params, ["f32[1024@dp,64]", ...], ["f32[1024,64]", ...], mesh)

The set is compiled jointly (``lowering.compile_many``): in each round, the steps of one
kind over one axis set, reduce op and dtype run as one collective on one packed buffer
(``torch_backend.packed``); the tensors may differ in shape and dtype (one collective per
dtype). Every check runs before the first collective; differentiable, with the joint
program of the gradients' programs as the backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch

from lowering.joint import JointProgram, Merged, check_type_lists, plan_jointly
from lowering.layout import group_ranks
from lowering.program import Program
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType
from torch_backend import collectives, comm, traced
from torch_backend.agree import Checks, agreed, describe
from torch_backend.api import agreed_program, agreeing, bound_call, check_agree, check_tensor
from torch_backend.autograd import backward_program
from torch_backend.comm import rank_map
from torch_backend.executor import _aliases, build_pieces
from torch_backend.faults import CollectiveError
from torch_backend.groups import MeshContext, context
from torch_backend.packed import LAUNCHABLE, PACKED
from torch_backend.runners import RUNNERS, Pieces
from torch_backend.type_tags import Tags, output_tags, typed_output


@dataclass(eq=False)
class JointBound:
    """A joint program bound to its context: every program's pieces on this process."""

    joint: JointProgram
    ctx: MeshContext
    pieces: list[list[Pieces]]
    _backward: JointBound | None = None
    tags: list[Tags] = field(init=False, repr=False)  # each output's SPMD types (type_tags.typed_output)

    def __post_init__(self) -> None:
        self.tags = [output_tags(p) for p in self.joint.programs]

    def run(self, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return self.unaliased(xs, self.run_rounds(list(xs), self.joint.rounds))

    def run_rounds(self, ys: list[torch.Tensor], rounds: Sequence[tuple[Merged, ...]]) -> list[torch.Tensor]:
        for rnd in rounds:
            for g in rnd:
                self.run_group(g, ys)
        return ys

    def run_group(self, g: Merged, ys: list[torch.Tensor]) -> None:
        try:
            if not g.packed:
                j, i = g.members[0]
                step = self.joint.programs[j].steps[i]
                ys[j] = RUNNERS[step.kind](self.ctx, step, self.pieces[j][i], ys[j])
                return
            steps = [self.joint.step(ref) for ref in g.members]
            outs = PACKED[g.kind](self.ctx, steps, [self.pieces[j][i] for j, i in g.members],
                                  [ys[j] for j, _ in g.members])
        except RuntimeError as e:
            err = self.failed(g, e)
            if err is e:
                raise
            raise err from e
        for (j, _), y in zip(g.members, outs):
            ys[j] = y

    def failed(self, g: Merged, e: RuntimeError) -> RuntimeError:
        """The error of a failed round: a CollectiveError naming the step, the tensors, the
        group and who is at fault (a local step's error as it is)."""
        step = self.joint.step(g.members[0])
        if not step.is_collective or isinstance(e, CollectiveError):
            return e
        ctx = self.ctx
        members = group_ranks(self.joint.mesh, step.axes, ctx.ranks[0])
        tensors = sorted({j for j, _ in g.members})
        where = (f"rank {ctx.ranks[0] if len(ctx.ranks) == 1 else list(ctx.ranks)}: {step.describe()} of "
                 f"tensor{'s' if len(tensors) > 1 else ''} {tensors} on group {list(members)}")
        return comm.failed(ctx, where, e, members, step.axes)

    def unaliased(self, xs: Sequence[torch.Tensor], ys: list[torch.Tensor]) -> list[torch.Tensor]:
        """The results, none sharing memory with an input (a lone view is copied)."""
        for j, (x, y) in enumerate(zip(xs, ys)):
            if _aliases(self.ctx, y, x):
                ys[j] = rank_map(self.ctx, lambda r, t: t.clone(memory_format=torch.contiguous_format), y)
        return ys

    def typed(self, ys: list[torch.Tensor], xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The outputs, each typed by its destination (``type_tags.typed_output``)."""
        return [typed_output(y, x, t) for y, x, t in zip(ys, xs, self.tags)]

    def backward(self) -> JointBound:
        if self._backward is None:
            self._backward = bind_joint(plan_jointly([backward_program(p) for p in self.joint.programs]), self.ctx)
        return self._backward


class JointPending:
    """``redistribute_many(..., async_op=True)``: every round but the last ran; in the last,
    the packed all_gathers, reduce_scatters and all_reduces (and single steps that can be
    launched, see ``collectives.launch``) are on the wire, and the other steps ran.
    ``result()`` waits for them, in launch order, and unpacks (once)."""

    def __init__(self, bound: JointBound, xs: Sequence[torch.Tensor]) -> None:
        self.bound, self._xs = bound, list(xs)
        rounds, ctx = bound.joint.rounds, bound.ctx
        ys = bound.run_rounds(list(xs), rounds[:-1])
        self._inflight: list[tuple[Merged, tuple[int, ...], Any, Callable[[], Any]]] = []
        for g in rounds[-1] if rounds else ():
            launched = self._launch(g, ys) if comm.of(ctx).launches else None
            if launched is None:
                bound.run_group(g, ys)
            else:
                self._inflight.append((g, *launched))
        self._ys, self._result = ys, None

    def _launch(self, g: Merged, ys: list[torch.Tensor]) -> tuple[tuple[int, ...], Any, Callable[[], Any]] | None:
        b = self.bound
        if g.packed and g.kind in LAUNCHABLE:
            steps = [b.joint.step(ref) for ref in g.members]
            work, unpack = PACKED[g.kind](b.ctx, steps, [b.pieces[j][i] for j, i in g.members],
                                          [ys[j] for j, _ in g.members], launch_only=True)
            return tuple(j for j, _ in g.members), work, unpack
        if not g.packed:
            j, i = g.members[0]
            out = collectives.launch(b.ctx, b.joint.programs[j].steps[i], b.pieces[j][i], ys[j])
            if out is not None:
                work, finish = out
                return (j,), work, lambda: [finish()]
        return None

    def result(self) -> list[torch.Tensor]:
        if self._result is None:
            ys = self._ys
            for g, members, work, unpack in self._inflight:
                try:
                    comm.wait(self.bound.ctx, work)
                except RuntimeError as e:
                    err = self.bound.failed(g, e)
                    if err is e:
                        raise
                    raise err from e
                for j, y in zip(members, unpack()):
                    ys[j] = y
            self._result, self._inflight = self.bound.unaliased(self._xs, ys), []
        return list(self._result)


class ManyHandle:
    """What ``redistribute_many(..., async_op=True)`` returns: ``wait()`` gives the results
    (the same list on every call), differentiable when an input requires grad."""

    def __init__(self, pending: JointPending, xs: Sequence[torch.Tensor]) -> None:
        self._pending, self._xs, self._out = pending, list(xs), None

    def wait(self) -> list[torch.Tensor]:
        if self._out is None:
            if torch.is_grad_enabled() and any(x.requires_grad for x in self._xs):
                ys = list(_ManyFinish.apply(self._pending, *self._xs))
            else:
                ys = self._pending.result()
            self._out = self._pending.bound.typed(ys, self._xs)
        return self._out


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
        if torch.is_grad_enabled() and any(g.requires_grad for g in filled):  # create_graph: see autograd.dual_run
            return (None, *_Many.apply(bound.backward(), *filled))
        return (None, *bound.backward().run(filled))


class _ManyFinish(_Many):
    """The end of an async joint redistribution, on autograd's tape from the inputs."""

    @staticmethod
    def forward(ctx: Any, pending: JointPending, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        ctx.bound = pending.bound
        return tuple(pending.result())


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
                      timeout: timedelta | float | None = None, agree: bool | None = None,
                      async_op: bool = False, dst_mesh: Mesh | str | Any | None = None) -> Any:
    """Redistribute ``xs[i]`` from ``srcs[i]`` to ``dsts[i]``, all on ``mesh``, jointly.

    Returns the new blocks in order; the inputs are never modified. See the module docstring.
    ``async_op=True`` returns a handle at once, the last round's collectives on the wire;
    ``handle.wait()`` gives the list (do not modify the inputs before it).

    ``dst_mesh=``: every ``dsts[i]`` on another mesh, one joint cross-mesh program
    (``torch_backend.mesh_transfer``; None for the tensors off ``mesh``).
    """
    if dst_mesh is not None:
        if async_op:
            raise SpecError("async_op=True is not supported with dst_mesh=", hint="drop async_op")
        from torch_backend import mesh_transfer

        return mesh_transfer.redistribute_many(xs, srcs, dsts, mesh, dst_mesh=dst_mesh, timeout=timeout)
    if torch.compiler.is_dynamo_compiling() and isinstance(xs, (list, tuple)):
        return traced.call("redistribute_many", list(xs), list(srcs), list(dsts), mesh, async_op=async_op,
                           timeout=timeout, agree=agree)
    if isinstance(xs, torch.Tensor) or not isinstance(xs, Sequence):
        raise SpecError("redistribute_many takes a sequence of tensors",
                        hint="pass a list, e.g. redistribute_many([x, y], [src_x, src_y], [dst_x, dst_y], mesh)")
    check_agree(agree)
    check_type_lists("redistribute_many", srcs, dsts,
                     "redistribute_many([x], ['f32[8@dp]'], ['f32[8]'], 'dp=2'); for one tensor, redistribute")
    if not (len(xs) == len(srcs) == len(dsts)) or not xs:
        raise SpecError(f"got {len(xs)} tensors, {len(srcs)} source types and {len(dsts)} destination types",
                        hint="pass one source and one destination type per tensor (at least one)")
    if agreeing(agree):
        def run(found: Checks) -> list[torch.Tensor]:
            found.ctx = ctx = context(mesh, timeout=timeout)
            programs = [agreed_program(s, d, ctx) for s, d in zip(srcs, dsts)]
            found.call = describe([(p.src, p.dst) for p in programs], ctx, xs)
            return _check_all(xs, programs, ctx)

        checked = agreed(mesh, run)
        bound = prepare_many(srcs, dsts, mesh, timeout=timeout)
    else:
        bound = prepare_many(srcs, dsts, mesh, timeout=timeout)
        checked = _check_all(xs, bound.joint.programs, bound.ctx)
    if async_op:
        return ManyHandle(JointPending(bound, [x.detach() if x.requires_grad else x for x in checked]), checked)
    if torch.is_grad_enabled() and any(x.requires_grad for x in checked):
        return bound.typed(list(_Many.apply(bound, *checked)), xs)
    return bound.typed(bound.run(checked), xs)


traced.entry("redistribute_many")(redistribute_many)


def prepare_many(srcs: Sequence[TensorType | str], dsts: Sequence[TensorType | str], mesh: Mesh | str | Any, *,
                 timeout: timedelta | float | None = None) -> JointBound:
    """The tensor-independent part of ``redistribute_many``: checked, compiled and bound."""
    bounds = [bound_call(s, d, mesh, timeout=timeout) for s, d in zip(srcs, dsts)]
    return JointBound(plan_jointly([b.program for b in bounds]), bounds[0].ctx, [b.pieces for b in bounds])


def _check_all(xs: Sequence[torch.Tensor], programs: Sequence[Program], ctx: MeshContext) -> list[torch.Tensor]:
    """Every tensor against its source type; the first that fails is the error."""
    out = []
    for i, (x, p) in enumerate(zip(xs, programs)):
        try:
            out.append(check_tensor(x, p.src, ctx))
        except SpecError as e:
            raise SpecError(f"tensor {i}: {e.message}", text=e.text, pos=e.pos, hint=e.hint) from None
    return out
