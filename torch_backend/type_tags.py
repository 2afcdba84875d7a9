"""Where a tensor keeps its SPMD types (two attributes), and the types of a redistribution's
output, from its destination type (a split axis S(i), an annotated one R, V or P, any other
I). Apart from ``torch_backend.spmd``, which imports the entry points that import this.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

import torch

from lowering.caching import on_clear
from lowering.program import Program
from lowering.spmd.types import LocalType, V, types_of
from spec_lang.ir import Mesh, TensorType

TYPES = "_spmd_types"  # {mesh axis: LocalType}
SIZES = "_spmd_sizes"  # {group axes: global size of the dim the group splits}

# > 0 while shardc's own code runs torch ops (the spmd functions' insides, shardc's c10d
# calls): the type checker leaves them alone, since the call types its output itself
UNCHECKED = [0]


@contextmanager
def unchecked() -> Iterator[None]:
    UNCHECKED[0] += 1
    try:
        yield
    finally:
        UNCHECKED[0] -= 1


def attach(x: torch.Tensor, types: dict[str, LocalType], sizes: dict[tuple[str, ...], int] | None = None) -> torch.Tensor:
    setattr(x, TYPES, types)
    if sizes:
        setattr(x, SIZES, sizes)
    return x


Tags = tuple[dict[str, LocalType], dict[tuple[str, ...], int]]


@lru_cache(maxsize=4096)
def _meaning(dst: TensorType, mesh: Mesh) -> Tags:
    types, sizes = types_of(dst, mesh.names)
    return {a: types[a] for a in mesh.names}, sizes


on_clear(_meaning.cache_clear)


def output_tags(program: Program) -> Tags:
    """The per-axis types (and split sizes) of ``program``'s output."""
    return _meaning(program.dst, program.mesh)


def typed_output(y: torch.Tensor, x: torch.Tensor, tags: Tags) -> torch.Tensor:
    """``y``, a redistribution's output from ``x``, typed by its program's ``tags`` (shared by
    every output of the program: never mutated). Axes of another mesh that ``x`` carries
    types on keep them (a redistribution acts on each of their coordinates alike), S(i) as
    V: the dims' blocks may have changed."""
    types, sizes = tags
    outer = getattr(x, TYPES, None)
    if outer and any(a not in types for a in outer):
        types = {**{a: V if t.kind == "S" else t for a, t in outer.items() if a not in types}, **types}
    return attach(y, types, sizes)
