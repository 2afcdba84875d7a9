"""Reference interpreter: runs a Program over per-rank numpy arrays.

Each step runs its kind's numpy semantics (``lowering.kinds``) over the per-rank pieces
the executor also runs from; the semantics follow the SPMD type system's collective
specifications. It is the oracle the planner's property tests and the executor's
tests compare against.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lowering.cross_mesh import world_of
from lowering.kinds import simulate_step
from lowering.layout import local_shapes
from lowering.program import Program, check_program
from spec_lang.errors import SpecError


def simulate(program: Program, local_inputs: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    """Run ``program`` on one numpy array per rank (rank order); returns the outputs.

    A cross-mesh program (``Program.crosses_meshes``) takes one entry per rank of its
    world (``0 .. max rank`` of its two meshes), None off the source mesh, and returns one
    per rank, None off the destination mesh: its steps on the source mesh run on the
    source ranks' blocks, then the crossing on every world rank's."""
    mesh = check_program(program).mesh
    if program.crosses_meshes:
        return _simulate_across(program, local_inputs)
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
    return list(xs)


def _simulate_across(p: Program, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    src_mesh, dst_mesh = p.mesh, p.dst_mesh
    world = world_of(src_mesh, dst_mesh)
    if isinstance(inputs, (str, bytes, bytearray)) or not hasattr(inputs, "__len__"):
        raise SpecError(f"simulate takes one array (or None) per world rank, got {type(inputs).__name__}",
                        hint=f"pass a list of {world} entries, None off the source mesh {src_mesh}")
    if len(inputs) != world:
        raise SpecError(f"simulate got {len(inputs)} inputs for a cross-mesh program over {world} ranks",
                        hint=f"pass one entry per rank 0..{world - 1}, None off the source mesh {src_mesh}")
    on_src = src_mesh.global_ranks
    for r, x in enumerate(inputs):
        if (x is None) == (r in on_src):
            raise SpecError(f"rank {r}'s input is {'missing' if x is None else 'given'}, but rank {r} is "
                            f"{'on' if r in on_src else 'off'} the source mesh {src_mesh}",
                            hint="give each rank of the source mesh its block and every other rank None")
    xs = [np.asarray(inputs[r]) for r in on_src]
    for r, x, want in zip(on_src, xs, local_shapes(p.src, src_mesh), strict=True):
        if x.shape != want:
            raise SpecError(f"rank {r}'s input has shape {list(x.shape)}, the source type says {list(want)}",
                            hint=f"give each rank of the source mesh its block of {p.src}")
    for step in p.steps[:-1]:
        xs = simulate_step(step, src_mesh, xs)
    dtype = xs[0].dtype if xs else np.dtype(np.float32)
    blocks = [np.empty(0, dtype=dtype)] * world
    for r, x in zip(on_src, xs, strict=True):
        blocks[r] = x
    out = simulate_step(p.steps[-1], src_mesh, blocks)
    on_dst = set(dst_mesh.global_ranks)
    return [y if r in on_dst else None for r, y in enumerate(out)]
