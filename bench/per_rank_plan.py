"""Per-rank planning: the time one rank takes to build its own execution plan of a program.

On a real backend each process plays one rank, so the first call of a program costs that
rank its compile plus its own plan. This bench simulates one rank of a 1,024- and a
4,096-rank world (no processes, no torch collectives): for each program it times

* ``compile``: ``lowering.compile`` with every cache cleared first;
* ``plan``: one rank's plan for every step, with every cache cleared again (first call,
  cold: the layout boxes are rebuilt too), for a few ranks, reported as ms per rank;
* ``all ranks``: with ``--quadratic``, the old first-call path that planned every rank
  of the step on every rank (``lowering.kinds.wire_bytes``: every rank's pieces), on 256, 512 and 1,024 ranks.

The target is a plan of at most 20 ms per rank at 1,024 ranks.

    PYTHONPATH=. .venv/bin/python bench/per_rank_plan.py
    PYTHONPATH=. .venv/bin/python bench/per_rank_plan.py --quadratic   # + the old path
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lowering
from lowering.kinds import rank_pieces, wire_bytes
from lowering.program import Program


def _one_rank_plan(program: Program, rank: int) -> list:
    """``rank``'s pieces of every step of ``program``: what a process playing that rank builds
    (``torch_backend.executor.build_pieces`` does exactly this for its own rank)."""
    return [rank_pieces(step, program.mesh, rank) for step in program.steps]


# (name, mesh at 1,024 ranks, mesh at 4,096 ranks, src, dst); {n} is a size that the
# whole world divides, {u} one that it does not
CASES: tuple[tuple[str, str, str, str, str], ...] = (
    ("all_to_all (1 axis)", "x=1024", "x=4096", "f32[{n}@x,64]", "f32[{n},64@x]"),
    ("all_to_all (4 axes)", "a=4,b=4,c=8,d=8", "a=8,b=8,c=8,d=8",
     "f32[{n}@(a,b),{n}@(c,d)]", "f32[{n}@(c,d),{n}@(a,b)]"),
    ("uneven all_gather", "x=1024", "x=4096", "f32[{u}@x,64]", "f32[{u},64]"),
    ("reduce_scatter", "x=1024", "x=4096", "f32[{n},64]{{U:x}}", "f32[{n}@x,64]"),
    ("permute", "a=32,b=32", "a=64,b=64", "f32[{n}@(a,b),64]", "f32[{n}@(b,a),64]"),
)


def _ms(f: object, *args: object) -> tuple[float, object]:
    """Milliseconds of one call, the garbage collector off (a full collection would land
    on a random call)."""
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter()
        out = f(*args)  # type: ignore[operator]
        return (time.perf_counter() - t) * 1e3, out
    finally:
        gc.enable()


def per_rank(world: int, ranks: int) -> list[dict[str, object]]:
    rows = []
    for name, m1k, m4k, src, dst in CASES:
        mesh = m1k if world == 1024 else m4k
        size = {"n": 4 * world, "u": 4 * world - 3}
        lowering.clear_caches()
        compile_ms, prog = _ms(lowering.compile, src.format(**size), dst.format(**size), mesh)
        kinds = ",".join(s.kind for s in prog.steps)
        times = []
        for rank in [0, world - 1, world // 3, world // 2, 7, world - 5][:ranks]:
            lowering.clear_caches()
            ms, _ = _ms(_one_rank_plan, prog, rank)
            times.append(ms)
        rows.append({"case": name, "world": world, "steps": kinds, "compile_ms": compile_ms,
                     "plan_ms_median": statistics.median(times), "plan_ms": times})
        print(f"  {name:<20} {world:5d} ranks  [{kinds}]  compile {compile_ms:8.1f} ms   plan per rank "
              f"{statistics.median(times):7.2f} ms (median of {len(times)} ranks, max {max(times):.2f}; cold)",
              flush=True)
    return rows


def quadratic(worlds: Sequence[int]) -> list[dict[str, object]]:
    """The old first call: every rank's pieces of the step, on every rank (cold caches)."""
    rows = []
    for world in worlds:
        prog = lowering.compile(f"f32[{4 * world}@x,64]", f"f32[{4 * world},64@x]", f"x={world}")
        step = prog.steps[0]
        lowering.clear_caches()
        ms, _ = _ms(wire_bytes, step, prog.mesh)
        rows.append({"world": world, "all_ranks_ms": ms})
        print(f"  all_to_all {world:5d} ranks: planning every rank (old first call) {ms / 1e3:7.2f} s", flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--ranks", type=int, default=3, help="ranks timed per case (default 3, at most 6)")
    ap.add_argument("--quadratic", action="store_true", help="also time the old all-ranks path")
    ap.add_argument("--quadratic-worlds", type=int, nargs="+", default=[256, 512, 1024])
    args = ap.parse_args(argv)
    out: dict[str, object] = {"per_rank": []}
    print("one rank's plan (cold caches), per program:")
    for world in args.worlds:
        out["per_rank"] += per_rank(world, args.ranks)  # type: ignore[operator]
    if args.quadratic:
        print("old path, every rank planned on every rank:")
        out["quadratic"] = quadratic(args.quadratic_worlds)
    return out


if __name__ == "__main__":
    main()
