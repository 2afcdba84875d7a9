"""The cross-mesh doors' parts (docs/cross_mesh.md), which ``api.through_door`` runs in its
one order: each rank compiles the program and checks its block, and the ranks agree over
the world, with which blocks require grad, before the first message; then a ``BoundCall``
runs it (``bound.bind_across``), its gradient's groups made while every rank takes part.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import lowering
from lowering.cross_mesh import CrossProgram
from lowering.joint import check_type_lists
from lowering.placements import from_placements, to_placements
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType
from spec_lang.parser import parse, parse_mesh
from torch_backend.agree import compare_gathering
from torch_backend.bound import BoundCall, bind_across
from torch_backend.cross_rounds import cross_backward_program, crossing, finish_groups, world, world_sum
from torch_backend.groups import (
    check_timeout,
    device_mesh_over_ranks,
    is_device_mesh,
    local_tensor_mode,
    nccl_device,
)
from torch_backend.tensor_checks import as_dtensor, check_cross_block, check_dtensor_source, is_dtensor


def mesh_over_ranks(mesh: Any, what: str) -> Mesh:
    """A mesh string, a ``spec_lang.Mesh`` or a named DeviceMesh as a ``Mesh`` over named ranks."""
    if isinstance(mesh, (str, Mesh)):
        return parse_mesh(mesh)
    if is_device_mesh(mesh):
        return device_mesh_over_ranks(mesh)
    raise SpecError(f"{what} must be a mesh, got {type(mesh).__name__}",
                    hint="pass a mesh string like 'tp=2@[4,5]', a spec_lang Mesh or a named DeviceMesh")


def plan(src: TensorType | str, dst: TensorType | str | None, mesh: Any, dst_mesh: Any) -> CrossProgram:
    """The CrossProgram every rank runs, with every check that does not depend on the tensor."""
    m, dm = mesh_over_ranks(mesh, "mesh"), mesh_over_ranks(dst_mesh, "dst_mesh")
    p = crossing(lowering.compile(_type_arg(src, "src"), _type_arg(dst, "dst"), m, dst_mesh=dm))
    world = dist.get_world_size()
    if world < p.world:
        raise SpecError(f"the program from mesh {p.src_mesh} to mesh {p.dst_mesh} runs over ranks "
                        f"0..{p.world - 1} but the world has {world} ranks",
                        hint=f"launch at least {p.world} ranks")
    return p


def _type_arg(t: object, what: str) -> TensorType | str:
    if not isinstance(t, (str, TensorType)):
        raise SpecError(f"{what} must be a type string or a TensorType, got {type(t).__name__}",
                        hint="pass e.g. 'f32[8@dp,16]'")
    return t


_REFUSED = (SpecError, TypeError, AttributeError, IndexError, KeyError)  # the last four: an argument of the wrong kind


def _refusal(e: Exception) -> SpecError:
    """A failed check as the SpecError the agreement carries (one on an argument of the wrong
    kind too: it must reach the agreement like any other, or the other ranks would wait)."""
    if isinstance(e, SpecError):
        return e
    return SpecError(f"a cross-mesh call's argument is not what it should be ({type(e).__name__}: {e})",
                     hint="pass type strings or TensorTypes, meshes as strings, spec_lang Meshes or named "
                          "DeviceMeshes, and each rank's block as a tensor (None off the source mesh)")


def _world_checks(timeout: timedelta | float | None) -> timedelta | None:
    """The call's timeout, and what every rank sees alike (no message is needed to fail everywhere)."""
    timeout = check_timeout(timeout)
    if local_tensor_mode() is not None:
        raise SpecError("a cross-mesh redistribute runs on real process groups, not under LocalTensorMode",
                        hint="simulate a cross-mesh program with lowering.simulate instead")
    if not dist.is_initialized():
        raise SpecError("no torch.distributed process group is initialized",
                        hint="call torch.distributed.init_process_group(...) on every rank of both meshes")
    return timeout


def _bind(programs: Sequence[CrossProgram], backs: Sequence[CrossProgram | None], device: torch.device,
          timeout: timedelta | None, outs: Sequence[Any] = ()) -> BoundCall:
    """The agreed move bound on this rank, every rank alike; the gradients' moves (``backs``)
    get their groups now (a backward runs only on the two meshes' ranks, and makes none)."""
    backend = str(dist.get_backend())
    for back in backs:
        if back is not None:
            finish_groups(back, timeout, backend)
    return bind_across([p.program for p in programs], [b.program if b is not None else None for b in backs],
                       len(programs), device, timeout, backend, outs=outs)


