"""One rank of ``shardc run``: build data, run the program as a user's call, check it, time
it (docs/running.md, "One machine"; ``SHARDC_FAULT``: "Timeouts and failures"). Progress
counters go to the launcher's TCPStore (keys under ``shardc/``), which outlives every rank.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from lowering.cross_mesh import CrossProgram
from lowering.program import Program
from torch_backend import comm
from torch_backend.bound import bind
from torch_backend.data import block, expected_block, global_tensor
from torch_backend.executor import watching
from torch_backend.faults import CollectiveError
from torch_backend.groups import MeshContext, context
from torch_backend.prepared import Redistributor, redistributor
from torch_backend.run_spec import STARTUP_S, RunSpec, compile_spec


def count(store: Any, key: str) -> None:
    """One more on a progress counter the launcher reads (advisory: never masks the real error)."""
    with contextlib.suppress(Exception):
        store.add(f"shardc/{key}", 1)


def rank_device(backend: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def prepared(program: Program, ctx: MeshContext) -> Callable[[torch.Tensor], Any]:
    """``program`` as a user's prepared call (``torch_backend.redistributor``'s object) on ``ctx``."""
    return Redistributor(bind(program, ctx).prepared())


class Clock:
    """A user's call timed at its start, the step boundaries of the runner loop it runs
    (``executor.watching``) and its end, each once the device has finished. While ``armed``
    (a rank's first run) it notes when each step began (how long a failed one was stuck)
    and injects ``SHARDC_FAULT``'s ``fault`` of this ``rank``."""

    def __init__(self, device: torch.device, rank: int = 0, fault: str | None = None) -> None:
        self.device, self.rank, self.armed = device, rank, True
        self.marks: list[float] = []
        self.step_started = time.monotonic()
        parts = (part.partition("=") for part in (fault or "").split(",") if part)  # "rank=2,step=1,kind=exit"
        self.fault = {k.strip(): int(v) if k.strip() in ("rank", "step") else v.strip() for k, _, v in parts}

    def __call__(self, i: int, y: Any) -> None:
        f = self.fault
        if self.armed and f.get("rank") == self.rank and f.get("step") == i:
            if f.get("kind") == "exit":
                os._exit(17)
            if f.get("kind") != "sleep":
                raise RuntimeError(f"injected fault before step {i + 1}")
            time.sleep(float(f.get("seconds", 3600)))
        if self.armed:
            self.step_started = time.monotonic()
        self.mark()

    def mark(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.marks.append(time.perf_counter())

    def run(self, call: Callable[[Any], Any], x: Any) -> Any:
        self.marks = []
        self(0, x)
        with watching(self):
            y = call(x)
        self.mark()
        return y

    @property
    def seconds(self) -> list[float]:
        """Each step's time in the last run (one figure, the call's, where no loop ran its steps)."""
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def init(spec: RunSpec, rank: int | None = None, world: int | None = None, store: Any = None) -> Any:
    """Join (or, under torchrun, create) the default process group; returns the store.
    Joining the launcher's group may take ``STARTUP_S``, then the collective timeout."""
    timeout = timedelta(seconds=spec.timeout)
    if spec.backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank or 0)) % torch.cuda.device_count())
    if store is None:
        dist.init_process_group(spec.backend, timeout=timeout)
        return dist.distributed_c10d._get_default_store()
    assert rank is not None and world is not None  # the launcher passes its store with both
    dist.init_process_group(spec.backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=max(spec.timeout, STARTUP_S)))
    store.set_timeout(timeout)
    dist.distributed_c10d._set_pg_timeout(timeout)  # torch's (private) way to change a live group's timeout
    return store


