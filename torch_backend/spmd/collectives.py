"""The typed per-axis collectives: each call is one Program (``lowering.spmd.programs``),
run by its ``BoundCall`` like every redistribution, every check (the pair against the SPMD
type system's tables, the axes, each rank's shape) before the first collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lowering.layout import group_ranks, local_shape
from lowering.spmd.programs import gradient_program, routed_program, stack_dim
from lowering.spmd.rules import backward_of, check_pair, check_whole_average
from lowering.spmd.types import resolve
from spec_lang.errors import SpecError
from spec_lang.local_type import LocalType
from torch_backend import comm, traced
from torch_backend.api import Door, bound_program, through_door
from torch_backend.bound import BoundCall
from torch_backend.collectives import all_reduce_into
from torch_backend.comm import local_of
from torch_backend.dtypes import dtype_name
from torch_backend.groups import MeshContext
from torch_backend.spmd import ragged
from torch_backend.spmd.check import STRICT, refuse_untyped_collective
from torch_backend.spmd.mesh import as_axes, current_mesh, mesh_context, traced_mesh
from torch_backend.spmd.precision import (
    as_dtype,
    backward_dtypes,
    check_options,
    reduce_in,
    wire_dtype,
    with_backward,
)
from torch_backend.spmd.tags import typeof
from torch_backend.tensor_checks import is_dtensor
from torch_backend.type_tags import SIZES, UNCHECKED, attach, unchecked


def _src_size(x: torch.Tensor, src: LocalType, group: tuple[str, ...], ctx: MeshContext,
              shapes: dict[int, tuple[int, ...]], size: int | None) -> int | None:
    """The global length of the dim an S(i) source splits: given, recorded on ``x``, the group's
    blocks added up (LocalTensorMode), or n blocks."""
    if src.kind != "S":
        return None
    i = src.dim
    r0 = ctx.ranks[0]
    if i is None or i >= len(shapes[r0]):
        raise SpecError(f"{src!r} names dim {i}, but the tensor has {len(shapes[r0])} dims",
                        hint=f"use S(i) with i < {len(shapes[r0])}")
    if size is not None:
        return int(size)
    got = (getattr(x, SIZES, None) or {}).get(group)
    if got is not None:
        return got
    if not comm.one_block(ctx):  # every rank's block is here
        return sum(shapes[q][i] for q in group_ranks(ctx.mesh, group, r0))
    return ctx.mesh.group_size(group) * shapes[r0][i]


@dataclass(frozen=True)
class Typed:
    """A typed collective's call as the door sequence carries it (``through_door``'s ``src``).
    ``at``: the dim V stacks on (``gather_dim``/``scatter_dim``); ``splits``: split sizes."""

    op: str
    axis: Any
    src: Any
    dst: Any
    size: int | None = None
    inplace: bool = False
    at: int | None = None
    op_dtype: Any = None
    out_dtype: Any = None
    splits: tuple | None = None
    backward_options: Any = None


def typed_call(op: str, x: torch.Tensor, axis: Any, src: Any, dst: Any, mesh: Any = None,
               **options: Any) -> torch.Tensor:
    """``op(x, axis, src, dst)`` through the door sequence; the result carries its type."""
    return through_door(TYPED, x, Typed(op, axis, src, dst, **options), None, mesh, None, None, False)


_TRACED_OPTIONS = ("size", "inplace", "at", "op_dtype", "out_dtype")  # the rest cannot be traced


def _compiled(x: torch.Tensor, call: Typed, _: None, mesh: Any, **__: Any) -> torch.Tensor:
    if call.splits is not None:
        raise SpecError(f"spmd.{call.op} with split sizes cannot run inside torch.compile (its sizes are data)",
                        hint="call it outside the compiled region")
    if call.backward_options is not None:
        raise SpecError(f"spmd.{call.op}(..., backward_options=...) cannot run inside torch.compile",
                        hint="call it outside the compiled region, or drop backward_options (the backward "
                        "then runs in the forward's dtypes)")
    from torch_backend import trace_marks

    return trace_marks.call("spmd", call.op, x, call.axis, call.src, call.dst, mesh=traced_mesh(mesh),
                            **{k: getattr(call, k) for k in _TRACED_OPTIONS})


@traced.entry("spmd")
def _traced_call(op: str, x: torch.Tensor, axis: Any, src: Any, dst: Any, mesh: Any = None,
                 inplace: bool = False, **options: Any) -> torch.Tensor:
    if inplace:
        raise SpecError(f"spmd.{op}(..., inplace=True) cannot run inside torch.compile (a compiled region "
                        "does not write its inputs)", hint="drop inplace=True and use the result")
    return typed_call(op, x, axis, src, dst, mesh, **options)


def _checked_run(x: torch.Tensor, call: Typed, _: None, mesh: Any) -> torch.Tensor:
    """The typed collective's own checks (the axes, shapes and program in ``_run``), then its run."""
    op, splits = call.op, call.splits
    if not isinstance(x, torch.Tensor):
        raise SpecError(f"spmd.{op} needs a tensor, got {type(x).__name__}")
    if is_dtensor(x):  # its collectives are DTensor's to run (a DTensor has no sharding rule for c10d's ops)
        raise SpecError(f"spmd.{op} takes this rank's local tensor, got a DTensor",
                        hint="pass dt.to_local() (typed with spmd.assert_type), or use dt.redistribute")
    # S(-1) counts from x's last dim (an S dim is a dim of the input and of the output alike)
    s, d = resolve(call.src, x.ndim, "src"), resolve(call.dst, x.ndim, "dst")
    if splits is not None and op == "all_to_all":
        routed = op  # the ragged exchange: V or S(d) -> V or S(d) on one dim (checked in ragged.run)
    else:
        routed = check_pair(op, s, d) or op  # refuses a bad pair before anything else
    dim = stack_dim(routed, s, d, x.ndim, call.at)
    dtypes = None
    if call.op_dtype is not None or call.out_dtype is not None:
        dtypes = as_dtype(call.op_dtype, "op_dtype"), as_dtype(call.out_dtype, "out_dtype")
        check_options(op, routed, s, x, dtypes[0], call.inplace)
    bw = None if call.backward_options is None else backward_dtypes(op, routed, s, d, call.backward_options,
                                                                    call.inplace, splits is not None)
    if STRICT.get() and not UNCHECKED[0]:  # under typecheck(strict=True): src must be x's type, not a claim
        ctx = mesh_context(mesh)
        have = typeof(x)
        missing = [a for a in as_axes(call.axis, ctx.mesh.names) if a not in have and ctx.mesh.axis_size(a) > 1]
        if missing:
            refuse_untyped_collective(f"spmd.{op}", x, missing)
    with unchecked():
        if splits is None:
            return _run(call, routed, x, s, d, mesh, dim, dtypes, bw)
        if dtypes or call.at is not None:
            raise SpecError(f"spmd.{op} with split sizes takes no op_dtype, out_dtype or gather/scatter dim",
                            hint="cast the tensor before or after the call")
        ctx, group = _placed(op, x, call.axis, s, mesh)[:2]
        return ragged.run(op, routed, x, group, s, d, splits, ctx, mesh)


