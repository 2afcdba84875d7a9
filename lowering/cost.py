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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lowering.layout import all_groups, box_numel, boxes, overlap
from spec_lang.ir import Mesh, TensorType


@dataclass(frozen=True)
class CostModel:
    """Per-axis alpha (seconds per collective) and beta (seconds per byte)."""

    alpha: tuple[tuple[str, float], ...] = field(default=())
    beta: tuple[tuple[str, float], ...] = field(default=())
    default_alpha: float = 0.0
    default_beta: float = 1e-10

    @staticmethod
    def make(alpha: dict[str, float] | None = None, beta: dict[str, float] | None = None,
             default_alpha: float = 0.0, default_beta: float = 1e-10) -> CostModel:
        return CostModel(
            tuple(sorted((alpha or {}).items())), tuple(sorted((beta or {}).items())),
            default_alpha, default_beta,
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


def _group_index_array(mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """(num_groups, n) rank array, rows in group order."""
    return np.asarray(all_groups(mesh, axes), dtype=np.int64).reshape(-1, mesh.group_size(axes))


def exchange_bytes(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """(world,) elements each rank sends in an exact box exchange over ``axes``.

    Rank q sends (src block of q) ∩ (dst block of r) to every other member r.
    Also returns nothing else: the receive side is the same sum transposed.
    """
    groups = _group_index_array(mesh, axes)
    sb = boxes(src, mesh)[groups]  # (G, n, ndim, 2)
    db = boxes(dst, mesh)[groups]
    pair = box_numel(overlap(sb[:, :, None], db[:, None, :]))  # (G, n_send, n_recv)
    n = groups.shape[1]
    pair[:, np.arange(n), np.arange(n)] = 0
    sent = np.zeros(mesh.size, dtype=np.int64)
    sent[groups.reshape(-1)] = pair.sum(axis=2).reshape(-1)
    return sent


def max_senders_per_receiver(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> int:
    """How many peers the busiest receiver hears from (1 means a pure permutation)."""
    groups = _group_index_array(mesh, axes)
    sb = boxes(src, mesh)[groups]
    db = boxes(dst, mesh)[groups]
    pair = box_numel(overlap(sb[:, :, None], db[:, None, :]))
    n = groups.shape[1]
    pair[:, np.arange(n), np.arange(n)] = 0
    return int((pair > 0).sum(axis=1).max()) if pair.size else 0


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
