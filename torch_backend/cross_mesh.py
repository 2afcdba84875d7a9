"""Run a ``lowering.CrossProgram`` on real process groups: a tensor moved from a layout
on one mesh to a layout on another mesh over other (or overlapping) global ranks.

Every rank of the program's world (``0 .. max rank`` of the two meshes) calls
``redistribute(x, src, dst, mesh, dst_mesh=...)``: ``x`` on the ranks of ``mesh``, None
elsewhere. The program is compiled on every rank alike (a bad type or mesh fails
everywhere without a message); what differs per rank (whether ``x`` is given, its
shape and dtype) is agreed in one small all_reduce over the world before the first
message, so a call wrong on one rank fails on every rank, each naming the ranks at fault.
Then the pending sums are finished on the source mesh by the ordinary executor, and each
round of point-to-point messages runs as one ``batch_isend_irecv``: one buffer per pair
of ranks, its pieces packed in the order of their global boxes, which both sides know
from their own ``CrossProgram.rank_part``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import lowering
from lowering.cross_mesh import Box, CrossProgram, Transfer
from lowering.cross_mesh import boxes as cross_boxes
from lowering.layout import group_ranks, local_shapes
from spec_lang.dual import dual_type
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType
from spec_lang.parser import parse_mesh
from torch_backend.autograd import check_differentiable
from torch_backend.dtypes import to_torch_dtype
from torch_backend.executor import execute
from torch_backend.groups import MeshContext, check_timeout, is_device_mesh, local_tensor_mode

Held = list[tuple[Box, torch.Tensor]]


def as_mesh(mesh: Any, what: str) -> Mesh:
    """A mesh string, a ``spec_lang.Mesh`` or a named DeviceMesh (its global ranks read
    from its layout) as a Mesh naming its global ranks."""
    if isinstance(mesh, (str, Mesh)):
        return parse_mesh(mesh)
    if is_device_mesh(mesh):
        names = getattr(mesh, "mesh_dim_names", None)
        if not names:
            raise SpecError(f"the DeviceMesh given as {what} has no mesh_dim_names",
                            hint="create it with init_device_mesh(..., mesh_dim_names=('dp', 'tp'))")
        layout = mesh.mesh
        return Mesh(tuple(names), tuple(int(s) for s in layout.shape),
                    tuple(int(g) for g in layout.flatten().tolist()))
    raise SpecError(f"{what} must be a mesh, got {type(mesh).__name__}",
                    hint="pass a mesh string like 'tp=2@[4,5]', a spec_lang Mesh or a named DeviceMesh")


def plan(src: TensorType | str, dst: TensorType | str, mesh: Any, dst_mesh: Any) -> CrossProgram:
    """The CrossProgram every rank runs (compiled alike on every rank, cached)."""
    m, dm = as_mesh(mesh, "mesh"), as_mesh(dst_mesh, "dst_mesh")
    return lowering.compile(src if isinstance(src, (str, TensorType)) else _bad_type(src, "src"),
                            dst if isinstance(dst, (str, TensorType)) else _bad_type(dst, "dst"),
                            m, dst_mesh=dm)


def _bad_type(t: object, what: str) -> Any:
    raise SpecError(f"{what} must be a type string or a TensorType, got {type(t).__name__}",
                    hint="pass e.g. 'f32[8@dp,16]'")


def redistribute(x: torch.Tensor | None, src: TensorType | str, dst: TensorType | str, mesh: Any, dst_mesh: Any,
                 *, timeout: timedelta | float | None = None) -> torch.Tensor | None:
    """This rank's block of ``dst`` on ``dst_mesh`` (None off it), from its block ``x`` of
    ``src`` on ``mesh`` (None off it). Every rank of the world ``0 .. max rank`` of the two
    meshes must call it, and every other rank of the default group too (they get None):
    the ranks agree on their checks over the whole world first."""
    return redistributor(src, dst, mesh, dst_mesh, timeout=timeout)(x)


def redistributor(src: TensorType | str, dst: TensorType | str, mesh: Any, dst_mesh: Any, *,
                  timeout: timedelta | float | None = None) -> CrossRedistributor:
    """``redistribute(..., dst_mesh=)`` prepared for many calls: the program compiled and
    the world checked now, every rank alike, before any message."""
    timeout = check_timeout(timeout)
    if local_tensor_mode() is not None:
        raise SpecError("a cross-mesh redistribute runs on real process groups, not under LocalTensorMode",
                        hint="simulate a cross-mesh program with lowering.simulate instead")
    if not dist.is_initialized():
        raise SpecError("no torch.distributed process group is initialized",
                        hint="call torch.distributed.init_process_group(...) on every rank of both meshes")
    p = plan(src, dst, mesh, dst_mesh)
    world = dist.get_world_size()
    if world < p.world:
        raise SpecError(f"the program from mesh {p.src_mesh} to mesh {p.dst_mesh} runs over ranks "
                        f"0..{p.world - 1} but the world has {world} ranks",
                        hint=f"launch at least {p.world} ranks")
    return CrossRedistributor(p, timeout)


class CrossRedistributor:
    """A compiled cross-mesh move; call it on this rank's block (None off the source mesh)."""

    def __init__(self, program: CrossProgram, timeout: timedelta | None) -> None:
        self.program = program
        self.timeout = timeout

    def __call__(self, x: torch.Tensor | None) -> torch.Tensor | None:
        p, timeout = self.program, self.timeout
        me = dist.get_rank()
        error = _check_block(x, p, me) or _check_grad(x, p)
        device = _device(x)
        _agree(error, p, me, device, timeout, str(dist.get_backend()))
        if x is not None and x.requires_grad and torch.is_grad_enabled():
            return CrossRedistribute.apply(x, p, me, device, timeout, str(dist.get_backend()))
        with torch.no_grad():
            return run(p, x, me, device, timeout, str(dist.get_backend()))

    def __repr__(self) -> str:
        p = self.program
        return f"CrossRedistributor({p.src} on {p.src_mesh} -> {p.dst} on {p.dst_mesh})"