@dataclass(frozen=True)
class CrossMove:
    """One tensor's move, and the DeviceMesh a DTensor result is laid on (None: local tensors out)."""

    program: CrossProgram
    out_mesh: Any = None

    def describe(self) -> str:
        """What the ranks agree on: the types, the meshes, and whether a DTensor comes out."""
        p = self.program
        return f"{p.src} on mesh {p.src_mesh} -> {p.dst} on mesh {p.dst_mesh}" + \
            (" as a DTensor" if self.out_mesh is not None else "")


def resolve(x: Any, src: TensorType | str | None, dst: TensorType | str | None, meshes: tuple[Any, Any],
            _: None) -> tuple[list[Any], tuple[Any, ...], tuple[Any, ...], tuple[Any, Any]]:
    """``redistribute(..., dst_mesh=)``'s inputs as a joint call's; with no ``dst``
    (``redistribute(dtensor, dst, dst_mesh=)``) ``src`` is the destination."""
    if dst is None:
        src, dst = None, src
    return [x], (src,), (dst,), meshes


def agreed_across(xs: Sequence[Any], srcs: Sequence[TensorType | str | None],
                  dsts: Sequence[TensorType | str | None], meshes: tuple[Any, Any],
                  timeout: timedelta | float | None, *, one: bool) -> tuple[BoundCall, list[Any]]:
    """The cross-mesh doors' agreement step: each rank's program and checks of its block (a
    DTensor taken apart), the agreement with each rank's grad code, then the agreed call
    bound with this rank's blocks. ``one``: ``redistribute``'s (its errors name no tensor)."""
    mesh, dst_mesh = meshes
    timeout = _world_checks(timeout)
    me = dist.get_rank()
    error: SpecError | None = None
    calls: list[CrossMove] = []
    locals_: list[torch.Tensor | None] = []
    try:
        check_lists(xs, srcs, dsts, across=True)
        for i, (x, s, d) in enumerate(zip(xs, srcs, dsts, strict=True)):
            call, local = _resolve(x, s, d, mesh, dst_mesh, me)  # its SpecError wins over a check's below
            calls.append(call)
            locals_.append(local)
            error = error or check_cross_block(local, call.program, me, None if one else i) \
                or _check_grad(local, call.program)
    except _REFUSED as e:
        error = _refusal(e)
    device = _device(next((t for t in locals_ if t is not None), None))
    wants = [_wants_grad(t) for t in locals_] if error is None else []
    codes = _agree(error, "; ".join(c.describe() for c in calls), timeout, _grad_code(wants))
    assert error is None  # _agree raised it
    programs = [c.program for c in calls]
    carries = _carries_grad(codes, wants, programs[0], me, device, timeout)
    backs = [cross_backward_program(p) if c else None for p, c in zip(programs, carries, strict=True)]
    return _bind(programs, backs, device, timeout, [c.out_mesh for c in calls]), locals_


def check_lists(xs: Any, srcs: Any, dsts: Any, across: bool = False) -> None:
    """``redistribute_many``'s arguments: a sequence of tensors, lists of types, a pair a tensor."""
    if isinstance(xs, torch.Tensor) or not isinstance(xs, Sequence):
        raise SpecError("redistribute_many takes a sequence of tensors" + (" (None off the source mesh)" if across else ""),
                        hint="pass a list, e.g. redistribute_many([x, y], [src_x, src_y], [dst_x, dst_y], mesh"
                             + (", dst_mesh=...)" if across else ")"))
    check_type_lists("redistribute_many", srcs, dsts,
                     "redistribute_many([x], ['f32[8@dp]'], ['f32[8]'], 'dp=2'); for one tensor, redistribute")
    if not (len(xs) == len(srcs) == len(dsts)) or not xs:
        raise SpecError(f"got {len(xs)} tensors, {len(srcs)} source types and {len(dsts)} destination types",
                        hint="pass one source and one destination type per tensor (at least one)")


