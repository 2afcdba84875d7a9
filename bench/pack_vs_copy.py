"""The executor's local pack/unpack vs a plain device-to-device copy of the same bytes.

    python bench/pack_vs_copy.py [--iters 50] [--device cuda|cpu]

For the exchange steps of the 8-rank cases of ``bench/cases/redistribute.jsonl``, scaled to about 2**20 elements
globally, this takes rank 0's plan and times (a) packing its pieces into the
contiguous send buffer, (b) unpacking a receive buffer into its output block, and
(c) one ``copy_`` of a contiguous buffer of the same size. (a)+(b) over 2*(c) is the
overhead of exact box exchanges over a single memcpy each way; 1.0 means packing
costs exactly as much as a copy. Runs on CUDA when available, else on CPU, and says which.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import lowering
from bench.exec_vs_dtensor import CASES, scaled
from lowering.kinds import rank_pieces
from spec_lang.parser import parse, parse_mesh
from torch_backend.collectives import _pack_exchange, _unpack_exchange
from torch_backend.dtypes import to_torch_dtype

TARGET = 2**20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(fn, device: torch.device, iters: int) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"device: {device} - {name}; {args.iters} timed runs each, median\n")
    print(f"{'case':<11} {'step':<28} {'bytes':>9} {'pack':>9} {'unpack':>9} {'copy':>9} {'(p+u)/2c':>9}")
    ratios = []
    for line in CASES.read_text().splitlines():
        c = json.loads(line)
        mesh = parse_mesh(c["mesh"])
        if mesh.size != 8:
            continue
        s, d = scaled(parse(c["src"]), parse(c["dst"]), TARGET)
        for step in lowering.compile(s, d, mesh).steps:
            if step.kind not in ("all_to_all", "permute"):
                continue
            plan = rank_pieces(step, mesh, 0)
            nbytes = plan.wire_elems * step.src.itemsize
            if not nbytes:
                continue
            dt = to_torch_dtype(step.src.dtype)
            x = torch.zeros(plan.in_shape, dtype=dt, device=device)
            send = _pack_exchange(plan, x)
            recv = torch.zeros(sum(p.numel for p in plan.recv), dtype=dt, device=device)
            flat_src = torch.zeros(send.numel(), dtype=dt, device=device)
            flat_dst = torch.empty_like(flat_src)
            tp = timeit(lambda: _pack_exchange(plan, x), device, args.iters)  # noqa: B023
            tu = timeit(lambda: _unpack_exchange(plan, x, recv), device, args.iters)  # noqa: B023
            tc = timeit(lambda: flat_dst.copy_(flat_src), device, args.iters)  # noqa: B023
            r = (tp + tu) / (2 * tc)
            ratios.append(r)
            print(f"{c['id']:<11} {step.describe()[:28]:<28} {nbytes:>9} {tp * 1e6:8.1f}u {tu * 1e6:8.1f}u "
                  f"{tc * 1e6:8.1f}u {r:8.2f}x")
    print(f"\nmedian (pack+unpack)/(2*copy): {statistics.median(ratios):.2f}x over {len(ratios)} exchange steps "
          f"on {device.type}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
