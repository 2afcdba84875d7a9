"""The collectives the executor issues, on a real process group or under LocalTensorMode.

Everything here takes flat contiguous buffers. On a real group (gloo, NCCL) these are
the tensor-form c10d calls: ``all_gather_single`` / ``reduce_scatter_single`` (the
2.13 names of ``all_gather_into_tensor`` / ``reduce_scatter_tensor``), ``all_reduce``,
``all_to_all_single`` with exact split sizes, and ``batch_isend_irecv``.

Under LocalTensorMode one call stands for every rank's call: tensors are LocalTensors
(one buffer per simulated rank, shapes may differ per rank) and split sizes differ per
rank, so ``all_to_all`` goes through the functional collective, which accepts per-rank
split sizes as LocalIntNode SymInts (the c10d form takes one int list for all ranks).
LocalTensorMode has no point-to-point without LocalRunnerMode threads, so the executor
never calls :func:`p2p` there (it uses ``all_to_all`` instead).

Reductions: ``avg`` is sent as SUM and divided afterwards on every backend (gloo and
NCCL differ in ReduceOp.AVG support, and SUM-then-divide is what the reference
simulator computes); ``bool`` travels as uint8 with MAX (logical or) for sum/avg/max.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from torch_backend.dtypes import wire_view
from torch_backend.faults import CollectiveError  # noqa: F401 - where it lived: torch_backend.comm.CollectiveError
from torch_backend.groups import GroupHandle, MeshContext
from torch_backend.type_tags import UNCHECKED

_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def reduce_op(op: str, dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX
    return _OPS[op]


def finish_avg(t: torch.Tensor, op: str, n: int) -> torch.Tensor:
    """Divide a SUM by the group size for ``avg`` (truncating for integers, like the simulator)."""
    if op != "avg" or n == 1 or t.dtype == torch.bool:
        return t
    if t.is_floating_point() or t.is_complex():
        return t.div_(n)
    return t.copy_(torch.div(t, n, rounding_mode="trunc"))


# ---- per-rank mapping -------------------------------------------------------------------


def local_of(t: torch.Tensor, rank: int) -> torch.Tensor:
    inner = getattr(t, "_local_tensors", None)
    return inner[rank] if inner is not None else t


def rank_map(ctx: MeshContext, fn: Callable[..., torch.Tensor], *tensors: torch.Tensor) -> torch.Tensor:
    """``fn(rank, *local blocks)`` on every rank this process plays.

    On a real group that is one call with this rank; under LocalTensorMode it runs on
    each simulated rank's plain tensors (mode disabled) and wraps them in a LocalTensor.
    """
    if not ctx.is_local:
        return fn(ctx.rank, *tensors)
    from torch.distributed._local_tensor import LocalTensor

    with ctx.local_mode.disable():
        out = {r: fn(r, *(local_of(t, r) for t in tensors)) for r in ctx.ranks}
    return LocalTensor(out)


# ---- collectives ------------------------------------------------------------------------


def _own(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """One of shardc's own c10d calls: outside the SPMD type checker (``typecheck()`` types
    torch.distributed's collectives in user code; a shardc call types its own result)."""
    UNCHECKED[0] += 1
    try:
        return fn(*args, **kwargs)
    finally:
        UNCHECKED[0] -= 1


def wait(ctx: MeshContext, work: Any) -> None:
    """Wait for one collective, bounded by the context's timeout (the group's otherwise)."""
    if work is None:
        return
    if ctx.timeout is not None and not ctx.is_local:
        work.wait(timeout=ctx.timeout)
    else:
        work.wait()


def all_gather(ctx: MeshContext, out: torch.Tensor, inp: torch.Tensor, group: GroupHandle,
               launch_only: bool = False) -> Any:
    """Gather into ``out``; ``launch_only`` returns the work unwaited (wait with ``wait``)."""
    work = _own(_all_gather, wire_view(out), wire_view(inp), group=group.pg, async_op=True)
    return work if launch_only else wait(ctx, work)


def reduce_scatter(ctx: MeshContext, out: torch.Tensor, inp: torch.Tensor, op: str, group: GroupHandle,
                   launch_only: bool = False) -> Any:
    work = _own(_reduce_scatter, wire_view(out, True), wire_view(inp, True), op=reduce_op(op, inp.dtype),
                group=group.pg, async_op=True)
    return work if launch_only else wait(ctx, work)


def all_reduce(ctx: MeshContext, buf: torch.Tensor, op: str, group: GroupHandle, launch_only: bool = False) -> Any:
    work = _own(dist.all_reduce, wire_view(buf, True), op=reduce_op(op, buf.dtype), group=group.pg, async_op=True)
    return work if launch_only else wait(ctx, work)


def all_to_all(ctx: MeshContext, send: torch.Tensor, send_splits: dict[int, list[int]],
               recv_splits: dict[int, list[int]], group: GroupHandle,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Exact-split all_to_all_single; returns the flat receive buffer (process-group order):
    ``out`` where given (real groups; a flat contiguous tensor of the received size)."""
    if not ctx.is_local:
        mine_in, mine_out = send_splits[ctx.rank], recv_splits[ctx.rank]
        recv = out if out is not None else torch.empty(sum(mine_out), dtype=send.dtype, device=send.device)
        wait(ctx, _own(dist.all_to_all_single, wire_view(recv), wire_view(send), mine_out, mine_in, group=group.pg,
                       async_op=True))
        return recv
    import torch.distributed._functional_collectives as fc
    from torch.distributed._local_tensor import LocalTensor

    ins = _per_rank_ints(ctx, send_splits)
    outs = _per_rank_ints(ctx, recv_splits)
    wire = wire_view(send)
    got = _own(fc.all_to_all_single, wire, outs, ins, group.pg)
    if not isinstance(got, LocalTensor) and hasattr(got, "wait"):
        got = got.wait()
    return got.view(send.dtype) if wire.dtype != send.dtype else got


def _per_rank_ints(ctx: MeshContext, splits: dict[int, list[int]]) -> list[Any]:
    """Split sizes that differ per simulated rank, as LocalIntNode SymInts."""
    from torch.distributed._local_tensor import LocalIntNode

    n = len(next(iter(splits.values())))
    out: list[Any] = []
    for i in range(n):
        vals = {r: int(splits[r][i]) for r in ctx.ranks}
        if len(set(vals.values())) == 1:
            out.append(next(iter(vals.values())))
        else:
            out.append(torch.SymInt(LocalIntNode(vals)))
    return out


def p2p(ctx: MeshContext, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
        group: GroupHandle) -> None:
    """One batch of isend/irecv (peers are mesh ranks); waits for all, with the step timeout."""
    if ctx.is_local:
        raise RuntimeError("point-to-point is not available under LocalTensorMode")
    ops = [dist.P2POp(dist.isend, wire_view(t), ctx.global_rank(q), group=group.pg) for t, q in sends]
    ops += [dist.P2POp(dist.irecv, wire_view(t), ctx.global_rank(q), group=group.pg) for t, q in recvs]
    if not ops:
        return
    for w in _own(dist.batch_isend_irecv, ops):
        wait(ctx, w)
