"""``shardc calibrate``: fit a cost model (alpha and beta per group of mesh axes) to the
collective times of probes run on local ranks, or on JAX devices (docs/running.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from lowering.checks import check_timeout_s
from spec_lang.errors import SpecError
from torch_backend.cli.output import json_text, require_torch

Timed = tuple[list[Any], int, str, float | None]  # samples, ranks, backend, XLA's local beta (JAX only)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mesh", required=True, help="mesh, e.g. dp=2,tp=4 (its size is the number of ranks)")
    p.add_argument("--engine", choices=("torch", "jax"), default="torch",
                   help="torch: ranks of torch.distributed (default); jax: the JAX devices of this process "
                   "(on CPU, as many as the mesh has ranks), the fit the JAX engine plans with")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="gloo",
                   help="the backend to calibrate (default gloo; auto: NCCL when every rank can have a GPU)")
    p.add_argument("--out", default=None, metavar="PATH", help="write the fitted model here as JSON")
    p.add_argument("--sizes", default="1K,16K,256K,4M",
                   help="message sizes (bytes of the full tensor, K/M suffixes), default 1K,16K,256K,4M")
    p.add_argument("--iters", type=int, default=5, metavar="N", help="timed runs per probe, after a warm-up (default 5)")
    p.add_argument("--json", action="store_true", help="print the model and the fit as JSON instead of text")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds each collective may take before the ranks give up (default 60)")


def run(args: argparse.Namespace) -> int:
    from lowering.calibration import calibration_json, fit_model, parse_sizes, probes
    from spec_lang import parse_mesh

    mesh = parse_mesh(args.mesh)
    if args.engine != "jax":
        require_torch("calibrate")
    sizes = parse_sizes(args.sizes)
    if args.iters < 1:
        raise SpecError("--iters must be >= 1", text=str(args.iters), pos=0, hint="e.g. --iters 5")
    check_timeout_s(args.timeout, "--timeout", "give seconds, e.g. --timeout 30")
    if mesh.size < 2 or not probes(mesh, sizes):
        raise SpecError(f"the mesh {mesh} has no axis of size > 1: nothing to calibrate", text=args.mesh, pos=0,
                        hint="give a mesh with 2 or more ranks, e.g. --mesh dp=2,tp=4")
    if args.out is not None:  # an --out that cannot be written, refused before a minute on the ranks
        parent = os.path.dirname(os.path.abspath(args.out))
        if os.path.isdir(args.out) or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            raise SpecError(f"cannot write the cost model to {args.out!r}", text=args.out, pos=0,
                            hint="give a file path in an existing, writable directory, e.g. --out model.json")
    timed = _timed_jax(args, mesh, sizes) if args.engine == "jax" else _timed_ranks(args, mesh, sizes)
    if isinstance(timed, int):  # failed, or a torchrun rank but 0
        return timed
    samples, world, backend, local_beta = timed
    model, fits = fit_model(samples, mesh)
    if local_beta is not None:
        model = dataclasses.replace(model, local_beta=local_beta)
    data = calibration_json(model, fits, backend=backend, mesh=mesh, sizes=sizes, iters=args.iters)
    if args.out is not None:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(json_text(data) + "\n")
    if args.json:
        print(json_text({"ok": True, "out": args.out, "model": data, "samples": [
            {"axes": list(s.axes), "kind": s.kind, "bytes_max": s.bytes_max, "seconds": s.seconds} for s in samples]}))
        return 0
    fit = data["fit"]
    print(f"calibrated {backend} on {world} ranks, mesh {data['mesh']}: {len(samples)} samples "
          f"({len(fit['sizes'])} sizes x 4 collectives per group, median of {fit['iters']} runs, slowest rank)")
    print(f"  {'axes':<12} {'ranks':>5} {'alpha':>10} {'beta':>12} {'bandwidth':>11} {'R^2':>6}")
    for g in fit["groups"]:
        bw = f"{1 / g['beta'] / 1e9:8.2f} GB/s" if g["beta"] > 0 else "       inf"
        print(f"  {','.join(g['axes']):<12} {g['group_size']:>5} {g['alpha'] * 1e6:7.1f} us "
              f"{g['beta'] * 1e9:8.4f} ns/B {bw:>11} {g['r2']:6.3f}")
    if args.out is not None:
        print(f"wrote {args.out}: use it with compile(..., cost_model={args.out!r}) or shardc plan --cost-model {args.out}")
    else:
        print("(not saved: pass --out model.json to keep it)")
    return 0


def _timed_ranks(args: argparse.Namespace, mesh: Any, sizes: tuple[int, ...]) -> Timed | int:
    """The probes on the mesh's ranks (local ones, or the torchrun world): the slowest rank's
    samples; else the exit code (1 where they failed, said here; 0 on a torchrun rank but 0)."""
    from lowering.calibration import Sample, probes
    from torch_backend import launcher
    from torch_backend.cli.run_cmd import launch

    launcher.prepare_local_ranks(mesh.size, mesh)
    from torch_backend.calibrate import CalibrateSpec, calibrate_rank, slowest

    spec = CalibrateSpec(mesh=args.mesh, sizes=sizes, iters=args.iters, timeout=args.timeout)
    result = launch(spec, mesh.size, args, len(probes(mesh, sizes)), calibrate_rank, command="shardc calibrate",
                    runs="probes", doing="timing the probes")
    if result is None:
        return 0
    if not result.ok:
        if args.json:
            print(json_text({"ok": False, "error": result.message, "failed_rank": result.failed_rank,
                             "text": None, "position": None, "hint": "re-run, or raise --timeout"}))
        print(f"calibration FAILED on {result.world} ranks ({result.backend}):\n{result.message}", file=sys.stderr)
        return 1
    samples = slowest([[Sample(tuple(a), k, b, t) for a, k, b, t in rep["samples"]]
                       for _, rep in sorted(result.reports.items())])
    return samples, result.world, result.backend, None


def _timed_jax(args: argparse.Namespace, mesh: Any, sizes: tuple[int, ...]) -> Timed:
    """The probes on this process's JAX devices (``jax_backend.timing``), and XLA's copy of a
    local step's block (about the speed of a collective's bytes on CPU)."""
    from torch_backend.cli.run_cmd import jax_devices

    jax_devices(mesh)
    import jax

    from jax_backend.timing import measure, measure_local

    samples = measure(mesh, sizes, args.iters)
    return samples, mesh.size, f"jax-{jax.devices()[0].platform}", measure_local(mesh, sizes, args.iters)
