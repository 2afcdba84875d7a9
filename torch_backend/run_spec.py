"""What ``shardc run`` was asked to do, and its program: torch-free, so the command refuses
bad types, meshes and dtypes before it imports torch or starts any rank."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import lowering
from lowering.program import Program
from spec_lang.errors import SpecError
from spec_lang.ir import DTYPE_HINT, TensorType, canonical_dtype
from spec_lang.parser import parse

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
    fault: str | None = field(default_factory=lambda: os.environ.get("SHARDC_FAULT"))


def with_dtype(text: str, dtype: str | None) -> TensorType:
    t = parse(text)
    if dtype is None:
        return t
    name = canonical_dtype(dtype)
    if name is None:
        raise SpecError(f"unknown dtype {dtype!r}", hint=DTYPE_HINT)
    return t.replace(dtype=name)


def compile_spec(spec: RunSpec) -> Program:
    """The program every rank runs; a SpecError for anything a rank would refuse before its
    first collective that the parent can see (a reduction torch cannot add included)."""
    program = lowering.compile(with_dtype(spec.src, spec.dtype), with_dtype(spec.dst, spec.dtype), spec.mesh)
    if any(step.op is not None for step in program.steps):
        from torch_backend.dtypes import check_reductions  # imports torch: only where it can matter

        check_reductions(program)
    return program
