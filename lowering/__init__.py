"""Lowering: checks, layout algebra, DTensor placements, planner, cost model, simulator.

Imports neither torch nor jax at module level; names resolve lazily from their modules.
"""

from __future__ import annotations

from spec_lang.lazy import lazy_exports

_EXPORTS = {
    # layout algebra
    "boxes": "lowering.layout.per_rank",
    "local_shape": "lowering.layout.per_rank",
    "local_shapes": "lowering.layout.per_rank",
    "local_slices": "lowering.layout.per_rank",
    "local_indices": "lowering.layout.per_rank",
    # the uneven placements (also written in the DSL: 10@dp<3,0,7>, <ragged ...>, <parts ...>)
    "DynamicShard": "lowering.uneven",
    "RaggedShard": "lowering.uneven",
    "PartitionedShard": "lowering.uneven",
    # checks
    "check_type": "lowering.checks",
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
    "simulate": "lowering.simulator",
    # caches
    "clear_caches": "lowering.caching",
    "cache_stats": "lowering.caching",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