def _check_grad(x: object, p: CrossProgram) -> SpecError | None:
    """Autograd through a cross-mesh call needs every rank to take part in the backward,
    which holds where the two meshes cover the same ranks, the whole world (a job
    reshaped in place)."""
    if not (isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled()):
        return None
    if set(p.src_mesh.global_ranks) != set(p.dst_mesh.global_ranks) or p.world != dist.get_world_size():
        return SpecError(f"no gradient through a move from mesh {p.src_mesh} to mesh {p.dst_mesh}: a "
                         "backward across meshes over different ranks is not supported yet",
                         hint="detach the tensor (x.detach()) or run under torch.no_grad(); meshes over the "
                              "same ranks, every rank of the world (a job reshaped), are differentiable")
    try:
        check_differentiable(p.src, p.dst)
    except SpecError as e:
        return e
    return None


class CrossRedistribute(torch.autograd.Function):
    """The backward of ``src`` on ``mesh`` -> ``dst`` on ``dst_mesh`` is the cross-mesh
    program from ``dual(dst)`` on ``dst_mesh`` back to ``dual(src)`` on ``mesh`` (the SPMD
    type system's duals, as ``torch_backend.autograd``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, p: CrossProgram, me: int, device: torch.device,
                timeout: timedelta | None, backend: str) -> torch.Tensor | None:
        ctx.args = (p, me, device, timeout, backend)
        return run(p, x, me, device, timeout, backend)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        p, me, device, timeout, backend = ctx.args
        back = lowering.compile(dual_type(p.dst), dual_type(p.src), p.dst_mesh, dst_mesh=p.src_mesh)
        with torch.no_grad():
            dx = run(back, g.contiguous(), me, device, timeout, backend)
        return dx, None, None, None, None, None


def _check_block(x: object, p: CrossProgram, me: int) -> SpecError | None:
    on_src = p.src_mesh.global_ranks
    if me not in on_src:
        if x is not None:
            return SpecError(f"rank {me} is off the source mesh {p.src_mesh} but was given a tensor",
                             hint="pass x=None on the ranks outside the source mesh")
        return None
    if x is None:
        return SpecError(f"rank {me} is on the source mesh {p.src_mesh} but was given None",
                         hint=f"pass this rank's block of {p.src}")
    if not isinstance(x, torch.Tensor):
        return SpecError(f"expected a torch.Tensor on rank {me}, got {type(x).__name__}",
                         hint=f"pass this rank's block of {p.src} as a tensor")
    want = local_shapes(p.src, p.src_mesh)[on_src.index(me)]
    if tuple(x.shape) != tuple(want):
        return SpecError(f"rank {me}'s block has shape {list(x.shape)}, the source type {p.src} gives it "
                         f"{list(want)} on mesh {p.src_mesh}", hint="pass this rank's own block of the source type")
    dtype = to_torch_dtype(p.src.dtype)
    if x.dtype != dtype:
        return SpecError(f"rank {me}'s block is {x.dtype}, the source type {p.src} says {dtype}",
                         hint=f"convert it with x.to({dtype})")
    return None


def _device(x: torch.Tensor | None) -> torch.device:
    if x is not None:
        return x.device
    if str(dist.get_backend()) == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _agree(error: SpecError | None, p: CrossProgram, me: int, device: torch.device,
           timeout: timedelta | None, backend: str) -> None:
    """One all_reduce over the world of which ranks failed their checks: a call wrong on
    some ranks only fails on every rank, before any message."""
    world = dist.get_world_size()
    union = world_context(world, me, timeout, backend)
    flags = torch.zeros(world, dtype=torch.int32, device=device)
    flags[me] = error is not None
    handle = union.group(("world",), me)
    try:
        dist.all_reduce(flags, group=handle.pg)
    except RuntimeError as e:
        raise union.real_failure(f"rank {me}: agreeing on the cross-mesh call's checks", e,
                                 list(range(world)), ("world",)) from e
    if error is not None:
        raise error
    bad = [r for r, f in enumerate(flags.tolist()) if f]
    if bad:
        raise SpecError(f"rank(s) {bad} failed their checks of the cross-mesh call from mesh {p.src_mesh} to "
                        f"mesh {p.dst_mesh}; no rank sent anything",
                        hint="see those ranks' errors: each rank of the source mesh passes its block, every "
                             "other rank None")


def world_context(n: int, me: int, timeout: timedelta | None, backend: str) -> MeshContext:
    """The whole world as a one-axis mesh (its group is the default group), for the agreement."""
    return MeshContext(Mesh(("world",), (n,)), (me,), tuple(range(n)), timeout=timeout, backend=backend)


def run(p: CrossProgram, x: torch.Tensor | None, me: int, device: torch.device,
        timeout: timedelta | None, backend: str) -> torch.Tensor | None:
    """The checked program on this rank: the source mesh's steps, then the rounds."""
    held: Held = []
    on_src = p.src_mesh.global_ranks
    if me in on_src:
        i = on_src.index(me)
        assert x is not None
        if p.finish is not None:
            ctx = MeshContext(p.finish.mesh, (i,), on_src, timeout=timeout, backend=backend)
            source_groups(p, me, ctx, timeout)
            x = execute(p.finish, x, ctx=ctx)
        held.append((_box(cross_boxes(p.sent, p.src_mesh)[i]), x))
    elif p.finish is not None:
        source_groups(p, me, None, timeout)
    for (sends, recvs) in _rank_part(p, me):
        held += _round(held, sends, recvs, to_torch_dtype(p.src.dtype), device)
    on_dst = p.dst_mesh.global_ranks
    if me not in on_dst:
        return None
    j = on_dst.index(me)
    shape = local_shapes(p.dst, p.dst_mesh)[j]
    return _assemble(held, _box(cross_boxes(p.dst, p.dst_mesh)[j]), shape, to_torch_dtype(p.dst.dtype), device)


