"""A thin interpreter of a Program over this rank's local tensor: each step's runner
(``torch_backend.runners``) on the pieces read off the layout boxes (``lowering.kinds``),
on NCCL/CUDA, gloo/CPU and LocalTensorMode alike. What each kind puts on the wire, and
why: docs/running.md, "What goes on the wire". The input is never modified; the result
never aliases it (copied only where every step was a view, e.g. a lone ``slice``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from lowering.kinds import rank_pieces
from lowering.program import Program, check_one_mesh
from spec_lang.errors import SpecError
from torch_backend import collectives, comm, local_steps, relay_steps, typed_steps, uneven_steps  # noqa: F401 - each registers its runners
from torch_backend.comm import rank_map
from torch_backend.dtypes import check_reductions
from torch_backend.faults import CollectiveError
from torch_backend.groups import MeshContext, context
from torch_backend.lean import collective_error
from torch_backend.runners import RUNNERS, Pieces
from torch_backend.tensor_checks import check_local

StepHook = Callable[[int, torch.Tensor], None]
_watch: StepHook | None = None


@contextmanager
def watching(hook: StepHook) -> Iterator[None]:
    """Within it, ``execute`` calls ``hook(i, y)`` before each step i >= 1 (``y``: the block so
    far): the boundaries ``shardc run --bench`` and ``calibrate`` time a user's call by, whose
    start and end they mark themselves (a one-step program's fast runner has no loop)."""
    global _watch
    outer, _watch = _watch, hook
    try:
        yield
    finally:
        _watch = outer


def build_pieces(program: Program, ctx: MeshContext) -> list[Pieces]:
    """Every step's pieces for the ranks this process plays (per-rank work scales with the
    rank's own pieces, not the world), its groups made; before the first collective, so a
    malformed program, or a reduction torch cannot add, fails on every rank alike."""
    check_one_mesh(program)
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
        out.append({r: rank_pieces(step, mesh, r, ctx.group(step.axes, r).members if collective else (r,))
                    for r in ctx.ranks})
    if program.steps and prev != program.dst:
        raise SpecError(f"program ends at {prev}, not at its destination {program.dst}",
                        hint="build programs with lowering.compile or lowering.make_program")
    return out


def execute(program: Program, x: torch.Tensor, *, ctx: MeshContext | None = None,
            pieces: list[Pieces] | None = None) -> torch.Tensor:
    """Run ``program`` on this rank's block ``x`` (a LocalTensor under LocalTensorMode):
    the runner loop. ``pieces``: a bound program's (``build_pieces``), whose caller checked
    the program and the tensor; without them both are checked first."""
    if pieces is None:
        check_one_mesh(program)
        if not isinstance(x, torch.Tensor):
            raise SpecError(f"expected a torch.Tensor, got {type(x).__name__}",
                            hint="pass this rank's local block as a tensor")
    ctx = ctx if ctx is not None else context(program.mesh)
    if pieces is None:
        x = check_local(x, program.src, ctx)
        pieces = build_pieces(program, ctx)
    y = x
    for i, (step, plan) in enumerate(zip(program.steps, pieces)):
        if i and _watch is not None:
            _watch(i, y)
        try:
            y = RUNNERS[step.kind](ctx, step, plan, y)
        except RuntimeError as e:
            if not step.is_collective or isinstance(e, CollectiveError):
                raise
            raise collective_error(ctx, program, i, step, e) from e
    if aliases(ctx, y, x):
        y = rank_map(ctx, lambda r, t: t.clone(memory_format=torch.contiguous_format), y)
    return y


def aliases(ctx: MeshContext, y: torch.Tensor, x: torch.Tensor) -> bool:
    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.numel() > 0 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()

    try:
        return any(same(comm.local_of(y, r), comm.local_of(x, r)) for r in ctx.ranks)
    except RuntimeError:  # no storage to compare (a tensor subclass): copy to be safe
        return True
