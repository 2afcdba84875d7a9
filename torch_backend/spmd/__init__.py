"""The SPMD type system for plain tensors (docs/spmd_types.md): typed per-axis collectives with
exact backward, types attached to tensors, an opt-in type checker, ``local_map`` and global-SPMD
einsum/linear.
"""

from __future__ import annotations

from lowering.spmd.types import S
from spec_lang.local_type import I, LocalType, P, R, V
from torch_backend.spmd.check import no_typecheck, typecheck
from torch_backend.spmd.collectives import (
    all_gather,
    all_reduce,
    all_to_all,
    convert,
    redistribute,
    reduce_scatter,
    reinterpret,
)
from torch_backend.spmd.global_spmd import einsum, linear, local_map
from torch_backend.spmd.mesh import use_mesh
from torch_backend.spmd.tags import assert_type, typeof

__all__ = [
    "I", "LocalType", "P", "R", "S", "V", "all_gather", "all_reduce", "all_to_all", "assert_type", "convert",
    "einsum", "linear", "local_map", "no_typecheck", "redistribute", "reduce_scatter", "reinterpret", "typecheck",
    "typeof", "use_mesh",
]
