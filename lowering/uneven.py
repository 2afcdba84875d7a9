"""The uneven placements: DynamicShard, RaggedShard and PartitionedShard, on one mesh axis.

Each is a frozen, hashable value that checks its own rules (a SpecError names the rule
that failed). Which global elements each shard holds, *in local order*:

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

import math
from dataclasses import dataclass

import numpy as np

from spec_lang.errors import SpecError, value_text
from spec_lang.split import INT64_LIMIT, size_row


def _dim(dim: object, placement: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 0 <= dim < INT64_LIMIT:
        raise SpecError(f"{placement}: dim must be an int >= 0 (below 2**63), got {value_text(dim)}",
                        hint="name the tensor dim to shard")
    return int(dim)


def _check_dim(dim: int, shape: tuple[int, ...], placement: str) -> None:
    if dim >= len(shape):
        raise SpecError(f"{placement} shards dim {dim}, but the tensor has {len(shape)} dims",
                        hint=f"use a dim below {len(shape)}")


@dataclass(frozen=True)
class DynamicShard:
    """Explicit per-shard sizes along ``dim``; see the module docstring."""

    dim: int
    chunk_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dim", _dim(self.dim, "DynamicShard"))
        sizes = size_row(self.chunk_sizes, "DynamicShard chunk_sizes", "give one size >= 0 per rank of the mesh axis")
        object.__setattr__(self, "chunk_sizes", sizes)

    def check(self, shape: tuple[int, ...], n: int) -> None:
        _check_dim(self.dim, shape, "DynamicShard")
        if len(self.chunk_sizes) != n:
            raise SpecError(f"DynamicShard has {len(self.chunk_sizes)} chunk sizes for a mesh axis of {n} ranks",
                            hint="give one size per rank of the mesh axis")
        if sum(self.chunk_sizes) != shape[self.dim]:
            raise SpecError(f"DynamicShard chunk sizes {list(self.chunk_sizes)} sum to {sum(self.chunk_sizes)}, "
                            f"but dim {self.dim} has {shape[self.dim]}",
                            hint="the sizes must add up to the dim exactly (DynamicShard never pads)")


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
        units = size_row(self.local_units, "RaggedShard local_units", "give one unit count >= 0 per rank")
        if not units or sum(units) == 0:
            raise SpecError("RaggedShard local_units must hold at least one positive count",
                            hint="e.g. (1, 2, 1, 1): 20%, 40%, 20%, 20% of the flattened prefix")
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "local_units", units)

    def check(self, shape: tuple[int, ...], n: int) -> None:
        if len(self.dims) > len(shape):
            raise SpecError(f"RaggedShard flattens dims {list(self.dims)}, but the tensor has {len(shape)} dims",
                            hint=f"use at most {len(shape)} prefix dims")
        if len(self.local_units) != n:
            raise SpecError(f"RaggedShard has {len(self.local_units)} local units for a mesh axis of {n} ranks",
                            hint="give one unit count per rank of the mesh axis")
        flat = math.prod(shape[: len(self.dims)])
        if flat % sum(self.local_units):
            raise SpecError(f"RaggedShard: the flattened prefix ({flat} positions) does not divide by the "
                            f"{sum(self.local_units)} units of {list(self.local_units)}",
                            hint="pick units whose sum divides the product of the prefix dims")


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
        rule = "splits[s][p] is the size of partition p's piece on shard s: one row per shard"
        try:
            rows = tuple(size_row(row, "PartitionedShard splits", rule) for row in self.splits)
        except TypeError:
            raise SpecError(f"PartitionedShard splits must be rows of ints, got {self.splits!r}", hint=rule) from None
        if not rows or any(len(r) != self.num_partitions for r in rows):
            raise SpecError(f"PartitionedShard splits must have one row of {self.num_partitions} sizes per shard, "
                            f"got rows of {[len(r) for r in rows]}", hint=rule)
        if self.aligned and self.num_partitions % len(rows):
            raise SpecError(f"aligned PartitionedShard needs num_partitions ({self.num_partitions}) divisible by "
                            f"the {len(rows)} shards", hint="each shard holds num_partitions / shards whole partitions")
        object.__setattr__(self, "num_partitions", int(self.num_partitions))
        object.__setattr__(self, "splits", rows)
        object.__setattr__(self, "aligned", bool(self.aligned))

    @property
    def num_shards(self) -> int:
        return len(self.splits)

    def check(self, shape: tuple[int, ...], n: int) -> None:
        _check_dim(self.dim, shape, "PartitionedShard")
        if self.num_shards != n:
            raise SpecError(f"PartitionedShard has splits for {self.num_shards} shards on a mesh axis of {n} ranks",
                            hint="give one row of splits per rank of the mesh axis")
        total = sum(map(sum, self.splits))
        if total != shape[self.dim]:
            raise SpecError(f"PartitionedShard splits sum to {total}, but dim {self.dim} has {shape[self.dim]}",
                            hint="the pieces of all partitions must add up to the dim exactly")

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
