"""Everything a call checks about a tensor, before any collective: its layout, dtype, device
and shape on each rank this process plays; a plain tensor that matches what a bound program
expects (``expected_block``) passes with three comparisons (``fits_block``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch

import lowering
from lowering.cross_mesh import CrossProgram
from lowering.layout import local_shapes
from lowering.placements import placement_specs
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType
from torch_backend import comm
from torch_backend.dtypes import dtype_name, short_name, to_torch_dtype
from torch_backend.faults import refused
from torch_backend.groups import MeshContext

# each backend's device rule: the tensor's flag, the backend's name, the fix
_DEVICE_RULES = {
    "gloo": ("is_cpu", "gloo", "gloo lacks all_to_all on GPU tensors: use an NCCL group, or move the tensor to CPU"),
    "nccl": ("is_cuda", "NCCL", "move the tensor to its rank's GPU (x.cuda()), or use a gloo group for CPU tensors"),
}


def is_dtensor(x: Any) -> bool:
    """Whether ``x`` is a DTensor, without importing torch.distributed.tensor (seconds: sympy):
    until it is imported nothing is one."""
    cls = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return cls is not None and isinstance(x, cls)


def check_tensor(x: Any, t: TensorType, ctx: MeshContext, want: tuple[Any, ...] = ()) -> torch.Tensor:
    """``x`` against the source type ``t`` (under LocalTensorMode a plain tensor becomes a
    LocalTensor); one that fits ``want`` (``expected_block``'s) skips the rest. A refused
    tensor on a real group is recorded, so the ranks left in their collective name this one."""
    if want and isinstance(x, torch.Tensor) and fits_block(x, want):
        return x
    try:
        if not isinstance(x, torch.Tensor):
            raise SpecError(f"expected a torch.Tensor, got {type(x).__name__}",
                            hint="pass this rank's local block as a tensor")
        return check_local(x, t, ctx)
    except SpecError as e:
        if ctx.local_mode is None:  # the other ranks may be in their collective already: they name this one
            refused(e, ctx.to_global, ctx.to_global[ctx.rank])
        raise


def check_all(xs: Sequence[Any], types: Sequence[TensorType], ctx: MeshContext,
              wants: Sequence[tuple[Any, ...]] | None = None, one: bool = False) -> list[torch.Tensor]:
    """Every tensor against its source type, the first failure naming it (``one``: none)."""
    out = []
    for i, (x, t) in enumerate(zip(xs[:1] if one else xs, types)):
        try:
            out.append(check_tensor(x, t, ctx, wants[i] if wants is not None else ()))
        except SpecError as e:
            if one:
                raise
            raise SpecError(f"tensor {i}: {e.message}", text=e.text, pos=e.pos, hint=e.hint) from None
    return out


def expected_block(t: TensorType, ctx: MeshContext) -> tuple[Any, ...]:
    """(torch dtype, this rank's shape, the device flag to test or None) that pass every check
    of ``check_local``; () where the fast test does not apply (a tensor of blocks, ...)."""
    if not comm.one_block(ctx):
        return ()
    rule = _DEVICE_RULES.get(ctx.backend)
    try:
        return to_torch_dtype(t.dtype), local_shapes(t, ctx.mesh)[ctx.rank], rule[0] if rule else None
    except SpecError:
        return ()


def fits_block(x: torch.Tensor, want: tuple[Any, ...]) -> bool:
    """``x`` passes every check of ``check_local`` (``want``: ``expected_block``'s, not empty)."""
    return (bool(want) and x.dtype is want[0] and x.shape == want[1] and x.layout is torch.strided
            and (want[2] is None or getattr(x, want[2])))


def check_strided(x: torch.Tensor) -> None:
    """A sparse (or MKL-DNN) tensor, which has no strides to pack from, refused before any collective."""
    if x.layout is not torch.strided:
        raise SpecError(f"the tensor's layout is {x.layout}: shardc moves dense (strided) tensors only",
                        hint="pass x.to_dense(), and make it sparse again after the redistribution if needed")


def check_local(x: torch.Tensor, t: TensorType, ctx: MeshContext) -> torch.Tensor:
    """layout, dtype, device and each rank's shape against ``t``; returns x (a LocalTensor when simulating)."""
    check_strided(x)
    got = dtype_name(x.dtype)
    if got != t.dtype:
        raise SpecError(
            f"the tensor is {short_name(x.dtype)} ({x.dtype}) but the source type is {t}",
            text=str(t), pos=0,
            hint=f"convert with x.to({to_torch_dtype(t.dtype)}) or write the type with dtype {short_name(x.dtype)}",
        )
    rule = _DEVICE_RULES.get(ctx.backend)
    if rule is not None and not getattr(x, rule[0]):
        raise SpecError(f"the process group uses {rule[1]} but the tensor is on {x.device}", hint=rule[2])
    shapes = local_shapes(t, ctx.mesh)  # one cached lookup: this runs on every call
    blocks = comm.blocks(ctx, x)
    if blocks is None:  # one plain tensor standing for every simulated rank's block
        each = {shapes[r] for r in ctx.ranks}
        if len(each) != 1 or tuple(x.shape) not in each:
            raise SpecError(f"under LocalTensorMode, pass a LocalTensor: the blocks of {t} differ per rank",
                            hint="build it with LocalTensorMode.rank_map or torch_backend.distribute")
        base = x.detach()
        x = comm.rank_map(ctx, lambda r: base.clone())
        blocks = comm.blocks(ctx, x)
        assert blocks is not None
    for r, b in blocks.items():
        if b is not x:
            check_strided(b)
        if tuple(b.shape) != shapes[r]:
            hint = f"give rank {r} its block of {t}, of shape {list(shapes[r])}"
            if tuple(b.shape) == t.shape and shapes[r] != t.shape:
                hint += " (this looks like the global tensor: use torch_backend.distribute first)"
            raise SpecError(f"rank {r}'s tensor has shape {list(b.shape)}, but {t} gives rank {r} the shape "
                            f"{list(shapes[r])} on mesh {ctx.mesh}", text=str(t), pos=str(t).find("["), hint=hint)
    return x


def check_cross_block(x: object, p: CrossProgram, me: int, i: int | None) -> SpecError | None:
    """The error (a value: the ranks agree on it first) of global rank ``me``'s block ``x``
    (tensor ``i``) of a cross-mesh move: None off the source mesh, else its block."""
    which = "" if i is None else f" (tensor {i})"
    on_src = p.src_mesh.global_ranks
    if me not in on_src:
        if x is not None:
            return SpecError(f"rank {me} is off the source mesh {p.src_mesh} but was given a tensor{which}",
                             hint="pass x=None on the ranks outside the source mesh")
        return None
    if x is None:
        return SpecError(f"rank {me} is on the source mesh {p.src_mesh} but was given None{which}",
                         hint=f"pass this rank's block of {p.src}")
    if not isinstance(x, torch.Tensor):
        return SpecError(f"expected a torch.Tensor on rank {me}{which}, got {type(x).__name__}",
                         hint=f"pass this rank's block of {p.src} as a tensor")
    want = local_shapes(p.src, p.src_mesh)[on_src.index(me)]
    if tuple(x.shape) != tuple(want):
        return SpecError(f"rank {me}'s block{which} has shape {list(x.shape)}, the source type {p.src} gives it "
                         f"{list(want)} on mesh {p.src_mesh}", hint="pass this rank's own block of the source type")
    dtype = to_torch_dtype(p.src.dtype)
    if x.dtype != dtype:
        return SpecError(f"rank {me}'s block{which} is {x.dtype}, the source type {p.src} says {dtype}",
                         hint=f"convert it with x.to({dtype})")
    return None


def check_dtensor_source(stated: TensorType, text: str | None, actual: TensorType, m: Mesh) -> TensorType:
    """The stated source type of a DTensor that is ``actual``, if it has the same blocks, pending
    reduction, dtype and shape; else a SpecError. R may stand where DTensor says Replicate (it
    asks for a partial gradient), so the stated type is the one used."""
    lowering.check_type(stated, m, text=text)
    if not (stated.dtype == actual.dtype and stated.shape == actual.shape
            and {a: at for a, at in stated.axis_types if at.kind in ("P", "V")}
            == {a: at for a, at in actual.axis_types if at.kind == "P"}
            and not stated.is_uneven  # DTensor has no uneven placements
            and bool((lowering.boxes(stated, m) == lowering.boxes(actual, m)).all())):
        shown = text if text is not None else str(stated)
        raise SpecError(
            f"the source type {stated} does not match the DTensor, which is {actual} "
            f"(placements {','.join(str(p) for p in placement_specs(actual, m, strided=True)[0])} on mesh {m})",
            text=shown, pos=shown.find("[") if "[" in shown else 0,
            hint=f"drop the source type (it is read from the DTensor) or write {actual}",
        )
    return stated


def as_dtensor(y: torch.Tensor, device_mesh: Any, placements: Any, shape: Sequence[int],
               grad_placements: Any = None) -> Any:
    """The block ``y`` as a DTensor of global ``shape``; ``grad_placements``: what its incoming
    gradient must have (dual(dst)'s layout: a P(sum) where dst says R, as the backward program
    expects; DTensor would otherwise normalize it to Replicate)."""
    from torch.distributed.tensor import DTensor

    size = torch.Size(shape)
    stride = tuple(size[i + 1:].numel() for i in range(len(size)))
    return DTensor.from_local(y, device_mesh, placements, run_check=False, shape=size, stride=stride,
                              grad_placements=grad_placements)
