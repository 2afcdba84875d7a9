"""Lowering: checks, layout algebra, DTensor placements, planner, cost model, simulator.

The public door: every name here takes types and meshes as strings or IR, and the modules
below it take IR only (the layout functions are thin doors defined here). Imports neither
torch nor jax at module level; the other names resolve lazily from their modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spec_lang.lazy import lazy_exports

if TYPE_CHECKING:  # what a type checker (and an IDE) sees of the lazy names
    import numpy as np

    from lowering.bounds import lower_bound as lower_bound
    from lowering.caching import cache_stats as cache_stats
    from lowering.caching import clear_caches as clear_caches
    from lowering.checks import resolve as resolve
    from lowering.cost import CostModel as CostModel
    from lowering.cross_mesh import CrossProgram as CrossProgram
    from lowering.joint import JointProgram as JointProgram
    from lowering.joint import compile_many as compile_many
    from lowering.kinds import make_step as make_step
    from lowering.kinds import rank_pieces as rank_pieces
    from lowering.placements import check_placements as check_placements
    from lowering.placements import from_placements as from_placements
    from lowering.placements import to_placements as to_placements
    from lowering.planner import compile as compile
    from lowering.program import Cost as Cost
    from lowering.program import Program as Program
    from lowering.program import Step as Step
    from lowering.program import make_program as make_program
    from lowering.simulator import simulate as simulate
    from lowering.uneven import DynamicShard as DynamicShard
    from lowering.uneven import PartitionedShard as PartitionedShard
    from lowering.uneven import RaggedShard as RaggedShard
    from spec_lang.ir import Mesh, TensorType

_EXPORTS = {
    # the uneven placements (also written in the DSL: 10@dp<3,0,7>, <ragged ...>, <parts ...>)
    "DynamicShard": "lowering.uneven",
    "RaggedShard": "lowering.uneven",
    "PartitionedShard": "lowering.uneven",
    # checks
    "resolve": "lowering.checks",
    "check_placements": "lowering.placements",
    # DTensor placements
    "to_placements": "lowering.placements",
    "from_placements": "lowering.placements",
    # programs, planning, cost
    "Cost": "lowering.program",
    "Program": "lowering.program",
    "Step": "lowering.program",
    "make_step": "lowering.kinds",
    "make_program": "lowering.program",
    "rank_pieces": "lowering.kinds",
    "CostModel": "lowering.cost",
    "compile": "lowering.planner",
    "compile_many": "lowering.joint",
    "JointProgram": "lowering.joint",
    "lower_bound": "lowering.bounds",
    "CrossProgram": "lowering.cross_mesh",
    "simulate": "lowering.simulator",
    # caches
    "clear_caches": "lowering.caching",
    "cache_stats": "lowering.caching",
}

# the doors below: the layout algebra (lowering.layout.per_rank) and check_type take IR only
_DOORS = ["boxes", "check_type", "local_indices", "local_shape", "local_shapes", "local_slices"]

__all__ = sorted([*_EXPORTS, *_DOORS])


def check_type(t: TensorType | str, mesh: Mesh | str, text: str | None = None) -> None:
    """Every axis the type names exists on the mesh; otherwise a SpecError at that axis,
    its caret in ``text`` (the type as written; a type string is its own text)."""
    from lowering.checks import check_type_once
    from spec_lang.parser import parse, parse_mesh

    check_type_once(parse(t), parse_mesh(mesh), t if isinstance(t, str) and text is None else text)


def boxes(t: TensorType | str, mesh: Mesh | str) -> np.ndarray:
    """(world, ndim, 2) int array, read-only: the global [start, stop) each rank holds, per
    dim, for a type with no uneven split (``lowering.layout.rank_layout`` gives the blocks
    of any type)."""
    from lowering.checks import resolve
    from lowering.layout.per_rank import boxes

    return boxes(*resolve(t, mesh))


def local_shapes(t: TensorType | str, mesh: Mesh | str) -> tuple[tuple[int, ...], ...]:
    """Every rank's local shape, in rank order."""
    from lowering.checks import resolve
    from lowering.layout.per_rank import local_shapes

    return local_shapes(*resolve(t, mesh))


def local_shape(t: TensorType | str, mesh: Mesh | str, rank: int) -> tuple[int, ...]:
    """``rank``'s local shape; a rank off the mesh is a SpecError."""
    from lowering.checks import resolve
    from lowering.layout.per_rank import local_shape

    return local_shape(*resolve(t, mesh), rank)


def local_slices(t: TensorType | str, mesh: Mesh | str) -> list[tuple[slice, ...]]:
    """One entry per rank, in rank order: the global index range that rank holds, so its
    local tensor is ``global[s]``; a SpecError for an uneven type where some rank's local
    tensor is not one slice of the global tensor (``local_indices`` describes it)."""
    from lowering.checks import resolve
    from lowering.layout.per_rank import local_slices

    return local_slices(*resolve(t, mesh))


def local_indices(t: TensorType | str, mesh: Mesh | str) -> list[np.ndarray]:
    """For each rank, the row-major flat global index of every element of its local tensor,
    in the local tensor's order."""
    from lowering.checks import resolve
    from lowering.layout.per_rank import local_indices

    return local_indices(*resolve(t, mesh))


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _DOORS)
