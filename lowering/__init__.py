"""Lowering: checks, layout algebra, DTensor placements, planner, cost model, simulator.

Imports neither torch nor jax at module level.
"""

from lowering.checks import check_type, resolve
from lowering.layout import boxes, local_shape, local_shapes, local_slices
from lowering.program import Cost, Program, Step
from lowering.simulate import simulate

__all__ = [
    "Cost", "Program", "Step", "boxes", "check_type", "local_shape", "local_shapes",
    "local_slices", "resolve", "simulate",
]