TYPED = Door(_compiled, None, None, own=_checked_run)


def _placed(op: str, x: torch.Tensor, axis: Any, s: LocalType, mesh: Any,
            ) -> tuple[MeshContext, tuple[str, ...], dict[str, LocalType]]:
    """The call's context, its group's axes and ``x``'s types, which must agree with ``src`` on the group."""
    ctx = mesh_context(mesh)
    group = as_axes(axis, ctx.mesh.names)
    have = typeof(x)
    for a in group:
        if a in have and not have[a].agrees(s):
            raise SpecError(f"spmd.{op}: x is {have[a]!r} on axis {a!r}, but src={s!r}",
                            hint=f"pass src={have[a]!r}, or convert x first")
    return ctx, group, have


def _run(call: Typed, routed: str, x: torch.Tensor, s: LocalType, d: LocalType, mesh: Any, at: int,
         dtypes: tuple[torch.dtype | None, torch.dtype | None] | None,
         backward: tuple[torch.dtype | None, torch.dtype | None] | None) -> torch.Tensor:
    op, axis, inplace = call.op, call.axis, call.inplace
    if inplace and x.requires_grad and torch.is_grad_enabled():
        raise SpecError(f"spmd.{op}(..., inplace=True) takes a tensor autograd does not record (a gradient "
                        "buffer); this one requires grad", hint="drop inplace=True (the result is then a new "
                        "tensor, differentiable), or call it under torch.no_grad()")
    ctx, group, have = _placed(op, x, axis, s, mesh)
    out = {**have, **{a: d for a in group}}
    op_dt, out_dt = dtypes or (None, None)
    if routed == "identity":  # src == dst: the input itself (typed dst on the group, as assert_type would)
        if out_dt is not None and out_dt != x.dtype:  # only a cast to do
            return attach(x.to(out_dt), out, getattr(x, SIZES, None))
        if any(have.get(a) != d for a in group):
            attach(x, out, getattr(x, SIZES, None))
        return x
    check_whole_average(routed, s, group, have, dtype_name(x.dtype), ctx.mesh)
    shapes = {r: tuple(local_of(x, r).shape) for r in ctx.ranks}
    n_src = _src_size(x, s, group, ctx, shapes, call.size)
    wire = wire_dtype(routed, x.dtype, op_dt, out_dt)
    program = routed_program(routed, s, d, group, shapes[ctx.ranks[0]], dtype_name(wire), ctx.mesh, n_src, at)
    for r in ctx.ranks:
        want = local_shape(program.src, ctx.mesh, r)
        if shapes[r] != want:
            raise SpecError(f"spmd.{op}: rank {r} holds shape {list(shapes[r])}, but {s!r} over {list(group)} "
                            f"gives it {list(want)} (uneven blocks follow torch.chunk)",
                            hint="give every rank its block, or pass size= (the global length of the split dim)")
    bound = bound_program(program, ctx, gradient_program)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if inplace:
            return _in_place(bound, x)
        if wire == x.dtype and op_dt is not None and op_dt != x.dtype:  # added in a wider dtype than the wire's
            return reduce_in(routed, bound.check(x), s, d, group, ctx, at, op_dt, out_dt, program)
        # the program in the wire's dtype (x cast first where they differ), its result cast to out_dtype
        y = bound.taped([bound.check(x if wire == x.dtype else x.to(wire))])[0]
        return y if (out_dt or x.dtype) == y.dtype else y.to(out_dt or x.dtype)

    if backward is not None and x.requires_grad and torch.is_grad_enabled():
        b_op, b_src, b_dst = backward_of(routed, s, d)
        b_size = program.dst.dims[b_src.dim].size if b_src.dim is not None else None
        where = current_mesh(mesh)

        def gradient(g: torch.Tensor) -> torch.Tensor:  # the table's backward collective, with the options
            with unchecked():
                return typed_call(b_op, g, axis, b_src, b_dst, where, size=b_size, at=call.at,
                                  op_dtype=backward[0], out_dtype=backward[1] or x.dtype)

        y = with_backward(x, forward, gradient)
    else:
        y = forward(x)
    sizes = {k: v for k, v in (getattr(x, SIZES, None) or {}).items() if not set(k) & set(group)}
    if d.dim is not None:  # S(dim), the one local type with a tensor dim
        sizes[group] = program.dst.dims[d.dim].size
    return attach(y, out, sizes)


