"""The byte lower bound of a redistribution, from the two layouts alone.

``lower_bound = max(recv_max, sent_avg) * itemsize`` where

* ``recv_max``: the most dst-local elements any rank lacks in its src block (all of
  its dst-local elements when a reduction is pending, since it must hear the other
  contributions);
* ``sent_avg``: the element transfers any plan needs, over the world size: a dst
  element needed by a rank that lacks it costs one transfer; a k-way pending
  reduction costs (k-1) + (needers-1) per element (gather the k contributions in
  one place, then hand the sum to the other ranks that need it).

It is 0 when dst is partial on an axis src is not (the conversion is local).
No plan can beat it; the planner reports its ratio to it.
"""

from __future__ import annotations

import numpy as np

from lowering.caching import cached
from lowering.layout import box_numel, boxes, mesh_coords, overlap
from spec_lang.ir import Mesh, TensorType


def _coverage(t: TensorType, mesh: Mesh, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Compressed grid of how many of ``ranks`` hold each element: (counts, cell sizes)."""
    b = boxes(t, mesh)[ranks]
    cuts = [np.unique(np.concatenate([[0, d.size], b[:, i, 0], b[:, i, 1]])) for i, d in enumerate(t.dims)]
    shape = tuple(max(len(c) - 1, 1) for c in cuts)
    if t.ndim == 0:
        counts = np.asarray(len(b), dtype=np.int64)
    else:
        # a difference array: +-1 at the 2^ndim corners of every box, then a prefix sum
        # along each dim gives every cell's count, with no loop over ranks
        lo = np.stack([np.searchsorted(c, b[:, i, 0]) for i, c in enumerate(cuts)], axis=1)
        hi = np.stack([np.searchsorted(c, b[:, i, 1]) for i, c in enumerate(cuts)], axis=1)
        diff = np.zeros(tuple(n + 1 for n in shape), dtype=np.int64)
        for corner in range(1 << t.ndim):
            pick = [(corner >> i) & 1 for i in range(t.ndim)]
            idx = tuple(np.where(p, hi[:, i], lo[:, i]) for i, p in enumerate(pick))
            np.add.at(diff, idx, (-1) ** sum(pick))
        for i in range(t.ndim):
            diff = np.cumsum(diff, axis=i)
        counts = diff[tuple(slice(0, n) for n in shape)]
    sizes = np.ones_like(counts)
    for i, c in enumerate(cuts):
        w = np.diff(c) if len(c) > 1 else np.array([0])
        shape = [1] * t.ndim
        shape[i] = len(w)
        sizes = sizes * w.reshape(shape)
    return counts, sizes


def lower_bound_detail(src: TensorType, dst: TensorType, mesh: Mesh) -> dict[str, float]:
    """``{"bytes", "recv_max_bytes", "sent_avg_bytes"}`` for ``src -> dst`` on ``mesh``."""
    item = src.itemsize
    src_p = set(src.partial_axes)
    dst_p = set(dst.partial_axes)
    if dst_p - src_p:
        return {"bytes": 0, "recv_max_bytes": 0, "sent_avg_bytes": 0.0}
    reduced = tuple(a for a in mesh.names if a in src_p and a not in dst_p)
    sb, db = boxes(src, mesh), boxes(dst, mesh)
    if not reduced:
        lack = box_numel(db) - box_numel(overlap(sb, db))
        recv = int(lack.max()) if lack.size else 0
        sent_avg = float(lack.sum()) / mesh.size
    else:
        recv = int(box_numel(db).max())
        k = mesh.group_size(reduced)
        coords = mesh_coords(mesh)
        kept = [mesh.index(a) for a in mesh.names if a in dst_p]
        total = 0.0
        # one class per coordinate on the kept partial axes: its own reduction
        _, class_of = np.unique(coords[:, kept], axis=0, return_inverse=True) if kept else (
            None, np.zeros(mesh.size, dtype=np.int64))
        for cls in np.unique(class_of):
            ranks = np.flatnonzero(class_of.reshape(-1) == cls)
            counts, sizes = _coverage(dst, mesh, ranks)
            needed = counts > 0
            total += float(((k - 1 + counts - 1) * sizes)[needed].sum())
        sent_avg = total / mesh.size
    return {
        "bytes": int(max(recv * item, -(-int(sent_avg * item * 1000) // 1000))),
        "recv_max_bytes": recv * item,
        "sent_avg_bytes": sent_avg * item,
    }


@cached(maxsize=4096)
def _lower_bound(src: TensorType, dst: TensorType, mesh: Mesh) -> int:
    return int(lower_bound_detail(src, dst, mesh)["bytes"])


def lower_bound(src: TensorType | str, dst: TensorType | str, mesh: Mesh | str) -> int:
    """The max over ranks of the bytes a rank must receive (or the reduction bound)."""
    from lowering.checks import check_same_global, resolve

    s, m = resolve(src, mesh)
    d, _ = resolve(dst, m)
    check_same_global(s, d)
    return _lower_bound(s, d, m)
