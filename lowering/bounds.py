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

from lowering.caching import cached
from lowering.layout import box_numel, boxes, overlap
from spec_lang.ir import Mesh, TensorType


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
        # per class of ranks (one per coordinate on the kept partial axes), every element is
        # needed (the class's dst blocks tile the tensor), so the sum over its cells of
        # (k-1) + (needers-1) is (k-2)*numel + the class's dst block sizes; over all classes:
        classes = mesh.size // mesh.group_size(tuple(a for a in mesh.names if a not in dst_p))
        total = float(classes * (k - 2) * src.numel + int(box_numel(db).sum()))
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
