"""``shardc run``'s launcher: one process per rank on this machine (docs/running.md, "One
machine"), each rank's report through a queue, or the torchrun world, whose rank 0 gathers
the reports. The parent hosts the TCPStore (port 0: the OS picks a free one), so it
outlives any rank, and the others can still read who failed (docs/running.md, "Timeouts
and failures").
"""

from __future__ import annotations

import contextlib
import os
import queue as queue_mod
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from spec_lang.errors import SpecError
from torch_backend.run_spec import STARTUP_S

if TYPE_CHECKING:
    from torch_backend.run_spec import RunSpec

# torch is imported where a rank (or the store) needs it: bad input is refused before that
GRACE_S = 10.0  # after the first failure, on top of the collective timeout
EXIT_WAIT_S = 3.0  # how long a rank the others gave up on gets to show that it exited (a loaded machine
# delivers an exit status late: at 1 s a rank that had exited was once reported hung)
_AT_FAULT = re.compile(r"at fault: ranks? (\d+|\[[\d, ]+\]) \(")  # ``faults.culprit_note``'s names


@dataclass
class RunResult:
    """The merged outcome of one ``shardc run``."""

    ok: bool
    world: int
    backend: str
    reports: dict[int, dict[str, Any]] = field(default_factory=dict)
    failed_rank: int | None = None
    message: str = ""


def choose_backend(requested: str, world: int) -> str:
    """``--backend``: auto is NCCL where every rank can have its own GPU, else gloo."""
    if requested == "gloo":
        return requested
    import torch

    if requested == "nccl" and not torch.cuda.is_available():
        raise SpecError("--backend nccl needs CUDA GPUs, and none is visible", hint="use --backend gloo")
    auto = torch.cuda.is_available() and torch.cuda.device_count() >= world
    return "nccl" if requested == "nccl" or auto else "gloo"


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def prepare_local_ranks(world: int, mesh: Any) -> None:
    """For a local launch of ``world`` ranks on ``mesh``: refuse one far larger than the
    machine (a typo, not a job: each rank is a process that imports torch), then start the
    ranks' fork server now, so that it imports torch while this process goes on."""
    if under_torchrun():
        return
    most = max(64, 4 * (os.cpu_count() or 1))  # torchrun, across machines, has no such cap
    if world > most:
        raise SpecError(
            f"the mesh {mesh} has {world} ranks, and a local run starts one process per rank: at most "
            f"{most} on this machine ({os.cpu_count()} cores)",
            hint="run a mesh of that many ranks under torchrun across machines, or try the layout on a "
            "smaller mesh (shardc plan and shardc show need no processes at all)")
    from torch_backend.procs import rank_context

    rank_context()


RankFn = Callable[[Any, Any], dict[str, Any]]  # (spec, store) -> this rank's report


def _child(rank: int, world: int, spec: RunSpec, port: int, q: Any, rank_fn: RankFn | None = None) -> None:
    """Entry point of a spawned rank (``rank_fn`` None: ``shardc run``'s own)."""
    import torch.distributed as dist

    from torch_backend.worker import count, init, run_rank

    report: dict[str, Any]
    try:
        # torch.distributed's public TCPStore is re-exported by a plain import from torch._C,
        # which mypy's no_implicit_reexport does not count as an export (torch's typing, not ours)
        store = dist.TCPStore("127.0.0.1", port, world + 1, False,  # type: ignore[attr-defined]
                              timeout=timedelta(seconds=max(spec.timeout, STARTUP_S)))
        count(store, "up")
        init(spec, rank, world, store)
        count(store, "joined")
        report = (rank_fn or run_rank)(spec, store)
    except BaseException as e:
        report = {"rank": rank, "ok": False, "error": f"{type(e).__name__}: {e}"}
    q.put(report)
    q.close()
    q.join_thread()
    if report.get("error"):
        os._exit(1)  # do not wait on a broken group in destroy_process_group
    if dist.is_initialized():
        dist.destroy_process_group()
    os._exit(0)


def _progress(store: Any, done: int, failed: int) -> dict[str, int]:
    """Where the ranks are: started (torch imported, store reached), joined the process
    group, timed runs rank 0 finished, reports in, failures (counters that fail read 0)."""
    def read(key: str) -> int:
        with contextlib.suppress(Exception):
            return int(store.add(f"shardc/{key}", 0))
        return 0

    return {"up": read("up"), "joined": read("joined"), "bench": read("bench"), "done": done, "failed": failed}


def launch_local(spec: RunSpec | Any, world: int,
                 on_progress: Callable[[dict[str, int]], None] | None = None,
                 rank_fn: RankFn | None = None) -> RunResult:
    """Spawn ``world`` ranks on this machine and run ``spec``: ``rank_fn(spec, store)`` on
    each once it joined the group (a module-level function; None: ``worker.run_rank``);
    ``on_progress`` gets ``_progress`` a few times a second."""
    import torch.distributed as dist

    from torch_backend.procs import rank_context, rank_process

    # TCPStore: torch re-exports it without marking the export (as in _child)
    store = dist.TCPStore("127.0.0.1", 0, world + 1, True,  # type: ignore[attr-defined]
                          timeout=timedelta(seconds=spec.timeout),
                          wait_for_workers=False)
    ctx = rank_context()
    q = ctx.Queue()
    procs = [rank_process(ctx, _child, r, world, spec, store.port, q, rank_fn) for r in range(world)]
    for p in procs:
        p.start()
    try:
        tick = None if on_progress is None else (lambda done, failed: on_progress(_progress(store, done, failed)))
        reports, died, hung = collect(procs, q, spec.timeout, world, tick)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
    return merge(reports, died, hung, world, spec.backend)


