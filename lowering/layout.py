"""Layout algebra: which global block each rank holds, uneven sizes exact.

The rule is torch.chunk applied axis by axis, major to minor (DTensor's nested
``Shard``): a range of length L split over n ranks gives chunks of ceil(L/n), the
trailing ones shorter or empty. ``10@(dp,tp)`` on ``dp=2,tp=4`` gives 2,2,1,0,2,2,1,0.
An empty chunk keeps the start the rule gives it.

Boxes are numpy arrays of shape (world, ndim, 2) holding [start, stop) per dim;
they are cached per (type, mesh), so the planner, the lower bound and the simulator
all share one computation.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from spec_lang.ir import Mesh, TensorType


@lru_cache(maxsize=256)
def mesh_coords(mesh: Mesh) -> np.ndarray:
    """(world, mesh.ndim) int array: row-major coordinates of every rank."""
    grids = np.indices(mesh.sizes).reshape(mesh.ndim, -1).T
    return np.ascontiguousarray(grids, dtype=np.int64)


def chunk_range(start: np.ndarray, length: np.ndarray, n: int, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """torch.chunk of [start, start+length) into n pieces; piece c as (start, length)."""
    size = -(-length // n)  # ceil
    lo = np.minimum(c * size, length)
    hi = np.minimum((c + 1) * size, length)
    return start + lo, hi - lo


@lru_cache(maxsize=4096)
def dim_ranges(size: int, axes: tuple[str, ...], mesh: Mesh) -> np.ndarray:
    """(world, 2) [start, stop) of one dim of ``size`` sharded by ``axes`` (read-only; cached,
    since the planner's states share most of their dims)."""
    coords = mesh_coords(mesh)
    world = mesh.size
    start = np.zeros(world, dtype=np.int64)
    length = np.full(world, size, dtype=np.int64)
    for a in axes:
        i = mesh.index(a)
        start, length = chunk_range(start, length, mesh.sizes[i], coords[:, i])
    out = np.stack([start, start + length], axis=1)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=4096)
def boxes(t: TensorType, mesh: Mesh) -> np.ndarray:
    """(world, ndim, 2) int array: the global [start, stop) each rank holds, per dim.

    Partial, replicated and varying axes do not cut the box: every rank on such
    an axis holds the same index range (with, for P and V, different values).
    """
    out = np.empty((mesh.size, t.ndim, 2), dtype=np.int64)
    for d, dim in enumerate(t.dims):
        out[:, d, :] = dim_ranges(dim.size, dim.axes, mesh)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=4096)
def local_shapes(t: TensorType, mesh: Mesh) -> tuple[tuple[int, ...], ...]:
    """Every rank's local shape, in rank order."""
    b = boxes(t, mesh)
    sizes = b[:, :, 1] - b[:, :, 0]
    if t.ndim == 0:
        return ((),) * mesh.size
    return tuple(zip(*sizes.T.tolist()))  # column lists zipped: the fast way to int tuples


def local_shape(t: TensorType, mesh: Mesh, rank: int) -> tuple[int, ...]:
    b = boxes(t, mesh)[rank]
    return tuple(int(hi - lo) for lo, hi in b)


@lru_cache(maxsize=4096)
def local_numel(t: TensorType, mesh: Mesh) -> np.ndarray:
    """(world,) elements each rank holds."""
    b = boxes(t, mesh)
    out = np.prod(b[:, :, 1] - b[:, :, 0], axis=1)
    out.setflags(write=False)
    return out


def box_slices(box: np.ndarray) -> tuple[slice, ...]:
    return tuple(slice(int(lo), int(hi)) for lo, hi in box)


def overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise box intersection (broadcasting over leading axes), stop clamped to start."""
    lo = np.maximum(a[..., 0], b[..., 0])
    hi = np.minimum(a[..., 1], b[..., 1])
    hi = np.maximum(hi, lo)
    return np.stack([lo, hi], axis=-1)


def box_numel(b: np.ndarray) -> np.ndarray:
    return np.prod(b[..., 1] - b[..., 0], axis=-1)


def group_ranks(mesh: Mesh, axes: tuple[str, ...], rank: int) -> tuple[int, ...]:
    """The ranks of ``rank``'s group over ``axes``, ordered row-major over ``axes`` as listed.

    The group holds every rank that shares ``rank``'s coordinates on the other axes.
    A rank's index in this tuple is its rank in the flattened collective.
    """
    return _groups(mesh, axes)[1][_groups(mesh, axes)[0][rank]]


@lru_cache(maxsize=1024)
def _groups(mesh: Mesh, axes: tuple[str, ...]) -> tuple[np.ndarray, tuple[tuple[int, ...], ...]]:
    idx = [mesh.index(a) for a in axes]
    rest = [i for i in range(mesh.ndim) if i not in idx]
    ranks = np.arange(mesh.size).reshape(mesh.sizes)
    perm = np.transpose(ranks, rest + idx).reshape(-1, mesh.group_size(axes) if axes else 1)
    group_of = np.empty(mesh.size, dtype=np.int64)
    group_of[perm] = np.arange(perm.shape[0])[:, None]
    return group_of, tuple(map(tuple, perm.tolist()))


def all_groups(mesh: Mesh, axes: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """Every group over ``axes`` (each ordered as in ``group_ranks``)."""
    return _groups(mesh, axes)[1]


def group_index(mesh: Mesh, axes: tuple[str, ...], rank: int) -> int:
    """``rank``'s position within its group over ``axes``."""
    c = mesh.coords(rank)
    i = 0
    for a in axes:
        k = mesh.index(a)
        i = i * mesh.sizes[k] + c[k]
    return i


def local_slices(t: TensorType | str, mesh: Mesh | str) -> list[tuple[slice, ...]]:
    """One entry per rank, in rank order: the global index range that rank holds."""
    from lowering.checks import resolve

    t, mesh = resolve(t, mesh)
    return [box_slices(b) for b in boxes(t, mesh)]
