"""Test helpers: per-rank inputs of a type for a global array, and the expected outputs.

Partial sources get random per-rank contributions whose reduction is the global
array, so a test checks the program's semantics, not a lucky coincidence.
"""

from __future__ import annotations

import numpy as np

from lowering.layout import block_indices, group_ranks, rank_layout
from spec_lang.ir import Mesh, TensorType


def local_array(full: np.ndarray, t: TensorType, mesh: Mesh, rank: int) -> np.ndarray:
    """``rank``'s local tensor of the global array ``full`` (a copy, in local order)."""
    lay = rank_layout(t, mesh, rank)
    return full.reshape(-1)[block_indices(lay, t.shape)].reshape(lay.shape)


def shards_of(full: np.ndarray, t: TensorType, mesh: Mesh, rng: np.random.Generator,
              exact_avg: bool = True) -> list[np.ndarray]:
    """Each rank's local block of ``full`` under ``t`` (partial axes split into contributions).

    ``exact_avg=False``: an average's contributions need not sum to a multiple of the group
    size, so an integer average truncates (the value is then not ``full``: read it with
    ``denoted_global``)."""
    out = [local_array(full, t, mesh, r) for r in range(mesh.size)]
    axes = tuple(a for a in mesh.names if a in t.partial_axes)
    if not axes:
        return out
    op = t.partial_op
    done: set[int] = set()
    for r in range(mesh.size):
        if r in done:
            continue
        group = group_ranks(mesh, axes, r)
        done.update(group)
        base = out[r]
        n = len(group)
        if op == "sum":
            parts = [rng.integers(-8, 8, size=base.shape).astype(base.dtype) for _ in range(n - 1)]
            parts.append(base - sum(parts, np.zeros_like(base)))
        elif op == "avg":
            parts = [rng.integers(-8, 8, size=base.shape).astype(base.dtype) for _ in range(n - 1)]
            parts.append(base * n - sum(parts, np.zeros_like(base)))
            if not exact_avg:  # a remainder that depends on the value alone, so replicas still agree
                parts[-1] = parts[-1] + (np.abs(base).astype(np.int64) % n).astype(base.dtype)
        else:  # max / min: one contribution holds the value, the others are beyond it
            sign = -1 if op == "max" else 1
            parts = [base + sign * rng.integers(1, 8, size=base.shape).astype(base.dtype) for _ in range(n)]
            parts[int(rng.integers(0, n))] = base.copy()
        for q, p in zip(group, parts):
            out[q] = p
    return out


def expected(full: np.ndarray, t: TensorType, mesh: Mesh) -> list[np.ndarray]:
    """What every rank must hold under ``t`` for a non-partial ``t``."""
    return [local_array(full, t, mesh, r) for r in range(mesh.size)]


def reduce_partial(outs: list[np.ndarray], t: TensorType, mesh: Mesh) -> list[np.ndarray]:
    """Reduce the P axes of ``t`` over per-rank outputs: the value the type denotes per rank."""
    axes = tuple(a for a in mesh.names if a in t.partial_axes)
    if not axes:
        return outs
    op = t.partial_op
    red = []
    for r in range(mesh.size):
        stack = np.stack([outs[q] for q in group_ranks(mesh, axes, r)])
        if op == "avg" and np.issubdtype(stack.dtype, np.integer):
            # the definition of an integer P(avg): the whole group's sum, divided once, toward zero
            total = stack.sum(0)
            red.append((np.sign(total) * (np.abs(total) // len(stack))).astype(stack.dtype))
            continue
        red.append({"sum": stack.sum(0), "avg": stack.mean(0), "max": stack.max(0), "min": stack.min(0)}[op])
    return red


def denoted_global(inputs: list[np.ndarray], t: TensorType, mesh: Mesh) -> np.ndarray:
    """The global array that per-rank blocks of ``t`` denote (P axes reduced by their definition)."""
    blocks = reduce_partial(inputs, t, mesh)
    out = np.zeros(t.shape, dtype=blocks[0].dtype).reshape(-1)
    for r, b in enumerate(blocks):
        out[block_indices(rank_layout(t, mesh, r), t.shape)] = b.reshape(-1)
    return out.reshape(t.shape)
