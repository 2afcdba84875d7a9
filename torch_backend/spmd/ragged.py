"""Ragged collectives for MoE dispatch (docs/spmd_types.md, "MoE dispatch: split sizes"):
each is ``torch_backend.redistribute`` between global types with an uneven split of the dim
over the axis, every other mesh axis V (``all_gather``: ``f32[N@ax<s>,..] -> f32[N,..]{R:ax}``;
``reduce_scatter``: ``f32[N,..]{U:ax} -> f32[N@ax<s>,..]``; ``all_to_all``:
``f32[T@ax<parts S>,..] -> f32[T@ax<c>,..]``, rank r receiving its partitions whole).
"""

from __future__ import annotations

from typing import Any

import torch

from spec_lang.errors import SpecError
from spec_lang.ir import Dim, TensorType
from spec_lang.local_type import LocalType
from spec_lang.split import Split, size_row
from torch_backend.comm import local_of
from torch_backend.dtypes import dtype_name
from torch_backend.groups import MeshContext
from torch_backend.sizes import uneven_type
from torch_backend.spmd.mesh import current_mesh
from torch_backend.spmd.tags import typeof
from torch_backend.type_tags import attach

V = LocalType("V")


def _typ(x: torch.Tensor, ctx: MeshContext, axis: str, d: int, dim: Dim | None,
         *anns: tuple[str, LocalType]) -> TensorType:
    """``x``'s global type: dim ``d`` is ``dim`` (else its local length), other axes V, and ``anns``."""
    dims = [Dim(int(s)) for s in local_of(x, ctx.ranks[0]).shape]
    if dim is not None:
        dims[d] = dim
    return TensorType(dtype_name(x.dtype), tuple(dims), tuple((a, V) for a in ctx.mesh.names if a != axis) + anns)


def _one_axis(op: str, group: tuple[str, ...]) -> str:
    if len(group) != 1:
        raise SpecError(f"spmd.{op} with split sizes runs over one mesh axis, got {list(group)}",
                        hint="pass one axis name (an uneven split is of one dim over one axis)")
    return group[0]


def _sizes(op: str, split_sizes: Any, n: int) -> tuple[int, ...]:
    sizes = size_row(split_sizes, f"spmd.{op} split_sizes", "list every rank's length of the split dim, in "
                     "group order, as ints >= 0 (torch_backend.uneven_type gives them from per-rank lengths)")
    if len(sizes) != n:
        raise SpecError(f"spmd.{op}: split_sizes has {len(sizes)} entries for a group of {n} ranks",
                        hint="one length per rank of the group, in group order")
    return sizes


def _run(x: torch.Tensor, src: TensorType, dst: TensorType, mesh: Any, axis: str,
         out: LocalType) -> torch.Tensor:
    from torch_backend.api import redistribute

    y = redistribute(x, src, dst, current_mesh(mesh))
    return attach(y, {**typeof(x), axis: out})


# the one-sided ragged collectives: the side whose S(d) the split sizes cut, what V's equal
# blocks do there, and the fix
_ONE_SIDED = {"all_gather": ("src", "stacked", "write src=S(d): blocks of any lengths concatenated on dim d"),
              "reduce_scatter": ("dst", "unbound", "write dst=S(d): blocks of any lengths on dim d")}


def run(op: str, routed: str, x: torch.Tensor, group: tuple[str, ...], s: LocalType, d: LocalType,
        splits: tuple, ctx: MeshContext, mesh: Any) -> torch.Tensor:
    """``spmd.op`` with split sizes (``splits``: all_to_all's input and output sizes, else the
    one list): all_gather(S(d) -> R|I) of blocks of those lengths along dim d,
    reduce_scatter(P -> S(d)) into them, or the all_to_all dispatch."""
    if routed in _ONE_SIDED:
        side, v_does, fix = _ONE_SIDED[routed]
        t = s if side == "src" else d
        if t.kind != "S":
            raise SpecError(f"spmd.{routed}({side}={t!r}) takes no split_sizes: V's blocks are equal ({v_does})",
                            hint=fix)
        axis = _one_axis(routed, group)
        sizes = _sizes(routed, splits[0], ctx.mesh.axis_size(axis))
        dim = t.dim or 0
        if routed == "all_gather":
            src = _typ(x, ctx, axis, dim, Dim(sum(sizes), (axis,), Split("sizes", sizes)))
            whole = _typ(x, ctx, axis, dim, Dim(sum(sizes)), *([(axis, LocalType("R"))] if d.kind == "R" else []))
            return _run(x, src, whole, mesh, axis, d)
        length = int(local_of(x, ctx.ranks[0]).shape[dim])
        if sum(sizes) != length:
            raise SpecError(f"spmd.reduce_scatter: split_sizes {list(sizes)} add up to {sum(sizes)}, but dim {dim} "
                            f"of the pending sum has {length}", hint="the pieces must cover the dim exactly")
        whole = _typ(x, ctx, axis, dim, None, (axis, s))
        piece = _typ(x, ctx, axis, dim, Dim(length, (axis,), Split("sizes", sizes)))
        return _run(x, whole, piece, mesh, axis, LocalType("S", dim=dim))
    if routed != "all_to_all" or s.base != "V" or d.base != "V" or (s.kind == d.kind == "S" and s.dim != d.dim):
        raise SpecError(f"spmd.{op}(src={s!r}, dst={d!r}) takes no split sizes",
                        hint="split sizes go with all_to_all(V or S(d) -> V or S(d)), all_gather(S(d), R|I) "
                        "and reduce_scatter(P, S(d))")
    at = s.dim if s.kind == "S" else d.dim if d.kind == "S" else 0
    return _dispatch(x, group, at or 0, d, splits[0], splits[1], ctx, mesh)


