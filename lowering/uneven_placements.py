"""The uneven placements as DTensor-style placements: Split <-> placement, text, checks.

``DynamicShard``, ``RaggedShard`` and ``PartitionedShard`` (``lowering.uneven``) stand in
a placements list like ``Shard(d)``, one per mesh axis. In a type they are a ``Split``
on the dim they cut (``spec_lang.split``); this module is the one place that converts
between the two, and applies the rules that only show once a placement meets the other
placements and the tensor's shape:

* an uneven placement's dim is sharded by that mesh axis alone (a RaggedShard's whole
  flattened prefix: its leading dims are sharded by no other axis);
* its entries (one per rank) match the mesh axis size, and its sizes sum to the dim
  (its ``Split``'s checks).

Their text form (what ``format_placements`` prints and ``parse_placements`` reads) is a
call: ``DynamicShard(0,[3,0,7])``, ``RaggedShard([0,1],[1,2,1])``,
``PartitionedShard(0,4,[[4,6,4,2],[2,4,8,2]],aligned=True)``; keywords are accepted too
(the grammar's calls, read by ``UNEVEN_FORMS``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import MISSING, fields
from typing import Any

from lowering.uneven import DynamicShard, PartitionedShard, RaggedShard
from spec_lang.errors import SpecError
from spec_lang.parser import Form
from spec_lang.split import Split

UnevenPlacement = DynamicShard | RaggedShard | PartitionedShard
UNEVEN_CLASSES = {"DynamicShard": DynamicShard, "RaggedShard": RaggedShard, "PartitionedShard": PartitionedShard}
# how their text form is read: a call of the constructor, its fields by position or keyword
UNEVEN_FORMS = {
    name: Form(tuple(f.name for f in fields(cls)), sum(f.default is MISSING for f in fields(cls)), bare=False)
    for name, cls in UNEVEN_CLASSES.items()
}


def is_uneven_placement(p: object) -> bool:
    return isinstance(p, (DynamicShard, RaggedShard, PartitionedShard))


def split_of(p: UnevenPlacement) -> tuple[int, Split]:
    """The tensor dim an uneven placement cuts and its ``Split`` (a RaggedShard over dims
    0..k-1 is a ragged split of span k on dim 0)."""
    if isinstance(p, DynamicShard):
        return p.dim, Split("sizes", p.chunk_sizes)
    if isinstance(p, RaggedShard):
        return 0, Split("ragged", p.local_units, span=len(p.dims))
    return p.dim, Split("parts", p.splits, aligned=p.aligned)


def placement_of(dim: int, split: Split) -> UnevenPlacement:
    """The placement of a ``Split`` on tensor dim ``dim`` (the inverse of ``split_of``)."""
    if split.kind == "sizes":
        return DynamicShard(dim, split.values)
    if split.kind == "ragged":
        return RaggedShard(tuple(range(split.span)), split.values)
    return PartitionedShard(dim, len(split.values[0]), split.values, split.aligned)


def placement_dim(p: UnevenPlacement) -> int:
    return split_of(p)[0]


def uneven_text(p: UnevenPlacement) -> str:
    def ints(v: Sequence[int]) -> str:
        return "[" + ",".join(map(str, v)) + "]"

    if isinstance(p, DynamicShard):
        return f"DynamicShard({p.dim},{ints(p.chunk_sizes)})"
    if isinstance(p, RaggedShard):
        return f"RaggedShard({ints(p.dims)},{ints(p.local_units)})"
    rows = "[" + ",".join(ints(r) for r in p.splits) + "]"
    return f"PartitionedShard({p.dim},{p.num_partitions},{rows}{',aligned=True' if p.aligned else ''})"


Fail = Callable[[str, int, str], SpecError]  # (message, index of the placement, hint) -> error


def check_uneven(placements: Sequence[Any], dims: Sequence[int | None], uneven: Sequence[Any],
                 sizes: Sequence[int], names: Sequence[str], shape: Sequence[int] | None, fail: Fail) -> None:
    """The rules of uneven placements among the others (see the module docstring).

    ``dims[i]`` is the tensor dim mesh axis i shards (None if none), ``uneven[i]`` its
    uneven placement (or None); ``sizes``/``names`` are the mesh's. Without ``shape`` only
    the rules that need no sizes are checked.
    """
    for i, p in enumerate(uneven):
        if p is None:
            continue
        covered = set(p.dims) if isinstance(p, RaggedShard) else {placement_dim(p)}
        for j, d in enumerate(dims):
            if j != i and d in covered:
                what = (f"tensor dim {d}, which the RaggedShard on {names[i]!r} flattens"
                        if isinstance(p, RaggedShard) and d != 0 else f"tensor dim {d}")
                raise fail(
                    f"mesh axis {names[j]!r} ({placements[j]}) also shards {what}: an uneven placement "
                    f"({placements[i]} on {names[i]!r}) must be the only one on its dim", max(i, j),
                    "shard another dim with the other mesh axis; an uneven placement composed with a "
                    "second axis on the same dim is not supported",
                )
        if shape is not None:
            d, split = split_of(p)
            try:
                split.check_axis(names[i], sizes[i])
                if split.kind == "ragged":
                    split.check_ragged(d, tuple(shape), [()] * len(shape))  # other axes: checked above
                else:
                    split.check_extent(shape[d], f"dim {d}")
            except SpecError as e:
                raise fail(e.message, i, e.hint or "") from None
