"""A thin interpreter of a Program over this rank's local tensor.

Each step is *pack -> one collective on flat contiguous buffers -> unpack*, with the
pieces read off the layout boxes (``lowering.kinds``), so every step kind works on
any dims, any group order and uneven blocks, with no padding on the wire except where
``step.padded`` says so. The same code runs on NCCL/CUDA, gloo/CPU and LocalTensorMode
(there, one call simulates every rank; see ``torch_backend.comm``).

What goes on the wire (per rank, in elements; equal to the planner's ``bytes_sent``):

* ``all_gather`` equal blocks: ``all_gather_single`` ((n-1)*b). Uneven blocks: an exact
  ring of ``batch_isend_irecv`` in the step's group order (n-1 rounds; total - b(succ)),
  since gloo's and NCCL's gathers need equal sizes. Under LocalTensorMode (no p2p):
  ``all_to_all_single`` with exact splits instead::

      [A]                  rank i, round k: send piece (i-k), receive piece (i-k-1)
      [B]  =>  [A, B, C]
      [C]

* ``reduce_scatter``: ``reduce_scatter_single``; uneven pieces are padded to the
  largest when ``step.padded`` (the planner's cost), otherwise exchanged exactly with
  ``all_to_all_single`` and reduced locally (total - own piece).
* ``all_reduce``: ``all_reduce`` on a contiguous copy.
* ``all_to_all``: pieces packed in process-group order into one send buffer (the
  rank's own piece is copied locally, split size 0), ``all_to_all_single`` with exact
  per-peer splits, unpacked into the output block. Packing and unpacking run the
  pieces' copy plans (``lowering.kinds.copies``: a few folded strided copies); where
  the pieces lie back to back, the send buffer is a view of the input and, on a real
  group, the receive buffer a view of the output.
* ``permute``: ``batch_isend_irecv`` straight from/into the blocks when a piece is one
  contiguous run (``all_to_all_single`` under LocalTensorMode).

The input is never modified; the result never aliases it (a final copy is made only
when every step was a view, e.g. a lone ``slice`` or ``reinterpret``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from lowering.kinds import rank_pieces
from lowering.program import Program, Step, check_program
from spec_lang.errors import SpecError
from torch_backend import collectives, comm, local_steps, relay_steps, typed_steps, uneven_steps  # noqa: F401 - each registers its runners
from torch_backend.comm import rank_map
from torch_backend.dtypes import check_reductions
from torch_backend.faults import CollectiveError
from torch_backend.groups import MeshContext, context
from torch_backend.lean import collective_error, lean_run
from torch_backend.runners import RUNNERS, Pieces
from torch_backend.scratch import Scratch, using
from torch_backend.type_tags import Tags, output_tags

__all__ = ["BoundProgram", "CollectiveError", "Pieces", "bind", "build_pieces", "execute"]
StepHook = Callable[[int, Step], None]


def build_pieces(program: Program, ctx: MeshContext) -> list[Pieces]:
    """Every step's pieces for the ranks this process plays (only those: per-rank work
    scales with the rank's own pieces, not the world), and the groups they use.

    Runs before the first collective, so a malformed program, or a reduction of a dtype
    torch cannot add, fails on every rank alike.
    """
    check_reductions(program)
    out: list[Pieces] = []
    prev = program.src
    mesh = program.mesh
    for step in program.steps:
        if step.src != prev:
            raise SpecError(f"program step {step.describe()} starts at {step.src}, previous step ends at {prev}",
                            hint="build programs with lowering.compile or lowering.make_program")
        if step.kind not in RUNNERS:
            raise SpecError(f"no torch execution is registered for step kind {step.kind!r}",
                            hint="register one with torch_backend.runners.runs")
        if len(step.bytes_sent) != mesh.size:
            raise SpecError(f"step {step.describe()} is not priced for the mesh {mesh}",
                            hint="build steps with lowering.make_step")
        prev = step.dst
        collective = step.is_collective and mesh.group_size(step.axes) > 1
        pieces: Pieces = {}
        for r in ctx.ranks:
            members = ctx.group(step.axes, r).members if collective else (r,)
            pieces[r] = rank_pieces(step, mesh, r, members)
        out.append(pieces)
    if program.steps and prev != program.dst:
        raise SpecError(f"program ends at {prev}, not at its destination {program.dst}",
                        hint="build programs with lowering.compile or lowering.make_program")
    return out


_UNSET: Any = object()


@dataclass(eq=False)
class BoundProgram:
    """A program bound to where it runs: its context and this process's pieces of every
    step (groups created), built once and replayed by every call; its backward is bound
    on first use. A one-step program on a real group runs as one function bound on the
    first call (``torch_backend.lean``), without the interpreter's per-call work."""

    program: Program
    ctx: MeshContext
    pieces: list[Pieces]
    _backward: BoundProgram | None = None
    scratch: Scratch | None = None  # a prepared program's reused send/receive buffers
    _lean: Any = field(default=_UNSET, repr=False)  # lean_run's function (None: interpret)
    expect: Any = field(default=None, repr=False)  # what api.check_tensor's fast test compares, once made
    tags: Tags = field(init=False, repr=False)  # the output's SPMD types (type_tags.typed_output)

    def __post_init__(self) -> None:
        self.tags = output_tags(self.program)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # traced: the interpreter, on functional collectives
            return execute(self.program, x, ctx=self.ctx, pieces=self.pieces)
        lean = self._lean
        if lean is _UNSET:
            lean = self.runner()
        if lean is not None:
            return lean(x)
        return self._interpret(x)

    def runner(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The function ``run`` calls: the program's lean one where it has one."""
        if self._lean is _UNSET:
            self._lean = lean_run(self.program, self.ctx, self.pieces, _aliases, self.scratch)
        return self._lean if self._lean is not None else self._interpret

    def _interpret(self, x: torch.Tensor) -> torch.Tensor:
        with using(self.scratch):
            return execute(self.program, x, ctx=self.ctx, pieces=self.pieces)

    def prepared(self) -> BoundProgram:
        """This program with buffers of its own that every call reuses (see ``scratch``)."""
        return BoundProgram(self.program, self.ctx, self.pieces, scratch=Scratch())

    def backward(self, make: Callable[[Program], Program]) -> BoundProgram:
        """The bound program of ``make(self.program)`` (the gradient's), cached here."""
        if self._backward is None:
            bwd = bind(make(self.program), self.ctx)
            self._backward = bwd.prepared() if self.scratch is not None else bwd
        return self._backward


class Pending:
    """An async redistribution: ``wait()`` gives the result. Every step before the last
    collective ran already and the last collective is on the wire (where its kind can be
    launched, see ``collectives.launch``); ``wait()`` waits for it and runs what follows.
    Do not modify the input before ``wait()``."""

    def __init__(self, bound: BoundProgram, x: torch.Tensor) -> None:
        self.bound, self._x = bound, x
        steps = bound.program.steps
        last = max((i for i, s in enumerate(steps) if s.is_collective and s.bytes_sent_max > 0), default=-1)
        self._result: torch.Tensor | None = None
        self._launched: collectives.Launched | None = None
        self._rest = last + 1
        if last > 0:
            with using(bound.scratch):
                y = execute(_prefix(bound.program, last), x, ctx=bound.ctx, pieces=bound.pieces[:last])
        else:
            y = x
        if last >= 0:
            self._launched = collectives.launch(bound.ctx, steps[last], bound.pieces[last], y)
            if self._launched is None:  # run it now: collectives go out in call order on every rank
                self._rest = last
        self._y = y
        if self._launched is None:
            self.result()

    def result(self) -> torch.Tensor:
        """Wait for the collective in flight and run the remaining steps (once)."""
        if self._result is None:
            y = self._y
            if self._launched is not None:
                work, finish = self._launched
                b = self.bound
                try:
                    comm.wait(b.ctx, work)
                except RuntimeError as e:
                    i = self._rest - 1
                    raise collective_error(b.ctx, b.program, i, b.program.steps[i], e) from e
                y = finish()
            b = self.bound
            rest = b.program.steps[self._rest:]
            if rest:
                with using(b.scratch):
                    y = execute(_suffix(b.program, self._rest), y, ctx=b.ctx, pieces=b.pieces[self._rest:])
            if _aliases(b.ctx, y, self._x):
                y = rank_map(b.ctx, lambda r, t: t.clone(memory_format=torch.contiguous_format), y)
            self._result, self._y, self._launched = y, None, None
        return self._result


def _prefix(program: Program, k: int) -> Program:
    return Program(program.mesh, program.src, program.steps[k - 1].dst, program.steps[:k], program.cost)


def _suffix(program: Program, k: int) -> Program:
    return Program(program.mesh, program.steps[k].src, program.dst, program.steps[k:], program.cost)


def bind(program: Program, ctx: MeshContext | None = None) -> BoundProgram:
    """Check ``program`` against ``ctx``, build this process's pieces and create its groups."""
    ctx = ctx if ctx is not None else context(program.mesh)
    return BoundProgram(program, ctx, build_pieces(program, ctx))


def execute(program: Program, x: torch.Tensor, *, ctx: MeshContext | None = None,
            timings: list[float] | None = None, on_step: StepHook | None = None,
            pieces: list[Pieces] | None = None) -> torch.Tensor:
    """Run ``program`` on this rank's block ``x`` (a LocalTensor under LocalTensorMode).

    ``timings``: if given, gets each step's wall time (device-synchronized).
    ``on_step(i, step)``: called before step i (the launcher's progress/fault hooks).
    ``pieces``: the pieces ``build_pieces(program, ctx)`` returned (a bound program's);
    without them the program and the tensor are checked first (a bound program's caller
    has checked them).
    """
    if pieces is None:
        from torch_backend.api import check_local

        check_program(program)
        if not isinstance(x, torch.Tensor):
            raise SpecError(f"expected a torch.Tensor, got {type(x).__name__}",
                            hint="pass this rank's local block as a tensor")
    ctx = ctx if ctx is not None else context(program.mesh)
    if pieces is None:
        x = check_local(x, program.src, ctx)
    plans = pieces if pieces is not None else build_pieces(program, ctx)
    y = x
    for i, (step, plan) in enumerate(zip(program.steps, plans)):
        if on_step is not None:
            on_step(i, step)
        t0 = time.perf_counter()
        try:
            y = RUNNERS[step.kind](ctx, step, plan, y)
        except RuntimeError as e:
            if not step.is_collective or isinstance(e, CollectiveError):
                raise
            raise collective_error(ctx, program, i, step, e) from e
        if timings is not None:
            if y.is_cuda:
                torch.cuda.synchronize(y.device)
            timings.append(time.perf_counter() - t0)
    if _aliases(ctx, y, x):
        y = rank_map(ctx, lambda r, t: t.clone(memory_format=torch.contiguous_format), y)
    return y


def _aliases(ctx: MeshContext, y: torch.Tensor, x: torch.Tensor) -> bool:
    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.numel() > 0 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()

    try:
        return any(same(comm.local_of(y, r), comm.local_of(x, r)) for r in ctx.ranks)
    except RuntimeError:  # no storage to compare (a tensor subclass): copy to be safe
        return True
