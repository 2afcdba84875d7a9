"""The timing half of calibration (docs/running.md, "Performance"): ``lowering.calibration``'s
probes on real ranks, each a user's prepared call timed as ``shardc run --bench`` times one
(``worker.timed``); every rank runs the same probes in the same order (they are collectives).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import lowering
from lowering.calibration import DEFAULT_SIZES, PROBE_MODEL, Sample, probes
from spec_lang.ir import Mesh
from spec_lang.parser import parse_mesh
from torch_backend.data import block, global_tensor
from torch_backend.groups import MeshContext, context
from torch_backend.worker import Clock, count, prepared, rank_device, timed


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
    clock = Clock(device or torch.device("cpu"))
    out: list[Sample] = []
    for i, probe in enumerate(probes(mesh, sizes)):
        program = lowering.compile(probe.src, probe.dst, mesh, cost_model=PROBE_MODEL)
        x = block(program.src, mesh, global_tensor(program.src, device=clock.device), ctx.ranks[0])
        call = prepared(program, ctx)
        clock.run(call, x)  # warm-up: groups, buffers, the first connection
        _, seconds = timed(clock, call, x, iters)
        out += [Sample(s.axes, s.kind, s.bytes_max, t) for s, t in zip(program.steps, seconds) if s.is_collective]
        if on_probe is not None:
            on_probe(i)
    return out


def slowest(per_rank: Sequence[Sequence[Sample]]) -> list[Sample]:
    """Sample by sample, the slowest rank's time (every rank measured the same steps)."""
    return [Sample(s[0].axes, s[0].kind, s[0].bytes_max, max(x.seconds for x in s)) for s in zip(*per_rank)]


def calibrate_rank(spec: CalibrateSpec, store: Any) -> dict[str, Any]:
    """One rank of ``shardc calibrate`` (the launcher's ``rank_fn``); returns its report."""
    rank = dist.get_rank()
    mesh = parse_mesh(spec.mesh)
    device = rank_device(spec.backend)
    report: dict[str, Any] = {"rank": rank, "ok": False, "check": None, "error": None, "device": str(device)}
    try:  # rank 0 counts the probes done for the launcher's progress
        samples = measure(mesh, spec.sizes, spec.iters, ctx=context(mesh, timeout=spec.timeout), device=device,
                          on_probe=lambda i: count(store, "bench") if rank == 0 else None)
        report["samples"] = [(s.axes, s.kind, s.bytes_max, s.seconds) for s in samples]
        report["ok"] = True
    except Exception as e:
        report["error"] = f"{type(e).__name__}: {e}"
    return report