def _dispatch(x: torch.Tensor, group: tuple[str, ...], d: int, dst: LocalType, input_split_sizes: Any,
              output_split_sizes: Any, ctx: MeshContext, mesh: Any) -> torch.Tensor:
    axis = _one_axis("all_to_all", group)
    n = ctx.mesh.axis_size(axis)
    if input_split_sizes is None:  # output_split_sizes alone: the input splits are even
        input_split_sizes = _even_rows(x, d, n, ctx, axis)
    if isinstance(input_split_sizes, (list, tuple)) and input_split_sizes and all(
            isinstance(r, (list, tuple)) for r in input_split_sizes):  # the whole matrix, known everywhere
        if len(input_split_sizes) != n:
            raise SpecError(f"spmd.all_to_all: input_split_sizes has {len(input_split_sizes)} rows for a group of "
                            f"{n} ranks", hint="one row per rank: row s lists rank s's rows for each partition")
        split = Split("parts", tuple(tuple(r) for r in input_split_sizes))
        for r in ctx.ranks:
            s = ctx.mesh.coords(r)[ctx.mesh.index(axis)]
            have = int(local_of(x, r).shape[d])
            if sum(split.values[s]) != have:
                raise SpecError(f"spmd.all_to_all: rank {r}'s row of input_split_sizes {list(split.values[s])} "
                                f"adds up to {sum(split.values[s])}, but it holds {have} along dim {d}",
                                hint="row s lists rank s's rows for each destination partition")
        src = _typ(x, ctx, axis, d, Dim(sum(map(sum, split.values)), (axis,), split))
    else:  # this rank's own row: the ranks exchange them first (one small all_reduce)
        src = uneven_type(x, current_mesh(mesh), axis, d, partitions=input_split_sizes,
                          template=_typ(x, ctx, axis, d, None))
    parted = src.dims[d].split
    assert parted is not None and parted.kind == "parts"
    rows = parted.values
    parts = len(rows[0])
    if parts % n:
        raise SpecError(f"spmd.all_to_all: {parts} partitions do not divide among {n} ranks",
                        hint="give each rank the same number of partitions (experts)")
    k = parts // n
    counts = tuple(sum(rows[s][p] for s in range(n) for p in range(r * k, r * k + k)) for r in range(n))
    if output_split_sizes is not None:
        _check_output(output_split_sizes, rows, k, ctx, axis)
    dst_type = _typ(x, ctx, axis, d, Dim(sum(counts), (axis,), Split("sizes", counts)))
    return _run(x, src, dst_type, mesh, axis, dst)


def _even_rows(x: torch.Tensor, d: int, n: int, ctx: MeshContext, axis: str) -> list:
    """No ``input_split_sizes``: an equal share of each rank's rows to every rank (as
    ``all_to_all_single``): this rank's row, or every rank's where they differ (LocalTensorMode)."""
    rows: dict[int, list[int]] = {}
    for r in ctx.ranks:
        have = int(local_of(x, r).shape[d])
        if have % n:
            raise SpecError(f"spmd.all_to_all: rank {r} holds {have} rows along dim {d}, which do not split "
                            f"evenly among the {n} ranks of {axis!r} (without input_split_sizes each rank sends "
                            "every rank the same count)",
                            hint="pass input_split_sizes: this rank's rows for each rank, in group order")
        rows[ctx.mesh.coords(r)[ctx.mesh.index(axis)]] = [have // n] * n
    if len({tuple(v) for v in rows.values()}) == 1:
        return next(iter(rows.values()))
    return [rows[c] for c in range(n)]


def _check_output(output_split_sizes: Any, rows: tuple, k: int, ctx: MeshContext, axis: str) -> None:
    n = len(rows)
    for r in ctx.ranks:
        c = ctx.mesh.coords(r)[ctx.mesh.index(axis)]
        want_src = [sum(rows[s][c * k:c * k + k]) for s in range(n)]
        got = local_of(output_split_sizes, r) if isinstance(output_split_sizes, torch.Tensor) else output_split_sizes
        got = list(size_row(got.tolist() if isinstance(got, torch.Tensor) else got, "output_split_sizes",
                            "list what this rank receives from each rank of the group"))
        if got != want_src:
            raise SpecError(f"spmd.all_to_all: rank {r}'s output_split_sizes {got} differ from what the input "
                            f"splits send it, {want_src} (from each rank of {axis!r})",
                            hint="leave output_split_sizes out: the input splits decide them")