def _rank_part(p: CrossProgram, me: int) -> Any:
    """This rank's messages, rebuilt once per program (a prepared call pays for it once)."""
    key = (id(p), me)
    hit = _PARTS.get(key)
    if hit is None or hit[0] is not p:
        if len(_PARTS) > 256:
            _PARTS.clear()
        hit = _PARTS[key] = (p, p.rank_part(me))
    return hit[1]


_PARTS: dict[tuple[int, int], tuple[CrossProgram, Any]] = {}


def source_groups(p: CrossProgram, me: int, ctx: MeshContext | None, timeout: timedelta | None) -> None:
    """Create the source mesh's groups the finish uses, alike on every rank of the world.

    torch names a group made by its members alone (``use_local_synchronization``) after its
    ranks and how many groups the caller already has, so every rank must make as many
    groups as every other, or a later group over ranks of both sides (the next call, or
    the backward) waits forever for a name its peers never use. Each rank of the source
    mesh makes its group of each axis set; every other rank makes a group of itself alone
    in its place (once per partition of the source ranks, as the members' groups are
    cached once)."""
    m = p.finish.mesh if p.finish is not None else p.src_mesh
    seen: list[tuple[str, ...]] = []
    for step in p.finish.steps if p.finish is not None else ():
        key = tuple(sorted(step.axes, key=m.index))
        if not step.is_collective or m.group_size(key) <= 1 or key in seen:
            continue
        seen.append(key)
        if ctx is not None:
            ctx.group(key, ctx.rank)
            continue
        parts = tuple(sorted(tuple(sorted(p.src_mesh.global_ranks[q] for q in group_ranks(m, key, r)))
                             for r in range(m.size)))
        if (parts, timeout) not in _ALONE:
            kwargs: dict[str, Any] = {"use_local_synchronization": True}
            if timeout is not None:
                kwargs["timeout"] = timeout
            _ALONE[(parts, timeout)] = dist.new_group([me], **kwargs)


