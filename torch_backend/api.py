"""The public entry points ``redistribute`` and ``distribute``, the one door sequence every
public call runs (``through_door``), and the one cache of bound calls. Everything about a
call is checked before the first collective, so a call wrong in the same way on every
rank fails on every rank at once (``agree=True``: one wrong on some ranks too); the input
tensor is never modified.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from types import SimpleNamespace
from typing import Any

import torch

import lowering
from lowering.caching import anchored_get, anchored_put, on_clear
from lowering.checks import check_flag, check_same_global
from lowering.kinds.local import keeps_values
from lowering.placements import as_mesh, from_placements, to_placements
from lowering.program import Program
from spec_lang.dual import dual_type
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType
from spec_lang.parser import parse
from torch_backend import mesh_transfer, traced
from torch_backend.agree import Checks, agreed, describe
from torch_backend.blocks import local_part
from torch_backend.bound import BoundCall, bind, joined
from torch_backend.comm import rank_map
from torch_backend.dtypes import check_reductions, dtype_name, short_name, to_torch_dtype
from torch_backend.groups import MeshContext, context, real_world
from torch_backend.tensor_checks import as_dtensor, check_all, check_dtensor_source, check_strided, is_dtensor

__all__ = ["ACROSS", "Door", "async_entries", "bound_for", "bound_program", "distribute", "hot_bound", "redistribute",
           "text_key", "through_door"]


def _type(t: TensorType | str, what: str) -> TensorType:
    if isinstance(t, TensorType):
        return t
    if isinstance(t, str):
        return parse(t)
    raise SpecError(f"the {what} type must be a string or a TensorType, got {type(t).__name__}",
                    hint="write it like 'f32[8@dp,16]'")


def redistribute(x: torch.Tensor, src: TensorType | str, dst: TensorType | str | None = None,
                 mesh: Mesh | str | Any | None = None, *,
                 timeout: timedelta | float | None = None, agree: bool | None = None,
                 async_op: bool = False, dst_mesh: Mesh | str | Any | None = None) -> Any:
    """Turn this rank's block ``x`` of type ``src`` into its block of type ``dst`` on ``mesh``.

    * local tensors: ``redistribute(x, 'f32[8@dp,16]', 'f32[8,16@dp]', 'dp=2,tp=4')``; the
      mesh may be a string, a spec_lang Mesh or a named DeviceMesh. Under LocalTensorMode
      ``x`` is a LocalTensor holding every rank's block.
    * DTensors: ``redistribute(dt, 'f32[8,16@dp]')`` (the source type comes from the
      DTensor's placements; the result is a DTensor on the same DeviceMesh). A source
      type or mesh stated as well, ``redistribute(dt, src, dst, mesh)``, must agree with
      the DTensor (same layout; ``{R:ax}`` may stand for a Replicate axis to ask for a
      partial gradient), else a SpecError before any communication.

    Differentiable (see ``torch_backend.autograd``). ``timeout`` bounds each collective of
    the groups this call creates (seconds or a timedelta).

    ``agree=True`` (or ``SHARDC_AGREE=1``) adds one small all_reduce before the program
    (``torch_backend.agree``), so that a call wrong on *some* ranks fails on every rank at
    once, each naming the ranks at fault; without it such ranks fail at the collective
    timeout, or return wrong data where the collectives happen to match (docs/running.md).

    ``async_op=True`` (local tensors) returns a handle at once, its last collective on the
    wire where the kind allows; ``handle.wait()`` gives the result, differentiable like the
    sync call. Do not modify ``x`` before ``wait()``.

    ``dst_mesh=`` moves the tensor to ``dst`` on another mesh (docs/cross_mesh.md): every rank
    of both meshes calls it, ``x`` None off ``mesh``, the result None off ``dst_mesh``.
    """
    return through_door(REDISTRIBUTE, x, src, dst, mesh, timeout, agree, async_op, dst_mesh=dst_mesh)


@dataclass(frozen=True)
class Door:
    """What one public call brings to the one door sequence (``through_door``). Each
    callable takes the call's ``(x, src, dst, mesh)`` as given (lists for many; for a
    prepared call, itself as ``src`` and its bound call as ``bound``; for a cross-mesh
    call, ``(mesh, dst_mesh)`` as ``mesh``)."""

    compiled: Callable[..., Any] | None  # inside torch.compile: its traced entry (or None: eager)
    fast: Callable[..., Any] | None  # the fast path's result, or None where the call does not take it
    resolve: Callable[..., tuple[list[Any], tuple[Any, ...], tuple[Any, ...], Any]] | None  # tensors, types, mesh
    one: bool = True  # one tensor in and out, else a list
    elsewhere: Callable[..., Any] | None = None  # a call whose inputs another sequence takes (a DTensor's)
    across: Door | None = None  # dst_mesh=: the door of the call to another mesh (parts from mesh_transfer)
    agreement: Callable[..., tuple[BoundCall, list[Any]]] | None = None  # its own, on every call (cross-mesh)
    check: Callable[[BoundCall, list[Any]], None] | None = None  # after the tensors' (a cross-mesh gradient's)
    out: Callable[[BoundCall, list[Any]], list[Any]] | None = None  # the results as the caller gets them
    own: Callable[..., Any] | None = None  # checks and runs a call after compile time (a typed SPMD collective)


def through_door(door: Door, x: Any, src: Any, dst: Any, mesh: Any, timeout: timedelta | float | None,
                 agree: bool | None, async_op: bool, dst_mesh: Any = None, bound: BoundCall | None = None) -> Any:
    """The one door sequence of every public call (its steps in order, below)."""
    if type(async_op) is not bool:  # its truthiness would decide silently
        check_flag(async_op, "async_op", "async_op=True returns a handle whose wait() gives the result")
    if dst_mesh is not None and door.across is not None:
        if async_op:
            raise SpecError("async_op=True is not supported with dst_mesh=", hint="drop async_op")
        door, mesh = door.across, (mesh, dst_mesh)
    if torch.compiler.is_dynamo_compiling() and door.compiled is not None:
        y = door.compiled(x, src, dst, mesh, async_op=async_op, timeout=timeout, agree=agree)
        if y is not None:
            return y
    if door.own is not None:
        return door.own(x, src, dst, mesh)
    agrees = agreeing(agree)
    if timeout is None and not async_op and not agrees and door.fast is not None:
        y = door.fast(x, src, dst, mesh, bound)
        if y is not None:
            return y
    if door.elsewhere is not None:
        y = door.elsewhere(x, src, dst, mesh, timeout=timeout, agree=agree, async_op=async_op)
        if y is not None:
            return y
    assert door.resolve is not None  # every door but an own one resolves its inputs
    xs, srcs, dsts, mesh = door.resolve(x, src, dst, mesh, bound)
    if door.agreement is not None:  # a cross-mesh call's, over the world (never a prepared one)
        bound, xs = door.agreement(xs, srcs, dsts, mesh, timeout)
    elif agrees:
        bound, xs = agreed_bound(xs, srcs, dsts, mesh, timeout, bound=bound)
    else:
        bound = bound if bound is not None else bound_for(srcs, dsts, mesh, timeout)
        xs = bound.checked(xs, door.one)
    if door.check is not None:
        door.check(bound, xs)
    if async_op:
        return bound.start(xs, one=door.one)
    ys = bound.call(xs) if door.out is None else door.out(bound, bound.call(xs))
    return ys[0] if door.one else ys


def _compiled(x: Any, src: Any, dst: Any, mesh: Any, *, async_op: bool, timeout: Any, agree: Any) -> Any:
    if is_dtensor(x):
        return _compiled_dtensor(x, src, dst, mesh, async_op=async_op, timeout=timeout, agree=agree)
    from torch_backend import trace_marks

    return trace_marks.call("redistribute", x, src, dst=dst, mesh=mesh, async_op=async_op, timeout=timeout,
                            agree=agree)


def _fast(x: Any, src: Any, dst: Any, mesh: Any, _: Any) -> Any:
    if type(x) is torch.Tensor and type(src) is str and type(dst) is str and type(mesh) is str:
        hot = hot_bound(src, dst, mesh)
        if hot is not None:
            return hot.hot(x)
    return None


def _redistribute_dtensor(x: Any, src: Any, dst: Any, mesh: Mesh | str | Any | None, *,
                          timeout: timedelta | float | None, agree: bool | None, async_op: bool) -> Any:
    """``redistribute(dtensor, ...)`` (None for any other ``x``)."""
    if not is_dtensor(x):
        return None
    src, dst = _dtensor_call(src, dst, async_op)
    dm = x.device_mesh
    held: list[Any] = []  # the destination type and the mesh, once resolved

    def resolve() -> tuple[list[Any], tuple[TensorType], tuple[TensorType]]:
        s, d, m = _dtensor_types(dm, tuple(x.placements), tuple(x.shape), x.dtype, x, src, dst, mesh)
        held[:] = [d, m]
        # the input's gradient has dual(src)'s layout: a P(sum) where src says R
        return [x.to_local(grad_placements=_grad_placements(s, m))], (s,), (d,)

    if agreeing(agree):
        bound, (local,) = agreed_bound(None, (), (), dm, timeout, resolve=resolve)
    else:
        xs, srcs, dsts = resolve()
        bound = bound_for(srcs, dsts, dm, timeout)
        local = bound.check(xs[0])
    d, m = held
    return as_dtensor(bound.call([local])[0], x.device_mesh, to_placements(d, m, strided=True)[0], x.shape,
                      _grad_placements(d, m))


def _dtensor_call(src: Any, dst: Any, async_op: bool) -> tuple[TensorType | str | None, TensorType | str]:
    """The stated source type (or None) and the destination type of ``redistribute(dtensor,
    ...)``, after what it refuses first, eagerly and at trace time."""
    if async_op:
        raise SpecError("async_op=True takes a local tensor, not a DTensor",
                        hint="pass dt.to_local() with its source type and mesh, or drop async_op")
    stated, dst = (None, src) if dst is None else (src, dst)
    if dst is None:
        raise SpecError("redistribute(dtensor, dst) needs a destination type", hint="e.g. 'f32[8,16@dp]'")
    return stated, dst


def _resolve(x: Any, src: Any, dst: Any, mesh: Any, _: Any) -> tuple[list[Any], tuple[Any, ...], tuple[Any, ...], Any]:
    if dst is None:
        raise SpecError("redistribute(x, src, dst, mesh) needs a destination type for a local tensor",
                        hint="pass both types, e.g. redistribute(x, 'f32[8@dp]', 'f32[8]', 'dp=2')")
    if mesh is None:
        raise SpecError("redistribute of a local tensor needs the mesh",
                        hint="pass mesh='dp=2,tp=4' (or a DeviceMesh)")
    if not isinstance(x, torch.Tensor):
        raise SpecError(f"expected a torch.Tensor, got {type(x).__name__}",
                        hint="pass this rank's local block as a tensor")
    return [x], (src,), (dst,), mesh


# dst_mesh=: each rank's checks and the agreement over the world, then the move bound and run
ACROSS = Door(None, None, mesh_transfer.resolve, agreement=partial(mesh_transfer.agreed_across, one=True),
               out=mesh_transfer.outputs)
REDISTRIBUTE = Door(_compiled, _fast, _resolve, elsewhere=_redistribute_dtensor, across=ACROSS)


traced.entry("redistribute")(redistribute)


def async_entries(name: str, bound_of: Callable[..., BoundCall]) -> None:
    """``async_op=True`` of the traced call ``name`` inside torch.compile (``trace_marks.Waiting``),
    on the bound call ``bound_of`` gives for the call's arguments but its tensor (one, or a list)."""
    def checked(bound: BoundCall, x: Any) -> list[torch.Tensor]:
        return bound.checked([x] if isinstance(x, torch.Tensor) else x, isinstance(x, torch.Tensor))

    def finish(x: Any, got: Any, *args: Any, **kwargs: Any) -> Any:
        bound = bound_of(*args, **kwargs)
        ys = bound.land(checked(bound, x), got)
        return ys[0] if isinstance(x, torch.Tensor) else ys

    def start(x: Any, *args: Any, **kwargs: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        bound = bound_of(*args, **kwargs)
        return bound.issue(checked(bound, x))

    traced.entry(name + ".splits")(lambda *args, **kwargs: bound_of(*args, **kwargs).issues())
    traced.entry(name + ".start")(start)
    traced.entry(name + ".finish")(finish)


async_entries("redistribute", lambda src, dst, mesh, **_: bound_for((src,), (dst,), mesh))


# The one cache of bound calls, least recently used evicted first. Two kinds of key:
# ``text_key`` (the strings) -> (default group, bound): a call written with strings and no
# timeout skips ``context()`` too, while the default group is the same object; and
# (srcs, dsts, id(context)) -> (context, bound) for every other call (IR types, a Mesh, a
# DeviceMesh, a timeout), the context kept in the entry and compared by identity, so a
# recycled id never matches.
_BOUND: OrderedDict[tuple[Any, Any, Any], tuple[Any, BoundCall]] = OrderedDict()
_BOUND_MAX = 4096
on_clear(_BOUND.clear)  # lowering.clear_caches() and torch_backend.clear_caches() empty it


def hot_bound(src: Any, dst: Any, mesh: str) -> BoundCall | None:
    """The fast path's one lookup: the bound call of these strings on the default group, if
    one was made. One call's types are its strings, many calls' the tuples of theirs."""
    return anchored_get(_BOUND, (src, dst, mesh), real_world())


def text_key(srcs: tuple[Any, ...], dsts: tuple[Any, ...], mesh: str) -> tuple[Any, Any, str]:
    """``hot_bound``'s key: a one-program call's strings as they are, many calls' as tuples."""
    return (srcs[0], dsts[0], mesh) if len(srcs) == len(dsts) == 1 else (srcs, dsts, mesh)


def bound_for(srcs: tuple[TensorType | str, ...], dsts: tuple[TensorType | str, ...], mesh: Mesh | str | Any,
              timeout: timedelta | float | None = None, *, ctx: MeshContext | None = None,
              programs: tuple[Program, ...] | None = None) -> BoundCall:
    """The bound call of ``srcs[i] -> dsts[i]`` on ``mesh``, from the cache where an earlier
    call made it. ``ctx`` and ``programs``: where the caller has them already (an agreeing call)."""
    def bound() -> BoundCall:
        return _bound_on(srcs, dsts, ctx if ctx is not None else context(mesh, timeout=timeout), programs)

    text = timeout is None and isinstance(mesh, str) and all(type(t) is str for t in (*srcs, *dsts))
    world = real_world() if text else None
    if world is None or not isinstance(mesh, str):
        return bound()
    return _cached(text_key(srcs, dsts, mesh), world, bound)


def _bound_on(srcs: tuple[Any, ...], dsts: tuple[Any, ...], ctx: MeshContext,
              programs: tuple[Program, ...] | None = None) -> BoundCall:
    def bound() -> BoundCall:
        if len(srcs) == 1:
            return bind(programs[0] if programs is not None else checked_program(srcs[0], dsts[0], ctx), ctx)
        # the one-program bounds' pieces, reused
        return joined([_bound_on((s,), (d,), ctx, None if programs is None else (programs[i],))
                       for i, (s, d) in enumerate(zip(srcs, dsts))])

    return _cached((srcs, dsts, id(ctx)), ctx, bound)


def bound_program(program: Program, ctx: MeshContext, backward: Callable[[Program], Program]) -> BoundCall:
    """A program planned elsewhere (a typed SPMD collective's), bound on ``ctx`` with its own
    gradient rule, from the one cache: keyed by the program's identity (its planner's cache
    returns the same object; the entry holds it, so the id is not reused)."""
    return _cached((id(program), backward, id(ctx)), ctx, lambda: bind(program, ctx, backward))


def _cached(key: Any, anchor: Any, make: Callable[[], BoundCall]) -> BoundCall:
    """The one cache's bound call under ``key`` for ``anchor``, made now where there is none
    (a key with an unhashable type argument, which the checks refuse, is never stored)."""
    bound: BoundCall | None = anchored_get(_BOUND, key, anchor)
    if bound is None:
        bound = make()
        with suppress(TypeError):
            anchored_put(_BOUND, key, anchor, bound, _BOUND_MAX)
    return bound


def checked_program(src: TensorType | str, dst: TensorType | str, ctx: MeshContext, *,
                    bindable: bool = False) -> Program:
    """Every tensor-independent check of a call (pure: no communication) and its program;
    ``bindable``: the binding's too (a reduction torch cannot add), for a call that agrees."""
    s, d = _type(src, "source"), _type(dst, "destination")
    s_text = src if isinstance(src, str) else None
    d_text = dst if isinstance(dst, str) else None
    lowering.check_type(s, ctx.mesh, text=s_text)
    lowering.check_type(d, ctx.mesh, text=d_text)
    check_same_global(s, d, s_text, d_text)
    program = lowering.compile(s, d, ctx.mesh)
    if bindable:
        check_reductions(program)
    return program


def agreed_bound(xs: Sequence[Any] | None, srcs: tuple[TensorType | str, ...], dsts: tuple[TensorType | str, ...],
                 mesh: Mesh | str | Any, timeout: timedelta | float | None, *, bound: BoundCall | None = None,
                 resolve: Callable[[], tuple[list[Any], tuple[Any, ...], tuple[Any, ...]]] | None = None,
                 ) -> tuple[BoundCall, list[torch.Tensor]]:
    """This rank's checks, the agreement, and only then the bound call (``bound``: a
    prepared call's), whose groups are made once every rank runs the same programs.
    ``xs``: the tensors (None: none yet); ``resolve``: what gives them and the types
    instead, inside the agreement (a DTensor's)."""
    got: list[Any] = []

    def run(found: Checks) -> list[torch.Tensor]:
        nonlocal xs, srcs, dsts
        found.ctx = ctx = bound.ctx if bound is not None else context(mesh, timeout=timeout)
        if resolve is not None:
            xs, srcs, dsts = resolve()
        before = bound if bound is not None else anchored_get(_BOUND, (srcs, dsts, id(ctx)), ctx)
        programs = before.programs if before is not None else \
            tuple(checked_program(s, d, ctx, bindable=True) for s, d in zip(srcs, dsts))
        got[:] = [ctx, programs]
        found.call = describe([(p.src, p.dst) for p in programs], ctx, xs or ())
        if xs is None:
            return []
        return check_all(xs, [p.src for p in programs], ctx, before.expect if before is not None else None,
                         one=len(xs) == 1)

    checked = agreed(mesh, run)
    if bound is None:
        bound = bound_for(srcs, dsts, mesh, timeout, ctx=got[0], programs=got[1])
    return bound, checked


_AGREE: list[bool] = []  # SHARDC_AGREE as read at the first call of this process
on_clear(_AGREE.clear)


def agreeing(agree: object = None) -> bool:
    """``agree`` as given, else ``SHARDC_AGREE`` (not empty, not ``0``), read once per process
    (a lookup per call costs more than the rest of the check; ``clear_caches()`` rereads it)."""
    if agree is not None:
        return bool(check_flag(agree, "agree", "pass agree=True for the ranks to compare their calls before any "
                               "collective (a call that differs on some ranks fails on all of them), False to skip "
                               "it, or None for SHARDC_AGREE's setting"))
    if not _AGREE:
        _AGREE.append(os.environ.get("SHARDC_AGREE", "") not in ("", "0"))
    return _AGREE[0]


def distribute(tensor: torch.Tensor, mesh: Mesh | str | Any, t: TensorType | str) -> torch.Tensor:
    """This rank's block of the global ``tensor`` under type ``t`` (a copy).

    Every rank passes the same global tensor. A P(sum) axis holds the values on its
    coordinate 0 and zeros elsewhere (convert(R,P)); P(avg/max/min), R, I and V axes hold the
    slice on every rank. The mesh may lie over some of the world's ranks (``"fsdp=2@[0,1]"``
    in a world of 4, or a DeviceMesh over them): any other rank is refused with a SpecError.
    """
    if not isinstance(tensor, torch.Tensor):
        raise SpecError(f"expected a torch.Tensor, got {type(tensor).__name__}",
                        hint="pass the global tensor, the same on every rank")
    check_strided(tensor)
    tt = _type(t, "target")
    ctx = context(mesh, over_ranks=True)  # fsdp=2@[0,1] in a bigger world, as a DeviceMesh over them
    lowering.check_type(tt, ctx.mesh, text=t if isinstance(t, str) else None)
    if dtype_name(tensor.dtype) != tt.dtype:
        raise SpecError(f"the tensor is {short_name(tensor.dtype)} but the type is {tt}", text=str(tt), pos=0,
                        hint=f"convert with tensor.to({to_torch_dtype(tt.dtype)})")
    if tuple(tensor.shape) != tt.shape:
        raise SpecError(f"the tensor has shape {list(tensor.shape)} but {tt} is global shape {list(tt.shape)}",
                        text=str(tt), pos=str(tt).find("["), hint="pass the global (unsharded) tensor")
    zero_on = tt.partial_axes if tt.partial_op == "sum" else ()

    def piece(r: int, g: torch.Tensor | None = None) -> torch.Tensor:
        x = local_part(tensor.detach() if g is None else g, tt, ctx.mesh, r)
        if zero_on and not keeps_values(ctx.mesh, zero_on, r):
            x.zero_()
        return x

    local = getattr(tensor, "_local_tensors", None) is not None  # a LocalTensor: each rank's own copy
    return rank_map(ctx, piece, *([tensor.detach()] if local else []))


def _dtensor_types(dm: Any, placements: tuple[Any, ...], shape: tuple[int, ...], dtype: torch.dtype, x: Any,
                   src: TensorType | str | None, dst: TensorType | str, mesh: Mesh | str | Any | None,
                   ) -> tuple[TensorType, TensorType, Mesh]:
    """The source type (read from the DTensor's placements, or the stated one if it agrees),
    the destination type and the mesh of ``redistribute(dtensor, ...)``."""
    m = as_mesh(dm)
    stated = as_mesh(mesh) if mesh is not None else m
    if stated != m or hasattr(mesh, "mesh") and mesh is not dm and mesh != dm:  # a DeviceMesh must be its own
        raise SpecError(f"the mesh {stated} does not match the DTensor's DeviceMesh {m}",
                        text=mesh if isinstance(mesh, str) else str(stated), pos=0,
                        hint="drop mesh= (a DTensor carries its mesh), or pass the DTensor's own device_mesh")
    order = _shard_order(x) if x is not None else {}
    s = from_placements(placements, m, shape, dtype, shard_order=order or None)
    if src is not None:
        s = check_dtensor_source(_type(src, "source"), src if isinstance(src, str) else None, s, m)
    return s, _type(dst, "destination"), m


# redistribute(dtensor, ...) inside torch.compile: what each traced call needs besides the
# local tensor, by a key of its constant arguments. Dynamo reads an entry as a global, so
# it is guarded by value; an evicted entry is computed again (a retrace), never wrong.
# (A namespace, not a dict: dynamo reads a global dict once per trace, so an entry added by
# a second DTensor call of the same trace would be missing; an attribute is read when used.)
_COMPILED_PLANS = SimpleNamespace()
on_clear(lambda: _COMPILED_PLANS.__dict__.clear())


@traced.constant_result
@traced.refusing  # a refusal is raised out of the compiled call as shardc's SpecError
def _compiled_dtensor_plan(dm: Any, placements: tuple[Any, ...], shape: tuple[int, ...], dtype: torch.dtype,
                           src: TensorType | str | None, dst: TensorType | str | None,
                           mesh: Mesh | str | Any | None, async_op: bool, timeout: Any, agree: Any) -> str:
    """At trace time: the eager call's checks, and the types and placements the traced call
    needs, stored in ``_COMPILED_PLANS`` under the key returned."""
    traced.check_compiled_flags(agree, timeout)
    s, d, m = _dtensor_types(dm, placements, shape, dtype, None, *_dtensor_call(src, dst, async_op), mesh)
    key = "plan_" + hashlib.sha1(repr((id(dm), placements, shape, dtype, s, d)).encode()).hexdigest()
    held = _COMPILED_PLANS.__dict__
    if key not in held:
        if len(held) >= 256:
            del held[next(iter(held))]
        # the types as their canonical text, which a traced region takes as a constant
        held[key] = (s.format(), d.format(), _grad_placements(s, m), to_placements(d, m, strided=True)[0],
                     _grad_placements(d, m))
    return key


def _compiled_dtensor(x: Any, src: TensorType | str | None, dst: TensorType | str | None,
                      mesh: Mesh | str | Any | None, *, async_op: bool, timeout: Any, agree: Any) -> Any:
    """``redistribute(dtensor, ...)`` inside torch.compile: a DTensor cannot leave a traced
    region, so it is taken apart before it and rebuilt after it from constants."""
    key = _compiled_dtensor_plan(x.device_mesh, tuple(x.placements), tuple(x.shape), x.dtype, src, dst, mesh,
                                 async_op, timeout, agree)
    s, d, src_grad, placements, dst_grad = getattr(_COMPILED_PLANS, key)
    from torch_backend import trace_marks

    y = trace_marks.call("redistribute", x.to_local(grad_placements=src_grad), s, dst=d, mesh=x.device_mesh)
    return as_dtensor(y, x.device_mesh, placements, x.shape, dst_grad)


def _grad_placements(t: TensorType, m: Mesh) -> Any:
    """DTensor placements of ``t``'s gradient (its dual type), or None where DTensor's default is right."""
    if t.partial_op and t.partial_op != "sum":
        return None  # P(avg): the gradient is R, DTensor's own convention; P(max/min) has none
    if not any(at.kind in ("R", "P") for _, at in t.axis_types):
        return None
    return to_placements(dual_type(t), m, strided=True)[0]


def _shard_order(x: Any) -> dict[int, list[int]]:
    """A DTensor's explicit shard_order ({dim: [mesh dims]}) where it is not mesh order (None
    where the placements use _StridedShard, which from_placements reads directly)."""
    order = getattr(getattr(x, "_spec", None), "shard_order", None) or ()
    dims = {int(entry.tensor_dim): [int(i) for i in entry.mesh_dims] for entry in order}
    return {d: mdims for d, mdims in dims.items() if len(mdims) > 1 and mdims != sorted(mdims)}
