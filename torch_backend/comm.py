"""The one network module: the collectives the runners issue, with three interchangeable
implementations (``of(ctx)`` picks one; the runners never ask which, only what it can do:
``has_p2p``, ``launches``, ``least_chunk``, ``one_block``):

* ``C10D``: eager c10d calls on a real process group (gloo, NCCL), writing into the
  buffers they are given, launchable without waiting, with point-to-point;
* ``FUNCTIONAL``: the traceable functional collectives whenever torch.compile traces:
  each call is the functional op and its ``wait_tensor`` in the graph, copied into the
  given buffer (the compiler removes the copy), and no point-to-point. Eager calls can
  run on them too (``eager_comm``); c10d stays the default, chosen by measurement
  (docs/running.md, "Performance");
* ``LOCAL``: LocalTensorMode, one call standing for every simulated rank's (shapes and
  split sizes may differ per rank), and no point-to-point (it needs LocalRunnerMode
  threads). Only ``rank_map``, ``plain`` and ``blocks`` see that one process plays
  every rank.

Reductions (docs/running.md, "Notes", says why): ``avg`` is sent as SUM and divided
afterwards, ``bool`` travels as uint8 with MAX (logical or) for sum/avg/max.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from contextvars import ContextVar
from typing import Any

import torch
import torch.distributed as dist

from spec_lang.errors import SpecError
from torch_backend.dtypes import wire_view
from torch_backend.faults import CollectiveError, watched_wait
from torch_backend.groups import GroupHandle, MeshContext
from torch_backend.strided import nothing_of
from torch_backend.type_tags import UNCHECKED

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _op_name(op: str, dtype: torch.dtype) -> str:
    """The reduction on the wire (see the module docstring)."""
    if dtype == torch.bool:
        return "min" if op == "min" else "max"
    return "sum" if op == "avg" else op


def reduce_op(op: str, dtype: torch.dtype) -> Any:
    return getattr(dist.ReduceOp, _op_name(op, dtype).upper())


def finish_avg(t: torch.Tensor, op: str, n: int) -> torch.Tensor:
    """Divide a SUM by the group size for ``avg`` (truncating for integers, like the simulator)."""
    if op != "avg" or n == 1 or t.dtype == torch.bool:
        return t
    return t.div_(n, rounding_mode=None if t.is_floating_point() or t.is_complex() else "trunc")


def local_of(t: torch.Tensor, rank: int) -> torch.Tensor:
    inner = getattr(t, "_local_tensors", None)
    return inner[rank] if inner is not None else t


def rank_map(ctx: MeshContext, fn: Callable[..., torch.Tensor], *tensors: torch.Tensor) -> torch.Tensor:
    """``fn(rank, *local blocks)`` on every rank this process plays (under LocalTensorMode
    on each simulated rank's plain tensors, wrapped in a LocalTensor)."""
    if not of(ctx).per_rank:
        return fn(ctx.rank, *tensors)
    from torch.distributed._local_tensor import LocalTensor

    with plain(ctx):
        out = {r: fn(r, *(local_of(t, r) for t in tensors)) for r in ctx.ranks}
    return LocalTensor(out)


def plain(ctx: MeshContext) -> Any:
    """A context for plain per-rank torch ops on local blocks (LocalTensorMode off)."""
    if not of(ctx).per_rank:
        return nullcontext()
    assert ctx.local_mode is not None  # one process plays every rank only under LocalTensorMode (``of``)
    return ctx.local_mode.disable()


def _own(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """One of shardc's own c10d calls: outside the SPMD type checker (``typecheck()`` types
    torch.distributed's collectives in user code; a shardc call types its own result)."""
    UNCHECKED[0] += 1
    try:
        return fn(*args, **kwargs)
    finally:
        UNCHECKED[0] -= 1


class Comm:
    """The communication interface; its flags say what an implementation can do (the
    module's functions of the same names; ``per_rank``: one call plays every rank, whose
    buffers may differ in size; ``real``: on real process groups, where a failure's roll
    call can name the culprit)."""

    p2p = per_rank = launches = real = False
    least_chunk = 0

    def wait(self, ctx: MeshContext, work: Any) -> None:
        if work is not None:
            work.wait()


class _C10d(Comm):
    p2p = launches = real = True

    def wait(self, ctx: MeshContext, work: Any) -> None:
        if work is None:
            return
        if ctx.backend == "gloo":  # a blocked gloo wait gives up once a rank of the mesh reported a failure
            watched_wait(work, ctx.timeout, ctx.to_global, ctx.to_global[ctx.rank])
        elif ctx.timeout is not None:
            work.wait(timeout=ctx.timeout)
        else:
            work.wait()

    def all_gather(self, ctx: MeshContext, out: torch.Tensor, inp: torch.Tensor, group: GroupHandle) -> Any:
        return _own(_all_gather, wire_view(out), wire_view(inp), group=group.pg, async_op=True)

    def reduce_scatter(self, ctx: MeshContext, out: torch.Tensor, inp: torch.Tensor, op: str,
                       group: GroupHandle) -> Any:
        return _own(_reduce_scatter, wire_view(out, True), wire_view(inp, True), op=reduce_op(op, inp.dtype),
                    group=group.pg, async_op=True)

    def all_reduce(self, ctx: MeshContext, buf: torch.Tensor, op: str, group: GroupHandle) -> Any:
        return _own(dist.all_reduce, wire_view(buf, True), op=reduce_op(op, buf.dtype), group=group.pg,
                    async_op=True)

    def all_to_all(self, ctx: MeshContext, send: torch.Tensor, send_splits: dict[int, list[int]],
                   recv_splits: dict[int, list[int]], group: GroupHandle, out: torch.Tensor | None) -> torch.Tensor:
        mine_in, mine_out = send_splits[ctx.rank], recv_splits[ctx.rank]
        recv = out if out is not None else torch.empty(sum(mine_out), dtype=send.dtype, device=send.device)
        self.wait(ctx, _own(dist.all_to_all_single, wire_view(recv), wire_view(send), mine_out, mine_in,
                            group=group.pg, async_op=True))
        return recv

    def p2p_batch(self, ctx: MeshContext, sends: list[tuple[torch.Tensor, int]],
                  recvs: list[tuple[torch.Tensor, int]], group: GroupHandle) -> None:
        ops = [dist.P2POp(dist.isend, wire_view(t), ctx.global_rank(q), group=group.pg) for t, q in sends]
        ops += [dist.P2POp(dist.irecv, wire_view(t), ctx.global_rank(q), group=group.pg) for t, q in recvs]
        if not ops:
            return
        for w in _own(dist.batch_isend_irecv, ops):
            # not in gloo's watched slices: a point-to-point wait that times out closes its pair
            # ("Application timeout caused pair closure"), so a peer one slice late would kill the call
            if ctx.timeout is not None:
                w.wait(timeout=ctx.timeout)
            else:
                w.wait()


class _Landing:
    """A functional collective's result and the buffer it lands in: ``wait()`` is the
    functional ``wait_tensor`` and the copy into the buffer (what a c10d call wrote).
    ``got``: the op's result before its wait (``in_flight``)."""

    def __init__(self, out: torch.Tensor, got: torch.Tensor, waited: bool = False) -> None:
        self.out, self.got, self.waited = out, got, waited

    def wait(self) -> None:
        self.out.copy_(self.got if self.waited else torch.ops._c10d_functional.wait_tensor(self.got))


# torch.compile's async call in two traced regions: the first issues the last collective
# and returns its result un-waited; the user's code waits on it (``wait_tensor``), and the
# second region replays the step with that result landed in place of the collective
_LANDED: ContextVar[torch.Tensor | None] = ContextVar("shardc_landed", default=None)


class landed:  # lower case: it reads as a function, ``with landed(t):``
    """Within the block, the next functional collective is not issued: ``t`` (its result,
    waited already) lands where it would."""

    __slots__ = ("_t", "_token")

    def __init__(self, t: torch.Tensor) -> None:
        self._t = t

    def __enter__(self) -> None:
        self._token = _LANDED.set(self._t)

    def __exit__(self, *exc: object) -> None:
        _LANDED.reset(self._token)


def _land(out: torch.Tensor, issue: Callable[[], torch.Tensor]) -> _Landing:
    t = _LANDED.get()
    if t is None:
        return _Landing(out, issue())
    _LANDED.set(None)
    return _Landing(out, t, waited=True)


def in_flight(work: Any) -> torch.Tensor:
    """A launched functional collective's result before its ``wait_tensor`` (what the
    compiler overlaps with the compute placed before the wait)."""
    if not isinstance(work, _Landing):
        raise TypeError(f"not a functional collective in flight: {type(work).__name__}")
    return work.got


def _real(t: torch.Tensor) -> torch.Tensor:
    """A complex tensor as its (re, im) pairs: the functional collectives take no complex
    dtype on gloo (c10d's calls make the same view themselves)."""
    return torch.view_as_real(t) if t.is_complex() else t


class _Functional(Comm):
    """torch.compile's form: the ops land in the trace; group names are constants of it."""

    launches = True

    def all_gather(self, ctx: MeshContext, out: torch.Tensor, inp: torch.Tensor, group: GroupHandle) -> Any:
        return _land(_real(wire_view(out)).view(-1), lambda: torch.ops._c10d_functional.all_gather_into_tensor(
            _real(wire_view(inp).contiguous()).view(-1), len(group.members), group.pg.group_name))

    def reduce_scatter(self, ctx: MeshContext, out: torch.Tensor, inp: torch.Tensor, op: str,
                       group: GroupHandle) -> Any:
        return _land(_real(wire_view(out, True)).view(-1), lambda: torch.ops._c10d_functional.reduce_scatter_tensor(
            _real(wire_view(inp, True).contiguous()).view(-1), _op_name(op, inp.dtype), len(group.members),
            group.pg.group_name))

    def all_reduce(self, ctx: MeshContext, buf: torch.Tensor, op: str, group: GroupHandle) -> Any:
        return _land(_real(wire_view(buf, True)), lambda: torch.ops._c10d_functional.all_reduce(
            _real(wire_view(buf, True)), _op_name(op, buf.dtype), group.pg.group_name))

    def all_to_all(self, ctx: MeshContext, send: torch.Tensor, send_splits: dict[int, list[int]],
                   recv_splits: dict[int, list[int]], group: GroupHandle, out: torch.Tensor | None) -> torch.Tensor:
        wire = _real(wire_view(send).contiguous()).view(-1)
        k = 2 if send.is_complex() else 1  # a complex element travels as two reals
        got = torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_to_all_single(
            wire, [k * n for n in recv_splits[ctx.rank]], [k * n for n in send_splits[ctx.rank]],
            group.pg.group_name))
        got = got.view(send.dtype) if wire.dtype != send.dtype else got
        return got if out is None else out.copy_(got)


class _Local(_C10d):
    """LocalTensorMode: c10d's calls on the fake group stand for every rank's, waited as
    they are; split sizes differ per simulated rank, so ``all_to_all`` goes through the
    functional collective, which takes them as LocalIntNode SymInts."""

    p2p = launches = real = False
    per_rank = True
    least_chunk = 1  # LocalTensorMode cannot split a buffer of 0 elements per member (torch.split by 0)
    wait = Comm.wait

    def all_to_all(self, ctx: MeshContext, send: torch.Tensor, send_splits: dict[int, list[int]],
                   recv_splits: dict[int, list[int]], group: GroupHandle, out: torch.Tensor | None) -> torch.Tensor:
        import torch.distributed._functional_collectives as fc
        from torch.distributed._local_tensor import LocalTensor

        ins = _per_rank_ints(ctx, send_splits)
        outs = _per_rank_ints(ctx, recv_splits)
        wire = wire_view(send)
        got = _own(fc.all_to_all_single, wire, outs, ins, group.pg)
        if not isinstance(got, LocalTensor) and hasattr(got, "wait"):
            got = got.wait()
        return got.view(send.dtype) if wire.dtype != send.dtype else got


class _EagerFunctional(_Functional):
    """The functional collectives run eagerly on a real group (``SHARDC_EAGER_COMM=functional``):
    eager code runs in program order, so nothing is ``tied``; a failure names its culprit as
    c10d's does; ``wait_tensor`` takes no timeout (the process group's own bounds it)."""

    real = True


C10D, FUNCTIONAL, LOCAL = _C10d(), _Functional(), _Local()
EAGER_FUNCTIONAL = _EagerFunctional()
_EAGER_FORMS = {"c10d": C10D, "functional": EAGER_FUNCTIONAL}
# the implementation of eager calls on a real group: set by ``eager_comm``, else read once
# from SHARDC_EAGER_COMM at the first call
_EAGER: list[Comm | None] = [None]


def eager_comm(name: str | None = None) -> str:
    """Which implementation eager calls on a real group use, ``"c10d"`` or ``"functional"``
    (docs/running.md, "Performance"; None: ``SHARDC_EAGER_COMM``'s setting); returns the
    name now in force. For benchmarks and tests, not the public API."""
    if name is None:
        name = os.environ.get("SHARDC_EAGER_COMM", "") or "c10d"
        where = f"SHARDC_EAGER_COMM={name!r}"
    else:
        where = f"eager_comm({name!r})"
    impl = _EAGER_FORMS.get(name) if isinstance(name, str) else None
    if impl is None:
        raise SpecError(f"{where}: no such communication implementation",
                        hint=f"use one of {sorted(_EAGER_FORMS)} (c10d is the default)")
    _EAGER[0] = impl
    return name


def of(ctx: MeshContext) -> Any:
    """The implementation a call on ``ctx`` runs with: functional while torch.compile traces,
    else c10d (or the functional collectives, eagerly, where ``eager_comm`` says so);
    LocalTensorMode inside torch.compile is refused (docs/running.md, "torch.compile")."""
    traced = torch.compiler.is_compiling()
    if ctx.local_mode is not None:
        if traced:
            raise SpecError("shardc cannot run inside torch.compile under LocalTensorMode",
                            hint="compile on real ranks (gloo, NCCL), or call shardc eagerly under LocalTensorMode")
        return LOCAL
    if traced:
        return FUNCTIONAL
    return _EAGER[0] or _EAGER_FORMS[eager_comm()]


def blocks(ctx: MeshContext, x: torch.Tensor) -> dict[int, torch.Tensor] | None:
    """Each rank's block of ``x`` that this process plays: ``{ctx.rank: x}`` on a real group;
    under LocalTensorMode the LocalTensor's blocks, or None for a plain tensor."""
    if not of(ctx).per_rank:
        return {ctx.rank: x}
    inner = getattr(x, "_local_tensors", None)
    return None if inner is None else {r: inner[r] for r in ctx.ranks}


def least_chunk(ctx: MeshContext) -> int:
    """The fewest elements per member a reduce_scatter's buffer may hold (a dummy element
    keeps an all-empty group whole where the implementation needs one; nothing is sent)."""
    return int(of(ctx).least_chunk)


def one_block(ctx: MeshContext) -> bool:
    """Whether a call's tensor is this rank's one block (not every simulated rank's)."""
    return not of(ctx).per_rank


def has_p2p(ctx: MeshContext) -> bool:
    """Whether ``p2p`` runs on ``ctx`` (else a runner exchanges with an exact ``all_to_all``)."""
    return bool(of(ctx).p2p)


def launches(ctx: MeshContext) -> bool:
    """Whether a collective on ``ctx`` can be left on the wire and waited later (``wait``)."""
    return bool(of(ctx).launches)


def wait(ctx: MeshContext, work: Any) -> None:
    """Wait for one collective, bounded by the context's timeout (the group's otherwise)."""
    of(ctx).wait(ctx, work)


def tied(ctx: MeshContext, y: torch.Tensor, *srcs: torch.Tensor) -> torch.Tensor:
    """``y``, a new block that no copy from ``srcs`` writes (it is empty, or all zeros), as
    a value computed from them in a traced graph (elsewhere ``y`` itself), so that each
    rank's collectives stay one chain of data (docs/running.md, "torch.compile", says why)."""
    if of(ctx) is not FUNCTIONAL:
        return y
    return torch.cat([*(nothing_of(s).to(y.dtype) for s in srcs), y.reshape(-1)]).view(y.shape)


def _done(ctx: MeshContext, work: Any, launch_only: bool) -> Any:
    if launch_only:
        return work
    wait(ctx, work)
    return None


def all_gather(ctx: MeshContext, out: torch.Tensor, inp: torch.Tensor, group: GroupHandle,
               launch_only: bool = False) -> Any:
    """Gather into ``out``; ``launch_only`` returns the work unwaited (wait with ``wait``)."""
    return _done(ctx, of(ctx).all_gather(ctx, out, inp, group), launch_only)


def reduce_scatter(ctx: MeshContext, out: torch.Tensor, inp: torch.Tensor, op: str, group: GroupHandle,
                   launch_only: bool = False) -> Any:
    return _done(ctx, of(ctx).reduce_scatter(ctx, out, inp, op, group), launch_only)


def all_reduce(ctx: MeshContext, buf: torch.Tensor, op: str, group: GroupHandle, launch_only: bool = False) -> Any:
    return _done(ctx, of(ctx).all_reduce(ctx, buf, op, group), launch_only)


def all_to_all(ctx: MeshContext, send: torch.Tensor, send_splits: dict[int, list[int]],
               recv_splits: dict[int, list[int]], group: GroupHandle,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Exact-split all_to_all_single; returns the flat receive buffer (process-group order):
    ``out`` where given (a flat contiguous tensor of the received size; used only where
    the implementation does not play every rank at once)."""
    return of(ctx).all_to_all(ctx, send, send_splits, recv_splits, group, out)


def _per_rank_ints(ctx: MeshContext, splits: dict[int, list[int]]) -> list[Any]:
    """Split sizes that differ per simulated rank, as LocalIntNode SymInts."""
    from torch.distributed._local_tensor import LocalIntNode

    out: list[Any] = []
    for i in range(len(splits[ctx.ranks[0]])):
        vals = {r: int(splits[r][i]) for r in ctx.ranks}
        out.append(vals[ctx.ranks[0]] if len(set(vals.values())) == 1 else torch.SymInt(LocalIntNode(vals)))
    return out


def p2p(ctx: MeshContext, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
        group: GroupHandle) -> None:
    """One batch of isend/irecv on a real group (peers are mesh ranks), each wait bounded by
    the context's timeout: c10d's, whichever implementation runs the collectives (the eager
    functional collectives have none: a cross-mesh round). A runner calls it only where
    ``has_p2p(ctx)``, and takes an exact all_to_all elsewhere."""
    impl = of(ctx)
    if not impl.real:
        raise RuntimeError(f"point-to-point is not available with {type(impl).__name__.strip('_')}")
    (impl if impl.p2p else C10D).p2p_batch(ctx, sends, recvs, group)


def barrier() -> None:
    """Every rank of the default group meets here (``shardc run``'s and calibration's timing)."""
    _own(dist.barrier)


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, on every rank of the default group, in rank order."""
    out: list[Any] = [None] * dist.get_world_size()
    _own(dist.all_gather_object, out, obj)
    return out


def wait_functional(t: torch.Tensor) -> torch.Tensor:
    """A functional collective's result once landed (its ``wait_tensor``)."""
    return torch.ops._c10d_functional.wait_tensor(t)


def failed(ctx: MeshContext, where: str, e: BaseException, members: Sequence[int],
           axes: tuple[str, ...] | None = None) -> CollectiveError:
    """The CollectiveError of a collective (or a group's creation) that failed ``where``."""
    if of(ctx).real:
        return ctx.real_failure(where, e, members, axes)
    return CollectiveError(f"{where} failed: {e}")
