"""Range and group arithmetic on a mesh: the chunk rule, boxes, their overlaps, rank groups.

The rule is torch.chunk applied axis by axis, major to minor (DTensor's nested
``Shard``): a range of length L split over n ranks gives chunks of ceil(L/n), the
trailing ones shorter or empty. ``10@(dp,tp)`` on ``dp=2,tp=4`` gives 2,2,1,0,2,2,1,0.
An empty chunk keeps the start the rule gives it. A box is an array (..., ndim, 2) of
[start, stop) per dim. Pure functions of IR and numpy arrays; the per-dim ones are cached,
since the planner's states share most of their dims.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from lowering.caching import MIB, cached
from spec_lang.ir import Mesh


@cached(maxsize=256, max_bytes=8 * MIB)
def mesh_coords(mesh: Mesh) -> np.ndarray:
    """(world, mesh.ndim) int array: row-major coordinates of every rank."""
    grids = np.indices(mesh.sizes).reshape(mesh.ndim, -1).T
    return np.ascontiguousarray(grids, dtype=np.int64)


# one range (ints) or one per rank (arrays)
Ints = TypeVar("Ints", int, np.ndarray)


def chunk_range(start: Ints, length: Ints, n: int, c: Ints) -> tuple[Ints, Ints]:
    """torch.chunk of [start, start+length) into n pieces; piece c as (start, length)."""
    size = -(-length // n)  # ceil
    lo = np.minimum(c * size, length)
    hi = np.minimum((c + 1) * size, length)
    return start + lo, hi - lo


@cached(maxsize=4096, max_bytes=16 * MIB)
def dim_ranges(size: int, axes: tuple[str, ...], mesh: Mesh) -> np.ndarray:
    """(world, 2) [start, stop) of one dim of ``size`` sharded by ``axes`` (read-only; cached,
    since the planner's states share most of their dims).

    The minor axis chunks the ranges of the axes before it, which are cached too: the
    search's states grow and shrink their dims at the minor end, so a new dim is one
    chunking of a known one."""
    if not axes:
        out = np.empty((mesh.size, 2), dtype=np.int64)
        out[:, 0], out[:, 1] = 0, size
    else:
        major = dim_ranges(size, axes[:-1], mesh)
        start = major[:, 0]
        start, length = chunk_range(start, major[:, 1] - start, mesh.axis_size(axes[-1]),
                                    mesh_coords(mesh)[:, mesh.index(axes[-1])])
        out = np.empty((mesh.size, 2), dtype=np.int64)
        out[:, 0] = start
        out[:, 1] = start + length
    out.setflags(write=False)
    return out


@cached(maxsize=4096, max_bytes=4 * MIB)
def dim_lengths(size: int, axes: tuple[str, ...], mesh: Mesh) -> np.ndarray:
    """(world,) each rank's length of one dim (read-only)."""
    r = dim_ranges(size, axes, mesh)
    out = r[:, 1] - r[:, 0]
    out.setflags(write=False)
    return out


@cached(maxsize=4096, max_bytes=4 * MIB)
def dim_overlap(size: int, axes_a: tuple[str, ...], axes_b: tuple[str, ...], mesh: Mesh) -> np.ndarray:
    """(world,) per rank, the length its ranges of one dim under ``axes_a`` and ``axes_b`` share."""
    ra, rb = dim_ranges(size, axes_a, mesh), dim_ranges(size, axes_b, mesh)
    out = np.maximum(np.minimum(ra[:, 1], rb[:, 1]) - np.maximum(ra[:, 0], rb[:, 0]), 0)
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


def overlap_numel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``box_numel(overlap(a, b))`` without building the boxes (the pricing's hot path)."""
    return np.prod(np.maximum(np.minimum(a[..., 1], b[..., 1]) - np.maximum(a[..., 0], b[..., 0]), 0), axis=-1)


def meet_numel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elements shared by the box lists ``a`` (..., ka, ndim, 2) and ``b`` (..., kb, ndim, 2)
    (boxes within a list are disjoint), broadcasting over the leading axes."""
    ext = np.minimum(a[..., :, None, :, 1], b[..., None, :, :, 1]) - \
        np.maximum(a[..., :, None, :, 0], b[..., None, :, :, 0])
    return np.prod(np.maximum(ext, 0), axis=-1).sum(axis=(-1, -2))


def flat_run_boxes(a: int, b: int, shape: tuple[int, ...]) -> list[list[tuple[int, int]]]:
    """The row-major run [a, b) of a ``shape`` tensor as boxes in order (at most 2k-1)."""
    if a >= b:
        return []
    if len(shape) == 1:
        return [[(a, b)]]
    inner = 1
    for s in shape[1:]:
        inner *= s
    lo, hi = a // inner, (b - 1) // inner
    if lo == hi:
        return [[(lo, lo + 1)] + box for box in flat_run_boxes(a - lo * inner, b - lo * inner, shape[1:])]
    out = []
    if a % inner:
        out += [[(lo, lo + 1)] + box for box in flat_run_boxes(a % inner, inner, shape[1:])]
        lo += 1
    full_hi = hi + 1 if b % inner == 0 else hi
    if full_hi > lo:
        out.append([(lo, full_hi)] + [(0, s) for s in shape[1:]])
    if b % inner:
        out += [[(hi, hi + 1)] + box for box in flat_run_boxes(0, b % inner, shape[1:])]
    return out


def group_ranks(mesh: Mesh, axes: tuple[str, ...], rank: int) -> tuple[int, ...]:
    """The ranks of ``rank``'s group over ``axes``, ordered row-major over ``axes`` as listed.

    The group holds every rank that shares ``rank``'s coordinates on the other axes.
    A rank's index in this tuple is its rank in the flattened collective.
    """
    group_of, groups = group_arrays(mesh, axes)
    return tuple(groups[group_of[rank]].tolist())


# Arrays, not tuples of Python ints: a search over a big mesh asks for the groups of many
# axis tuples, and an int array holds a 4,096-rank table in a fifth of the memory.
@cached(maxsize=1024, max_bytes=8 * MIB)
def group_arrays(mesh: Mesh, axes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(group index of every rank, (num_groups, n) ranks of each group in group order)."""
    idx = [mesh.index(a) for a in axes]
    rest = [i for i in range(mesh.ndim) if i not in idx]
    ranks = np.arange(mesh.size).reshape(mesh.sizes)
    perm = np.ascontiguousarray(np.transpose(ranks, rest + idx).reshape(-1, mesh.group_size(axes) if axes else 1))
    group_of = np.empty(mesh.size, dtype=np.int64)
    group_of[perm] = np.arange(perm.shape[0])[:, None]
    perm.setflags(write=False)
    group_of.setflags(write=False)
    return group_of, perm


def all_groups(mesh: Mesh, axes: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """Every group over ``axes`` (each ordered as in ``group_ranks``)."""
    return tuple(map(tuple, group_arrays(mesh, axes)[1].tolist()))
