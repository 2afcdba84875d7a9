"""One rank of ``shardc run``: build data, run the program, check it, time it.

Progress and failures are published in the launcher's TCPStore (keys under
``shardc/``), which outlives every rank: when a collective fails, the surviving ranks
read who failed or never reached the step and name that rank in their error.

Fault injection for tests: ``SHARDC_FAULT="rank=2,step=1,kind=raise|sleep|exit[,seconds=30]"``
makes that rank fail just before that step (0-based) of the first run.
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from lowering.cross_mesh import CrossProgram
from lowering.program import Program, Step
from torch_backend import comm
from torch_backend.data import block, expected_block, global_tensor
from torch_backend.executor import execute
from torch_backend.faults import CollectiveError, default_store, failures
from torch_backend.groups import MeshContext, context
from torch_backend.run_spec import STARTUP_S, RunSpec, compile_spec


class Monitor:
    """Progress keys and fault injection, as the executor's ``on_step`` hook."""

    def __init__(self, store: Any, rank: int, world: int, fault: str | None) -> None:
        self.store, self.rank, self.world = store, rank, world
        self.step = -1
        self.step_started = time.monotonic()
        self.fault = _parse_fault(fault) if fault else None
        self.armed = True
        self._set(f"progress/{rank}", "-1")

    def __call__(self, i: int, step: Step) -> None:
        f = self.fault
        if self.armed and f and f["rank"] == self.rank and f["step"] == i:
            kind = f.get("kind", "raise")
            if kind == "sleep":
                time.sleep(float(f.get("seconds", 3600)))
            elif kind == "exit":
                os._exit(17)
            else:
                raise RuntimeError(f"injected fault before step {i + 1} ({step.describe()})")
        self.step = i
        self.step_started = time.monotonic()
        self._set(f"progress/{self.rank}", str(i))

    def _set(self, key: str, value: str) -> None:
        try:
            self.store.set(f"shardc/{key}", value)
        except Exception:
            pass

    def _get(self, key: str) -> str | None:
        try:
            if self.store.check([f"shardc/{key}"]):
                return self.store.get(f"shardc/{key}").decode()
        except Exception:
            return None
        return None

    def count(self, key: str) -> None:
        """One more on a progress counter the launcher reads (advisory, like every key here)."""
        try:
            self.store.add(f"shardc/{key}", 1)
        except Exception:
            pass

    def failed(self, message: str) -> None:
        self._set(f"error/{self.rank}", message[:500])

    def diagnose(self) -> str:
        """Who else failed, or has not reached this rank's step (read from the store)."""
        time.sleep(0.2)  # let a peer that raised publish its error first
        notes = []
        store = default_store()
        for q in range(self.world):
            if q == self.rank:
                continue
            err = self._get(f"error/{q}")
            if err is not None and "CollectiveError" not in err:
                notes.append(f"rank {q} failed: {err.splitlines()[0]}")
                continue
            if err is not None or _saw_failure(store, q):
                continue  # a collective failed under it too: a victim, like this rank
            at = self._get(f"progress/{q}")
            if at is None or int(at) < self.step:
                where = "it reported no progress" if at is None or int(at) < 0 else f"it last began step {int(at) + 1}"
                notes.append(f"rank {q} did not reach step {self.step + 1} ({where})")
        return "; ".join(notes)


def _saw_failure(store: Any, rank: int) -> bool:
    """Whether ``rank`` reported a failed collective (``torch_backend.faults``'s count)."""
    try:
        return store is not None and failures(store, rank) > 0
    except Exception:
        return False


