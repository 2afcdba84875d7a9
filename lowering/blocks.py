"""Which global elements each rank holds, for every type: blocks in local order.

A plain type puts one box on each rank (``layout.boxes``, the fast path). An uneven
split does not: a PartitionedShard rank holds several runs of its dim, in a permuted
order, and a RaggedShard over flattened prefix dims holds a run of positions that is a
box only by luck. So a rank's local tensor is described as a list of global boxes,
*blocks*, in local order, each at an offset of the local tensor::

    f32[32@ep<parts 4,6,4,2|2,4,8,2>]  on ep=2    (global order P00 P10 P01 P11 ...)
    rank 0: blocks [0:4] [6:12] [16:20] [28:30]   concatenated along dim 0
    rank 1: blocks [4:6] [12:16] [20:28] [30:32]

* ``cat`` is the local dim the blocks are concatenated along (the split dim), or None
  when the local tensor is 1-D and each block is flattened (a ragged split over more
  than one dim);
* ``offsets[i]`` is block i's start along ``cat`` (or in the flat tensor).

Every block of a rank has the same extent on the dims other than ``cat``. This is the
one answer to "which rank holds which elements" for uneven types; ``local_indices`` and
``local_shapes`` read it, and so do the uneven exchange's pieces, the bound and
``shardc show``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lowering.caching import MIB, cached
from lowering.layout import boxes, chunk_range, dim_ranges, mesh_coords
from spec_lang.ir import Mesh, TensorType


class LocalLayout(NamedTuple):
    """One rank's local tensor: its shape and its blocks (global boxes) in local order."""

    shape: tuple[int, ...]
    blocks: np.ndarray  # (k, ndim, 2) global [start, stop) per dim
    offsets: tuple[int, ...]  # each block's start along ``cat`` (flat when ``cat`` is None)
    cat: int | None

    def block_shape(self, i: int) -> tuple[int, ...]:
        b = self.blocks[i]
        return tuple(int(hi - lo) for lo, hi in b)


def is_uneven(t: TensorType) -> bool:
    return any(d.split is not None for d in t.dims)


def split_dim(t: TensorType) -> int | None:
    for i, d in enumerate(t.dims):
        if d.split is not None:
            return i
    return None


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
    d = split_dim(t)
    if d is None:
        box = boxes(t, mesh)[rank]
        shape = tuple(int(hi - lo) for lo, hi in box)
        return LocalLayout(shape, box[None], (0,), 0 if t.ndim else None)
    sp = t.dims[d].split
    assert sp is not None
    runs = _split_runs(t, d, mesh, rank)
    other = [dim_ranges(dim.size, dim.axes, mesh)[rank] if k != d else None for k, dim in enumerate(t.dims)]
    if sp.kind == "ragged" and sp.span > 1:
        prefix = tuple(dim.size for dim in t.dims[:sp.span])
        tail = [(int(r[0]), int(r[1])) for r in other[sp.span:]]  # type: ignore[index]
        blocks = [box + tail for a, b in runs for box in flat_run_boxes(a, b, prefix)]
        arr = np.asarray(blocks, dtype=np.int64).reshape(len(blocks), t.ndim, 2)
        sizes = np.prod(arr[:, :, 1] - arr[:, :, 0], axis=1).tolist() if len(blocks) else []
        offsets = tuple(int(x) for x in np.concatenate([[0], np.cumsum(sizes)[:-1]])) if sizes else ()
        total = int(sum(sizes))
        return LocalLayout((total,), arr, offsets, None)
    arr = np.empty((len(runs), t.ndim, 2), dtype=np.int64)
    for k, r in enumerate(other):
        if k != d:
            arr[:, k, :] = r
    arr[:, d, :] = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
    lengths = [b - a for a, b in runs]
    offsets = tuple(int(sum(lengths[:i])) for i in range(len(runs)))
    shape = tuple(int(sum(lengths)) if k == d else int(r[1] - r[0]) for k, r in enumerate(other))  # type: ignore[index]
    return LocalLayout(shape, arr, offsets, d)


def layouts(t: TensorType, mesh: Mesh) -> list[LocalLayout]:
    """Every rank's layout, in rank order (the simulator's and the tests' view)."""
    return [rank_layout(t, mesh, r) for r in range(mesh.size)]


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


@cached(maxsize=256, max_bytes=64 * MIB)
def stacked_blocks(t: TensorType, mesh: Mesh) -> np.ndarray:
    """(world, k, ndim, 2): every rank's blocks, padded with empty boxes to the most any
    rank holds (for vectorised pricing over the world)."""
    lays = layouts(t, mesh)
    k = max(1, max(len(lay.blocks) for lay in lays))
    out = np.zeros((mesh.size, k, t.ndim, 2), dtype=np.int64)
    for r, lay in enumerate(lays):
        out[r, :len(lay.blocks)] = lay.blocks
    out.setflags(write=False)
    return out


def meet_numel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elements shared by the block lists ``a`` (..., ka, ndim, 2) and ``b`` (..., kb, ndim, 2)
    (blocks within a list are disjoint), broadcasting over the leading axes."""
    ext = np.minimum(a[..., :, None, :, 1], b[..., None, :, :, 1]) - \
        np.maximum(a[..., :, None, :, 0], b[..., None, :, :, 0])
    return np.prod(np.maximum(ext, 0), axis=-1).sum(axis=(-1, -2))


def held_overlap(src: TensorType, dst: TensorType, mesh: Mesh) -> np.ndarray:
    """(world,) per rank, how many of its destination elements it already holds as source."""
    return meet_numel(stacked_blocks(src, mesh), stacked_blocks(dst, mesh)).astype(np.int64)


def local_part(full: np.ndarray, t: TensorType, mesh: Mesh, rank: int) -> np.ndarray:
    """``rank``'s local tensor cut out of the global array ``full`` (a copy, in local order)."""
    lay = rank_layout(t, mesh, rank)
    if lay.cat is None or len(lay.blocks) == 1:
        parts = [full[tuple(slice(int(lo), int(hi)) for lo, hi in b)] for b in lay.blocks]
        if lay.cat is None:
            return np.concatenate([p.reshape(-1) for p in parts]) if parts else np.zeros(0, full.dtype)
        return parts[0].copy()
    return np.concatenate([full[tuple(slice(int(lo), int(hi)) for lo, hi in b)] for b in lay.blocks], axis=lay.cat)
