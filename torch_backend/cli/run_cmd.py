"""``shardc run``: compile a redistribution and run it on real ranks, one process per rank
on this machine or the torchrun world (docs/running.md, "One machine").
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from lowering.checks import check_timeout_s
from spec_lang.errors import SpecError
from torch_backend.cli.output import json_text, require_torch, time_text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="source type, e.g. 'f32[12@(dp,tp),10]'")
    p.add_argument("dst", help="destination type, e.g. 'f32[12@tp,10]'")
    p.add_argument("--mesh", required=True, help="mesh, e.g. dp=2,tp=4 (its size is the number of ranks)")
    p.add_argument("--to-mesh", default=None, metavar="MESH",
                   help="move to DST laid out on this mesh over named ranks (a cross-mesh run over the union "
                   "of both meshes' ranks), e.g. --mesh 'fsdp=4@[0-3]' --to-mesh 'rep=2,tp=2@[4-7]'")
    p.add_argument("--engine", choices=("torch", "jax"), default="torch",
                   help="torch: one process per rank (default); jax: this process's JAX devices, one per rank, "
                   "the program as one shard_map (on CPU, --xla_force_host_platform_device_count is set for you)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto: NCCL when every rank can have its own GPU, else gloo on CPU")
    p.add_argument("--dtype", default=None, help="run with this dtype instead of the types' (f32, bf16, i32, ...)")
    p.add_argument("--check", action="store_true", help="verify every rank's output against the destination type")
    p.add_argument("--bench", type=int, default=0, metavar="N",
                   help="time N runs after a warm-up: median per step and in total (max over ranks)")
    p.add_argument("--json", action="store_true",
                   help='print {"ok", "ranks", "time_s", "steps": [...]} instead of text')
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds each collective may take before the ranks give up (default 60)")


def run(args: argparse.Namespace) -> int:
    from lowering.cross_mesh import CrossProgram
    from torch_backend import launcher  # torch-free until a rank or the store needs torch
    from torch_backend.run_spec import RunSpec, compile_spec

    if args.bench < 0:
        raise SpecError("--bench must be >= 0", hint="give the number of timed runs, e.g. --bench 20")
    if args.engine == "jax":
        return _run_jax(args)
    require_torch("run")
    check_timeout_s(args.timeout, "--timeout", "give seconds, e.g. --timeout 30")
    spec = RunSpec(mesh=args.mesh, src=args.src, dst=args.dst, dtype=args.dtype, check=args.check,
                   bench=args.bench, timeout=args.timeout, to_mesh=args.to_mesh)
    program = compile_spec(spec)  # every SpecError before any process starts
    mesh: Any
    if isinstance(program, CrossProgram):  # --to-mesh: the ranks of both meshes
        world, mesh = program.world, f"{program.src_mesh} and {program.dst_mesh}"
    else:
        world, mesh = program.mesh.size, program.mesh
    if launcher.under_torchrun() and int(os.environ["WORLD_SIZE"]) != world:
        raise SpecError(f"torchrun started {os.environ['WORLD_SIZE']} ranks but the mesh {mesh} has {world}",
                        hint=f"use torchrun --nproc-per-node ... so that there are {world} ranks")
    launcher.prepare_local_ranks(world, mesh)
    if not args.json and (not launcher.under_torchrun() or os.environ.get("RANK") == "0"):
        print(program, flush=True)  # compiled before any rank starts: show it while they do
    spec.progress_bar = bool(spec.bench >= 20 and not args.json and sys.stderr.isatty())  # under torchrun
    result = launch(spec, world, args, spec.bench)
    if result is None:  # a torchrun rank but 0
        return 0
    _print(args, program, result)
    return 0 if result.ok else 1


def launch(spec: Any, world: int, args: argparse.Namespace, counted: int, rank_fn: Any = None, **shown: Any) -> Any:
    """``spec`` on ``world`` local ranks, progress on stderr (``counted`` units; ``shown``:
    ``RunProgress``'s words), or on the torchrun world: the merged result (None on a torchrun
    rank but 0). Called once the program is shown: choosing the backend may import torch."""
    from torch_backend import launcher
    from torch_backend.cli.progress import RunProgress

    spec.backend = launcher.choose_backend(args.backend, world)
    if launcher.under_torchrun():
        return launcher.launch_torchrun(spec, rank_fn)
    progress = RunProgress(world, spec.backend, counted, rich=sys.stderr.isatty(), plain=not args.json, **shown)
    try:
        return launcher.launch_local(spec, world, on_progress=progress, rank_fn=rank_fn)
    finally:
        progress.close()


def jax_devices(mesh: Any) -> None:
    """Before jax loads: a CPU device per rank of ``mesh``, unless XLA_FLAGS names a count."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={mesh.size}".strip()


