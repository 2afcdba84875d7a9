"""``shardc calibrate --engine jax``'s timing: the calibration probes run as JAX programs.

The probes are ``lowering.calibration``'s (an all_gather, reduce_scatter, all_reduce and
all_to_all over each axis group at a few sizes), each compiled by the planner and run by
this engine as one jitted ``shard_map`` on the JAX devices; a sample's time is the median
over runs of one call, ``block_until_ready`` (one process drives every device, so there
is no slowest rank to wait for: the call returns when every device is done).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

import lowering
from jax_backend.arrays import from_blocks
from jax_backend.engine import device_mesh, shard_mapped
from lowering.calibration import DEFAULT_SIZES, PROBE_MODEL, Sample, fit_line, probes
from lowering.layout import local_shapes
from spec_lang.ir import Mesh


def measure(mesh: Mesh, sizes: Sequence[int] = DEFAULT_SIZES, iters: int = 5,
            on_probe: Callable[[int], None] | None = None) -> list[Sample]:
    """One sample per probe: its one step's (axes, kind, bytes_max) and median seconds."""
    jm = device_mesh(mesh)
    out = []
    for i, probe in enumerate(probes(mesh, sizes)):
        program = lowering.compile(probe.src, probe.dst, mesh, cost_model=PROBE_MODEL)
        blocks = [np.ones(s, dtype=np.float32) for s in local_shapes(program.src, mesh)]
        x = from_blocks(blocks, program.src, jm)
        fn = jax.jit(shard_mapped(program, jm))
        fn(x).block_until_ready()  # compiled and warm
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(x).block_until_ready()
            times.append(time.perf_counter() - t0)
        seconds = statistics.median(times)
        for step in program.steps:  # one step: the probe's collective
            if step.is_collective:
                out.append(Sample(step.axes, step.kind, step.bytes_max, seconds))
        if on_probe is not None:
            on_probe(i)
    return out


def measure_local(mesh: Mesh, sizes: Sequence[int] = DEFAULT_SIZES, iters: int = 5) -> float:
    """``local_beta``: seconds per byte of its output block a local step writes, the slope of
    the times of slices (``f32[e] -> f32[e@axis]``) over each mesh axis at ``sizes``. XLA
    copies a slice, at about the speed of a collective's bytes on CPU, which the bytes-first
    plans (a slice to split a reduction) do not pay for."""
    jm = device_mesh(mesh)
    written, seconds = [], []
    for axis in (a for a in mesh.names if mesh.axis_size(a) > 1):
        n = mesh.axis_size(axis)
        for size in sizes:
            e = max(n, -(-size // 4 // n) * n)
            program = lowering.compile(f"f32[{e}]", f"f32[{e}@{axis}]", mesh, cost_model=PROBE_MODEL)
            x = from_blocks([np.ones(s, dtype=np.float32) for s in local_shapes(program.src, mesh)], program.src, jm)
            fn = jax.jit(shard_mapped(program, jm))
            fn(x).block_until_ready()
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                fn(x).block_until_ready()
                times.append(time.perf_counter() - t0)
            written.append(e // n * 4)
            seconds.append(statistics.median(times))
    return fit_line(written, seconds)[1] if len(set(written)) > 1 else 0.0