def _in_place(bound: BoundCall, x: torch.Tensor) -> torch.Tensor:
    """The bound all_reduce run on ``x`` itself (a non-contiguous one through a copy, written back)."""
    if bound.check(x) is not x:
        raise SpecError("inplace=True under LocalTensorMode needs a LocalTensor (every rank's block)",
                        hint="build it with LocalTensorMode's rank_map or torch_backend.distribute")
    ctx, step, pieces = bound.ctx, bound.program.steps[0], bound.pieces[0][0]
    if x.is_contiguous():
        return all_reduce_into(ctx, step, pieces, x)
    return x.copy_(all_reduce_into(ctx, step, pieces, x.contiguous()))


def all_gather(x: torch.Tensor, axis: Any, *, src: Any, dst: Any, mesh: Any = None,
               size: int | None = None, gather_dim: int | None = None, split_sizes: Any = None,
               op_dtype: Any = None, out_dtype: Any = None,
               backward_options: Any = None) -> torch.Tensor:
    """Every rank gets the group's blocks: V stacks them on a new dim 0 (``gather_dim``: on
    that new dim of the result), S(i) concatenates them on dim i; dst R (gradient:
    reduce_scatter) or I (gradient: the rank's own piece)::

        A                        [A0]
        B  =>  [A, B, C]         [A1]  =>  [A0, A1, A2]
        C                        [A2]

    ``split_sizes``: every rank's length of dim i, in group order (blocks of any lengths).
    ``op_dtype``/``out_dtype``/``backward_options`` (every collective): docs/spmd_types.md.
    """
    return typed_call("all_gather", x, axis, src, dst, mesh, size=size, at=gather_dim, op_dtype=op_dtype,
                      out_dtype=out_dtype, splits=None if split_sizes is None else (split_sizes,),
                      backward_options=backward_options)


