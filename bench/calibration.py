"""Does the calibrated cost model rank the public cases as the wire does? 8 gloo ranks (CPU).

    python bench/calibration.py [--iters 10] [--sizes small,medium] [--cal-sizes 1K,16K,256K,4M]
                                [--cal-iters 5] [--json out.json]

In one world of 8 gloo ranks (a FileStore in a temporary directory), for each mesh of the
8-rank cases of ``bench/cases/redistribute.jsonl`` (the ``large`` ones left out, as in
``bench/exec_vs_dtensor.py``):

1. calibrate: time ``lowering.calibration``'s probes on every axis group of the mesh
   (``torch_backend.calibrate.measure``, what ``shardc calibrate`` runs), take the slowest
   rank of each sample and fit the model (every rank fits the same gathered samples, so
   every rank compiles the same programs);
2. compile each case with that model, at the case's size (*small*) and scaled to about
   2**18 elements (*medium*, ``exec_vs_dtensor.scaled``), and time the bound program:
   2 warm-up calls, then ``--iters`` calls each after a barrier; a case's time is the
   median over calls of the slowest rank.

Reported: each case's predicted ``program.cost.time_s`` and measured time, and the
Spearman rank correlation between them, per size and over both sizes pooled. For
comparison, the same correlation for the program's bytes alone (what the default
bytes-first model ranks by) and its collective count. Where the calibrated model picks
another plan than the default, the default's plan is timed too, and the bench reports
how often the calibrated plan was the faster one. Spearman is Pearson's correlation
of the ranks, ties given their average rank.

Numbers on a 2-core machine with 8 ranks are dominated by scheduling (8 processes
time-share 2 cores): the fitted alpha is milliseconds, not the microseconds of a network.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.exec_vs_dtensor import (
    MEDIUM,
    WORLD,
    _time,
    load_cases,
    scaled,
)
from lowering.calibration import DEFAULT_SIZES, parse_sizes
from spec_lang.parser import parse, parse_mesh


def average_ranks(values: Any) -> np.ndarray:
    """0-based ranks of ``values``; tied values share the average of their ranks."""
    v = np.asarray(values, dtype=np.float64)
    _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))  # rank of each distinct value's first copy
    return (first + (counts - 1) / 2.0)[inverse]


def spearman(x: Any, y: Any) -> float:
    """Spearman's rank correlation of two equal-length sequences; nan when either is constant."""
    rx, ry = average_ranks(x), average_ranks(y)
    if rx.size < 2 or rx.size != ry.size:
        return float("nan")
    dx, dy = rx - rx.mean(), ry - ry.mean()
    denom = float(np.sqrt(np.sum(dx * dx) * np.sum(dy * dy)))
    return float(np.sum(dx * dy) / denom) if denom > 0 else float("nan")


def rank_main(rank: int, store_path: str, iters: int, sizes: list[str], cal_sizes: list[int], cal_iters: int,
              out_path: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    import lowering
    from lowering.calibration import Sample, calibration_json, fit_model
    from torch_backend.bound import bind
    from torch_backend.calibrate import measure, slowest
    from torch_backend.data import block, global_tensor
    from torch_backend.groups import context

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=300))
    cases = load_cases()
    models: dict[str, Any] = {}
    rows = []
    for mesh_text in sorted({c["mesh"] for c in cases}):
        m = parse_mesh(mesh_text)
        ctx = context(m)
        mine = measure(m, cal_sizes, cal_iters, ctx=ctx)
        gathered: list[Any] = [None] * WORLD
        dist.all_gather_object(gathered, [(s.axes, s.kind, s.bytes_max, s.seconds) for s in mine])
        samples = slowest([[Sample(*t) for t in g] for g in gathered])
        model, fits = fit_model(samples, m)
        models[mesh_text] = calibration_json(model, fits, backend="gloo", mesh=m, sizes=cal_sizes, iters=cal_iters)
        for c in (c for c in cases if c["mesh"] == mesh_text):
            for size in sizes:
                s, d = parse(c["src"]), parse(c["dst"])
                if size == "medium":
                    s, d = scaled(s, d, MEDIUM)
                prog = lowering.compile(s, d, m, cost_model=model)
                x = block(prog.src, m, global_tensor(prog.src), rank)
                row = {"id": c["id"], "mesh": mesh_text, "size": size, "src": str(s), "dst": str(d),
                       "predicted_s": prog.cost.time_s, "bytes_sent_max": prog.cost.bytes_sent_max,
                       "collectives": prog.cost.collectives,
                       "measured_s": _time(partial(bind(prog, ctx).run_one, x), iters)}
                default = lowering.compile(s, d, m)
                if default.steps != prog.steps:  # the calibrated model chose another plan: time both
                    row["default_bytes_sent_max"] = default.cost.bytes_sent_max
                    row["default_collectives"] = default.cost.collectives
                    row["default_measured_s"] = _time(partial(bind(default, ctx).run_one, x), iters)
                rows.append(row)
    everyone: list[Any] = [None] * WORLD
    dist.all_gather_object(everyone, rows)
    if rank == 0:
        for i, row in enumerate(rows):
            for key in ("measured_s", "default_measured_s"):
                if key in row:
                    row[key] = max(g[i][key] for g in everyone)
        Path(out_path).write_text(json.dumps({"rows": rows, "models": models}))
    dist.barrier()
    dist.destroy_process_group()


