"""One-step programs on a real process group, bound once into a plain function.

Most calls in a training loop are one step: an even all_gather of a sharded parameter,
a reduce_scatter of its gradient, an all_reduce, a local slice. For those the
interpreter's per-call work (the step loop, the dispatch on the pieces, the group lookup,
the scratch context, the aliasing test) is the same on every call, so ``lean_run`` does
it once, when the program is bound: the kind's fast runner (``runners.fast``) where it
has one, else its registered runner without the step loop. Multi-step programs,
LocalTensorMode and programs with no steps keep the interpreter (``executor.execute``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import torch

from lowering.layout import group_ranks
from lowering.program import Program, Step
from torch_backend import comm
from torch_backend.faults import CollectiveError
from torch_backend.groups import MeshContext
from torch_backend.runners import FAST, RUNNERS, Pieces
from torch_backend.scratch import Scratch, using

LeanRun = Callable[[torch.Tensor], torch.Tensor]


def collective_error(ctx: MeshContext, program: Program, i: int, step: Step, e: RuntimeError) -> CollectiveError:
    """The error a failed collective step raises: which rank, which step, which group, who is at fault."""
    members = group_ranks(program.mesh, step.axes, ctx.ranks[0])
    where = (f"rank {ctx.ranks[0] if len(ctx.ranks) == 1 else list(ctx.ranks)}: step {i + 1}/{len(program)} "
             f"{step.describe()} on group {list(members)}")
    return comm.failed(ctx, where, e, members, step.axes)


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

    def failed(e: RuntimeError) -> NoReturn:
        if isinstance(e, CollectiveError):
            raise e
        raise collective_error(ctx, program, 0, step, e) from e

    make = FAST.get(step.kind)
    made = make(ctx, step, p, failed) if make is not None and (p.n > 1 or not step.is_collective) else None
    if made is not None:
        return made
    runner, plan, collective = RUNNERS[step.kind], pieces[0], step.is_collective

    def run(x: torch.Tensor) -> torch.Tensor:
        try:
            with using(scratch):
                y = runner(ctx, step, plan, x)
        except RuntimeError as e:
            if not collective:
                raise
            failed(e)
        if aliases(ctx, y, x):
            y = y.clone(memory_format=torch.contiguous_format)
        return y

    return run