def collect(procs: list[Any], q: Any, timeout: float, world: int,
            tick: Callable[[int, int], None] | None = None
            ) -> tuple[dict[int, dict[str, Any]], dict[int, int], list[int]]:
    """Every rank's report from ``q``: (reports, the ranks that died without one and their
    exit codes, the ranks still running when the others had stopped: hung)."""
    reports: dict[int, dict[str, Any]] = {}
    died: dict[int, int] = {}
    start = time.monotonic()
    first_failure: float | None = None
    while len(reports) + len(died) < world:
        if tick is not None:
            tick(len(reports), len(died) + sum(bool(rep.get("error")) for rep in reports.values()))
        with contextlib.suppress(queue_mod.Empty):
            rep = q.get(timeout=0.2)
            reports[rep["rank"]] = rep
            if rep.get("error") and first_failure is None:
                first_failure = time.monotonic()
            continue
        now = time.monotonic()
        if _reap(procs, q, reports, died, 0.0):
            first_failure = first_failure or now
        if first_failure is not None:
            pending = [r for r in range(world) if r not in reports and r not in died]
            if now - first_failure > timeout + GRACE_S or _all_named(pending, reports):
                break
        if first_failure is None and now - start > STARTUP_S + timeout * 4 and not reports:
            break
    # a rank the others named may have exited a moment ago (its exit status reaches this
    # process after their reports): it died, whatever the counters said, so look once more
    _reap(procs, q, reports, died, EXIT_WAIT_S)
    hung = [r for r in range(world) if r not in reports and r not in died]
    return reports, died, hung


def _reap(procs: list[Any], q: Any, reports: dict[int, dict[str, Any]], died: dict[int, int],
          wait_s: float) -> bool:
    """Mark the ranks that exited without a report as died (their exit codes); returns
    whether any was. ``wait_s``: how long to wait for a rank still running to exit."""
    from multiprocessing.connection import wait

    running = {procs[r].sentinel: r for r in range(len(procs)) if r not in reports and r not in died}
    deadline = time.monotonic() + wait_s
    while running and (left := deadline - time.monotonic()) > 0:
        for sentinel in wait(list(running), timeout=left):
            running.pop(sentinel)
    exited = [r for r in range(len(procs)) if r not in reports and r not in died and procs[r].exitcode is not None]
    if exited:  # a report sent just before the exit may still be in flight: take what comes within 0.5 s
        deadline = time.monotonic() + 0.5
        with contextlib.suppress(queue_mod.Empty):
            while True:
                rep = q.get(timeout=max(deadline - time.monotonic(), 0.01))
                reports[rep["rank"]] = rep
    died.update({r: procs[r].exitcode for r in exited if r not in reports})
    return any(r in died for r in exited)


def _all_named(pending: list[int], reports: dict[int, dict[str, Any]]) -> bool:
    """Every rank still running was named at fault by a peer (``faults``): no need to wait."""
    named = {int(r) for rep in reports.values() for group in _AT_FAULT.findall(str(rep.get("error") or ""))
             for r in group.strip("[]").split(",")}
    return bool(pending) and named.issuperset(pending)


def merge(reports: dict[int, dict[str, Any]], died: dict[int, int], hung: list[int], world: int,
          backend: str) -> RunResult:
    """One verdict from every rank's report, the culprit first: a rank that raised in its
    own code, else one that died, else one that hung, else the first collective error."""
    res = RunResult(ok=False, world=world, backend=backend, reports=reports)
    own = [r for r, rep in sorted(reports.items()) if rep.get("error") and not rep.get("collective")]
    coll = [r for r, rep in sorted(reports.items()) if rep.get("error") and rep.get("collective")]
    lines = [f"rank {r} failed: {reports[r]['error']}" for r in own]
    lines += [f"rank {r} died (exit code {c}) without a report" for r, c in sorted(died.items())]
    lines += [f"rank {r} hung: still running when the other ranks had stopped (killed)" for r in hung]
    if coll:
        lines.append(f"ranks {coll} stopped with collective errors, e.g. rank {coll[0]}: {reports[coll[0]]['error']}")
    culprits = [*own, *sorted(died), *hung, *coll]
    if lines:
        res.failed_rank, res.message = culprits[0], "\n".join(lines)
        return res
    res.ok = all(rep.get("ok") for rep in reports.values()) and len(reports) == world
    if not res.ok:
        bad = [r for r, rep in sorted(reports.items()) if rep.get("check") is False]
        res.message = f"check failed on ranks {bad}" if bad else "some ranks did not report"
        res.failed_rank = bad[0] if bad else None
    return res


def launch_torchrun(spec: RunSpec | Any, rank_fn: RankFn | None = None) -> RunResult | None:
    """Run on the torchrun world; rank 0 gets the merged result, the others None."""
    import torch.distributed as dist

    from torch_backend import comm
    from torch_backend.worker import init, run_rank

    store = init(spec)
    report = (rank_fn or run_rank)(spec, store)
    world = dist.get_world_size()
    if report.get("error"):
        # the group may be broken: no gather; every rank speaks for itself
        return merge({report["rank"]: report}, {}, [], world, spec.backend)
    gathered = comm.gather_objects(report)
    dist.destroy_process_group()
    if report["rank"] != 0:
        return None
    return merge({rep["rank"]: rep for rep in gathered}, {}, [], world, spec.backend)
