"""The uneven placements on 8 gloo ranks (CPU): bytes against the bound, and time against
the padded and the through-Replicate routes, in one run:

    python bench/uneven.py [--iters 20] [--scale 8] [--hidden 128] [--json PATH|-]

Cases (at the default scale each tensor is 2 MiB of float32):

* MoE tokens ``f32[T@ep<sizes>,H]`` with skewed sizes (one rank routed nothing): the
  router's re-balance to other skewed sizes, the gather to Replicate, and 16 experts'
  ``PartitionedShard`` from per-rank pieces (unaligned) to whole experts (aligned) and back;
* FSDP: a 2-D parameter as a ``ragged ... over 2`` flat buffer, unsharded to Replicate,
  resharded (local), its gradient reduce-scattered from a pending sum, and a 1-D ragged
  flat buffer to an even Shard;
* block quantization: rows in blocks of 32 and ragged units of whole blocks (``unit``
  rows = 32 * scale), to Replicate and to an even Shard.

Per case, from the compiled program and the layout algebra (no torch): bytes sent max and
received max per rank, the lower bound ``max(recv_max, sent_avg)``
(``lowering.bounds.lower_bound_detail``), and two floors for ranks that alone hold data
others need: the *sole-holder floor* (max over ranks of the bytes only it holds and some
other rank needs: every plan sends them at least once) and the *direct floor* (the same
elements counted once per rank needing them: every plan that sends each element straight
from a holder to each needer, which is what an exact exchange does; with a pending
reduction, each rank's contribution to each other rank that holds the sum, and the
contributions each rank receives). Where a floor
is above the bound, the bound is out of reach: by any plan for the sole-holder floor, by a
plan without relays for the direct floor. A gather (``all_gatherv``) relays around a ring,
so it reaches the bound past its direct floor.

Per case, the time of one call (2 warm-up calls, then ``--iters`` calls each after a
barrier; the median over calls, slowest rank) of three routes, all run by shardc:

* **shardc**: ``redistribute(x, src, dst)``, one exact exchange;
* **padded**: the tensor padded to a multiple of the group and split evenly (torch.chunk's
  padding), moved to the same kind of destination: ``f32[Tp@ep,H] -> f32[Tp,H]`` (an
  all_gather) for Replicate, ``{U:dp} -> f32[R@dp,C]`` (a reduce_scatter) for a reduction,
  and, for a split-to-split exchange, an all_to_all where every pair of ranks exchanges
  the largest piece of the exact exchange (``f32[8@ep,8c] -> f32[8,8c@ep]``, c that
  piece's elements: the capacity an all_to_all without per-peer sizes must allot);
* **through R**: ``src -> Replicate`` then ``Replicate -> dst`` (a local slice), the route
  of an implementation that gathers variable sizes first (the same as shardc when the
  destination is Replicate, so not timed there).

Ratios printed: shardc / through R (target <= 0.7 where the destination is not
Replicate) and shardc / padded. Numbers on a 2-core machine with 8 ranks are dominated by
scheduling; they compare the routes on equal terms, not against hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.exec_vs_dtensor import _time
from spec_lang.ir import Mesh, TensorType
from spec_lang.parser import parse, parse_mesh

WORLD = 8
THROUGH_R_TARGET = 0.7
# skewed per-rank shares (one zero), in 1/512ths of the tokens
MOE_SIZES = (154, 0, 51, 31, 102, 20, 82, 72)
MOE_REBALANCE = (64, 88, 37, 76, 53, 72, 59, 63)
FSDP_UNITS = (3, 1, 2, 2, 1, 3, 2, 2)  # sum 16
QUANT_UNITS = (3, 1, 2, 2, 1, 3, 2, 2)  # sum 16: a unit is rows / 16 = 32 * scale rows
QUANT_BLOCK = 32
EXPERTS = 16


@dataclass
class Case:
    name: str
    group: str  # moe, fsdp, quant
    mesh: str
    src: str
    dst: str
    replicated: str  # the global type with every axis replicated (the through-R midpoint)
    padded_src: str = ""
    padded_dst: str = ""
    stats: dict[str, Any] = field(default_factory=dict)


def expert_splits(scale: int) -> tuple[tuple[int, ...], ...]:
    """Tokens of each rank routed to each of 16 experts: every rank holds 64 * scale tokens,
    expert popularity falls off steeply (some pieces are 0)."""
    rng = np.random.default_rng(0)
    pop = 1.0 / np.arange(1, EXPERTS + 1) ** 1.5
    rng.shuffle(pop)
    rows = rng.multinomial(64 * scale, pop / pop.sum(), size=WORLD)
    return tuple(tuple(int(v) for v in r) for r in rows)


def cases(scale: int, hidden: int) -> list[Case]:
    t = 512 * scale
    sz = ",".join(str(v * scale) for v in MOE_SIZES)
    rb = ",".join(str(v * scale) for v in MOE_REBALANCE)
    parts = "|".join(",".join(map(str, r)) for r in expert_splits(scale))
    rows, cols = 128 * scale, 4 * hidden
    fu = ",".join(map(str, FSDP_UNITS))
    qrows = 512 * scale
    qu = ",".join(map(str, QUANT_UNITS))
    moe_r, fsdp_r, quant_r = f"f32[{t},{hidden}]", f"f32[{rows},{cols}]", f"f32[{qrows},{hidden}]"
    flat = rows * cols
    return [
        Case("moe re-balance", "moe", "ep=8", f"f32[{t}@ep<{sz}>,{hidden}]", f"f32[{t}@ep<{rb}>,{hidden}]", moe_r),
        Case("moe gather", "moe", "ep=8", f"f32[{t}@ep<{sz}>,{hidden}]", moe_r, moe_r),
        Case("moe to experts", "moe", "ep=8", f"f32[{t}@ep<parts {parts}>,{hidden}]",
             f"f32[{t}@ep<aligned {parts}>,{hidden}]", moe_r),
        Case("moe from experts", "moe", "ep=8", f"f32[{t}@ep<aligned {parts}>,{hidden}]",
             f"f32[{t}@ep<parts {parts}>,{hidden}]", moe_r),
        Case("fsdp unshard", "fsdp", "dp=8", f"f32[{rows}@dp<ragged {fu} over 2>,{cols}]", fsdp_r, fsdp_r),
        Case("fsdp reshard", "fsdp", "dp=8", fsdp_r, f"f32[{rows}@dp<ragged {fu} over 2>,{cols}]", fsdp_r),
        Case("fsdp grad", "fsdp", "dp=8", f"{fsdp_r}{{U:dp}}", f"f32[{rows}@dp<ragged {fu} over 2>,{cols}]",
             fsdp_r),
        Case("fsdp flat to even", "fsdp", "dp=8", f"f32[{flat}@dp<ragged {fu}>]", f"f32[{flat}@dp]", f"f32[{flat}]"),
        Case("quant gather", "quant", "dp=8", f"f32[{qrows}@dp<ragged {qu}>,{hidden}]", quant_r, quant_r),
        Case("quant to even", "quant", "dp=8", f"f32[{qrows}@dp<ragged {qu}>,{hidden}]",
             f"f32[{qrows}@dp,{hidden}]", quant_r),
    ]


# ---- bytes, bounds and floors (the layout algebra only) -------------------------------------


def holder_floors(src: TensorType, dst: TensorType, mesh: Mesh) -> tuple[int | None, int]:
    """(sole-holder floor, direct floor) in bytes, max over ranks (see the module docstring).

    With a pending reduction every rank is the sole holder of its contribution: the direct
    floor counts each contribution once per other rank holding the sum, and the sole-holder
    floor is None (a relay may add contributions on the way)."""
    from lowering import local_indices

    held, need = local_indices(src, mesh), local_indices(dst, mesh)
    held_count = np.bincount(np.concatenate(held), minlength=src.numel)
    need_count = np.bincount(np.concatenate(need), minlength=src.numel)
    once = direct = 0
    for r in range(mesh.size):
        sole = held[r] if src.partial_axes else held[r][held_count[held[r]] == 1]
        mine = np.zeros(src.numel, dtype=bool)
        mine[need[r]] = True
        others = need_count[sole] - mine[sole]
        once, direct = max(once, int((others > 0).sum())), max(direct, int(others.sum()))
        if src.partial_axes:  # and r hears from every other contributor to each element it holds
            has = np.zeros(src.numel, dtype=bool)
            has[held[r]] = True
            direct = max(direct, int((held_count[need[r]] - has[need[r]]).sum()))
    return (None if src.partial_axes else once * src.itemsize), direct * src.itemsize


def padded_types(c: Case, src: TensorType, dst: TensorType, prog: Any, mesh: Mesh) -> tuple[str, str]:
    """The padded route's (src, dst) types (see the module docstring)."""
    from lowering.kinds import rank_pieces

    ax = mesh.names[0]
    shape = list(src.shape)
    shape[0] = -(-shape[0] // WORLD) * WORLD  # torch.chunk pads dim 0 to a multiple of the group
    rest = "".join(f",{s}" for s in shape[1:])
    if src.partial_axes:
        return f"f32[{shape[0]}{rest}]{{U:{ax}}}", f"f32[{shape[0]}@{ax}{rest}]"
    if not src.dims[0].axes:  # from Replicate: a local slice both ways
        return f"f32[{shape[0]}{rest}]", f"f32[{shape[0]}@{ax}{rest}]"
    if not dst.dims[0].axes:  # to Replicate: an all_gather
        return f"f32[{shape[0]}@{ax}{rest}]", f"f32[{shape[0]}{rest}]"
    cap = max((p.numel for st in prog.steps for r in range(mesh.size)
               for p in getattr(rank_pieces(st, mesh, r), "send", ())), default=0)
    cap = max(cap, 1)
    return f"f32[{WORLD}@{ax},{WORLD * cap}]", f"f32[{WORLD},{WORLD * cap}@{ax}]"


def analyse(c: Case) -> None:
    import lowering
    from lowering.bounds import lower_bound_detail
    from lowering.kinds import rank_pieces

    mesh = parse_mesh(c.mesh)
    src, dst = parse(c.src), parse(c.dst)
    prog = lowering.compile(src, dst, mesh)
    recv = [sum(getattr(rank_pieces(st, mesh, r), "recv_elems", 0) for st in prog.steps) * src.itemsize
            for r in range(mesh.size)]
    lb = lower_bound_detail(src, dst, mesh)
    sole_once, direct = holder_floors(src, dst, mesh)
    sent = prog.cost.bytes_sent_max
    most = max(sent, max(recv))  # the bound bounds the larger of the two
    if most == lb["bytes"]:
        status = "= bound"
    elif sole_once is not None and most == sent == sole_once > lb["bytes"]:
        status = "= sole-holder floor"
    elif most == direct > lb["bytes"]:
        status = "= direct floor"
    else:
        status = f"gap +{100 * (most - lb['bytes']) / max(1, lb['bytes']):.0f}%"
    c.padded_src, c.padded_dst = padded_types(c, src, dst, prog, mesh)
    c.stats = {
        "steps": [st.kind for st in prog.steps], "bytes_sent_max": sent, "bytes_recv_max": max(recv),
        "lower_bound": lb["bytes"], "lb_recv_max": lb["recv_max_bytes"], "lb_sent_avg": lb["sent_avg_bytes"],
        "sole_holder_floor": sole_once, "direct_floor": direct,
        "sole_holder_case": direct > lb["bytes"], "status": status,
        "padded_bytes_sent_max": lowering.compile(parse(c.padded_src), parse(c.padded_dst), mesh).cost.bytes_sent_max,
        "global_bytes": src.numel * src.itemsize,
    }


# ---- timing (8 gloo ranks) -------------------------------------------------------------------


RankRunner = Callable[..., dict[int, Any]]  # (fn, *args) -> {rank: fn(rank, world, *args)}


def measure(rank: int, world: int, iters: int, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This rank's timings and checks of every case (``rows``: the cases as dicts), run on
    the default process group of ``world`` ranks, which the caller initialised; it leaves
    the group as it found it (only shardc's own caches grow)."""
    import torch

    from lowering.layout import rank_layout
    from torch_backend import redistribute
    from torch_backend.blocks import local_part

    if world != WORLD:
        raise ValueError(f"the cases are for {WORLD} ranks, not {world}")
    out = []
    for i, c in enumerate(rows):
        mesh = parse_mesh(c["mesh"])
        src, dst, rep = parse(c["src"]), parse(c["dst"]), parse(c["replicated"])
        psrc, pdst = parse(c["padded_src"]), parse(c["padded_dst"])
        gen = torch.Generator().manual_seed(i)
        if src.partial_axes:  # each rank's contribution; the destination holds their sum
            parts = [torch.randn(src.shape, generator=gen) for _ in range(WORLD)]
            g, x = sum(parts[1:], parts[0]), parts[rank]
        else:
            g = torch.randn(src.shape, generator=gen)
            x = local_part(g, src, mesh, rank)
        xp = torch.randn(rank_layout(psrc, mesh, rank).shape, generator=gen)
        want = local_part(g, dst, mesh, rank)

        def shardc(x: Any = x, s: Any = src, d: Any = dst, m: str = c["mesh"]) -> Any:
            return redistribute(x, s, d, m)

        def through_r(x: Any = x, s: Any = src, d: Any = dst, r: Any = rep, m: str = c["mesh"]) -> Any:
            return redistribute(redistribute(x, s, r, m), r, d, m)

        def padded(x: Any = xp, s: Any = psrc, d: Any = pdst, m: str = c["mesh"]) -> Any:
            return redistribute(x, s, d, m)

        ok = bool(torch.allclose(shardc(), want, atol=1e-4)) and bool(torch.allclose(through_r(), want, atol=1e-4))
        row = {"ok": ok, "shardc_s": _time(shardc, iters), "padded_s": _time(padded, iters)}
        # through Replicate is shardc's own route when the destination is Replicate
        row["through_r_s"] = row["shardc_s"] if dst == rep else _time(through_r, iters)
        out.append(row)
    return out


def merge_ranks(per_rank: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every case once: the slowest rank's times, ok where every rank was."""
    ranks = [per_rank[r] for r in sorted(per_rank)]
    return [{k: (max(g[i][k] for g in ranks) if k.endswith("_s") else all(g[i][k] for g in ranks))
             for k in ranks[0][i]} for i in range(len(ranks[0]))]


def _spawned_rank(rank: int, store: str, fn: Callable[..., Any], args: tuple[Any, ...], out_path: str) -> None:
    """One of :func:`spawn_ranks`' processes: joins the group, runs ``fn``, rank 0 writes
    every rank's result."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=300))
    gathered: list[Any] = [None] * WORLD
    dist.all_gather_object(gathered, fn(rank, WORLD, *args))
    if rank == 0:
        Path(out_path).write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


def spawn_ranks(fn: Callable[..., Any], *args: Any) -> dict[int, Any]:
    """``{rank: fn(rank, WORLD, *args)}`` from 8 fresh gloo processes (the bench's own runner;
    a test hands :func:`main` a pool of ranks that already joined a group instead)."""
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ranks.json")
        mp.spawn(_spawned_rank, args=(os.path.join(tmp, "store"), fn, args, out), nprocs=WORLD, join=True)
        return dict(enumerate(json.loads(Path(out).read_text())))


# ---- report ------------------------------------------------------------------------------------


def _kib(b: float | None) -> str:
    return "-" if b is None else f"{b / 1024:.1f}"


def report(rows: list[Case]) -> dict[str, Any]:
    print(f"{'case':<18} {'steps':<28} {'sent max':>9} {'recv max':>9} {'bound':>8} {'sole fl':>8} "
          f"{'direct fl':>9} {'padded':>8}  status  (KiB per rank)")
    for c in rows:
        s = c.stats
        print(f"{c.name:<18} {'+'.join(s['steps']) if s['bytes_sent_max'] else 'local':<28} {_kib(s['bytes_sent_max']):>9} "
              f"{_kib(s['bytes_recv_max']):>9} {_kib(s['lower_bound']):>8} {_kib(s['sole_holder_floor']):>8} "
              f"{_kib(s['direct_floor']):>9} {_kib(s['padded_bytes_sent_max']):>8}  {s['status']}")
    print(f"\n{'case':<18} {'shardc':>9} {'padded':>9} {'through R':>10} {'/through R':>11} {'/padded':>8}  ok")
    ratios_r: list[float] = []
    for c in rows:
        s = c.stats
        to_r = parse(c.dst) == parse(c.replicated)
        local = s["bytes_sent_max"] == 0
        rr, rp = s["shardc_s"] / s["through_r_s"], s["shardc_s"] / s["padded_s"]
        if not to_r and not local:
            ratios_r.append(rr)
        rr_txt = "(same)" if to_r else ("(local)" if local else f"{rr:.2f}")
        print(f"{c.name:<18} {s['shardc_s'] * 1e3:7.2f}ms {s['padded_s'] * 1e3:7.2f}ms {s['through_r_s'] * 1e3:8.2f}ms "
              f"{rr_txt:>11} {rp:8.2f}  {'yes' if s['ok'] else 'WRONG'}")
    at_bound = [c.name for c in rows if c.stats["status"] == "= bound"]
    sole = [c.name for c in rows if c.stats["sole_holder_case"]]
    other = [c.name for c in rows if c.name not in at_bound and c.name not in sole]
    worst = max(ratios_r) if ratios_r else None
    summary = {
        "at_bound": at_bound, "sole_holder_cases": sole,
        # a relay (the ring of a gather) can reach the bound past the direct floor
        "sole_holder_at_a_floor": [c.name for c in rows if c.stats["sole_holder_case"]
                                   and c.stats["status"] in ("= bound", "= sole-holder floor", "= direct floor")],
        "above_every_bound": other,
        "through_r_ratio_median": statistics.median(ratios_r) if ratios_r else None,
        "through_r_ratio_max": worst,
        "through_r_target_met": worst is not None and worst <= THROUGH_R_TARGET,
        "all_ok": all(c.stats["ok"] for c in rows),
    }
    print(f"\nbytes: at the bound {len(at_bound)}/{len(rows)}: {', '.join(at_bound) or '-'}")
    print(f"  sole holders (a floor above the bound puts the bound out of reach): "
          f"{', '.join(sole) or '-'}; at the bound or a floor: {len(summary['sole_holder_at_a_floor'])}/{len(sole)}")
    print(f"  above every bound and floor: {', '.join(other) or 'none'}")
    if worst is not None:
        print(f"time: shardc / through R over the {len(ratios_r)} cases with an exchange to a split: median "
              f"{summary['through_r_ratio_median']:.2f}, max {worst:.2f} (target <= {THROUGH_R_TARGET}: "
              f"{'met' if summary['through_r_target_met'] else 'NOT met'})")
    print(f"results equal the expected blocks: {summary['all_ok']}")
    return summary


def main(argv: Sequence[str] | None = None, run_ranks: RankRunner = spawn_ranks) -> dict[str, Any]:
    """Run the bench; ``run_ranks(measure, iters, rows)`` runs the timing on 8 gloo ranks
    (:func:`spawn_ranks` unless given)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--scale", type=int, default=8, help="tokens 512*scale, FSDP rows 128*scale (default 8)")
    ap.add_argument("--hidden", type=int, default=128, help="MoE hidden size; FSDP columns are 4x (default 128)")
    ap.add_argument("--json", default=None, help="write rows and summary here; '-' prints JSON, no tables")
    args = ap.parse_args(argv)
    t0 = time.time()
    rows = cases(args.scale, args.hidden)
    for c in rows:
        analyse(c)
    timed = merge_ranks(run_ranks(measure, args.iters, [asdict(c) for c in rows]))
    for c, row in zip(rows, timed, strict=True):
        c.stats.update(row)
    quiet = args.json == "-"
    if quiet:
        sys.stdout, real = open(os.devnull, "w"), sys.stdout
    try:
        print(f"8 gloo ranks on CPU ({os.cpu_count()} cores), tensors of "
              f"{max(c.stats['global_bytes'] for c in rows) / 2**20:.1f} MiB, median of {args.iters} calls, "
              f"slowest rank; {time.time() - t0:.0f}s in all\n")
        summary = report(rows)
    finally:
        if quiet:
            sys.stdout.close()
            sys.stdout = real
    result = {"cases": [asdict(c) for c in rows], "summary": summary,
              "settings": {"iters": args.iters, "scale": args.scale, "hidden": args.hidden}}
    if args.json == "-":
        print(json.dumps(result, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
