"""DTensor with shardc as its redistribution engine, off vs on in one run, on 8 gloo ranks (CPU).

    python bench/dtensor_engine.py [--part cases,overhead,model] [--iters 10] [--sizes medium]
                                   [--cases rd-pub-005,rd-pub-070] [--model-iters 5]
                                   [--compile-backend aot_eager] [--json out.json]

*cases*: the 62 public 8-rank cases of ``bench/cases/redistribute.jsonl`` (as
``bench/exec_vs_dtensor.py`` builds them: flattened meshes for every contiguous axis
group, inputs from the same blocks, ``_StridedShard`` where a dim's axis order is not
mesh order), each called as ``DTensor.redistribute(...).to_local()``, first on DTensor's
own path, then with ``torch_backend.dtensor_engine()`` (``--cases``: only those ids,
to rerun the slow ones with more iterations). A case's time is the median over
calls of the slowest rank; ``speedup = off / on``. Reported: the median speedup, the
median where DTensor's own plan moves at least twice the lower bound, the slowest case,
and how many results were wrong each way (DTensor's own path is wrong on uneven gathers
over a flattened mesh).

*overhead*: calls that move nothing (same placements through op dispatch's path, and a
``Replicate -> Shard`` that only slices locally) and a small repeated gather, timed per
call off and on: the engine's own cost on the hot path.

*model*: a Llama-style block (RMSNorm, attention, RMSNorm, SwiGLU MLP) under
``parallelize_module`` (ColwiseParallel / RowwiseParallel / SequenceParallel, tp=4) and
``fully_shard`` (dp=2) on a 2x4 mesh: forward and backward steps, eager and compiled
(``--compile-backend``), engine off vs on: step times, the largest loss and gradient
differences, and the engine's share of the redistributions.

Numbers on a 2-core machine with 8 ranks are dominated by scheduling (8 processes
time-share 2 cores); they compare the two paths on equal terms, not against hardware.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.exec_vs_dtensor import CASES, case_blocks, load_cases
from bench.gloo_world import report, run_world

WORLD = 8


def _cases(rank: int, iters: int, sizes: list[str], only: list[str]) -> list[dict[str, Any]]:
    import torch
    from torch.distributed.tensor import DTensor

    from lowering.placements import to_placements
    from torch_backend.data import expected_block
    from torch_backend.dtensor_switch import dtensor_engine, dtensor_engine_stats

    rows = []
    for c, size, s, d, m, dm, g, x in case_blocks(sizes, rank):
        if only and c["id"] not in only:
            continue
        row: dict[str, Any] = {"id": c["id"], "size": size, "src": str(s), "dst": str(d),
                               "dtensor_bytes": c["dtensor_default"]["bytes_sent_max"],
                               "lower_bound": c["lower_bound"]["bytes"]}
        sp, _ = to_placements(s, m, strided=True)
        dp, _ = to_placements(d, m, strided=True)
        shape = tuple(s.shape)
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        dt = DTensor.from_local(x, dm, sp, run_check=False, shape=torch.Size(shape), stride=stride)
        want = None if d.partial_axes else expected_block(d, m, g, rank)

        def call(dt: Any = dt, dm: Any = dm, dp: Any = dp) -> Any:
            return dt.redistribute(dm, dp).to_local()

        try:
            out = call()
            row["off_correct"] = None if want is None else bool(torch.equal(out, want))
            before = dtensor_engine_stats()
            with dtensor_engine():
                out = call()
            row["taken"] = dtensor_engine_stats()["taken"] > before["taken"]
            row["on_correct"] = None if want is None else bool(torch.equal(out, want))
            row["off_s"], row["on_s"] = _paired(call, iters)
        except Exception as e:  # DTensor's own path refuses some pairs
            row["error"] = f"{type(e).__name__}: {str(e)[:100]}"
        rows.append(row)
    return rows


def _paired(call: Any, iters: int) -> tuple[float, float]:
    """Median seconds of ``call`` with the engine off and on, the two timed in turn (which
    goes first alternates), each after a barrier, so drift in the machine's load hits both."""
    import torch.distributed as dist

    from torch_backend.dtensor_switch import dtensor_engine

    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(iters + 2):
        for on in ((False, True) if i % 2 else (True, False)):
            with dtensor_engine(on):
                dist.barrier()
                t0 = time.perf_counter()
                call()
                if i >= 2:
                    times[on].append(time.perf_counter() - t0)
    return statistics.median(times[False]), statistics.median(times[True])


