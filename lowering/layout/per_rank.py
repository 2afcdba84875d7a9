"""Which global elements each rank holds, in local order: the one answer, for every type.

``rank_layout(t, mesh, r)`` is rank r's local tensor as a list of global boxes, *blocks*,
concatenated in local order along ``cat``. A type with no uneven split gives one box per
rank (the chunk rule of ``lowering.layout.ranges``); ``boxes`` gives all of them at once,
the planner's fast path. An uneven split gives several: a PartitionedShard rank holds
several runs of its dim, a RaggedShard over several dims flattened runs (``cat`` None,
the local tensor 1-D)::

    f32[32@ep<parts 4,6,4,2|2,4,8,2>]  on ep=2    (global order P00 P10 P01 P11 ...)
    rank 0: blocks [0:4] [6:12] [16:20] [28:30]   concatenated along dim 0
    rank 1: blocks [4:6] [12:16] [20:28] [30:32]

Every block of a rank has the same extent on the dims other than ``cat``. Every function
here takes IR; ``lowering.boxes``, ``local_shape(s)``, ``local_slices`` and
``local_indices`` are their public doors, which take strings too.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import numpy as np

from lowering.caching import MIB, cached, on_clear
from lowering.checks import check_rank, check_type_once
from lowering.layout.ranges import (
    box_slices,
    chunk_range,
    dim_lengths,
    dim_overlap,
    dim_ranges,
    flat_run_boxes,
    meet_numel,
    mesh_coords,
)
from spec_lang.errors import SpecError
from spec_lang.ir import Dim, Mesh, TensorType


class LocalLayout(NamedTuple):
    """One rank's local tensor: its shape and its blocks (global boxes) in local order."""

    shape: tuple[int, ...]
    blocks: np.ndarray  # (k, ndim, 2) global [start, stop) per dim
    offsets: tuple[int, ...]  # each block's start along ``cat`` (flat when ``cat`` is None)
    cat: int | None

    def slices(self) -> list[tuple[slice, ...]]:
        """Each block as the global index it cuts (``global[s]``), in local order."""
        return [box_slices(b) for b in self.blocks]


@cached(maxsize=4096, max_bytes=24 * MIB)
def boxes(t: TensorType, mesh: Mesh) -> np.ndarray:
    """(world, ndim, 2) int array: the global [start, stop) each rank holds, per dim.

    Partial, replicated and varying axes do not cut the box: every rank on such
    an axis holds the same index range (with, for P and V, different values).
    """
    if t.is_uneven:
        raise SpecError(f"{t} splits a dim unevenly: its ranks hold blocks, not one box each",
                        hint="ask lowering.layout.rank_layout for an uneven type's blocks")
    key = (t.dims, mesh)
    out = _BOXES_BY_DIMS.get(key)
    if out is None:
        check_type_once(t, mesh)  # a type built in code may name an axis its mesh lacks
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


def _runs(t: TensorType, d: int, c: int, length: int) -> list[tuple[int, int]]:
    """Shard ``c``'s [start, stop) runs of the split dim within a chunk of ``length``
    (flattened prefix positions for a ragged split over several dims), in local order."""
    sp = t.dims[d].split
    assert sp is not None
    if sp.kind == "sizes":
        start = sum(sp.values[:c])
        return [(start, start + sp.values[c])]
    if sp.kind == "ragged":
        flat = length
        for dim in t.dims[1:sp.span]:
            flat *= dim.size
        unit = flat // sum(sp.values)
        start = sum(sp.values[:c]) * unit
        return [(start, start + sp.values[c] * unit)]
    rows = sp.values
    n, parts = len(rows), len(rows[0])
    starts: dict[tuple[int, int], int] = {}
    pos = 0
    for p in range(parts):  # partition-major: P0p P1p ... then the next partition
        for s in range(n):
            starts[s, p] = pos
            pos += rows[s][p]
    if sp.aligned:
        k = parts // n
        order = [(q, p) for p in range(c * k, (c + 1) * k) for q in range(n)]
    else:
        order = [(c, p) for p in range(parts)]
    return [(starts[q, p], starts[q, p] + rows[q][p]) for q, p in order]


