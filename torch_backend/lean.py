"""One-step programs on a real process group, bound once into a plain function: most calls
in a training loop are one step, and the interpreter's per-call work (the step loop, the
dispatch, the group lookup) is the same on every call, so ``lean_run`` does it once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NoReturn

import torch

from lowering.layout import group_ranks
from lowering.program import Program, Step
from torch_backend import comm
from torch_backend.faults import CollectiveError
from torch_backend.groups import MeshContext
from torch_backend.runners import FAST, RUNNERS, Pieces
from torch_backend.scratch import Scratch, using


def collective_error(ctx: MeshContext, program: Program, i: int, step: Step, e: RuntimeError,
                     tensors: Sequence[int] = ()) -> CollectiveError:
    """A failed collective step's error (``tensors``: a joint call's, which the step moves)."""
    members = group_ranks(program.mesh, step.axes, ctx.ranks[0])
    what = f"{step.describe()} of tensor{'s' if len(tensors) > 1 else ''} {list(tensors)}" if tensors else \
        f"step {i + 1}/{len(program)} {step.describe()}"
    where = f"rank {ctx.ranks[0] if len(ctx.ranks) == 1 else list(ctx.ranks)}: {what} on group {list(members)}"
    return comm.failed(ctx, where, e, members, step.axes)


def lean_run(program: Program, ctx: MeshContext, pieces: list[Pieces],
             aliases: Callable[[MeshContext, torch.Tensor, torch.Tensor], bool],
             scratch: Scratch | None = None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``program`` on this rank's block as one function: its kind's fast runner where it has
    one, else its runner without the step loop (a result that ``aliases`` the input copied,
    as the interpreter does); None where the interpreter must run it (several steps,
    LocalTensorMode, no steps)."""
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
