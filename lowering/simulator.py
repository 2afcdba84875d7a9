"""Reference interpreter: runs a Program over per-rank numpy arrays.

Each step runs its kind's numpy semantics (``lowering.kinds``) over the per-rank pieces
the executor also runs from; the semantics follow the SPMD type system's collective
specifications. It is the oracle the planner's property tests and the executor's
tests compare against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np

from lowering.cross_mesh import CrossProgram, simulate_cross
from lowering.kinds import simulate_step
from lowering.layout import local_shapes
from lowering.program import Program, check_program
from spec_lang.errors import SpecError


@overload
def simulate(program: Program, local_inputs: Sequence[np.ndarray]) -> list[np.ndarray]: ...


@overload
def simulate(program: CrossProgram, local_inputs: Sequence[np.ndarray | None]) -> list[np.ndarray | None]: ...


def simulate(program: Program | CrossProgram,
             local_inputs: Sequence[np.ndarray | None]) -> list[np.ndarray] | list[np.ndarray | None]:
    """Run ``program`` on one numpy array per rank (rank order); returns the outputs.

    A ``CrossProgram`` takes one entry per rank of its world (``0 .. max rank``), None off
    the source mesh, and returns one per rank, None off the destination mesh."""
    if isinstance(program, CrossProgram):
        return simulate_cross(program, local_inputs, simulate)
    mesh = check_program(program).mesh
    if isinstance(local_inputs, (str, bytes, bytearray)) or not hasattr(local_inputs, "__len__") \
            or getattr(local_inputs, "ndim", 1) == 0:  # a 0-d array or tensor has __len__ but no length
        raise SpecError(f"simulate takes one array per rank, got {type(local_inputs).__name__}",
                        hint="pass a list of numpy arrays, one per rank, in rank order")
    if len(local_inputs) != mesh.size:
        raise SpecError(
            f"simulate got {len(local_inputs)} local inputs for a mesh of {mesh.size} ranks",
            hint="pass one array per rank, in rank order",
        )
    shapes = local_shapes(program.src, mesh)
    xs = [np.asarray(x) for x in local_inputs]
    for r, x in enumerate(xs):
        want = shapes[r]
        if x.shape != want:
            raise SpecError(
                f"rank {r}'s input has shape {list(x.shape)}, the source type says {list(want)}",
                hint=f"give each rank its block of {program.src}",
            )
    for step in program.steps:
        xs = simulate_step(step, mesh, xs)
    return xs
