"""``shardc run --engine jax``: a program run on this process's JAX devices, one per rank.

Every rank's block of a sample tensor (a pending sum: a different addend per coordinate of
its summed axes) goes through the program as one jitted ``shard_map``
(``engine.blocks_call``: any type, uneven ones included); ``check`` compares every
rank's output with ``lowering.simulate``'s, ``bench`` times repeated calls
(``block_until_ready``, median).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import jax
import numpy as np

import lowering
from jax_backend.engine import blocks_call, blocks_out, device_mesh
from lowering.layout import local_slices
from lowering.program import Program
from spec_lang.ir import TensorType


def sample_blocks(t: TensorType, program: Program) -> list[np.ndarray]:
    mesh = program.mesh
    full = (np.arange(int(np.prod(t.shape)), dtype=np.int64) % 251).reshape(t.shape)
    summed = [mesh.index(a) for a in t.partial_axes]
    out = []
    for r, sl in enumerate(local_slices(t, mesh)):
        shift = sum(mesh.coords(r)[i] for i in summed)
        out.append(((full + shift) % 251)[sl].astype(np.dtype(jax.numpy.dtype(t.dtype))))
    return out


def run_program(program: Program, *, check: bool = False, bench: int = 0) -> dict[str, Any]:
    """Run ``program`` once (cold: compiled here), then ``bench`` timed runs; the report."""
    jm = device_mesh(program.mesh)
    blocks = sample_blocks(program.src, program)
    t0 = time.perf_counter()
    fn, x = blocks_call(program, blocks, jm)
    y = fn(x)
    y.block_until_ready()
    report: dict[str, Any] = {"ok": True, "ranks": program.mesh.size, "cold_s": time.perf_counter() - t0,
                              "device": jax.devices()[0].platform, "check": None, "time_s": None}
    if check:
        want = lowering.simulate(program, blocks)
        got = blocks_out(program, y)
        bad = [r for r, (a, b) in enumerate(zip(got, want)) if b is None or a.shape != b.shape or not np.array_equal(a, b)]
        report["check"] = not bad
        report["ok"] = not bad
        if bad:
            report["error"] = f"rank {bad[0]}'s output differs from lowering.simulate's ({len(bad)} ranks do)"
    if bench:
        times = []
        for _ in range(bench):
            t1 = time.perf_counter()
            fn(x).block_until_ready()
            times.append(time.perf_counter() - t1)
        report["time_s"] = statistics.median(times)
    return report