def all_reduce(x: torch.Tensor, axis: Any, *, src: Any = "P", dst: Any, mesh: Any = None,
               inplace: bool = False, op_dtype: Any = None, out_dtype: Any = None,
               backward_options: Any = None) -> torch.Tensor:
    """Finish the pending reduction: ``+A, +B, +C  =>  A + B + C`` on every rank (R or I).

    ``inplace=True`` reduces ``x`` itself (a flat gradient buffer: no copy) and returns it,
    retyped; for a tensor autograd does not record (under ``torch.no_grad()``, or a ``.grad``).
    ``op_dtype``: add in that dtype, sending x's (bf16 on the wire, fp32 sums)."""
    return typed_call("all_reduce", x, axis, src, dst, mesh, inplace=inplace, op_dtype=op_dtype, out_dtype=out_dtype,
                      backward_options=backward_options)


def reduce_scatter(x: torch.Tensor, axis: Any, *, src: Any = "P", dst: Any, mesh: Any = None,
                   scatter_dim: int | None = None, op_dtype: Any = None, out_dtype: Any = None,
                   split_sizes: Any = None,
                   backward_options: Any = None) -> torch.Tensor:
    """Finish the pending reduction, keeping this rank's piece: V unbinds dim 0 (``scatter_dim``:
    that dim), S(i) chunks dim i::

        +[Ax, Bx, Cx]      Ax + Ay + Az
        +[Ay, By, Cy]  =>  Bx + By + Bz
        +[Az, Bz, Cz]      Cx + Cy + Cz

    ``split_sizes``: every rank's length of dim i, in group order."""
    return typed_call("reduce_scatter", x, axis, src, dst, mesh, at=scatter_dim, op_dtype=op_dtype,
                      out_dtype=out_dtype, splits=None if split_sizes is None else (split_sizes,),
                      backward_options=backward_options)


def all_to_all(x: torch.Tensor, axis: Any, *, src: Any, dst: Any, mesh: Any = None,
               size: int | None = None, input_split_sizes: Any = None, output_split_sizes: Any = None,
               op_dtype: Any = None, out_dtype: Any = None,
               backward_options: Any = None) -> torch.Tensor:
    """V -> V transposes the mesh axis with dim 0; S(i) -> S(j) unsplits dim i and splits dim j::

        [A0, A1, A2]      [A0, B0, C0]
        [B0, B1, B2]  =>  [A1, B1, C1]
        [C0, C1, C2]      [A2, B2, C2]

    ``input_split_sizes`` (MoE token dispatch): this rank's rows for each destination
    partition (one per rank, or k experts per rank), as a list or an int tensor, or every
    rank's row (a list of lists); ``output_split_sizes`` is checked against what arrives,
    or, given alone, goes with even input splits (``all_to_all_single``'s default).
    """
    splits = None if input_split_sizes is None and output_split_sizes is None else (
        input_split_sizes, output_split_sizes)
    return typed_call("all_to_all", x, axis, src, dst, mesh, size=size, op_dtype=op_dtype, out_dtype=out_dtype,
                      splits=splits, backward_options=backward_options)


def reinterpret(x: torch.Tensor, axis: Any, *, src: Any, dst: Any, mesh: Any = None,
                op_dtype: Any = None, out_dtype: Any = None,
                backward_options: Any = None) -> torch.Tensor:
    """Change the type, not the local tensor (the value may change: reinterpret(R,P) is n times it)."""
    return typed_call("reinterpret", x, axis, src, dst, mesh, op_dtype=op_dtype, out_dtype=out_dtype,
                      backward_options=backward_options)


def convert(x: torch.Tensor, axis: Any, *, src: Any, dst: Any, mesh: Any = None,
            size: int | None = None, op_dtype: Any = None, out_dtype: Any = None,
            backward_options: Any = None) -> torch.Tensor:
    """Change the type, keeping the value, without communication (slicing or zeroing locally)::

        convert(R, P):  [A]  =>  +[A], +[0], +[0]      convert(V, P):  A, B, C  =>  +[A,0,0], +[0,B,0], +[0,0,C]
    """
    return typed_call("convert", x, axis, src, dst, mesh, size=size, op_dtype=op_dtype, out_dtype=out_dtype,
                      backward_options=backward_options)


def redistribute(x: torch.Tensor, axis: Any, *, src: Any, dst: Any, mesh: Any = None,
                 size: int | None = None, op_dtype: Any = None, out_dtype: Any = None,
                 backward_options: Any = None) -> torch.Tensor:
    """Keep the value, with one collective: V|S(i)->R|I all_gather, P->R|I all_reduce,
    P->V|S(i) reduce_scatter, S(i)->S(j) all_to_all; or with none, where none is needed
    (R|I -> R|I|V|S(i)|P and V|S(i) -> P are the ``convert``: no data moves)."""
    return typed_call("redistribute", x, axis, src, dst, mesh, size=size, op_dtype=op_dtype, out_dtype=out_dtype,
                      backward_options=backward_options)