def _parse_fault(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in text.split(","):
        k, _, v = part.partition("=")
        out[k.strip()] = int(v) if k.strip() in ("rank", "step") else v.strip()
    return out


def init(spec: RunSpec, rank: int | None = None, world: int | None = None, store: Any = None) -> Any:
    """Join (or, under torchrun, create) the default process group; returns the store.

    Joining the launcher's group waits for the slowest rank to import torch, so it gets
    ``STARTUP_S`` (or the collective timeout, if longer); then the group, and the store,
    are held to the collective timeout. Under torchrun the ranks start together, after
    torchrun's own rendezvous: the group gets the collective timeout from the start."""
    timeout = timedelta(seconds=spec.timeout)
    if spec.backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank or 0)) % torch.cuda.device_count())
    if store is None:
        dist.init_process_group(spec.backend, timeout=timeout)
        return dist.distributed_c10d._get_default_store()
    assert rank is not None and world is not None  # the launcher passes its store with both
    # torch's (private) way to change a live group's timeout; a torch without it keeps the
    # collective timeout from the start, as before the allowance existed
    set_pg_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    joining = max(spec.timeout, STARTUP_S) if set_pg_timeout is not None else spec.timeout
    dist.init_process_group(spec.backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=joining))
    if set_pg_timeout is not None:
        store.set_timeout(timeout)
        set_pg_timeout(timeout)
    return store


def run_rank(spec: RunSpec, store: Any) -> dict[str, Any]:
    """Run ``spec`` on this rank of the initialized world; returns this rank's report."""
    rank, world = dist.get_rank(), dist.get_world_size()
    program = compile_spec(spec)
    device = torch.device("cuda", torch.cuda.current_device()) if spec.backend == "nccl" else torch.device("cpu")
    if isinstance(program, CrossProgram):
        return run_cross_rank(program, spec, store, device)
    ctx = context(program.mesh, timeout=spec.timeout)
    mon = Monitor(store, rank, world, spec.fault)
    report: dict[str, Any] = {"rank": rank, "ok": False, "check": None, "error": None, "device": str(device)}
    try:
        g = global_tensor(program.src, device=device)
        x = block(program.src, program.mesh, g, rank)
        t0 = time.perf_counter()
        y = execute(program, x, ctx=ctx, on_step=mon)
        if device.type == "cuda":
            torch.cuda.synchronize()
        report["time_s"] = time.perf_counter() - t0
        mon.armed = False
        if spec.check:
            report["check"] = check_output(program, ctx, g, y)
        if spec.bench:
            report.update(bench(program, ctx, x, spec, rank, mon))
        report["ok"] = report["check"] is not False
    except Exception as e:
        _record_failure(report, mon, e, in_step=True)
    return report


def _record_failure(report: dict[str, Any], mon: Monitor, e: Exception, *, in_step: bool) -> None:
    """A rank's failure in its report and in the store (``mon``): a collective's marked as
    one, with how long it was stuck in its step and the monitor's diagnosis where
    ``in_step`` (a run of a Program's steps)."""
    if not isinstance(e, CollectiveError):
        report["error"] = f"{type(e).__name__}: {e}"
    else:
        if in_step:
            report["failed_after_s"] = time.monotonic() - mon.step_started  # stuck in the step this long
        report["error"] = f"CollectiveError: {e}"
        why = mon.diagnose() if in_step else ""
        if why:
            report["error"] += f" [{why}]"
        report["collective"] = True
    mon.failed(report["error"])


