"""Wall time of shardc's redistribute vs DTensor.redistribute on 8 gloo ranks (CPU).

    python bench/exec_vs_dtensor.py [--iters 20] [--sizes small,medium] [--json out.json]

Every 8-rank case of ``bench/cases/redistribute.jsonl`` runs at two sizes: *small* (its shapes)
and *medium* (one dim scaled so the global tensor has about 2**18 elements; the
largest dim that neither side shards is scaled when there is one, so the layout's
unevenness is kept). Each implementation gets 2 warm-up calls, then ``--iters`` timed
calls, each after a barrier; a case's time is the median over calls of the slowest
rank. DTensor gets flattened meshes for every contiguous axis group (as its recorded
plans do), and its inputs are built with ``DTensor.from_local`` from the same blocks, in
the ``_StridedShard`` form where a dim's axis order is not mesh order.

Reported per case: both times, ``speedup = dtensor / shardc``, and whether DTensor's
output was right. Summary: the median speedup, and the median over the cases where
DTensor's default plan moves at least twice the lower bound (the recorded
``dtensor_default.bytes_sent_max`` vs ``lower_bound.bytes``, measured at the case
size; the plans' shapes do not change with size).

Numbers on a 2-core machine with 8 ranks are dominated by scheduling (8 processes
time-share 2 cores); they compare the two on equal terms, not against hardware.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spec_lang.ir import Dim, TensorType
from spec_lang.parser import parse, parse_mesh

REPO = Path(__file__).resolve().parents[1]
CASES = REPO / "bench" / "cases" / "redistribute.jsonl"
WORLD = 8
MEDIUM = 2**18


def scaled(src: TensorType, dst: TensorType, target: int) -> tuple[TensorType, TensorType]:
    f = max(1, target // max(1, src.numel))
    if f == 1:
        return src, dst
    free = [i for i in range(src.ndim) if not src.dims[i].axes and not dst.dims[i].axes]
    k = max(free, key=lambda i: src.dims[i].size) if free else 0

    def grow(t: TensorType) -> TensorType:
        dims = tuple(Dim(d.size * f, d.axes) if i == k else d for i, d in enumerate(t.dims))
        return t.replace(dims=dims)

    return grow(src), grow(dst)


def load_cases() -> list[dict[str, Any]]:
    out = []
    for line in CASES.read_text().splitlines():
        c = json.loads(line)
        if parse_mesh(c["mesh"]).size == WORLD and "large" not in c["tags"]:
            out.append(c)
    return out


def _time(fn: Any, iters: int) -> float:
    import torch.distributed as dist

    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _flatten_all(dm: Any, names: tuple[str, ...]) -> None:
    for i in range(len(names)):
        for j in range(i + 2, len(names) + 1):
            dm[names[i:j]]._flatten()


def case_blocks(sizes: list[str], rank: int) -> Iterator[tuple[Any, ...]]:
    """Each public case at each size, on this rank of a gloo world: (case, size, src type,
    dst type, Mesh, DeviceMesh, global tensor, this rank's block). One DeviceMesh per mesh,
    with every contiguous axis group flattened (what DTensor's best plans need)."""
    from torch.distributed.device_mesh import init_device_mesh

    from torch_backend.data import block, global_tensor

    meshes: dict[str, Any] = {}
    for c in load_cases():
        m = parse_mesh(c["mesh"])
        if c["mesh"] not in meshes:
            meshes[c["mesh"]] = init_device_mesh("cpu", m.sizes, mesh_dim_names=m.names)
            _flatten_all(meshes[c["mesh"]], m.names)
        for size in sizes:
            s, d = parse(c["src"]), parse(c["dst"])
            if size == "medium":
                s, d = scaled(s, d, MEDIUM)
            g = global_tensor(s)
            yield c, size, s, d, m, meshes[c["mesh"]], g, block(s, m, g, rank)


def rank_main(rank: int, store_path: str, iters: int, sizes: list[str], out_path: str) -> None:
    import logging
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    import lowering
    from lowering.placements import to_placements
    from torch_backend import redistribute
    from torch_backend.data import expected_block

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)  # its "suboptimal" notes
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    rows = []
    for c, size, s, d, m, dm, g, x in case_blocks(sizes, rank):
        row = {"id": c["id"], "size": size, "src": str(s), "dst": str(d), "numel": s.numel,
               "dtensor_bytes": c["dtensor_default"]["bytes_sent_max"], "lower_bound": c["lower_bound"]["bytes"]}
        lowering.compile(s, d, m)
        row["shardc_s"] = _time(lambda x=x, s=s, d=d, mt=c["mesh"]: redistribute(x, s, d, mt), iters)
        try:
            sp, _ = to_placements(s, m, strided=True)
            dp, _ = to_placements(d, m, strided=True)
            shape = tuple(s.shape)
            stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
            dt = DTensor.from_local(x, dm, sp, run_check=False, shape=torch.Size(shape), stride=stride)
            out = dt.redistribute(dm, dp)
            row["dtensor_correct"] = (None if d.partial_axes else
                                      bool(torch.equal(out.to_local(), expected_block(d, m, g, rank))))
            row["dtensor_s"] = _time(lambda dt=dt, dm=dm, dp=dp: dt.redistribute(dm, dp).to_local(), iters)
        except Exception as e:
            row["dtensor_error"] = f"{type(e).__name__}: {str(e)[:120]}"
        rows.append(row)
    gathered: list[Any] = [None] * WORLD
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        merged = []
        for i, row in enumerate(rows):
            r = dict(row)
            for key in ("shardc_s", "dtensor_s"):
                if key in r:
                    r[key] = max(g[i][key] for g in gathered)
            if "dtensor_correct" in r and r["dtensor_correct"] is not None:
                r["dtensor_correct"] = all(g[i]["dtensor_correct"] for g in gathered)
            merged.append(r)
        Path(out_path).write_text(json.dumps(merged))
    dist.barrier()
    dist.destroy_process_group()


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    print(f"{'case':<11} {'size':<6} {'numel':>7} {'shardc':>10} {'dtensor':>10} {'speedup':>8}  dtensor ok  "
          f"src -> dst")
    summary: dict[str, Any] = {}
    for size in sorted({r["size"] for r in rows}, reverse=True):
        ratios, heavy = [], []
        for r in (r for r in rows if r["size"] == size):
            if "dtensor_s" in r:
                sp = r["dtensor_s"] / r["shardc_s"]
                ratios.append(sp)
                if r["dtensor_bytes"] >= 2 * r["lower_bound"]:
                    heavy.append(sp)
                dt, spt = f"{r['dtensor_s'] * 1e3:8.2f}ms", f"{sp:7.2f}x"
                ok = {True: "yes", False: "WRONG", None: "-"}[r.get("dtensor_correct")]
            else:
                dt, spt, ok = "   error  ", "     -  ", r["dtensor_error"][:40]
            print(f"{r['id']:<11} {size:<6} {r['numel']:>7} {r['shardc_s'] * 1e3:8.2f}ms {dt} {spt}  {ok:<10}  "
                  f"{r['src']} -> {r['dst']}")
        summary[size] = {
            "cases": len(ratios),
            "median_speedup": statistics.median(ratios) if ratios else None,
            "heavy_cases": len(heavy),
            "median_speedup_where_dtensor_moves_2x_lb": statistics.median(heavy) if heavy else None,
            "dtensor_wrong": sum(1 for r in rows if r["size"] == size and r.get("dtensor_correct") is False),
            "dtensor_errors": sum(1 for r in rows if r["size"] == size and "dtensor_error" in r),
        }
    print("\nsummary (speedup = DTensor time / shardc time, >1 means shardc is faster):")
    for size, s in summary.items():
        print(f"  {size}: median {s['median_speedup']:.2f}x over {s['cases']} cases; "
              f"where DTensor moves >= 2x the lower bound: {s['median_speedup_where_dtensor_moves_2x_lb']:.2f}x "
              f"over {s['heavy_cases']} cases; DTensor wrong on {s['dtensor_wrong']}, failed on {s['dtensor_errors']}")
    print("targets, as time ratios shardc / DTensor (the inverse of the speedup):")
    for size, s in summary.items():
        med, heavy = s["median_speedup"], s["median_speedup_where_dtensor_moves_2x_lb"]
        if med is None or heavy is None:
            continue
        r_all, r_heavy = 1 / med, 1 / heavy
        print(f"  {size}: median ratio {r_all:.2f} (target <= 1.0: {'met' if r_all <= 1.0 else 'NOT met'}); "
              f"where DTensor moves >= 2x the bound {r_heavy:.2f} (target <= 0.5: "
              f"{'met' if r_heavy <= 0.5 else 'NOT met'})")
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sizes", default="small,medium")
    ap.add_argument("--json", default=None, help="also write rows and summary here")
    args = ap.parse_args()
    if not CASES.is_file():
        print(f"cases not found at {CASES}", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        t0 = time.time()
        # a FileStore in the temporary directory: no port that another process could take
        store = os.path.join(tmp, "store")
        mp.spawn(rank_main, args=(store, args.iters, args.sizes.split(","), out), nprocs=WORLD, join=True)
        rows = json.loads(Path(out).read_text())
    print(f"8 gloo ranks on CPU ({os.cpu_count()} cores), {args.iters} timed calls per case, "
          f"{time.time() - t0:.0f}s in all\n")
    summary = report(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
