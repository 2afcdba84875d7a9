"""Box exchange geometry: what each rank sends when every rank's dst block is assembled from
the pieces (src block of q) ∩ (dst block of r) of its group members q.

Priced two ways with one answer: all pairs of a group intersected (the definition, used on
small groups) or factorised by dim with prefix sums (used where pairs would be many).
"""

from __future__ import annotations

import numpy as np

from lowering.caching import MIB, cached
from lowering.kinds.rows import group_rows
from lowering.layout import (
    box_numel,
    boxes,
    group_arrays,
    local_numel,
    overlap,
    overlap_numel,
    own_overlap_numel,
)
from spec_lang.ir import Mesh, TensorType


def _dim_factors(a: TensorType, b: TensorType, mesh: Mesh, axes: tuple[str, ...],
                 count: bool) -> np.ndarray:
    """Per-rank sum over group members r of |a(q) ∩ b(r)| (or the count of r that meet a(q)).

    Each mesh axis cuts at most one dim, so a block is a product of per-dim intervals
    and the sum over the group factorises by dim. Along one dim the members' intervals
    are disjoint (they are different leaves of the same chunk tree), so each rank's sum
    is a difference of prefix sums found by binary search: O(world log n), not O(world n).
    """
    ab, bb = boxes(a, mesh), boxes(b, mesh)
    out = np.ones(mesh.size, dtype=np.int64)
    moving = set(axes)
    for d, dim in enumerate(b.dims):
        cut = tuple(x for x in dim.axes if x in moving)
        lo, hi = ab[:, d, 0], ab[:, d, 1]
        if not cut:
            length = np.maximum(np.minimum(hi, bb[:, d, 1]) - np.maximum(lo, bb[:, d, 0]), 0)
            out *= (length > 0) if count else length
            continue
        groups = group_rows(mesh, cut)  # (G, n): every rank in exactly one row
        starts, stops = bb[groups, d, 0], bb[groups, d, 1]
        keep = stops > starts
        order = np.argsort(np.where(keep, starts, np.iinfo(np.int64).max), axis=1, kind="stable")
        starts = np.take_along_axis(starts, order, axis=1)
        stops = np.take_along_axis(stops, order, axis=1)
        nonempty = np.take_along_axis(keep, order, axis=1)
        g = _group_of(mesh, cut)  # the row each rank's members sit in
        # offset every row so one flat searchsorted serves all groups
        # empty intervals sort to the end of their own row, past any real value or query
        span = int(max(bb[:, d, 1].max(), ab[:, d, 1].max(), 0)) + 2
        base = np.arange(groups.shape[0], dtype=np.int64)[:, None] * span
        pad = base + span - 1
        s_key = np.where(nonempty, starts + base, pad).reshape(-1)
        e_key = np.where(nonempty, stops + base, pad).reshape(-1)
        lengths = np.where(nonempty, stops - starts, 0).reshape(-1)
        cum = np.concatenate([[0], np.cumsum(lengths)])
        q_lo, q_hi = lo + g * span, hi + g * span
        if count:
            n_start_before_hi = np.searchsorted(s_key, q_hi, side="left")
            n_end_le_lo = np.searchsorted(e_key, q_lo, side="right")
            hits = np.where(hi > lo, n_start_before_hi - n_end_le_lo, 0)
            out *= hits
        else:
            out *= _covered(s_key, e_key, cum, q_hi) - _covered(s_key, e_key, cum, q_lo)
    for x in axes:
        if b.dim_of(x) is None and not count:
            out *= mesh.axis_size(x)
    return out