def report(rows: list[dict[str, Any]], models: dict[str, Any]) -> dict[str, Any]:
    print("calibrated models (alpha, beta per group; R^2 of the fit):")
    for mesh, data in models.items():
        groups = "  ".join(f"{','.join(g['axes'])}: {g['alpha'] * 1e6:.0f}us {g['beta'] * 1e9:.2f}ns/B "
                           f"R2={g['r2']:.2f}" for g in data["fit"]["groups"])
        print(f"  {mesh:<15} {groups}")
    print(f"\n{'case':<11} {'size':<6} {'mesh':<15} {'colls':>5} {'bytes':>9} {'predicted':>11} {'measured':>11}")
    for r in rows:
        print(f"{r['id']:<11} {r['size']:<6} {r['mesh']:<15} {r['collectives']:>5} {r['bytes_sent_max']:>9} "
              f"{r['predicted_s'] * 1e3:9.3f}ms {r['measured_s'] * 1e3:9.3f}ms")
    summary: dict[str, Any] = {}
    for label in [*sorted({r["size"] for r in rows}, reverse=True), "pooled"]:
        sel = [r for r in rows if label in ("pooled", r["size"])]
        measured = [r["measured_s"] for r in sel]
        summary[label] = {
            "cases": len(sel),
            "spearman_predicted_vs_measured": spearman([r["predicted_s"] for r in sel], measured),
            "spearman_bytes_vs_measured": spearman([r["bytes_sent_max"] for r in sel], measured),
            "spearman_collectives_vs_measured": spearman([r["collectives"] for r in sel], measured),
        }
    changed = [r for r in rows if "default_measured_s" in r]
    if changed:
        ratios = [r["measured_s"] / r["default_measured_s"] for r in changed]
        summary["changed_plans"] = {
            "cases": len(changed),
            "median_time_ratio_calibrated_over_default": statistics.median(ratios),
            "calibrated_faster": sum(q < 1 for q in ratios),
        }
        print(f"\nthe calibrated model chose another plan than the bytes-first default in {len(changed)} of "
              f"{len(rows)} cases: measured time calibrated plan / default plan, median "
              f"{statistics.median(ratios):.2f}, calibrated faster in {sum(q < 1 for q in ratios)}")
    print("\nSpearman rank correlation with the measured time (slowest rank, median of calls):")
    for label, s in summary.items():
        if label == "changed_plans":
            continue
        print(f"  {label:<7} over {s['cases']:>3} cases: calibrated time_s {s['spearman_predicted_vs_measured']:.3f}"
              f"   (bytes alone {s['spearman_bytes_vs_measured']:.3f}, "
              f"collectives alone {s['spearman_collectives_vs_measured']:.3f})")
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--iters", type=int, default=10, help="timed calls per case")
    ap.add_argument("--sizes", default="small,medium", help="case sizes: small (as recorded), medium (~2**18 elements)")
    ap.add_argument("--cal-sizes", default=None, help="calibration message sizes (default 1K,16K,256K,4M)")
    ap.add_argument("--cal-iters", type=int, default=5, help="timed runs per calibration probe")
    ap.add_argument("--json", default=None, help="also write rows, models and summary here")
    args = ap.parse_args(argv)
    cal_sizes = list(parse_sizes(args.cal_sizes) if args.cal_sizes else DEFAULT_SIZES)
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        t0 = time.time()
        store = os.path.join(tmp, "store")  # a FileStore: no port another process could take
        mp.spawn(rank_main, args=(store, args.iters, args.sizes.split(","), cal_sizes, args.cal_iters, out),
                 nprocs=WORLD, join=True)
        data = json.loads(Path(out).read_text())
    print(f"8 gloo ranks on CPU ({os.cpu_count()} cores), {args.iters} timed calls per case, "
          f"{time.time() - t0:.0f}s in all\n")
    summary = report(data["rows"], data["models"])
    if args.json:
        Path(args.json).write_text(json.dumps({**data, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
