"""Layout algebra: which global block each rank holds, uneven sizes exact.

The rule is torch.chunk applied axis by axis, major to minor (DTensor's nested
``Shard``): a range of length L split over n ranks gives chunks of ceil(L/n), the
trailing ones shorter or empty. ``10@(dp,tp)`` on ``dp=2,tp=4`` gives 2,2,1,0,2,2,1,0.
An empty chunk keeps the start the rule gives it.

Boxes are numpy arrays of shape (world, ndim, 2) holding [start, stop) per dim;
they are cached per (type, mesh), so the planner, the lower bound and the simulator
all share one computation (and one array serves the types that differ only in dtype or
P/R/I/V axes).
"""

from __future__ import annotations

import weakref

import numpy as np

from lowering.caching import MIB, cached, on_clear
from lowering.checks import check_rank, check_type, resolve
from spec_lang.errors import SpecError
from spec_lang.ir import Dim, Mesh, TensorType


@cached(maxsize=256, max_bytes=8 * MIB)
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


@cached(maxsize=4096, max_bytes=24 * MIB)
def boxes(t: TensorType | str, mesh: Mesh | str) -> np.ndarray:
    """(world, ndim, 2) int array: the global [start, stop) each rank holds, per dim.

    Partial, replicated and varying axes do not cut the box: every rank on such
    an axis holds the same index range (with, for P and V, different values).
    """
    if type(t) is not TensorType or type(mesh) is not Mesh:
        t, mesh = resolve(t, mesh)
    if any(d.split is not None for d in t.dims):
        raise SpecError(f"{t} splits a dim unevenly: its ranks hold blocks, not one box each",
                        hint="ask lowering.blocks.rank_layout for an uneven type's blocks")
    key = (t.dims, mesh)
    out = _BOXES_BY_DIMS.get(key)
    if out is None:
        check_type(t, mesh)  # a type built in code may name an axis its mesh lacks
        out = np.empty((mesh.size, t.ndim, 2), dtype=np.int64)
        for d, dim in enumerate(t.dims):
            out[:, d, :] = dim_ranges(dim.size, dim.axes, mesh)
        out.setflags(write=False)
        _BOXES_BY_DIMS[key] = out
    return out


# Types that differ only in dtype or in their P/R/I/V axes (many of a search's states)
# have the same boxes: a miss reuses a live array. Keyed weakly, so the byte bound of
# ``boxes`` (keyed by the type, whose hash is cached: a cheaper hit) still decides.
_BOXES_BY_DIMS: weakref.WeakValueDictionary[tuple[tuple[Dim, ...], Mesh], np.ndarray] = weakref.WeakValueDictionary()
on_clear(_BOXES_BY_DIMS.clear)


@cached(maxsize=4096, max_bytes=8 * MIB)
def local_shapes(t: TensorType | str, mesh: Mesh | str) -> tuple[tuple[int, ...], ...]:
    """Every rank's local shape, in rank order (equal shapes are one shared tuple)."""
    if type(t) is not TensorType or type(mesh) is not Mesh:
        t, mesh = resolve(t, mesh)
    if t.ndim == 0:
        return ((),) * mesh.size
    if any(d.split is not None for d in t.dims):
        from lowering.blocks import layouts

        check_type(t, mesh)
        return tuple(lay.shape for lay in layouts(t, mesh))
    b = boxes(t, mesh)
    sizes = b[:, :, 1] - b[:, :, 0]
    shared: dict[tuple[int, ...], tuple[int, ...]] = {}
    # column lists zipped: the fast way to int tuples; a world of equal blocks keeps one
    return tuple(shared.setdefault(s, s) for s in zip(*sizes.T.tolist()))


def local_shape(t: TensorType | str, mesh: Mesh | str, rank: int) -> tuple[int, ...]:
    """``rank``'s local shape; a rank off the mesh is a SpecError."""
    if type(t) is not TensorType or type(mesh) is not Mesh:
        t, mesh = resolve(t, mesh)
    return local_shapes(t, mesh)[check_rank(rank, mesh)]


@cached(maxsize=4096, max_bytes=4 * MIB)
def local_numel(t: TensorType, mesh: Mesh) -> np.ndarray:
    """(world,) elements each rank holds."""
    if any(d.split is not None for d in t.dims):
        out = np.array([int(np.prod(s)) for s in local_shapes(t, mesh)], dtype=np.int64)
    elif not t.dims:
        out = np.ones(mesh.size, dtype=np.int64)
    else:
        # a box is a product of per-dim ranges, and a search's states share most of their
        # dims: the per-dim lengths are cached, the box is never built
        out = _dim_lengths(t.dims[0].size, t.dims[0].axes, mesh)
        for d in t.dims[1:]:
            out = out * _dim_lengths(d.size, d.axes, mesh)
    out.setflags(write=False)  # one dim: the per-dim cache's array itself, read-only already
    return out


@cached(maxsize=4096, max_bytes=4 * MIB)
def _dim_lengths(size: int, axes: tuple[str, ...], mesh: Mesh) -> np.ndarray:
    r = dim_ranges(size, axes, mesh)
    out = r[:, 1] - r[:, 0]
    out.setflags(write=False)
    return out


def own_overlap_numel(a: TensorType, b: TensorType, mesh: Mesh) -> np.ndarray:
    """(world,) elements of each rank's ``a`` block that its own ``b`` block holds too
    (``overlap_numel(boxes(a), boxes(b))``), from cached per-dim overlaps (read-only).
    Uneven types hold several blocks a rank: ``lowering.blocks`` counts those."""
    if any(d.split is not None for d in a.dims + b.dims):
        from lowering.blocks import held_overlap  # blocks builds on this module

        return held_overlap(a, b, mesh)
    if not a.dims:
        return np.ones(mesh.size, dtype=np.int64)
    out = _dim_overlap(a.dims[0].size, a.dims[0].axes, b.dims[0].axes, mesh)
    for da, db in zip(a.dims[1:], b.dims[1:]):
        out = out * _dim_overlap(da.size, da.axes, db.axes, mesh)
    return out  # read-only where it is one dim's cached array: callers only read it


@cached(maxsize=4096, max_bytes=4 * MIB)
def _dim_overlap(size: int, axes_a: tuple[str, ...], axes_b: tuple[str, ...], mesh: Mesh) -> np.ndarray:
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


def local_slices(t: TensorType | str, mesh: Mesh | str) -> list[tuple[slice, ...]]:
    """One entry per rank, in rank order: the global index range that rank holds."""
    t, mesh = resolve(t, mesh)
    return [box_slices(b) for b in boxes(t, mesh)]
