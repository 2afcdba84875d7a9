"""The uneven placements' semantics written from their definition (docs/uneven.md), the
tests' oracle for the layout algebra: per shard of a mesh axis of ``n`` ranks, the
row-major flat global index of every element of its local tensor, in local order."""

from __future__ import annotations

import math

import numpy as np

from lowering import DynamicShard, PartitionedShard, RaggedShard

Placement = DynamicShard | RaggedShard | PartitionedShard
Runs = list[tuple[int, int]]  # [start, stop) along the dim (a RaggedShard: its flattened prefix), in local order


def runs(p: Placement, shape: tuple[int, ...], n: int) -> list[Runs]:
    """Per shard, its runs of the placement's dim (a RaggedShard: of its flattened prefix)."""
    if isinstance(p, (DynamicShard, RaggedShard)):
        if isinstance(p, DynamicShard):
            sizes = np.asarray(p.chunk_sizes)
        else:  # units of equal length; the prefix divides by their sum
            sizes = np.asarray(p.local_units) * (math.prod(shape[:len(p.dims)]) // sum(p.local_units))
        starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        return [[(starts[s], starts[s + 1])] for s in range(n)]
    start: dict[tuple[int, int], int] = {}
    pos = 0
    for part in range(p.num_partitions):  # pieces lie partition-major: P0p P1p ... P0(p+1) ...
        for s in range(n):
            start[s, part] = pos
            pos += p.splits[s][part]
    k = p.num_partitions // n
    order = [[(q, part) for part in range(s * k, s * k + k) for q in range(n)] if p.aligned
             else [(s, part) for part in range(p.num_partitions)] for s in range(n)]
    return [[(start[q, part], start[q, part] + p.splits[q][part]) for q, part in o] for o in order]


def _with_rows(shape: tuple[int, ...], dim: int, rs: Runs) -> np.ndarray:
    """Flat global indices of the runs along ``dim`` concatenated (every other dim whole)."""
    grids = [np.arange(k) for k in shape]
    grids[dim] = np.concatenate([np.arange(a, b) for a, b in rs]) if rs else np.zeros(0, dtype=np.int64)
    mesh = np.meshgrid(*grids, indexing="ij")
    return np.ravel_multi_index(tuple(m.reshape(-1) for m in mesh), shape)


def indices(p: Placement, shape: tuple[int, ...], n: int) -> list[np.ndarray]:
    if isinstance(p, RaggedShard):
        grain = math.prod(shape[len(p.dims):])
        return [(np.arange(a, b)[:, None] * grain + np.arange(grain)[None, :]).reshape(-1)
                for (a, b), in runs(p, shape, n)]
    return [_with_rows(shape, p.dim, rs) for rs in runs(p, shape, n)]


def local_shape(p: Placement, shape: tuple[int, ...], n: int, s: int) -> tuple[int, ...]:
    if isinstance(p, RaggedShard):
        (a, b), = runs(p, shape, n)[s]
        if len(p.dims) > 1:  # the flattened prefix: a 1-D local tensor
            return ((b - a) * math.prod(shape[len(p.dims):]),)
        return (b - a,) + shape[1:]
    return shape[:p.dim] + (sum(b - a for a, b in runs(p, shape, n)[s]),) + shape[p.dim + 1:]
