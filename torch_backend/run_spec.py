"""What ``shardc run`` was asked to do, and its program: torch-free, so the command refuses
bad types, meshes and dtypes before it imports torch or starts any rank."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import lowering
from lowering.cross_mesh import CrossProgram
from lowering.program import Program
from spec_lang.errors import SpecError
from spec_lang.ir import DTYPE_HINT, canonical_dtype
from torch_backend.held_dtypes import TORCH_HELD, not_held

# a rank's start-up (import torch, join the group) on a loaded machine: far longer than a
# collective may take, so joining gets this much however short the collective timeout
STARTUP_S = 180.0


@dataclass
class RunSpec:
    """What ``shardc run`` was asked to do (picklable: it travels to every rank)."""

    mesh: str
    src: str
    dst: str
    backend: str = "gloo"
    dtype: str | None = None
    check: bool = False
    bench: int = 0
    timeout: float = 60.0
    progress_bar: bool = False
    to_mesh: str | None = None  # a cross-mesh run: dst laid out on this mesh
    fault: str | None = field(default_factory=lambda: os.environ.get("SHARDC_FAULT"))


def compile_spec(spec: RunSpec) -> Program | CrossProgram:
    """The program every rank runs (a CrossProgram with ``to_mesh``); a SpecError for
    anything a rank would refuse before its first collective that the parent can see: a
    dtype torch cannot hold, a reduction torch cannot add. Errors about the types quote
    them as they were typed."""
    name = None if spec.dtype is None else canonical_dtype(spec.dtype)
    if spec.dtype is not None and name is None:
        raise SpecError(f"unknown dtype {spec.dtype!r}", text=spec.dtype, pos=0, hint=DTYPE_HINT)
    program = lowering.compile(spec.src, spec.dst, spec.mesh, dst_mesh=spec.to_mesh)
    if name is not None and name != program.src.dtype:
        # the plan depends on the dtype (bytes against a fixed charge per collective)
        program = lowering.compile(program.src.replace(dtype=name), program.dst.replace(dtype=name), program.mesh,
                                   dst_mesh=spec.to_mesh)
    if program.src.dtype not in TORCH_HELD:
        text = spec.dtype if spec.dtype is not None else spec.src
        raise not_held(program.src.dtype, text=text, pos=len(text) - len(text.lstrip()))
    if any(step.op is not None for step in program.steps):
        from torch_backend.dtypes import check_reductions  # imports torch: only where it can matter

        check_reductions(program)
    return CrossProgram(program) if spec.to_mesh is not None else program