def run_rank(spec: RunSpec, store: Any) -> dict[str, Any]:
    """Run ``spec`` on this rank of the initialized world as a user's prepared call
    (``torch_backend.redistributor``; with ``--to-mesh`` its cross-mesh form, None off a
    mesh); returns this rank's report."""
    rank = dist.get_rank()
    program = compile_spec(spec)
    device = rank_device(spec.backend)
    clock = Clock(device, rank, spec.fault)
    report: dict[str, Any] = {"rank": rank, "ok": False, "check": None, "error": None, "device": str(device)}
    try:
        g = global_tensor(program.src, device=device)
        if isinstance(program, CrossProgram):
            on_src, on_dst = program.src_mesh.global_ranks, program.dst_mesh.global_ranks
            x = block(program.src, program.src_mesh, g, on_src.index(rank)) if rank in on_src else None
            call = redistributor(program.src, program.dst, program.src_mesh, dst_mesh=program.dst_mesh,
                                 timeout=spec.timeout)
        else:
            ctx = context(program.mesh, timeout=spec.timeout)
            x = block(program.src, program.mesh, g, rank)
            call = prepared(program, ctx)
        y = clock.run(call, x)
        report["time_s"] = clock.marks[-1] - clock.marks[0]
        clock.armed = False
        if spec.check and not isinstance(program, CrossProgram):
            report["check"] = check_output(program, ctx, g, y)
        elif spec.check:  # the destination's block, None off its mesh
            want = expected_block(program.dst, program.dst_mesh, g, on_dst.index(rank)) if rank in on_dst else None
            report["check"] = y is None if want is None else y is not None and _same(_widest(y), _widest(want))
        if spec.bench:
            report.update(bench(call, x, spec, clock, store))
        report["ok"] = report["check"] is not False
    except Exception as e:
        report["error"] = f"{type(e).__name__}: {e}"
        if isinstance(e, CollectiveError):  # stuck in the step this long
            report["collective"], report["failed_after_s"] = True, time.monotonic() - clock.step_started
    return report


def _widest(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a dtype that holds every value of its own exactly: complex128 for complex
    tensors (float64 would drop the imaginary part), float64 otherwise."""
    return t.to(torch.complex128) if t.is_complex() else t.double()


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    return tuple(got.shape) == tuple(want.shape) and bool(torch.equal(got, want))


def check_output(program: Program, ctx: MeshContext, g: torch.Tensor, y: torch.Tensor) -> bool:
    """This rank's output against the destination's denotation (P axes reduced first)."""
    dst, mesh, rank = program.dst, program.mesh, ctx.rank
    want, got = _widest(expected_block(dst, mesh, g, rank)), _widest(y)
    p_axes = tuple(a for a in mesh.names if a in dst.partial_axes)
    if p_axes and mesh.group_size(p_axes) > 1:
        op = dst.partial_op or "sum"
        comm.all_reduce(ctx, got, op, ctx.group(p_axes, rank))
        comm.finish_avg(got, op, mesh.group_size(p_axes))
        if y.dtype == torch.bool:  # a reduced bool is an or (a sum of 0/1 here)
            got = (got != 0).double()
    return _same(got, want)


def timed(clock: Clock, call: Callable[[Any], Any], x: Any, runs: int,
          done: Callable[[int], None] | None = None) -> tuple[float, list[float]]:
    """Medians over ``runs`` calls, each after a barrier: the whole call's, and each of the
    figures its ``clock`` marked (``Clock.seconds``). ``done(i)`` after run i."""
    seconds: list[list[float]] = []
    for i in range(runs):
        comm.barrier()
        clock.run(call, x)
        seconds.append(clock.seconds)
        if done is not None:
            done(i)
    return statistics.median(sum(s) for s in seconds), [statistics.median(s) for s in zip(*seconds)]


def bench(call: Callable[[Any], Any], x: Any, spec: RunSpec, clock: Clock, store: Any) -> dict[str, Any]:
    """``shardc run --bench``: ``timed`` runs of the user's call after the first (its warm-up):
    in total, and each figure its clock marked (each step's where the runner loop ran them)."""
    from torch_backend.cli.progress import RunProgress

    world = dist.get_world_size()
    bar = RunProgress(world, spec.backend, spec.bench, rich=True, plain=False) \
        if spec.progress_bar and clock.rank == 0 else None  # rank 0 under torchrun: no launcher shows it

    def done(i: int) -> None:  # rank 0 counts the runs for the launcher's progress
        if clock.rank == 0:
            count(store, "bench")
        if bar is not None:
            bar({"up": world, "joined": world, "bench": i + 1, "done": 0, "failed": 0})

    total, steps = timed(clock, call, x, spec.bench, done)
    if bar is not None:
        bar.close()
    return {"bench_total_s": total, "bench_steps_s": steps}
