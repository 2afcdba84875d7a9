"""One-step programs on a real process group, bound once into a plain function.

Most calls in a training loop are one step: an even all_gather of a sharded parameter,
a reduce_scatter of its gradient, an all_reduce, a local slice. For those the generic
interpreter's per-call work (the step loop, the runner's dispatch on the pieces, the
group lookup, the scratch context, the aliasing test) is the same on every call, so
:func:`lean_run` does it once, when the program is bound, and returns a closure that
holds the group handle, the output shape and the op. Per call it allocates the output
and issues the collective (through ``torch_backend.comm``, as the runners do), nothing
else; the result is bit for bit the runner's, since it runs the same collective on the
same buffers.

Only the forms whose result cannot alias the input and that need no scratch buffer get
a closure of their own; any other one-step program on a real group runs its registered
runner directly (still skipping the step loop). Multi-step programs, LocalTensorMode
and programs with no steps keep the interpreter (``executor.execute``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import torch

from lowering.kinds import RankPieces
from lowering.kinds.gather import GatherPieces
from lowering.kinds.local import RegionPieces
from lowering.kinds.reduce import ScatterPieces
from lowering.layout import group_ranks
from lowering.program import Program, Step
from torch_backend import comm
from torch_backend.comm import finish_avg
from torch_backend.faults import CollectiveError
from torch_backend.groups import MeshContext
from torch_backend.runners import RUNNERS, Pieces
from torch_backend.scratch import Scratch, using
from torch_backend.strided import contiguous, flat

LeanRun = Callable[[torch.Tensor], torch.Tensor]


def collective_error(ctx: MeshContext, program: Program, i: int, step: Step, e: RuntimeError) -> CollectiveError:
    """The error a failed collective step raises: which rank, which step, which group, who is at fault."""
    members = group_ranks(program.mesh, step.axes, ctx.ranks[0])
    where = (f"rank {ctx.ranks[0] if len(ctx.ranks) == 1 else list(ctx.ranks)}: step {i + 1}/{len(program)} "
             f"{step.describe()} on group {list(members)}")
    return comm.failed(ctx, where, e, members, step.axes)


def _stacks(big: tuple[int, ...], small: tuple[int, ...], n: int) -> bool:
    """``big`` is ``n`` blocks of ``small`` along dim 0: c10d takes the tensors as they are
    (its concatenated form, the same bytes as the flat one), and no view is made per call."""
    return len(big) == len(small) >= 1 and big[0] == n * small[0] and big[1:] == small[1:]


def _collective(ctx: MeshContext, program: Program, step: Step, p: RankPieces) -> LeanRun | None:
    """The closure of an even, direct all_gather or reduce_scatter, or an all_reduce."""
    kind, shape = step.kind, p.out_shape
    g = ctx.group(step.axes, ctx.rank)
    op = step.op or "sum"
    n = p.n

    def failed(e: RuntimeError) -> NoReturn:
        if isinstance(e, CollectiveError):
            raise e
        raise collective_error(ctx, program, 0, step, e) from e

    if isinstance(p, GatherPieces) and p.even and p.direct and _stacks(shape, p.in_shape, n):
        def gather_stacked(x: torch.Tensor) -> torch.Tensor:
            y = x.new_empty(shape)
            try:
                comm.all_gather(ctx, y, contiguous(x), g)
            except RuntimeError as e:
                failed(e)
            return y

        return gather_stacked
    if isinstance(p, GatherPieces) and p.even and p.direct:
        def gather(x: torch.Tensor) -> torch.Tensor:
            y = x.new_empty(shape)
            try:
                comm.all_gather(ctx, y.view(-1), flat(x), g)
            except RuntimeError as e:
                failed(e)
            return y

        return gather
    if (isinstance(p, ScatterPieces) and (p.even or step.padded) and p.direct
            and _stacks(p.in_shape, shape, n)):
        def scatter_stacked(x: torch.Tensor) -> torch.Tensor:
            y = x.new_empty(shape)
            try:
                comm.reduce_scatter(ctx, y, contiguous(x), op, g)
            except RuntimeError as e:
                failed(e)
            return finish_avg(y, op, n)

        return scatter_stacked
    if isinstance(p, ScatterPieces) and (p.even or step.padded) and p.direct:
        def scatter(x: torch.Tensor) -> torch.Tensor:
            y = x.new_empty(shape)
            try:
                comm.reduce_scatter(ctx, y.view(-1), flat(x), op, g)
            except RuntimeError as e:
                failed(e)
            return finish_avg(y, op, n)

        return scatter
    if kind == "all_reduce":
        def reduce(x: torch.Tensor) -> torch.Tensor:
            buf = x.clone(memory_format=torch.contiguous_format)
            try:
                comm.all_reduce(ctx, buf, op, g)
            except RuntimeError as e:
                failed(e)
            return finish_avg(buf, op, n)

        return reduce
    return None


def _slice(p: RegionPieces) -> LeanRun:
    region = p.region

    def slice_(x: torch.Tensor) -> torch.Tensor:
        # a view of the input: copied, as the interpreter copies a result that aliases it
        y = x[region]
        return y.clone(memory_format=torch.contiguous_format) if y.numel() else y

    return slice_


def lean_run(program: Program, ctx: MeshContext, pieces: list[Pieces],
             aliases: Callable[[MeshContext, torch.Tensor, torch.Tensor], bool],
             scratch: Scratch | None = None) -> LeanRun | None:
    """``program`` on this rank's block as one bound function, or None where the
    interpreter must run it (several steps, LocalTensorMode, no steps).

    ``aliases``: the interpreter's test that a result shares the input's storage (the
    runner path copies such a result, as the interpreter does); ``scratch``: the bound
    program's reused buffers, which the runner path hands to its runner.
    """
    if len(program.steps) != 1 or len(pieces[0]) != 1:  # several steps, or every rank played here
        return None
    step = program.steps[0]
    p = pieces[0][ctx.rank]
    if step.is_collective and p.n > 1:
        fast = _collective(ctx, program, step, p)
        if fast is not None:
            return fast
    elif isinstance(p, RegionPieces) and step.kind == "slice":
        return _slice(p)
    runner, plan = RUNNERS[step.kind], pieces[0]
    collective = step.is_collective

    def run(x: torch.Tensor) -> torch.Tensor:
        try:
            with using(scratch):
                y = runner(ctx, step, plan, x)
        except RuntimeError as e:
            if not collective or isinstance(e, CollectiveError):
                raise
            raise collective_error(ctx, program, 0, step, e) from e
        if aliases(ctx, y, x):
            y = y.clone(memory_format=torch.contiguous_format)
        return y

    return run