def _merge_cases(gathered: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    merged = []
    for i, row in enumerate(gathered[0]):
        r = dict(row)
        for key in ("off_s", "on_s"):
            if key in r:
                r[key] = max(g[i][key] for g in gathered)
        for key in ("off_correct", "on_correct", "taken"):
            if r.get(key) is not None:
                r[key] = all(g[i][key] for g in gathered)
        merged.append(r)
    return merged


def _overhead(rank: int, iters: int) -> dict[str, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from torch_backend.dtensor_switch import dtensor_engine

    dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    r = distribute_tensor(torch.randn(64, 32), dm, [Replicate(), Replicate()])
    s = distribute_tensor(torch.randn(64, 32), dm, [Shard(0), Shard(1)])
    calls = {
        "R,R -> R,S(0) (local slice)": lambda: r.redistribute(dm, [Replicate(), Shard(0)]).to_local(),
        "S(0),S(1) -> S(0),S(1) (no change)": lambda: s.redistribute(dm, [Shard(0), Shard(1)]).to_local(),
        "S(0),S(1) -> R,R (repeated gather)": lambda: s.redistribute(dm, [Replicate(), Replicate()]).to_local(),
        "full_tensor of S(0),S(1)": lambda: s.full_tensor(),
    }
    out: dict[str, Any] = {}
    for name, fn in calls.items():
        n = iters * 10
        runs: dict[str, list[float]] = {"off": [], "on": []}
        for i in range(6):  # rounds of n calls, off and on in turn (which goes first alternating)
            for mode in (("off", "on") if i % 2 else ("on", "off")):
                with dtensor_engine(mode == "on"):
                    for _ in range(3):
                        fn()
                    torch.distributed.barrier()
                    t0 = time.perf_counter()
                    for _ in range(n):
                        fn()
                    runs[mode].append((time.perf_counter() - t0) / n)
        out[name] = {mode: statistics.median(ts) for mode, ts in runs.items()}
    return out


def _merge_overhead(gathered: list[dict[str, Any]]) -> dict[str, Any]:
    return {name: {mode: statistics.median(g[name][mode] for g in gathered) for mode in gathered[0][name]}
            for name in gathered[0]}


def rank_main(rank: int, store_path: str, parts: list[str], iters: int, sizes: list[str], model_iters: int,
              backend: str, only: list[str], out_path: str) -> None:
    import logging
    from datetime import timedelta

    import torch.distributed as dist

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)  # its "suboptimal" notes
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=300))
    row: dict[str, Any] = {}
    if "overhead" in parts:
        row["overhead"] = _overhead(rank, iters)
    if "cases" in parts:
        row["cases"] = _cases(rank, iters, sizes, only)
    if "model" in parts:
        from bench.dtensor_engine_model import model_rows

        row["model"] = model_rows(rank, model_iters, backend)

    def merge(gathered: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if "overhead" in gathered[0]:
            out["overhead"] = _merge_overhead([g["overhead"] for g in gathered])
        if "cases" in gathered[0]:
            out["cases"] = _merge_cases([g["cases"] for g in gathered])
        if "model" in gathered[0]:
            from bench.dtensor_engine_model import merge_model

            out["model"] = merge_model([g["model"] for g in gathered])
        return out

    report(row, out_path, merge)


def print_cases(rows: list[dict[str, Any]]) -> dict[str, Any]:
    print(f"{'case':<11} {'size':<6} {'off':>10} {'on':>10} {'speedup':>8}  off ok  on ok  src -> dst")
    ok = {True: "yes", False: "WRONG", None: "-"}
    ratios, heavy = [], []
    for r in rows:
        if "off_s" in r and "on_s" in r:
            sp = r["off_s"] / r["on_s"]
            ratios.append((sp, r["id"]))
            if r["dtensor_bytes"] >= 2 * r["lower_bound"]:
                heavy.append(sp)
            print(f"{r['id']:<11} {r['size']:<6} {r['off_s'] * 1e3:8.2f}ms {r['on_s'] * 1e3:8.2f}ms {sp:7.2f}x  "
                  f"{ok[r.get('off_correct')]:<6}  {ok[r.get('on_correct')]:<5}  {r['src']} -> {r['dst']}")
        else:
            print(f"{r['id']:<11} {r['size']:<6} error: {r.get('error', '-')[:80]}")
    summary = {
        "cases": len(ratios),
        "median_speedup": statistics.median(s for s, _ in ratios) if ratios else None,
        "heavy_cases": len(heavy),
        "median_speedup_where_dtensor_moves_2x_lb": statistics.median(heavy) if heavy else None,
        "slowest": min(ratios) if ratios else None,
        "taken": sum(1 for r in rows if r.get("taken")),
        "off_wrong": sum(1 for r in rows if r.get("off_correct") is False),
        "on_wrong": sum(1 for r in rows if r.get("on_correct") is False),
        "errors": sum(1 for r in rows if "error" in r),
    }
    s = summary
    if not ratios:
        print(f"\ncases: none timed; errors {s['errors']}")
        return summary
    heavy_median = s["median_speedup_where_dtensor_moves_2x_lb"]
    print(f"\ncases: median speedup {s['median_speedup']:.2f}x over {s['cases']} cases (target none < 0.91x: "
          f"slowest {s['slowest'][0]:.2f}x, {s['slowest'][1]}); where DTensor moves >= 2x the bound "
          f"{'-' if heavy_median is None else f'{heavy_median:.2f}x'} over {s['heavy_cases']} (target >= 1.5x); "
          f"engine took {s['taken']}/{len(rows)}; wrong: off {s['off_wrong']}, on {s['on_wrong']}; "
          f"errors {s['errors']}")
    return summary


def print_overhead(res: dict[str, Any]) -> None:
    print("\nper call (median over rounds, median rank):    off          on   on/off")
    for name, per in res.items():
        print(f"  {name:<40} {per['off'] * 1e6:8.1f}us {per['on'] * 1e6:8.1f}us {per['on'] / per['off']:7.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="overhead,cases,model")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--sizes", default="medium")
    ap.add_argument("--cases", default="", help="only these case ids (comma-separated), e.g. rd-pub-005,rd-pub-070")
    ap.add_argument("--model-iters", type=int, default=5)
    ap.add_argument("--compile-backend", default="aot_eager")
    ap.add_argument("--json", default=None, help="also write the rows and summaries here")
    args = ap.parse_args()
    if not CASES.is_file():
        print(f"cases not found at {CASES}", file=sys.stderr)
        return 2
    parts = args.part.split(",")
    t0 = time.time()
    only = [c for c in args.cases.split(",") if c]
    known = {c["id"] for c in load_cases()}
    if set(only) - known:
        print(f"unknown case ids: {', '.join(sorted(set(only) - known))}", file=sys.stderr)
        return 2
    res = run_world(rank_main, WORLD, parts, args.iters, args.sizes.split(","), args.model_iters,
                    args.compile_backend, only)
    import os

    print(f"8 gloo ranks on CPU ({os.cpu_count()} cores), {time.time() - t0:.0f}s in all")
    out: dict[str, Any] = {"raw": res}
    if "overhead" in res:
        print_overhead(res["overhead"])
    if "cases" in res:
        print()
        out["cases"] = print_cases(res["cases"])
    if "model" in res:
        from bench.dtensor_engine_model import print_model

        out["model"] = print_model(res["model"])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
