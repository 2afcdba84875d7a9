"""Reference interpreter: runs a Program over per-rank numpy arrays.

It follows the seeds' ``*_spec`` semantics through the layout algebra and is the
oracle the planner's property tests and the executor's tests compare against.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lowering.layout import boxes, group_ranks, overlap
from lowering.program import Program, Step
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh


def _rel(piece: np.ndarray, base: np.ndarray) -> tuple[slice, ...]:
    """``piece`` (global box) as a slice of a buffer holding global box ``base``."""
    return tuple(slice(int(p[0] - b[0]), int(p[1] - b[0])) for p, b in zip(piece, base))


def _reduce(arrays: list[np.ndarray], op: str) -> np.ndarray:
    stack = np.stack(arrays)
    if op == "sum":
        return stack.sum(axis=0)
    if op == "avg":
        return stack.sum(axis=0) / len(arrays)
    if op == "max":
        return stack.max(axis=0)
    if op == "min":
        return stack.min(axis=0)
    raise SpecError(f"unknown reduce op {op!r}")


def simulate_step(step: Step, mesh: Mesh, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    src_b = boxes(step.src, mesh)
    dst_b = boxes(step.dst, mesh)
    out: list[np.ndarray] = []
    for r in range(mesh.size):
        shape = tuple(int(hi - lo) for lo, hi in dst_b[r])
        group = group_ranks(mesh, step.axes, r)
        if step.kind in ("slice", "all_gather", "all_to_all", "permute"):
            y = np.zeros(shape, dtype=xs[r].dtype)
            filled = 0
            members = (r,) if step.kind == "slice" else group
            for q in members:
                piece = overlap(src_b[q], dst_b[r])
                n = int(np.prod(piece[:, 1] - piece[:, 0]))
                if n == 0:
                    continue
                y[_rel(piece, dst_b[r])] = xs[q][_rel(piece, src_b[q])]
                filled += n
            if filled != y.size:
                raise AssertionError(f"{step.describe()}: rank {r} got {filled} of {y.size} elements")
            out.append(y)
        elif step.kind == "reduce_scatter":
            parts = [xs[q][_rel(dst_b[r], src_b[q])] for q in group]
            out.append(_reduce(parts, step.op or "sum").astype(xs[r].dtype))
        elif step.kind == "all_reduce":
            out.append(_reduce([xs[q] for q in group], step.op or "sum").astype(xs[r].dtype))
        elif step.kind == "zero_fill":
            c = mesh.coords(r)
            first = all(c[mesh.index(a)] == 0 for a in step.axes)
            out.append(xs[r].copy() if first else np.zeros_like(xs[r]))
        elif step.kind == "zero_pad":
            y = np.zeros(shape, dtype=xs[r].dtype)
            y[_rel(src_b[r], dst_b[r])] = xs[r]
            out.append(y)
        elif step.kind == "reinterpret":
            out.append(xs[r].copy())
        else:
            raise SpecError(f"unknown step kind {step.kind!r}")
    return out


def simulate(program: Program, local_inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run ``program`` on one numpy array per rank (rank order); returns the outputs."""
    mesh = program.mesh
    if len(local_inputs) != mesh.size:
        raise SpecError(
            f"simulate got {len(local_inputs)} local inputs for a mesh of {mesh.size} ranks",
            hint="pass one array per rank, in rank order",
        )
    src_b = boxes(program.src, mesh)
    xs = [np.asarray(x) for x in local_inputs]
    for r, x in enumerate(xs):
        want = tuple(int(hi - lo) for lo, hi in src_b[r])
        if x.shape != want:
            raise SpecError(
                f"rank {r}'s input has shape {list(x.shape)}, the source type says {list(want)}",
                hint=f"give each rank its block of {program.src}",
            )
    for step in program.steps:
        xs = simulate_step(step, mesh, xs)
    return xs