def _resolve(x: Any, src: TensorType | str | None, dst: TensorType | str | None, mesh: Any, dst_mesh: Any,
             me: int) -> tuple[CrossMove, torch.Tensor | None]:
    """The call's program and this rank's local block (a DTensor taken apart)."""
    local = x
    if is_dtensor(x):
        own = mesh_over_ranks(x.device_mesh, "the DTensor's mesh")
        if mesh is None:
            mesh = x.device_mesh
        elif mesh_over_ranks(mesh, "mesh") != own:
            raise SpecError(f"the mesh {mesh_over_ranks(mesh, 'mesh')} does not match the DTensor's DeviceMesh "
                            f"{own}", hint="drop mesh= on the ranks holding the DTensor, or pass its own device_mesh")
        plain = Mesh(own.names, own.sizes)
        actual = from_placements(tuple(x.placements), plain, tuple(x.shape), x.dtype)
        src = actual if src is None else \
            check_dtensor_source(src if isinstance(src, TensorType) else parse(src), None, actual, plain)
        local = x.to_local()
    if src is None:
        raise SpecError(f"rank {me} gave no source type",
                        hint="every rank off the source mesh states it: the ranks all run the same program")
    if mesh is None:
        raise SpecError(f"rank {me} gave no source mesh",
                        hint="every rank passes the source mesh (a DTensor's rank may leave it to the DTensor)")
    p = plan(src, dst, mesh, dst_mesh)
    out_mesh = dst_mesh if is_device_mesh(dst_mesh) and is_device_mesh(mesh) else None
    return CrossMove(p, out_mesh), local


def outputs(bound: BoundCall, ys: list[Any]) -> list[Any]:
    """The cross-mesh doors' results: None off the destination mesh (or the stand-in its
    backward starts from), a DTensor where the call was given DeviceMeshes, else the block."""
    assert bound.across is not None
    me, outs = bound.ctx.rank, bound.across.outs
    return [y if y is None or out is None or p.dst_mesh is None or me not in p.dst_mesh.global_ranks
            else as_dtensor(y, out, to_placements(p.dst, Mesh(p.dst_mesh.names, p.dst_mesh.sizes), strided=True)[0],
                            p.dst.shape)
            for y, p, out in zip(ys, bound.programs, outs or [None] * len(ys), strict=True)]


def prepare(srcs: Sequence[TensorType | str], dsts: Sequence[TensorType | str], mesh: Any, dst_mesh: Any,
            timeout: timedelta | float | None, requires_grad: bool) -> list[BoundCall]:
    """A prepared cross-mesh call's programs compiled and checked, the world agreed, then the
    move bound without a gradient and, with ``requires_grad``, with one."""
    timeout = _world_checks(timeout)
    programs: list[CrossProgram] = []
    backs: list[CrossProgram | None] = []
    error = None
    try:
        if not isinstance(requires_grad, bool):
            raise SpecError(f"requires_grad must be True or False, got {requires_grad!r}",
                            hint="pass requires_grad=True where the calls carry a gradient")
        if not (len(srcs) == len(dsts)) or not srcs:
            raise SpecError(f"got {len(srcs)} source types and {len(dsts)} destination types",
                            hint="pass one source and one destination type per tensor (at least one)")
        for s, d in zip(srcs, dsts, strict=True):
            programs.append(plan(s, d, mesh, dst_mesh))
            backs.append(cross_backward_program(programs[-1]) if requires_grad else None)
    except _REFUSED as e:
        error = _refusal(e)
    _agree(error, "; ".join(CrossMove(p).describe() for p in programs) + (", requires_grad=True" if requires_grad else ""),
           timeout)
    bound = _bind(programs, backs, _device(None), timeout)  # the backward's groups made first, as everywhere
    return [_bind(programs, [None] * len(programs), _device(None), timeout), bound] if requires_grad else [bound]


def check_prepared_grad(bound: BoundCall, xs: list[Any], many: bool) -> None:
    """On the source mesh, a prepared call's blocks require grad exactly where its bound carries one."""
    assert bound.across is not None
    carries, me, p = any(b is not None for b in bound.across.backs), bound.ctx.rank, bound.program
    if me not in p.mesh.global_ranks or all(_wants_grad(x) == carries for x in xs):
        return
    if carries:
        raise SpecError(f"rank {me}'s block does not require grad, but the cross-mesh call was prepared "
                        "with requires_grad=True and runs in grad mode",
                        hint="call x.requires_grad_() on every source rank, or make the call under "
                             "torch.no_grad() on every rank")
    if many:
        raise SpecError("a prepared joint cross-mesh move does not carry gradients yet",
                        hint="detach the tensors or run under torch.no_grad(), or move them with "
                             "redistribute_many(..., dst_mesh=), which carries them")
    raise SpecError(f"rank {me}'s block requires grad, but the cross-mesh call was prepared without "
                    "requires_grad", hint="prepare it with redistributor(..., dst_mesh=, requires_grad=True) "
                                          "on every rank, or detach the block")