def run_cross_rank(program: CrossProgram, spec: RunSpec, store: Any, device: torch.device) -> dict[str, Any]:
    """``shardc run --to-mesh``: this rank's part of the cross-mesh move (its block of the
    source where it is on the source mesh, None elsewhere), checked against the
    destination's block of the same global tensor (None off the destination mesh)."""
    from torch_backend.prepared import redistributor

    rank, world = dist.get_rank(), dist.get_world_size()
    mon = Monitor(store, rank, world, None)
    report: dict[str, Any] = {"rank": rank, "ok": False, "check": None, "error": None, "device": str(device)}
    on_src, on_dst = program.src_mesh.global_ranks, program.dst_mesh.global_ranks
    try:
        g = global_tensor(program.src, device=device)
        x = block(program.src, program.src_mesh, g, on_src.index(rank)) if rank in on_src else None
        f = redistributor(program.src, program.dst, program.src_mesh, dst_mesh=program.dst_mesh, timeout=spec.timeout)
        t0 = time.perf_counter()
        y = f(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        report["time_s"] = time.perf_counter() - t0
        if spec.check:
            if rank in on_dst:
                want = _widest(expected_block(program.dst, program.dst_mesh, g, on_dst.index(rank)))
                report["check"] = y is not None and tuple(y.shape) == tuple(want.shape) and \
                    bool(torch.equal(_widest(y), want))
            else:
                report["check"] = y is None
        if spec.bench:
            totals = []
            for _ in range(spec.bench):
                comm.barrier()
                t0 = time.perf_counter()
                f(x)
                totals.append(time.perf_counter() - t0)
            report.update(bench_total_s=statistics.median(totals), bench_steps_s=[])
        report["ok"] = report["check"] is not False
    except Exception as e:
        _record_failure(report, mon, e, in_step=False)
    return report


def _widest(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a dtype that holds every value of its own exactly: complex128 for complex
    tensors (float64 would drop the imaginary part), float64 otherwise."""
    return t.to(torch.complex128) if t.is_complex() else t.double()


def check_output(program: Program, ctx: MeshContext, g: torch.Tensor, y: torch.Tensor) -> bool:
    """This rank's output against the destination's denotation (P axes reduced first)."""
    dst, mesh, rank = program.dst, program.mesh, ctx.rank
    want, got = _widest(expected_block(dst, mesh, g, rank)), _widest(y)
    p_axes = tuple(a for a in mesh.names if a in dst.partial_axes)
    if p_axes and mesh.group_size(p_axes) > 1:
        op = dst.partial_op or "sum"
        comm.all_reduce(ctx, got, op, ctx.group(p_axes, rank))
        comm.finish_avg(got, op, mesh.group_size(p_axes))
        if y.dtype == torch.bool:
            got = (got != 0).double()
    if y.dtype == torch.bool:
        want = (want != 0).double()
    return tuple(y.shape) == tuple(want.shape) and bool(torch.equal(got, want))


def bench(program: Program, ctx: MeshContext, x: torch.Tensor, spec: RunSpec, rank: int,
          mon: Monitor) -> dict[str, Any]:
    """Median per-step and total times over ``spec.bench`` runs (after one warm-up). The
    total is what a user's ``redistribute`` call runs (its bound call: the checks, the
    program's fast runner where it has one); each step's time is the interpreter's, run
    after it, step by step."""
    from torch_backend.api import bound_for

    bound = bound_for((program.src,), (program.dst,), ctx.mesh, ctx=ctx, programs=(program,))
    steps: list[list[float]] = [[] for _ in program.steps]
    totals: list[float] = []
    bar = _progress(spec.bench) if (spec.progress_bar and rank == 0) else None
    for it in range(spec.bench):
        comm.barrier()
        t0 = time.perf_counter()
        y = bound.call_one(bound.check(x))
        if y.is_cuda:
            torch.cuda.synchronize(y.device)
        totals.append(time.perf_counter() - t0)
        comm.barrier()
        timings: list[float] = []
        execute(program, x, ctx=ctx, timings=timings)
        for i, t in enumerate(timings):
            steps[i].append(t)
        mon._set(f"progress/{rank}", str(len(program.steps) * (it + 2)))
        if rank == 0:
            mon.count("bench")
        if bar is not None:
            bar[0].update(bar[1], advance=1)
    if bar is not None:
        bar[0].stop()
    return {"bench_total_s": statistics.median(totals),
            "bench_steps_s": [statistics.median(s) for s in steps] if spec.bench else []}


def _progress(n: int) -> tuple[Any, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    p = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                 TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    p.start()
    return p, p.add_task("bench", total=n)