# per (partition of the source ranks into groups, timeout): this rank's group of itself
_ALONE: dict[tuple[Any, timedelta | None], Any] = {}


def _box(b: Any) -> Box:
    return tuple((int(lo), int(hi)) for lo, hi in b)


def _numel(box: Box) -> int:
    n = 1
    for lo, hi in box:
        n *= hi - lo
    return n


def _by_peer(transfers: tuple[Transfer, ...], peer_of: Any) -> dict[int, list[Box]]:
    """Boxes per peer, sorted: sender and receiver pack and unpack in the same order."""
    out: dict[int, list[Box]] = {}
    for t in transfers:
        if _numel(t.box):
            out.setdefault(peer_of(t), []).append(t.box)
    return {peer: sorted(bs) for peer, bs in sorted(out.items())}


def _round(held: Held, sends: tuple[Transfer, ...], recvs: tuple[Transfer, ...], dtype: torch.dtype,
           device: torch.device) -> Held:
    """One batched round of point-to-point messages; the pieces this rank received."""
    ops, incoming = [], []
    out = _by_peer(sends, lambda t: t.receiver)
    into = _by_peer(recvs, lambda t: t.sender)
    for peer, bs in out.items():
        buf = torch.cat([_cut(held, b).reshape(-1) for b in bs])
        ops.append(dist.P2POp(dist.isend, buf, peer))
    for peer, bs in into.items():
        buf = torch.empty(sum(map(_numel, bs)), dtype=dtype, device=device)
        ops.append(dist.P2POp(dist.irecv, buf, peer))
        incoming.append((bs, buf))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    got: Held = []
    for bs, buf in incoming:
        at = 0
        for b in bs:
            n = _numel(b)
            got.append((b, buf[at:at + n].view([hi - lo for lo, hi in b])))
            at += n
    return got


def _cut(held: Held, box: Box) -> torch.Tensor:
    for b, t in held:
        if all(blo <= lo and hi <= bhi for (lo, hi), (blo, bhi) in zip(box, b, strict=True)):
            return t[tuple(slice(lo - blo, hi - blo) for (lo, hi), (blo, _) in zip(box, b, strict=True))]
    raise AssertionError(f"rank asked to send {box}, which it does not hold")


def _assemble(held: Held, box: Box, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    out = torch.empty(shape, dtype=dtype, device=device)
    for b, t in held:
        lo = [max(a[0], c[0]) for a, c in zip(box, b, strict=True)]
        hi = [min(a[1], c[1]) for a, c in zip(box, b, strict=True)]
        if any(h <= lo_ for lo_, h in zip(lo, hi, strict=True)):
            continue
        out[tuple(slice(l_ - a[0], h - a[0]) for l_, h, a in zip(lo, hi, box, strict=True))] = \
            t[tuple(slice(l_ - c[0], h - c[0]) for l_, h, c in zip(lo, hi, b, strict=True))]
    return out
