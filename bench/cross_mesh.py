"""Cross-mesh redistribution on 8 gloo ranks (CPU), in one run:

    python bench/cross_mesh.py [--iters 10] [--rows 1024]

* weight sync: ``f32[rows@fsdp,1024]`` on a 4-rank trainer ``fsdp=4@[0-3]`` to two
  2-rank tensor-parallel replicas ``rep=2,tp=2@[4-7]`` (``f32[rows,1024@tp]{R:rep}``);
* elastic shrink: ``f32[rows@dp,1024]`` on ``dp=8`` to ``dp=6@[0,1,2,4,6,7]``;
* a state dict (weight sync of 10 tensors, f32 and bf16, column- and row-parallel, biases
  replicated), trainer to replicas as above: one joint program against the per-tensor
  loop of shardc calls, and against the workaround per tensor.

Each as shardc (a prepared call, ``redistributor(..., dst_mesh=)``; the state dict with
``prepared.redistributor_many``, and the one-shot ``redistribute_many``, which agrees
over the world on every call) against the workaround users write (gather the full tensor on
the source, broadcast it, slice each block). A time is the median over calls of the
slowest rank, after 2 warm-up calls and a barrier per call. Bytes are the busiest rank's
(the larger of what it sends and receives): shardc's from its program, against the
cross-mesh lower bound; the workaround's at least what its collectives move at their own
bounds (a ring all_gather: (n-1)/n of the tensor in and out on each rank; a broadcast:
the whole tensor out of the root and into every other rank). Target: weight sync at least
2x faster than gather + broadcast + slice.
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
COLS = 1024
TRAINER, REPLICAS = "fsdp=4@[0-3]", "rep=2,tp=2@[4-7]"


def cases(rows: int) -> list[tuple[str, str, str, str, str]]:
    return [("weight sync 4 -> 2x2", f"f32[{rows}@fsdp,{COLS}]", TRAINER, f"f32[{rows},{COLS}@tp]{{R:rep}}",
             REPLICAS),
            ("elastic 8 -> 6", f"f32[{rows}@dp,{COLS}]", "dp=8", f"f32[{rows}@dp,{COLS}]", "dp=6@[0,1,2,4,6,7]")]


def state_dict(rows: int) -> list[tuple[str, str]]:
    """(src on the trainer, dst on the replicas) per tensor: a transformer block's weights."""
    h = rows // 2
    out = []
    for name in ("q", "k", "v"):  # column-parallel
        out += [(f"f32[{h}@fsdp,{h}]", f"f32[{h}@tp,{h}]{{R:rep}}"), (f"f32[{h}@fsdp]", f"f32[{h}@tp]{{R:rep}}")]
        del name
    out += [(f"f32[{h}@fsdp,{h}]", f"f32[{h},{h}@tp]{{R:rep}}"),  # row-parallel o
            (f"bf16[{2 * h}@fsdp,{h}]", f"bf16[{2 * h}@tp,{h}]{{R:rep}}"),  # mlp up
            (f"bf16[{h}@fsdp,{2 * h}]", f"bf16[{h},{2 * h}@tp]{{R:rep}}"),  # mlp down
            (f"f32[{h}@fsdp]", f"f32[{h}]{{R:(rep,tp)}}")]  # a norm's weight, replicated
    return out


def workaround_bytes(nbytes: int, n_src: int) -> int:
    """The busiest rank's bytes for gather + broadcast + slice of an ``nbytes`` tensor held
    by ``n_src`` ranks, at its collectives' own bounds (the root of the broadcast, or every
    rank when no broadcast is needed)."""
    gather = nbytes * (n_src - 1) // n_src
    return gather if n_src == WORLD else gather + nbytes  # the root sends both, another trainer receives both


def joint_bytes(programs: Any) -> int:
    """The busiest rank's bytes of programs run jointly: each rank's bytes summed over the
    programs' steps (as one program's price sums its steps), the largest."""
    import numpy as np

    moved = sum(np.asarray(s.bytes_moved, dtype=np.int64) for p in programs for s in p.steps)
    return int(np.max(moved))