def _wants_grad(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled()


def _check_grad(x: object, p: CrossProgram) -> SpecError | None:
    """Where this rank's block carries a gradient, the backward compiles (no P(max)/P(min))."""
    if not _wants_grad(x):
        return None
    try:
        cross_backward_program(p)
    except SpecError as e:
        return e
    return None


GRAD_MODE = 1  # the bit of a rank's grad code (``_grad_code``) that says grad mode is on


def _pattern(wants: Sequence[bool]) -> int:
    key = "".join("1" if w else "0" for w in wants).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=7).digest(), "big") if any(wants) else 0


def _grad_code(wants: Sequence[bool]) -> int:
    """What a rank tells the agreement: grad mode, and above that bit which blocks require grad."""
    return (GRAD_MODE if torch.is_grad_enabled() else 0) | _pattern(wants) << 1


def _carries_grad(codes: Sequence[int], wants: Sequence[bool], p: CrossProgram, me: int, device: torch.device,
                  timeout: timedelta | None) -> list[bool]:
    """Which tensors of the agreed call carry a gradient, the same verdict on every rank from
    the agreement's codes (``wants``: this rank's blocks), a wrong call failing everywhere
    before any message. Where only some of a joint call's tensors carry one, the source
    ranks tell the others which, in one more all_reduce."""
    src = p.src_mesh.global_ranks
    patterns: dict[int, list[int]] = {}
    for r in src:
        patterns.setdefault(codes[r] >> 1, []).append(r)
    if len(patterns) > 1:
        if len(patterns) == 2 and 0 in patterns and len(wants) == 1:
            without, wanted = patterns[0], next(v for k, v in patterns.items() if k)
            told = (f"rank(s) {without} of the source mesh {p.src_mesh} passed a block that does not require grad "
                    f"(or ran under torch.no_grad()), rank(s) {wanted} one that does")
        else:
            told = (f"the ranks of the source mesh {p.src_mesh} differ in which blocks require grad (rank(s) "
                    + ", rank(s) ".join(str(v) for v in patterns.values()) + " each alike)")
        raise SpecError(told + "; no rank sent anything",
                        hint="a tensor's blocks carry a gradient on every rank of its mesh or on none: "
                             "requires_grad_() them all, or detach them all (and run in grad mode on all)")
    n = len(wants)  # the same on every rank: the agreed call's
    (pattern,) = patterns
    if pattern == 0:
        return [False] * n
    off = [r for r in p.dst_mesh.global_ranks if not codes[r] & GRAD_MODE]
    if off:
        raise SpecError(f"rank(s) {off} of the destination mesh {p.dst_mesh} run under torch.no_grad(), but "
                        "the source blocks require grad; no rank sent anything",
                        hint="run the call in grad mode on every destination rank (its backward sends the "
                             "gradient back), or detach the source blocks")
    if pattern == _pattern([True] * n):
        return [True] * n
    flags = torch.tensor([int(w) for w in wants] if me == src[0] else [0] * n, dtype=torch.int64, device=device)
    return [c > 0 for c in world_sum(flags, me, timeout, "learning which tensors carry a gradient")]


def _device(x: torch.Tensor | None) -> torch.device:
    return x.device if x is not None else nccl_device(str(dist.get_backend())) or torch.device("cpu")


def _agree(error: SpecError | None, call: str, timeout: timedelta | None, grad: int = 0) -> list[int]:
    """The one agreement over the world, before any message; each rank's ``grad`` code comes back."""
    ctx = world(timeout)
    bad, codes = compare_gathering(ctx, call if error is None else None, error, grad, lead="a cross-mesh call",
                          hint="every rank of the world passes the same types, meshes and dst_mesh, its block on "
                               "the source mesh and None elsewhere; no rank sent anything")
    if bad is not None:
        raise bad
    return [codes[r] for r in range(ctx.mesh.size)]