def _split_runs(t: TensorType, d: int, mesh: Mesh, rank: int) -> list[tuple[int, int]]:
    """The split dim's runs on ``rank``, in mesh-order semantics: the axes before the split
    cut the dim evenly first, the split applies within that chunk, and the axes after it
    cut the split's (single) run evenly."""
    dim = t.dims[d]
    coords = mesh_coords(mesh)[rank]
    start, length = 0, dim.size
    if dim.split_at:
        lo, hi = dim_ranges(dim.size, dim.axes[:dim.split_at], mesh)[rank]
        start, length = int(lo), int(hi - lo)
    c = int(coords[mesh.index(dim.axes[dim.split_at])])
    runs = [(start + a, start + b) for a, b in _runs(t, d, c, length)]
    for a in dim.axes[dim.split_at + 1:]:  # the IR allows minor axes after a single run only
        (lo, hi), = runs
        s, n = chunk_range(lo, hi - lo, mesh.axis_size(a), int(coords[mesh.index(a)]))
        runs = [(int(s), int(s + n))]
    return runs


@cached(maxsize=4096, max_bytes=16 * MIB)
def rank_layout(t: TensorType, mesh: Mesh, rank: int) -> LocalLayout:
    """``rank``'s blocks in local order (see the module docstring); a rank's own work."""
    d = next((k for k, dim in enumerate(t.dims) if dim.split is not None), None)
    if d is None:
        box = boxes(t, mesh)[rank]
        shape = tuple(int(hi - lo) for lo, hi in box)
        return LocalLayout(shape, box[None], (0,), 0 if t.ndim else None)
    sp = t.dims[d].split
    assert sp is not None
    runs = _split_runs(t, d, mesh, rank)
    other = {k: dim_ranges(dim.size, dim.axes, mesh)[rank] for k, dim in enumerate(t.dims) if k != d}
    if sp.kind == "ragged" and sp.span > 1:
        prefix = tuple(dim.size for dim in t.dims[:sp.span])
        tail = [(int(r[0]), int(r[1])) for k, r in other.items() if k >= sp.span]
        blocks = [box + tail for a, b in runs for box in flat_run_boxes(a, b, prefix)]
        arr = np.asarray(blocks, dtype=np.int64).reshape(len(blocks), t.ndim, 2)
        sizes = np.prod(arr[:, :, 1] - arr[:, :, 0], axis=1).tolist() if len(blocks) else []
        offsets = tuple(int(x) for x in np.concatenate([[0], np.cumsum(sizes)[:-1]])) if sizes else ()
        total = int(sum(sizes))
        return LocalLayout((total,), arr, offsets, None)
    arr = np.empty((len(runs), t.ndim, 2), dtype=np.int64)
    for k, r in other.items():
        arr[:, k, :] = r
    arr[:, d, :] = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
    lengths = [b - a for a, b in runs]
    offsets = tuple(int(sum(lengths[:i])) for i in range(len(runs)))
    shape = tuple(int(sum(lengths)) if k == d else int(other[k][1] - other[k][0]) for k in range(t.ndim))
    return LocalLayout(shape, arr, offsets, d)


def layouts(t: TensorType, mesh: Mesh) -> list[LocalLayout]:
    """Every rank's layout, in rank order (the simulator's and the tests' view)."""
    return [rank_layout(t, mesh, r) for r in range(mesh.size)]


@cached(maxsize=4096, max_bytes=8 * MIB)
def local_shapes(t: TensorType, mesh: Mesh) -> tuple[tuple[int, ...], ...]:
    """Every rank's local shape, in rank order (equal shapes are one shared tuple)."""
    if t.ndim == 0:
        return ((),) * mesh.size
    if t.is_uneven:
        check_type_once(t, mesh)
        return tuple(lay.shape for lay in layouts(t, mesh))
    b = boxes(t, mesh)
    sizes = b[:, :, 1] - b[:, :, 0]
    shared: dict[tuple[int, ...], tuple[int, ...]] = {}
    # column lists zipped: the fast way to int tuples; a world of equal blocks keeps one
    return tuple(shared.setdefault(s, s) for s in zip(*sizes.T.tolist()))


def local_shape(t: TensorType, mesh: Mesh, rank: int) -> tuple[int, ...]:
    """``rank``'s local shape; a rank off the mesh is a SpecError."""
    return local_shapes(t, mesh)[check_rank(rank, mesh)]


@cached(maxsize=4096, max_bytes=4 * MIB)
def local_numel(t: TensorType, mesh: Mesh) -> np.ndarray:
    """(world,) elements each rank holds."""
    if t.is_uneven:
        out = np.array([int(np.prod(s)) for s in local_shapes(t, mesh)], dtype=np.int64)
    elif not t.dims:
        out = np.ones(mesh.size, dtype=np.int64)
    else:
        # a box is a product of per-dim ranges, and a search's states share most of their
        # dims: the per-dim lengths are cached, the box is never built
        out = dim_lengths(t.dims[0].size, t.dims[0].axes, mesh)
        for d in t.dims[1:]:
            out = out * dim_lengths(d.size, d.axes, mesh)
    out.setflags(write=False)  # one dim: the per-dim cache's array itself, read-only already
    return out


