"""How one mesh axis cuts a dim unevenly: the IR of the three uneven placements.

A ``Dim`` sharded by a single mesh axis may carry a ``Split`` instead of torch.chunk's
even rule. Three kinds, one per placement (``lowering.DynamicShard``, ``RaggedShard``
and ``PartitionedShard`` are the user-facing classes; this is their torch-free core)::

    sizes   10@dp<3,0,7>              rank s holds sizes[s] consecutive rows (zeros allowed)
    ragged  24@dp<ragged 1,2,1>       rank s holds a run proportional to units[s]; with
            4@dp<ragged 1,2,1 over 2>  ``over k`` the leading k dims are flattened first
    parts   16@ep<parts 4,6|2,4>      partitions in partition-major order; rank s holds
            16@ep<aligned 4,6|2,4>    its piece of every partition, or whole partitions

``values`` holds the sizes (sizes), the units (ragged), or one row per shard (parts).
Every rule of a split lives here, checked once: its values in the constructor; against
its dim, the type's prefix and its mesh axis in the ``check_*`` methods, which the IR's
constructors, ``lowering.check_type`` and the placements' checks call.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from spec_lang.errors import SpecError, number_text, value_text

# int64 is what numpy, torch and the planner's byte counts use (spec_lang.ir reads it here)
INT64_LIMIT = 2**63

SPLIT_KINDS = ("sizes", "ragged", "parts")


def _count(v: object, what: str, hint: str) -> int:
    if isinstance(v, bool):
        raise SpecError(f"{what} must hold ints, got {v!r}", hint=hint)
    try:
        n = operator.index(v)  # type: ignore[arg-type]  # any object: operator.index decides
    except TypeError:
        raise SpecError(f"{what} must hold ints, got {v!r}", hint=hint) from None
    if n < 0:
        raise SpecError(f"{what} holds a negative size {number_text(n)}", hint=hint)
    if n >= INT64_LIMIT:
        raise SpecError(f"{what} holds the size {number_text(n)}, which does not fit in int64",
                        hint="sizes must stay below 2**63")
    return n


def size_row(values: object, what: str, hint: str) -> tuple[int, ...]:
    """``values`` as a tuple of sizes (ints >= 0, numpy ints included); a SpecError naming
    ``what`` for a string, a non-sequence, an unordered collection (a set, a dict), a bool,
    a float, a negative entry or one past int64. Every public entry that takes a row of
    sizes (a shape, chunk sizes, splits) reads it here."""
    if isinstance(values, (str, bytes, bytearray, memoryview)):
        raise SpecError(f"{what} must be a sequence of ints, got {value_text(values)}", hint=hint)
    if isinstance(values, (Set, Mapping)):  # iterating one would reorder the sizes, or read the keys
        raise SpecError(f"{what} must be a sequence of ints in order, got a {type(values).__name__} {value_text(values)}",
                        hint=hint + " (a list or tuple: a set has no order)")
    try:
        items: tuple[object, ...] = tuple(values)  # type: ignore[arg-type]  # any object: tuple() decides
    except Exception:  # not iterable, or its iteration raises (a DTensor sharded on dim 0)
        raise SpecError(f"{what} must be a sequence of ints, got {value_text(values)}", hint=hint) from None
    return tuple(_count(v, what, hint) for v in items)


@dataclass(frozen=True)
class Split:
    """An uneven cut of one dim over one mesh axis (see the module docstring)."""

    kind: str
    values: tuple
    span: int = 1  # ragged: the number of leading dims flattened
    aligned: bool = False  # parts: each shard holds whole partitions

    def __post_init__(self) -> None:
        if self.kind not in SPLIT_KINDS:
            raise SpecError(f"unknown uneven split {self.kind!r}", hint="use sizes, ragged or parts")
        if self.kind == "parts":
            hint = "give one row of partition sizes per shard: parts 4,6,4,2 | 2,4,8,2"
            if isinstance(self.values, (str, bytes)):
                raise SpecError(f"PartitionedShard splits must be rows of ints, got {value_text(self.values)}", hint=hint)
            try:
                rows = tuple(size_row(r, "PartitionedShard splits", hint) for r in self.values)
            except (TypeError, RuntimeError):  # not iterable, or its iteration raises (a DTensor)
                raise SpecError(f"PartitionedShard splits must be rows of ints, got {value_text(self.values)}",
                                hint=hint) from None
            if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
                raise SpecError(f"PartitionedShard splits must have one row per shard, every row with the same "
                                f"number of partitions (>= 1), got rows of {[len(r) for r in rows]}", hint=hint)
            if self.aligned is True and len(rows[0]) % len(rows):  # any other value is refused below
                raise SpecError(f"aligned PartitionedShard needs num_partitions ({len(rows[0])}) divisible by "
                                f"the {len(rows)} shards",
                                hint="each shard holds num_partitions / shards whole partitions; "
                                     "use the unaligned form, or a partition count the shards divide")
            values: tuple = rows
        else:
            what = "DynamicShard chunk sizes" if self.kind == "sizes" else "RaggedShard local_units"
            values = size_row(self.values, what, "give one count >= 0 per rank of the mesh axis")
            if not values:
                raise SpecError(f"{what} are empty", hint="give one count per rank of the mesh axis")
            if self.kind == "ragged" and sum(values) == 0:
                raise SpecError("RaggedShard local_units must hold at least one positive count",
                                hint="e.g. 1,2,1,1: 20%, 40%, 20%, 20% of the flattened prefix")
        if self.kind == "parts" and self.aligned is not False and self.aligned is not True:
            raise SpecError(f"aligned must be a bool, got {value_text(self.aligned)}", hint="aligned=True or False")
        if self.kind != "parts" and self.aligned is not False:
            raise SpecError("only a PartitionedShard split is aligned", hint="drop aligned")
        span = _count(self.span, "the ragged span", "over k flattens the leading k >= 1 dims")
        if span < 1 or (self.kind != "ragged" and span != 1):
            raise SpecError(f"span {span} is only for ragged splits, and at least 1",
                            hint="over k flattens the leading k >= 1 dims of a RaggedShard")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "span", span)
        object.__setattr__(self, "aligned", bool(self.aligned))

    @property
    def shards(self) -> int:
        """The number of ranks of the mesh axis this split is written for."""
        return len(self.values)

    @property
    def total(self) -> int | None:
        """The dim size the split covers (None for ragged: its units are proportions)."""
        if self.kind == "sizes":
            return sum(self.values)
        if self.kind == "parts":
            return sum(map(sum, self.values))
        return None

    @property
    def entries(self) -> str:
        """What its entries are called, one per rank of its mesh axis."""
        return {"sizes": "chunk sizes", "ragged": "local units", "parts": "rows of splits"}[self.kind]

    def fits(self, n: int) -> bool:
        """Whether it cuts a run of ``n`` exactly: its sizes sum to n, or its units divide n."""
        return n % sum(self.values) == 0 if self.kind == "ragged" else self.total == n

    def check_extent(self, n: int, where: str) -> None:
        """It cuts ``where`` (a dim, or a ragged split's flattened prefix) of ``n`` exactly."""
        if self.fits(n):
            return
        if self.kind == "ragged":
            raise SpecError(f"RaggedShard: the flattened prefix ({n} positions) does not divide by the "
                            f"{sum(self.values)} units of {list(self.values)}",
                            hint="pick units whose sum divides the product of the prefix dims")
        what = "DynamicShard chunk sizes" if self.kind == "sizes" else "PartitionedShard splits"
        raise SpecError(f"{what} sum to {self.total}, but {where} has {n}",
                        hint="the sizes must add up to the dim exactly (uneven placements never pad)")

    def check_dim(self, size: int, axes: tuple[str, ...], at: int) -> None:
        """Its rules on a dim of ``size`` sharded by ``axes``, ``axes[at]`` carrying it."""
        if len(axes) > 1 and self.kind == "ragged" and self.span > 1:
            raise SpecError(
                f"a ragged split over {self.span} dims takes its dim alone, but {', '.join(axes)} all shard it",
                hint="shard other dims with the other axes, or use a ragged split over one dim",
            )
        if at < len(axes) - 1 and self.kind == "parts":
            raise SpecError(
                f"a PartitionedShard split cannot be cut further by the minor axes {', '.join(axes[at + 1:])}",
                hint="put the partitioned axis last on its dim (minor), or shard another dim with the other axes",
            )
        if at == 0 and self.kind != "ragged":  # under major axes it cuts each of their chunks instead
            self.check_extent(size, "the dim")

    def check_ragged(self, i: int, sizes: Sequence[int], axes: Sequence[tuple[str, ...]]) -> None:
        """A ragged split on dim ``i`` of a tensor of ``sizes`` (``axes`` shard each dim): it
        flattens the leading ``span`` dims, so it sits on dim 0, the other dims of the prefix
        are unsharded, and the flattened prefix divides by its units."""
        hint = "a RaggedShard flattens the leading dims: put it on dim 0, leave the other prefix dims unsharded"
        if i != 0:
            raise SpecError(f"a ragged split must be on dim 0 (the flattened prefix), not dim {i}", hint=hint)
        if self.span > len(sizes):
            raise SpecError(f"a ragged split over {self.span} dims, but the tensor has {len(sizes)}",
                            hint=f"use over k with k <= {len(sizes)}")
        for a in axes[1:self.span]:
            if a:
                raise SpecError(f"a ragged split over {self.span} dims flattens dims sharded by {', '.join(a)}",
                                hint=hint)
        flat = 1
        for n in sizes[:self.span]:
            flat *= n
        self.check_extent(flat, "the flattened prefix")

    def check_axis(self, axis: str, ranks: int) -> None:
        """One entry per rank of the mesh axis ``axis`` (of ``ranks`` ranks) it cuts over."""
        if self.shards != ranks:
            raise SpecError(f"the uneven split {self} gives {self.shards} {self.entries} for mesh axis {axis!r} "
                            f"of {ranks} ranks", hint=f"give one entry per rank of {axis!r}")

    def check_chunks(self, axis: str, major: tuple[str, ...], size: int, lengths: Sequence[int], group: int) -> None:
        """Under the major axes ``major`` (``group`` ranks), it cuts each chunk they cut from
        the dim of ``size``, of ``lengths``."""
        if all(self.fits(n) for n in lengths):
            return
        need = f"sum to each chunk ({self.total})" if self.total is not None else \
            f"divide each chunk by {sum(self.values)} units"
        raise SpecError(
            f"the uneven split {self} on {axis!r} applies within each chunk that {', '.join(major)} cut "
            f"from the dim of {size}, of lengths {list(lengths)}; its entries must {need}",
            hint=f"make the dim {group} x the split's total, or put {axis!r} first on the dim",
        )

    def __str__(self) -> str:
        if self.kind == "sizes":
            return "<" + ",".join(map(str, self.values)) + ">"
        if self.kind == "ragged":
            over = f" over {self.span}" if self.span != 1 else ""
            return "<ragged " + ",".join(map(str, self.values)) + over + ">"
        head = "aligned" if self.aligned else "parts"
        return f"<{head} " + "|".join(",".join(map(str, r)) for r in self.values) + ">"