def rank_main(rank: int, store: str, iters: int, rows: int, out_path: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import lowering
    import torch_backend
    from spec_lang import parse, parse_mesh
    from torch_backend import cross_rounds, prepared
    from torch_backend.dtypes import to_torch_dtype

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    gen = torch.Generator().manual_seed(0)
    results: dict[str, Any] = {}
    trainer = dist.new_group([0, 1, 2, 3])  # every rank makes it (the workaround's gather)

    def block(t: str, mesh: str, full: Any) -> Any:
        s, m = parse(t), parse_mesh(mesh)
        return full[lowering.local_slices(s, m)[m.global_ranks.index(rank)]].clone() if rank in m.global_ranks \
            else None

    def workaround(x: Any, src: str, mesh: str, dst: str, dst_mesh: str) -> Any:
        s, m, d, dm = parse(src), parse_mesh(mesh), parse(dst), parse_mesh(dst_mesh)
        g = torch.empty(s.shape, dtype=to_torch_dtype(s.dtype))
        if rank in m.global_ranks:
            dist.all_gather_single(g, x, group=trainer if m.size == 4 else None)
        if m.size != WORLD:
            dist.broadcast(g, src=0)
        return g[lowering.local_slices(d, dm)[dm.global_ranks.index(rank)]].clone() if rank in dm.global_ranks \
            else None

    for name, src, mesh, dst, dst_mesh in cases(rows):
        full = torch.randn(rows, COLS, generator=gen)
        x, want = block(src, mesh, full), block(dst, dst_mesh, full)
        f = torch_backend.redistributor(src, dst, mesh, dst_mesh=dst_mesh)
        y, w = f(x), workaround(x, src, mesh, dst, dst_mesh)
        p = f.program
        results[name] = {
            "shardc_s": _time(lambda f=f, x=x: f(x), iters),
            "workaround_s": _time(lambda x=x, a=(src, mesh, dst, dst_mesh): workaround(x, *a), iters),
            "ok": all((z is None) == (want is None) and (z is None or torch.equal(z, want)) for z in (y, w)),
            "bytes": p.cost.bytes_max, "bound": p.bound,
            "workaround_bytes": workaround_bytes(full.numel() * 4, parse_mesh(mesh).size)}
    # the state dict
    pairs = state_dict(rows)
    fulls = [torch.randn(parse(s).shape, generator=gen).to(to_torch_dtype(parse(s).dtype)) for s, _ in pairs]
    xs = [block(s, TRAINER, g) for (s, _), g in zip(pairs, fulls, strict=True)]
    wants = [block(d, REPLICAS, g) for (_, d), g in zip(pairs, fulls, strict=True)]
    srcs, dsts = [s for s, _ in pairs], [d for _, d in pairs]
    joint = prepared.redistributor_many(srcs, dsts, TRAINER, REPLICAS)
    loop = [torch_backend.redistributor(s, d, TRAINER, dst_mesh=REPLICAS) for s, d in pairs]

    def one_shot() -> Any:
        return torch_backend.redistribute_many(xs, srcs, dsts, TRAINER, dst_mesh=REPLICAS)

    def per_tensor() -> Any:
        return [f(x) for f, x in zip(loop, xs, strict=True)]

    def per_tensor_workaround() -> Any:
        return [workaround(x, s, TRAINER, d, REPLICAS) for x, s, d in zip(xs, srcs, dsts, strict=True)]

    ok = True
    for ys in (joint(xs), one_shot(), per_tensor(), per_tensor_workaround()):
        ok &= all((y is None) == (w is None) and (y is None or torch.equal(y, w)) for y, w in zip(ys, wants,
                                                                                               strict=True))
    rounds = cross_rounds.rounds(joint.programs, rank)
    results["state dict"] = {
        "joint_s": _time(lambda: joint(xs), iters), "one_shot_s": _time(one_shot, iters),
        "loop_s": _time(per_tensor, iters), "workaround_s": _time(per_tensor_workaround, iters), "ok": ok,
        "tensors": len(pairs), "mib": sum(g.numel() * g.element_size() for g in fulls) / 2**20,
        "bytes": joint_bytes(joint.programs), "bound": sum(p.bound for p in joint.programs),
        "workaround_bytes": sum(workaround_bytes(g.numel() * g.element_size(), 4) for g in fulls),
        "joint_messages": sum(len(r.sends) for r in rounds),
        "loop_messages": sum(len(r.sends) for p in joint.programs for r in cross_rounds.rounds([p], rank))}

    def merge(gathered: list[Any]) -> dict[str, Any]:
        def one(n: str, k: str) -> Any:
            if k.endswith("_s") or k.endswith("_messages"):
                return max(g[n][k] for g in gathered)
            return all(g[n][k] for g in gathered) if k == "ok" else gathered[0][n][k]

        return {n: {k: one(n, k) for k in results[n]} for n in results}

    report(results, out_path, merge)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rows", type=int, default=1024)
    args = ap.parse_args()
    r = run_world(rank_main, WORLD, args.iters, args.rows)
    print(f"8 gloo ranks, {os.cpu_count()} cores, median of {args.iters} calls, slowest rank; "
          f"f32[{args.rows},{COLS}] ({args.rows * COLS * 4 / 2**20:.1f} MiB)")
    for name, row in r.items():
        if name == "state dict":
            continue
        print(f"  {name:22s} shardc {row['shardc_s'] * 1e3:8.2f} ms   gather+broadcast+slice "
              f"{row['workaround_s'] * 1e3:8.2f} ms   speed-up {row['workaround_s'] / row['shardc_s']:.2f}x   "
              f"correct: {row['ok']}")
        print(f"  {'':22s} busiest rank: shardc {row['bytes']} B (bound {row['bound']} B), "
              f"gather+broadcast+slice >= {row['workaround_bytes']} B")
    sd = r["state dict"]
    print(f"  state dict, {sd['tensors']} tensors, {sd['mib']:.1f} MiB, trainer -> replicas   correct: {sd['ok']}")
    for label, key in (("shardc joint, prepared", "joint_s"), ("shardc redistribute_many", "one_shot_s"),
                       ("shardc per-tensor loop", "loop_s"), ("gather+broadcast+slice per tensor", "workaround_s")):
        print(f"    {label:34s} {sd[key] * 1e3:8.2f} ms   ({sd['workaround_s'] / sd[key]:.2f}x the workaround)")
    print(f"    busiest rank: shardc {sd['bytes']} B (bound {sd['bound']} B), gather+broadcast+slice >= "
          f"{sd['workaround_bytes']} B; messages out of the busiest rank: joint {sd['joint_messages']}, "
          f"loop {sd['loop_messages']}")
    ws = r["weight sync 4 -> 2x2"]
    met = ws["workaround_s"] / ws["shardc_s"] >= 2
    print(f"  weight sync target >= 2x faster than the workaround: {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