def _run_jax(args: argparse.Namespace) -> int:
    """``--engine jax``: the program on this process's JAX devices (``jax_backend.local_run``)."""
    import lowering
    from spec_lang import parse_mesh
    from spec_lang.ir import canonical_dtype

    if args.to_mesh is not None:
        raise SpecError("--engine jax runs on one mesh", text=args.to_mesh, pos=0,
                        hint="leave out --to-mesh, or use --engine torch for a cross-mesh run")
    mesh = parse_mesh(args.mesh)
    src, dst = lowering.resolve(args.src, mesh)[0], lowering.resolve(args.dst, mesh)[0]
    if args.dtype is not None:
        name = canonical_dtype(args.dtype)
        if name is None:
            raise SpecError(f"unknown dtype {args.dtype!r}", text=args.dtype, pos=0, hint="e.g. --dtype f32")
        src, dst = src.replace(dtype=name), dst.replace(dtype=name)
    jax_devices(mesh)
    import jax

    if len(jax.devices()) < mesh.size:
        raise SpecError(f"the mesh {mesh} needs {mesh.size} JAX devices, this process has {len(jax.devices())}",
                        text=args.mesh, pos=0, hint="set XLA_FLAGS=--xla_force_host_platform_device_count=N on CPU")
    from jax_backend import default_cost_model, describe
    from jax_backend.local_run import run_program

    program = lowering.compile(src, dst, mesh, cost_model=default_cost_model(mesh))
    if not args.json:
        print(program)
        print("\n".join(["lowered to one jax.shard_map:", *describe(program)]), flush=True)
    report = run_program(program, check=args.check, bench=args.bench)
    if args.json:
        print(json_text({**report, "engine": "jax", "steps": [s.to_json() for s in program.steps],
                         "jax": describe(program), "bench_runs": args.bench, "cost": program.cost.to_json()}))
        return 0 if report["ok"] else 1
    print(f"ran on {report['ranks']} JAX devices ({report['device']}, one process): "
          f"{'ok' if report['ok'] else 'FAILED'}")
    if not report["ok"]:
        print(report["error"], file=sys.stderr)
        return 1
    if args.check:
        print(f"check: every rank holds what lowering.simulate computes for {program.dst}")
    if args.bench:
        print(f"time (median of {args.bench} runs): {time_text(report['time_s'])}")
    else:
        print(f"time: {time_text(report['cold_s'])} (the first call: planned, compiled and run)")
    return 0


def _print(args: argparse.Namespace, program: Any, result: Any) -> None:
    """The report: a cross-mesh run is timed as a whole; one mesh's steps each (the slowest rank's)."""
    reports = result.reports.values()
    cross = args.to_mesh is not None
    benched = bool(args.bench and result.ok)
    steps = program.to_json()["steps"] if cross else [s.to_json() for s in program.steps]
    times = [max(r["bench_steps_s"][i] for r in reports) for i in range(len(steps))] if benched and not cross else []
    total = max((r["bench_total_s"] if benched else r.get("time_s", 0.0) for r in reports), default=0.0)
    device = next((r.get("device") for r in reports if r.get("device")), "cpu")
    if args.json:
        out = {"ok": result.ok, "ranks": result.world, "backend": result.backend, "device": device, "time_s": total,
               "steps": [{**s, "time_s": t} for s, t in zip(steps, times)] or steps, "bench_runs": args.bench,
               "check": all(r.get("check") for r in reports) if args.check and result.ok else None,
               "cost": program.cost.to_json()}
        if not result.ok:
            out.update(failed_rank=result.failed_rank, error=result.message, rank_reports=[
                {k: v for k, v in r.items() if k in ("rank", "ok", "error", "failed_after_s")}
                for _, r in sorted(result.reports.items())])
        print(json_text(out))
        return
    print(f"ran on {result.world} ranks ({result.backend}, {device}): {'ok' if result.ok else 'FAILED'}")
    if not result.ok:
        print(result.message, file=sys.stderr)
        return
    if args.check:
        print(f"check: every rank holds its block of {program.dst}"
              + (f" on {program.dst_mesh}, the others None" if cross else ""))
    if not args.bench:
        print(f"time: {time_text(total)} (one cold run, slowest rank; use --bench N for steady-state times)")
        return
    print(f"time (median of {args.bench} runs, slowest rank):" + (f" {time_text(total)}" if cross else ""))
    width = max((len(s.describe()) for s in program.steps), default=5)
    for i, t in enumerate(times):
        print(f"  {i + 1}. {program.steps[i].describe():<{width}}  {time_text(t)}")
    if not cross:
        print(f"     {'total':<{width}}  {time_text(total)}")
