"""The uneven placements: DynamicShard, RaggedShard and PartitionedShard, on one mesh axis.

Each is a frozen, hashable value; its sizes are checked by the ``Split`` it stands for (a
SpecError names the rule that failed). Which global elements each shard holds, *in local order*:

* ``DynamicShard(dim, chunk_sizes)``: shard s holds ``chunk_sizes[s]`` consecutive
  slices of ``dim`` (zeros allowed, never padded)::

      chunk_sizes (3, 0, 5) on a dim of 8:   [0 1 2] [] [3 4 5 6 7]

* ``RaggedShard(dims, local_units)``: the prefix ``dims`` (0..k-1) are flattened
  row-major, and shard s holds a contiguous run of that flattened prefix, of length
  proportional to ``local_units[s]``; each prefix position carries the trailing dims
  whole (the granularity). The local tensor is 1-D when ``len(dims) > 1`` and keeps
  the trailing dims when ``dims == (0,)``.
* ``PartitionedShard(dim, num_partitions, splits, aligned=False)``: ``dim`` is cut into
  partitions in partition-major order, partition p being ``[P0p, P1p, ...]`` where
  ``Psp`` has ``splits[s][p]`` elements. Unaligned, shard s holds ``[Ps0, Ps1, ...]``;
  aligned, shard s holds partitions ``s*k .. s*k+k-1`` whole (k = num_partitions / n)::

      splits ((4,6,4,2), (2,4,8,2)), global order P00 P10 P01 P11 P02 P12 P03 P13
      unaligned: shard 0 [P00 P01 P02 P03]   shard 1 [P10 P11 P12 P13]
      aligned:   shard 0 [P00 P10 P01 P11]   shard 1 [P02 P12 P03 P13]

In a type each is a dim's split (``spec_lang.split``; ``lowering.uneven_placements``
converts both ways), written ``10@dp<3,0,7>``, ``<ragged ...>``, ``<parts ...>``; the layout
algebra (``lowering.local_indices``) answers which elements each rank holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spec_lang.errors import SpecError, value_text
from spec_lang.split import INT64_LIMIT, Split, size_row


def _dim(dim: object, placement: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 0 <= dim < INT64_LIMIT:
        raise SpecError(f"{placement}: dim must be an int >= 0 (below 2**63), got {value_text(dim)}",
                        hint="name the tensor dim to shard")
    return int(dim)


@dataclass(frozen=True)
class DynamicShard:
    """Explicit per-shard sizes along ``dim``; see the module docstring."""

    dim: int
    chunk_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dim", _dim(self.dim, "DynamicShard"))
        object.__setattr__(self, "chunk_sizes", Split("sizes", self.chunk_sizes).values)


@dataclass(frozen=True)
class RaggedShard:
    """Contiguous runs of the flattened prefix ``dims``, proportional to ``local_units``."""

    dims: tuple[int, ...]
    local_units: tuple[int, ...]

    def __post_init__(self) -> None:
        dims = size_row(self.dims, "RaggedShard dims", "name the prefix dims, e.g. (0,) or (0, 1)")
        if not dims or dims != tuple(range(len(dims))):
            raise SpecError(f"RaggedShard dims must be a prefix (0, 1, ..., k-1), got {list(dims)}",
                            hint="RaggedShard flattens the leading dims; use (0,) or (0, 1), ...")
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "local_units", Split("ragged", self.local_units, span=len(dims)).values)


@dataclass(frozen=True)
class PartitionedShard:
    """Partitions of ``dim`` held per shard (unaligned) or whole (aligned); see the module docstring."""

    dim: int
    num_partitions: int
    splits: tuple[tuple[int, ...], ...]
    aligned: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dim", _dim(self.dim, "PartitionedShard"))
        if isinstance(self.num_partitions, bool) or not isinstance(self.num_partitions, (int, np.integer)) \
                or not 1 <= self.num_partitions < INT64_LIMIT:
            raise SpecError(f"PartitionedShard num_partitions must be an int >= 1, got "
                            f"{value_text(self.num_partitions)}",
                            hint="count the partitions (e.g. experts) along the dim")
        rows = Split("parts", self.splits, aligned=self.aligned).values
        if len(rows[0]) != self.num_partitions:
            raise SpecError(f"PartitionedShard splits must have one row of {self.num_partitions} sizes per shard, "
                            f"got rows of {[len(r) for r in rows]}",
                            hint="splits[s][p] is the size of partition p's piece on shard s: one row per shard")
        object.__setattr__(self, "num_partitions", int(self.num_partitions))
        object.__setattr__(self, "splits", rows)
        object.__setattr__(self, "aligned", bool(self.aligned))

    @property
    def num_shards(self) -> int:
        return len(self.splits)

    def piece_starts(self) -> np.ndarray:
        """(shards, partitions) global start of every piece Psp along ``dim``."""
        sizes = np.asarray(self.splits, dtype=np.int64)  # [s, p]
        by_partition = sizes.T.reshape(-1)  # partition-major: P00 P10 P01 P11 ...
        starts = np.concatenate([[0], np.cumsum(by_partition)[:-1]])
        return starts.reshape(self.num_partitions, self.num_shards).T

    def local_order(self, s: int) -> list[tuple[int, int]]:
        """The pieces ``(shard, partition)`` shard ``s`` holds, in local order."""
        if not self.aligned:
            return [(s, p) for p in range(self.num_partitions)]
        k = self.num_partitions // self.num_shards
        return [(q, p) for p in range(s * k, (s + 1) * k) for q in range(self.num_shards)]

    def local_splits(self, s: int) -> tuple[int, ...]:
        """The sizes of shard ``s``'s pieces, in local order."""
        return tuple(self.splits[q][p] for q, p in self.local_order(s))

    def realigned(self) -> PartitionedShard:
        """The same partitions with the other alignment."""
        return PartitionedShard(self.dim, self.num_partitions, self.splits, not self.aligned)

    def exchange_splits(self) -> list[tuple[int, ...]]:
        """Per shard, the sizes it receives when converting to the other alignment, in arrival
        order (by sender, each sender's pieces in its local order): the split-information
        exchange that comes before the local reorder."""
        target = self.realigned()
        out = []
        for s in range(self.num_shards):
            want = set(target.local_order(s))
            got = [self.splits[q][p] for sender in range(self.num_shards)
                   for q, p in self.local_order(sender) if (q, p) in want]
            out.append(tuple(got))
        return out
