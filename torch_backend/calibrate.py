"""The timing half of calibration: run ``lowering.calibration``'s probes on real ranks.

Every rank runs the same probes in the same order (they are collectives): one warm-up
run, then ``iters`` runs, each after a barrier. A probe of one step (every probe today) is
timed as a user's ``redistribute`` runs it (its bound call: the kind's fast runner where
it has one); a program of several steps, step by step with the executor's ``timings``. A rank's sample is its median; the launcher keeps the slowest rank's
(``slowest``), as ``shardc run --bench`` and the benchmarks do. The fit is torch-free
(``lowering.calibration.fit_model``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import lowering
from lowering.calibration import DEFAULT_SIZES, PROBE_MODEL, Sample, probes
from spec_lang.ir import Mesh
from spec_lang.parser import parse_mesh
from torch_backend import comm
from torch_backend.data import block, global_tensor
from torch_backend.executor import execute
from torch_backend.groups import MeshContext, context


@dataclass
class CalibrateSpec:
    """What ``shardc calibrate`` asked for (picklable: it travels to every rank)."""

    mesh: str
    sizes: tuple[int, ...] = DEFAULT_SIZES
    iters: int = 5
    backend: str = "gloo"
    timeout: float = 60.0


def measure(mesh: Mesh, sizes: Sequence[int], iters: int, *, ctx: MeshContext | None = None,
            device: torch.device | None = None, on_probe: Callable[[int], None] | None = None) -> list[Sample]:
    """This rank's samples (median over ``iters`` runs) of every probe; collective: every
    rank of the mesh calls it with the same arguments."""
    ctx = ctx if ctx is not None else context(mesh)
    device = device or torch.device("cpu")
    rank = ctx.ranks[0]
    out: list[Sample] = []
    for i, probe in enumerate(probes(mesh, sizes)):
        program = lowering.compile(probe.src, probe.dst, mesh, cost_model=PROBE_MODEL)
        x = block(program.src, mesh, global_tensor(program.src, device=device), rank)
        run = _timed(program, ctx)
        run(x)  # warm-up: groups, buffers, the first connection
        runs: list[list[float]] = []
        for _ in range(iters):
            comm.barrier()
            runs.append(run(x))
        for j, step in enumerate(program.steps):
            if step.is_collective:
                out.append(Sample(step.axes, step.kind, step.bytes_max,
                                  statistics.median(r[j] for r in runs)))
        if on_probe is not None:
            on_probe(i)
    return out


def _timed(program: lowering.Program, ctx: MeshContext) -> Callable[[torch.Tensor], list[float]]:
    """A run of ``program`` on a block that returns each step's seconds: a one-step program
    timed as a user's call runs it (its bound call), a longer one by the interpreter."""
    if len(program.steps) != 1:
        def steps(x: torch.Tensor) -> list[float]:
            timings: list[float] = []
            execute(program, x, ctx=ctx, timings=timings)
            return timings

        return steps
    from torch_backend.api import bound_for

    bound = bound_for((program.src,), (program.dst,), ctx.mesh, ctx=ctx, programs=(program,))

    def call(x: torch.Tensor) -> list[float]:
        t0 = time.perf_counter()
        y = bound.call_one(bound.check(x))
        if y.is_cuda:
            torch.cuda.synchronize(y.device)
        return [time.perf_counter() - t0]

    return call


def slowest(per_rank: Sequence[Sequence[Sample]]) -> list[Sample]:
    """Sample by sample, the slowest rank's time (every rank measured the same steps)."""
    return [Sample(s[0].axes, s[0].kind, s[0].bytes_max, max(x.seconds for x in s)) for s in zip(*per_rank)]


def calibrate_rank(spec: CalibrateSpec, store: Any) -> dict[str, Any]:
    """One rank of ``shardc calibrate`` (the launcher's ``rank_fn``); returns its report."""
    rank = dist.get_rank()
    report: dict[str, Any] = {"rank": rank, "ok": False, "check": None, "error": None}
    mesh = parse_mesh(spec.mesh)
    device = torch.device("cuda", torch.cuda.current_device()) if spec.backend == "nccl" else torch.device("cpu")
    report["device"] = str(device)

    def done(i: int) -> None:
        if rank == 0:  # the launcher's progress reads this counter
            try:
                store.add("shardc/bench", 1)
            except Exception:
                pass

    try:
        samples = measure(mesh, spec.sizes, spec.iters, ctx=context(mesh, timeout=spec.timeout),
                          device=device, on_probe=done)
        report["samples"] = [(s.axes, s.kind, s.bytes_max, s.seconds) for s in samples]
        report["ok"] = True
    except Exception as e:
        report["error"] = f"{type(e).__name__}: {e}"
    return report