def _covered(s_key: np.ndarray, e_key: np.ndarray, cum: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Total length of the sorted disjoint intervals (s_key, e_key) below x."""
    i = np.searchsorted(s_key, x, side="right")  # intervals starting at or before x
    full = cum[i]
    last = np.maximum(i - 1, 0)
    inside = (i > 0) & (e_key[last] > x)
    return full - np.where(inside, e_key[last] - x, 0)


def _group_of(mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    return group_arrays(mesh, axes)[0]


# Below this many (rank, group member) pairs, intersecting every pair at once in numpy
# is cheaper than the factorised search (whose constant cost dominates on small meshes).
_PAIRS_DIRECT = 4096


def _few_pairs(mesh: Mesh, axes: tuple[str, ...]) -> bool:
    return mesh.size * mesh.group_size(axes) <= _PAIRS_DIRECT


@cached(maxsize=16384, max_bytes=16 * MIB)
def exchange_bytes(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """(world,) elements each rank sends in an exact box exchange over ``axes`` (read-only).

    Rank q sends (src block of q) ∩ (dst block of r) to every other member r. Cached:
    the search prices a move once and the assembly prices the chosen ones again.
    """
    if _tiled_by_group(src, dst, axes):
        out = local_numel(src, mesh) - own_overlap_numel(src, dst, mesh)
    elif _few_pairs(mesh, axes):
        out = exchange_bytes_bruteforce(src, dst, mesh, axes)
    else:
        out = exchange_bytes_factorised(src, dst, mesh, axes)
    out.setflags(write=False)
    return out


def _tiled_by_group(src: TensorType, dst: TensorType, axes: tuple[str, ...]) -> bool:
    """Whether every rank's src block is tiled by its group's dst blocks, so a rank sends
    all it holds but its own dst piece: every dim's axes past its common prefix are group
    axes, and every group axis shards dst. The group's members then share that prefix
    block, which the chunks of the group axes cut into disjoint dst blocks that cover it::

        src 8@(x,y) -> dst 8@(y,x), group (x, y): the four dst blocks tile [0, 8), so
        rank (x=0, y=1), holding [2, 4), sends [2, 4) less its dst block [4, 6): 2
    """
    group = set(axes)
    if not group <= set(dst.sharded_axes):
        return False
    for da, db in zip(src.dims, dst.dims):
        p = 0
        while p < min(len(da.axes), len(db.axes)) and da.axes[p] == db.axes[p]:
            p += 1
        if not set(da.axes[p:]) <= group or not set(db.axes[p:]) <= group:
            return False
    return True


def exchange_bytes_factorised(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    total = _dim_factors(src, dst, mesh, axes, count=False)
    own = box_numel(overlap(boxes(src, mesh), boxes(dst, mesh)))
    return total - own


@cached(maxsize=4096)
def max_senders_per_receiver(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> int:
    """How many peers the busiest receiver hears from (1 means a pure permutation)."""
    if _few_pairs(mesh, axes):
        groups = group_rows(mesh, axes)
        pair = box_numel(overlap(boxes(src, mesh)[groups][:, :, None], boxes(dst, mesh)[groups][:, None, :]))
        n = groups.shape[1]
        pair[:, np.arange(n), np.arange(n)] = 0
        return int((pair > 0).sum(axis=1).max()) if pair.size else 0
    return max_senders_factorised(src, dst, mesh, axes)


def max_senders_factorised(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> int:
    """Senders differ only in the group axes, which all shard ``src``; receiver r hears
    from every combination whose src interval meets its dst interval on every dim."""
    heard = _dim_factors(dst, src, mesh, axes, count=True)
    own = box_numel(overlap(boxes(src, mesh), boxes(dst, mesh))) > 0
    return int((heard - own).max()) if heard.size else 0


def exchange_bytes_bruteforce(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """All pairs of the group intersected: the definition, kept for tests."""
    groups = group_rows(mesh, axes)
    sb, db = boxes(src, mesh), boxes(dst, mesh)
    pair = overlap_numel(sb[groups][:, :, None], db[groups][:, None, :])
    sent = np.zeros(mesh.size, dtype=np.int64)
    sent[groups.reshape(-1)] = pair.sum(axis=2).reshape(-1)
    return sent - overlap_numel(sb, db)  # the own piece is kept, not sent


def received_elems(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """(world,) elements each rank gets from its group (its own piece included): a rank's
    dst block is tiled by the group exactly when this equals the block's size."""
    if _few_pairs(mesh, axes):
        rows = group_rows(mesh, axes)
        pair = box_numel(overlap(boxes(src, mesh)[rows][:, :, None], boxes(dst, mesh)[rows][:, None, :]))
        out = np.zeros(mesh.size, dtype=np.int64)
        out[rows.reshape(-1)] = pair.sum(axis=1).reshape(-1)
        return out
    return _dim_factors(dst, src, mesh, axes, count=False)
