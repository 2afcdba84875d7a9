"""The split-information exchange (docs/uneven.md, "Sizes known only per rank"): the type
of data whose sizes each rank knows only locally, from one small all_reduce of a table each
rank writes its row of. Every rank gets the same table, so a count that differs between
ranks that must agree is a SpecError on every rank at once.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch

from spec_lang.errors import SpecError, value_text
from spec_lang.ir import Dim, Mesh, TensorType
from spec_lang.parser import parse
from spec_lang.split import Split, size_row
from torch_backend import comm
from torch_backend.comm import local_of, rank_map
from torch_backend.dtypes import dtype_name
from torch_backend.groups import context


def uneven_type(x: torch.Tensor, mesh: Mesh | str | Any, axis: str, dim: int = 0, *,
                partitions: torch.Tensor | Sequence[int] | None = None, aligned: bool = False,
                template: TensorType | str | None = None) -> TensorType:
    """The global type of local tensors ``x`` split unevenly along ``dim`` over ``axis``.

    * without ``partitions``: a DynamicShard, each rank's size being ``x.shape[dim]``;
    * with ``partitions`` (this rank's piece sizes in its local order, an int tensor or
      list; a LocalTensor under LocalTensorMode): a PartitionedShard (``aligned``: each
      rank holds whole partitions, its pieces listed partition by partition, shard by
      shard within one).

    ``template`` gives the other dims (their global sizes and axes) and the local types;
    the size of dim ``dim`` in it is ignored. Without it the other dims are unsharded,
    of ``x``'s sizes.
    """
    ctx = context(mesh)
    m = ctx.mesh
    if not isinstance(axis, str):  # a numpy array's `in` would compare elementwise
        raise SpecError(f"axis must be a mesh axis name (a str), got {type(axis).__name__}",
                        hint=f"pass the name of the mesh axis that splits the tensor, one of {', '.join(m.names)}")
    if axis not in m:
        raise SpecError(f"mesh axis {axis!r} is not on the mesh {m}", hint=f"use one of {', '.join(m.names)}")
    if not isinstance(x, torch.Tensor):
        raise SpecError(f"expected a torch.Tensor, got {type(x).__name__}", hint="pass this rank's local tensor")
    try:
        d = -1 if isinstance(dim, bool) else operator.index(dim)  # numpy ints too
    except TypeError:
        d = -1
    if not 0 <= d < x.dim():
        raise SpecError(f"dim {value_text(dim)} is not a dim of the local tensor of shape {list(x.shape)}",
                        hint=f"pass an int below {x.dim()}, the dim that {axis!r} splits")
    dim = d
    rows = _table(ctx, x, dim, partitions)
    by_coord: dict[int, tuple[int, ...]] = {}
    for r in range(m.size):
        c = m.coords(r)[m.index(axis)]
        if by_coord.setdefault(c, rows[r]) != rows[r]:
            raise SpecError(
                f"ranks at {axis}={c} disagree on their sizes: {list(by_coord[c])} and {list(rows[r])} (rank {r})",
                hint=f"a global type needs one size per coordinate of {axis!r}: ranks that differ only on the "
                     "other mesh axes must hold as many elements",
            )
    per = [by_coord[c] for c in range(m.axis_size(axis))]
    if partitions is None:
        split = Split("sizes", tuple(p[0] for p in per))
    else:
        split = Split("parts", _splits(per, m.axis_size(axis), aligned), aligned=aligned)
    base = parse(template) if template is not None else None
    if base is not None and len(base.dims) != x.dim():
        raise SpecError(f"the template {base} has {len(base.dims)} dims, the tensor {x.dim()}",
                        hint="give the template the tensor's dims")
    first = local_of(x, ctx.ranks[0])
    dims = list(base.dims) if base is not None else [Dim(int(s)) for s in first.shape]
    if dims[dim].axes:
        raise SpecError(f"the template already shards dim {dim} by {', '.join(dims[dim].axes)}",
                        hint=f"leave dim {dim} unsharded in the template: {axis!r} splits it")
    dims[dim] = Dim(split.total or 0, (axis,), split)
    out = TensorType(base.dtype if base is not None else dtype_name(first.dtype), tuple(dims),
                     base.axis_types if base is not None else ())
    from lowering.checks import check_type

    check_type(out, m)
    return out


def _counts(x: torch.Tensor, dim: int, partitions: Any, r: int) -> list[int]:
    n = int(local_of(x, r).shape[dim])
    if partitions is None:
        return [n]
    p = local_of(partitions, r) if isinstance(partitions, torch.Tensor) else partitions
    if isinstance(p, torch.Tensor):
        if p.device.type == "meta" or type(p) is not torch.Tensor:  # no values to read (a DTensor: no one block)
            raise SpecError(f"partitions must be this rank's sizes, an int tensor or a list, got a "
                            f"{type(p).__name__} on {p.device.type}",
                            hint="list this rank's piece of every partition, in local order, as ints >= 0")
        p = p.tolist()
    vals = list(size_row(p, f"rank {r}'s partition sizes",
                         "list this rank's piece of every partition, in local order, as ints >= 0"))
    if sum(vals) != n:
        held = f"{n} rows" if dim == 0 else f"{n} slices along dim {dim}"  # a partition size counts whole rows
        raise SpecError(f"rank {r}'s partition sizes {vals} add up to {sum(vals)}, not its {held}",
                        hint="list this rank's piece of every partition, in local order, sizes >= 0")
    return vals


def _table(ctx: Any, x: torch.Tensor, dim: int, partitions: Any) -> list[tuple[int, ...]]:
    """Every rank's counts: each rank fills its row of a zeroed table, one all_reduce sums
    them. The row widths go first (a fixed-size table), so ranks that disagree on the
    width fail together instead of hanging on tensors of different sizes."""
    mine: dict[int, list[int]] = {}
    errors: dict[int, SpecError] = {}
    for r in ctx.ranks:
        try:
            mine[r] = _counts(x, dim, partitions, r)
        except SpecError as e:  # told to every rank through the widths table (-1)
            errors[r], mine[r] = e, []
    widths = _gathered(ctx, {r: [-1 if r in errors else len(v)] for r, v in mine.items()}, 1)
    bad = [r for r, row in enumerate(widths) if row[0] < 0]
    if bad:
        if errors:
            raise next(iter(errors.values()))
        raise SpecError(f"rank(s) {bad} passed sizes that do not match their tensors; this rank's were fine",
                        hint="see the error on those ranks")
    if len({row[0] for row in widths}) != 1:
        raise SpecError(f"the ranks list different numbers of partition sizes: {[row[0] for row in widths]}",
                        hint="every rank lists one size per partition piece it holds (the same count)")
    return [tuple(row) for row in _gathered(ctx, mine, widths[0][0])]


def _gathered(ctx: Any, rows: dict[int, list[int]], width: int) -> list[list[int]]:
    m = ctx.mesh

    def table(r: int) -> torch.Tensor:
        t = torch.zeros(m.size, width, dtype=torch.int64)
        t[r] = torch.tensor(rows[r], dtype=torch.int64)
        return t

    buf = rank_map(ctx, table)
    comm.all_reduce(ctx, buf, "sum", ctx.group(m.names, ctx.ranks[0]))
    return local_of(buf, ctx.ranks[0]).tolist()


def _splits(per: list[tuple[int, ...]], n: int, aligned: bool) -> tuple[tuple[int, ...], ...]:
    """Each rank's pieces in its local order -> ``splits[shard][partition]``."""
    if not aligned:
        return tuple(per)
    k = len(per[0]) // n  # whole partitions per shard, each as its n pieces
    if len(per[0]) % n:
        raise SpecError(f"aligned partitions: each rank lists {len(per[0])} pieces, not a multiple of the "
                        f"{n} shards", hint="an aligned rank holds num_partitions / shards partitions, n pieces each")
    return tuple(tuple(per[s][j * n + q] for s in range(n) for j in range(k)) for q in range(n))
