"""The cost model: bytes each rank sends per step (ring model), and alpha-beta time.

Bytes sent by one rank in one step, for a group of n ranks:

=================  ======================================================
all_gather         (n-1)*b; on uneven pieces, an exact ring: total - b(succ)
reduce_scatter     (n-1)/n * B_in; padded to n equal chunks when uneven
all_reduce         2(n-1)/n * B
all_to_all/permute exactly the bytes leaving the rank
local ops          0
=================  ======================================================

A program's ``bytes_sent_max`` is the max over ranks of the sum over its steps.
Time is ``sum(alpha(step axes) + beta(step axes) * max bytes of the step)``,
with per-axis alpha (latency, s) and beta (s/byte); a flattened group pays the
slowest of its axes. The default model prices bytes only, so plans are chosen by
bytes, then by collective count, then by peak memory.

One exception keeps the bytes-first model honest about latency: a *spare* axis is
one that both the source and the destination replicate, so no data has to cross it.
A plan can still use it, to split a pending reduction (slice over the spare axis,
reduce on half the data, all_gather back), which saves bytes for one more collective.
The bytes-first model charges each collective over a spare axis ``spare_axis_bytes``
(64 KiB: about what a 5 us collective latency costs at 12.5 GB/s), so a reduction is
split only where the saving pays for that latency, as an alpha-beta model would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from lowering.layout import all_groups, box_numel, boxes, overlap
from spec_lang.ir import Mesh, TensorType

SPARE_AXIS_BYTES = 65536  # the bytes-first model's charge per collective over a spare axis


@dataclass(frozen=True)
class CostModel:
    """Per-axis alpha (seconds per collective) and beta (seconds per byte)."""

    alpha: tuple[tuple[str, float], ...] = field(default=())
    beta: tuple[tuple[str, float], ...] = field(default=())
    default_alpha: float = 0.0
    default_beta: float = 1e-10
    spare_axis_bytes: int = SPARE_AXIS_BYTES  # bytes-first only; see the module docstring

    @staticmethod
    def make(alpha: dict[str, float] | None = None, beta: dict[str, float] | None = None,
             default_alpha: float = 0.0, default_beta: float = 1e-10,
             spare_axis_bytes: int = SPARE_AXIS_BYTES) -> CostModel:
        return CostModel(
            tuple(sorted((alpha or {}).items())), tuple(sorted((beta or {}).items())),
            default_alpha, default_beta, int(spare_axis_bytes),
        )

    def alpha_of(self, axes: tuple[str, ...]) -> float:
        table = dict(self.alpha)
        return max((table.get(a, self.default_alpha) for a in axes), default=0.0)

    def beta_of(self, axes: tuple[str, ...]) -> float:
        table = dict(self.beta)
        return max((table.get(a, self.default_beta) for a in axes), default=0.0)

    def step_time(self, axes: tuple[str, ...], bytes_max: int, collective: bool) -> float:
        if not collective:
            return 0.0
        return self.alpha_of(axes) + self.beta_of(axes) * bytes_max

    @property
    def bytes_first(self) -> bool:
        """True when time is a fixed multiple of bytes (no latency, one bandwidth)."""
        return (
            self.default_alpha == 0.0
            and all(v == 0.0 for _, v in self.alpha)
            and all(v == self.default_beta for _, v in self.beta)
        )


DEFAULT_COST_MODEL = CostModel()


@lru_cache(maxsize=1024)
def _group_index_array(mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """(num_groups, n) rank array, rows in group order (read-only; cached: every priced
    move needs it, and building it from tuples costs more than the pricing)."""
    out = np.asarray(all_groups(mesh, axes), dtype=np.int64).reshape(-1, mesh.group_size(axes))
    out.setflags(write=False)
    return out


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
        groups = _group_index_array(mesh, cut)  # (G, n): every rank in exactly one row
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
    from lowering.layout import _groups

    return _groups(mesh, axes)[0]


# Below this many (rank, group member) pairs, intersecting every pair at once in numpy
# is cheaper than the factorised search (whose constant cost dominates on small meshes).
_PAIRS_DIRECT = 4096


def _few_pairs(mesh: Mesh, axes: tuple[str, ...]) -> bool:
    return mesh.size * mesh.group_size(axes) <= _PAIRS_DIRECT


@lru_cache(maxsize=16384)
def exchange_bytes(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """(world,) elements each rank sends in an exact box exchange over ``axes`` (read-only).

    Rank q sends (src block of q) ∩ (dst block of r) to every other member r. Cached:
    the search prices a move once and the assembly prices the chosen ones again.
    """
    if _few_pairs(mesh, axes):
        out = exchange_bytes_bruteforce(src, dst, mesh, axes)
    else:
        out = exchange_bytes_factorised(src, dst, mesh, axes)
    out.setflags(write=False)
    return out


def exchange_bytes_factorised(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    total = _dim_factors(src, dst, mesh, axes, count=False)
    own = box_numel(overlap(boxes(src, mesh), boxes(dst, mesh)))
    return total - own


@lru_cache(maxsize=4096)
def max_senders_per_receiver(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> int:
    """How many peers the busiest receiver hears from (1 means a pure permutation)."""
    if _few_pairs(mesh, axes):
        groups = _group_index_array(mesh, axes)
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
    groups = _group_index_array(mesh, axes)
    pair = box_numel(overlap(boxes(src, mesh)[groups][:, :, None], boxes(dst, mesh)[groups][:, None, :]))
    n = groups.shape[1]
    pair[:, np.arange(n), np.arange(n)] = 0
    sent = np.zeros(mesh.size, dtype=np.int64)
    sent[groups.reshape(-1)] = pair.sum(axis=2).reshape(-1)
    return sent


def all_gather_bytes(src: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """(world,) elements sent in a ring all_gather of each rank's src block over ``axes``."""
    groups = _group_index_array(mesh, axes)
    sb = boxes(src, mesh)[groups]
    pieces = box_numel(sb)  # (G, n)
    total = pieces.sum(axis=1, keepdims=True)
    succ = np.roll(pieces, -1, axis=1)
    sent = np.zeros(mesh.size, dtype=np.int64)
    sent[groups.reshape(-1)] = (total - succ).reshape(-1)
    return sent


def reduce_scatter_bytes(src: TensorType, dst: TensorType, mesh: Mesh,
                         axes: tuple[str, ...]) -> tuple[np.ndarray, bool]:
    """(world,) elements sent in a ring reduce_scatter, and whether pieces were padded."""
    groups = _group_index_array(mesh, axes)
    n = groups.shape[1]
    pieces = box_numel(boxes(dst, mesh)[groups])  # (G, n)
    biggest = pieces.max(axis=1, keepdims=True)
    padded = bool((pieces != biggest).any())
    # even: (n-1)/n * B_in = (n-1) * piece; uneven: n equal padded chunks on the wire
    sent = np.zeros(mesh.size, dtype=np.int64)
    sent[groups.reshape(-1)] = np.broadcast_to((n - 1) * biggest, pieces.shape).reshape(-1)
    return sent, padded


def all_reduce_bytes(src: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """(world,) elements sent by a ring all_reduce: 2(n-1)/n * B (rounded up)."""
    n = mesh.group_size(axes)
    numel = box_numel(boxes(src, mesh))
    return -(-(2 * (n - 1) * numel) // n)
