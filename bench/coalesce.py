"""Coalesced redistribution of an FSDP-like layer on 8 gloo ranks (CPU), in one run:

    python bench/coalesce.py [--iters 20] [--params 32]

32 parameters of mixed shapes, ``f32[n@dp,k] -> f32[n,k]`` on ``dp=8`` (an FSDP
all_gather), three ways: ``redistribute_many`` (one packed collective), a loop of
shardc's ``redistribute``, and a loop of ``DTensor.redistribute(Shard(0) -> Replicate)``.
Each gets 2 warm-up calls, then ``--iters`` timed calls after a barrier; a time is the
median over calls of the slowest rank. Also counts the collectives each way issues.
Targets: one collective per dtype; ``redistribute_many`` at most 0.3x the DTensor loop
and 0.5x shardc's own loop.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.exec_vs_dtensor import _time
from bench.gloo_world import report, run_world

WORLD = 8


def layer(count: int) -> list[tuple[int, int]]:
    """Mixed parameter shapes, each divisible by the 8 ranks (weights, then biases)."""
    rows = [64, 128, 256, 512, 1024]
    cols = [16, 32, 64, 128]
    out = [(rows[i % len(rows)], cols[(i * 3) % len(cols)]) for i in range(count * 3 // 4)]
    out += [(rows[i % len(rows)], 1) for i in range(count - len(out))]
    return out


def rank_main(rank: int, store: str, iters: int, count: int, out_path: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    import torch_backend
    from torch_backend import comm

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    mesh = "dp=8"
    shapes = layer(count)
    srcs = [f"f32[{n}@dp,{k}]" for n, k in shapes]
    dsts = [f"f32[{n},{k}]" for n, k in shapes]
    gen = torch.Generator().manual_seed(rank)
    xs = [torch.randn(n // WORLD, k, generator=gen) for n, k in shapes]

    calls = {"n": 0}
    for name in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "p2p"):
        real = getattr(comm, name)

        def counted(*a: Any, _real: Any = real, **k: Any) -> Any:
            calls["n"] += 1
            return _real(*a, **k)

        setattr(comm, name, counted)

    def many() -> list[torch.Tensor]:
        return torch_backend.redistribute_many(xs, srcs, dsts, mesh)

    def loop() -> list[torch.Tensor]:
        return [torch_backend.redistribute(x, s, d, mesh) for x, s, d in zip(xs, srcs, dsts)]

    calls["n"] = 0
    got = many()
    many_colls = calls["n"]
    want = loop()
    calls["n"] = 0
    loop()
    loop_colls = calls["n"]
    same = all(torch.equal(a, b) for a, b in zip(got, want))

    dm = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
    dts = [DTensor.from_local(x, dm, [Shard(0)], run_check=False) for x in xs]

    def dtensor_loop() -> list[torch.Tensor]:
        return [d.redistribute(dm, [Replicate()]).to_local() for d in dts]

    dt_same = all(torch.equal(a, b) for a, b in zip(dtensor_loop(), want))
    row = {"many_s": _time(many, iters), "loop_s": _time(loop, iters), "dtensor_s": _time(dtensor_loop, iters),
           "many_collectives": many_colls, "loop_collectives": loop_colls, "same": same, "dtensor_same": dt_same,
           "numel": sum(n * k for n, k in shapes)}
    def merge(gathered: list[Any]) -> dict[str, Any]:
        merged = {k: (max(g[k] for g in gathered) if k.endswith("_s") else gathered[0][k]) for k in row}
        merged["same"] = all(g["same"] for g in gathered)
        merged["dtensor_same"] = all(g["dtensor_same"] for g in gathered)
        return merged

    report(row, out_path, merge)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--params", type=int, default=32)
    args = ap.parse_args()
    r = run_world(rank_main, WORLD, args.iters, args.params)
    print(f"{args.params} parameters, {r['numel']} float32 elements, f32[n@dp,k] -> f32[n,k] on dp=8 "
          f"(8 gloo ranks, {os.cpu_count()} cores), median of {args.iters} calls, slowest rank")
    print(f"  redistribute_many      {r['many_s'] * 1e3:8.2f} ms   {r['many_collectives']} collective(s)   "
          f"results equal the loop's: {r['same']}")
    print(f"  loop of redistribute   {r['loop_s'] * 1e3:8.2f} ms   {r['loop_collectives']} collective(s)")
    print(f"  loop of DTensor        {r['dtensor_s'] * 1e3:8.2f} ms   results equal: {r['dtensor_same']}")
    vs_dt, vs_loop = r["many_s"] / r["dtensor_s"], r["many_s"] / r["loop_s"]
    print(f"  ratio many / DTensor loop {vs_dt:.2f} (target <= 0.3: {'met' if vs_dt <= 0.3 else 'NOT met'})")
    print(f"  ratio many / shardc loop  {vs_loop:.2f} (target <= 0.5: {'met' if vs_loop <= 0.5 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