def own_overlap_numel(a: TensorType, b: TensorType, mesh: Mesh) -> np.ndarray:
    """(world,) elements of each rank's ``a`` blocks that its own ``b`` blocks hold too;
    for one box a rank, from cached per-dim overlaps (read-only)."""
    if a.is_uneven or b.is_uneven:
        return meet_numel(stacked_blocks(a, mesh), stacked_blocks(b, mesh)).astype(np.int64)
    if not a.dims:
        return np.ones(mesh.size, dtype=np.int64)
    out = dim_overlap(a.dims[0].size, a.dims[0].axes, b.dims[0].axes, mesh)
    for da, db in zip(a.dims[1:], b.dims[1:]):
        out = out * dim_overlap(da.size, da.axes, db.axes, mesh)
    return out  # read-only where it is one dim's cached array: callers only read it


@cached(maxsize=256, max_bytes=64 * MIB)
def stacked_blocks(t: TensorType, mesh: Mesh) -> np.ndarray:
    """(world, k, ndim, 2): every rank's blocks, padded with empty boxes to the most any
    rank holds (for vectorised pricing over the world)."""
    if not t.is_uneven:  # one box a rank
        return boxes(t, mesh)[:, None]
    lays = layouts(t, mesh)
    k = max(1, max(len(lay.blocks) for lay in lays))
    out = np.zeros((mesh.size, k, t.ndim, 2), dtype=np.int64)
    for r, lay in enumerate(lays):
        out[r, :len(lay.blocks)] = lay.blocks
    out.setflags(write=False)
    return out


def block_indices(lay: LocalLayout, shape: tuple[int, ...]) -> np.ndarray:
    """The row-major flat global index of every element of the local tensor, in local order."""
    if not shape:
        return np.zeros(1, dtype=np.int64)
    parts = []
    for b in lay.blocks:
        grids = np.meshgrid(*[np.arange(lo, hi) for lo, hi in b], indexing="ij")
        parts.append(np.ravel_multi_index(tuple(g for g in grids), shape) if grids else np.zeros((), np.int64))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    if lay.cat is None:
        return np.concatenate([p.reshape(-1) for p in parts])
    return np.concatenate(parts, axis=lay.cat).reshape(-1)


def local_indices(t: TensorType, mesh: Mesh) -> list[np.ndarray]:
    """For each rank, the row-major flat global index of every element of its local tensor,
    in the local tensor's order (its blocks, flattened)."""
    check_type_once(t, mesh)
    return [block_indices(lay, t.shape) for lay in layouts(t, mesh)]


def local_slices(t: TensorType, mesh: Mesh) -> list[tuple[slice, ...]]:
    """One entry per rank, in rank order: the global index range that rank holds, so its
    local tensor is ``global[s]``. An uneven type where some rank's local tensor is not
    one slice of the global tensor (several runs, or a flattened run) is a SpecError."""
    check_type_once(t, mesh)
    if not t.is_uneven:
        return [box_slices(b) for b in boxes(t, mesh)]
    return [box_slices(_one_box(t, mesh, r)) for r in range(mesh.size)]


def _one_box(t: TensorType, mesh: Mesh, rank: int) -> np.ndarray:
    """``rank``'s blocks as one box, where they lie end to end in local order."""
    lay = rank_layout(t, mesh, rank)
    if lay.cat is None:
        raise SpecError(f"{t}: rank {rank}'s local tensor is 1-D, a flattened run of the global tensor, "
                        "not a slice of it", hint="ask lowering.local_indices for each element's global index")
    held = [b for b in lay.blocks if b[lay.cat, 1] > b[lay.cat, 0]] or [lay.blocks[0]]  # empty runs cut nothing
    box = held[0].copy()
    for b in held[1:]:
        if b[lay.cat, 0] != box[lay.cat, 1]:
            raise SpecError(f"{t}: rank {rank} holds {len(held)} runs of dim {lay.cat} that do not "
                            "follow each other, so its local tensor is not one slice of the global tensor",
                            hint="ask lowering.local_indices for each element's global index")
        box[lay.cat, 1] = b[lay.cat, 1]
    return box
