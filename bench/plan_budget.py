"""Plan budget: cold compile time on a 6-axis mesh of 2s (64 ranks), against the time budget.

Real meshes have 5 or 6 axes (dp, fsdp, cp, tp, ep, pp). This draws seeded random
redistributions on ``a=2,b=2,c=2,d=2,e=2,f=2``: 1-3 dims of 1-9 elements, up to 3 axes
per dim, a pending sum on about one axis in five, and a destination that keeps some of it
(or converts new axes into it). Two fixed cases that once took seconds come first.

Every compile is cold: every lru_cache of ``lowering`` and ``spec_lang`` is cleared and the
types are re-parsed, untimed, before it. Prints the median, p90 and max compile time (wall
clock, and the process's CPU time, which is what an idle core would take: on a shared,
loaded machine the wall clock says more about the neighbours), how
many cases ran over the budget plus 10%, and what the search proved of each program:
the cheapest; within its gap (``compile(..., gap_bytes=)``: it set aside plans that could
save at most that many bytes with as many collectives); or nothing, where it ran out of
its budget and returned the best plan found (the constructive fallback at worst).

Unless ``--gap-bytes 0`` is given, the same cases are then compiled again without a gap,
in the same run, and compared case by case: what the gap buys in time and costs in bytes.

``--even`` multiplies every dim's size by the world size (64): the same layouts on tensors
whose every block, in every state a search passes through, is even, as most model tensors'
are. There the search also floors what the busiest rank must still receive, and proves
more programs cheapest sooner; the tiny dims of the default cases split unevenly, where
no such floor holds, and are the harder set.

``--sweep`` compiles the same cases at several budgets instead and prints what each one
buys: the compile times, the programs proven optimal, the bytes summed, and the cases
whose plan sends more or fewer bytes than at the default budget (the trade a caller makes
with ``compile(..., budget_s=...)``), at the default gap or ``--gap-bytes``.

    PYTHONPATH=. .venv/bin/python bench/plan_budget.py [--cases 60] [--seed 0] [--json PATH|-] [--sweep] [--even]
        [--gap-bytes B]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.plan_speed import clear_shardc_caches, no_gc, shardc_caches
from lowering.planner import DEFAULT_GAP_BYTES
from lowering.planner import compile as shardc_compile
from spec_lang import format_type
from spec_lang.ir import Dim, TensorType, U
from spec_lang.parser import parse, parse_mesh

MESH = "a=2,b=2,c=2,d=2,e=2,f=2"
BUDGET_S = 0.05  # the planner's default search budget
FIXED_CASES = (
    ("f32[3@f,1@e,1@(d,b,a)]{U:c}", "f32[3@(f,e),1,1]"),
    ("f32[2@(c,d),1@b,8@(a,e)]", "f32[2,1@c,8@e]"),
)


def random_case(rng: np.random.Generator, names: Sequence[str]) -> tuple[str, str]:
    """One valid (src, dst) pair as text, drawn from ``rng`` alone (deterministic per seed)."""
    ndim = int(rng.integers(1, 4))
    shape = [int(rng.integers(1, 10)) for _ in range(ndim)]

    def layout(partial: list[str], new_partial: float) -> tuple[list[list[str]], list[str]]:
        dims: list[list[str]] = [[] for _ in shape]
        part = []
        for a in rng.permutation(list(names)):
            a = str(a)
            if a in partial or (new_partial and rng.random() < new_partial):
                part.append(a)
                continue
            k = int(rng.integers(-1, ndim))
            if k >= 0 and len(dims[k]) < 3:
                dims[k].append(a)
        return dims, part

    src_dims, src_p = layout([a for a in names if rng.random() < 0.2], 0.0)
    keep = [a for a in src_p if rng.random() < 0.3]
    dst_dims, dst_p = layout(keep, 0.05)
    return _text(shape, src_dims, src_p, names), _text(shape, dst_dims, dst_p, names)


def _text(shape: list[int], dims: list[list[str]], partial: list[str], names: Sequence[str]) -> str:
    """The case's type in the DSL, through the canonical printer (partial axes in mesh order)."""
    t = TensorType("f32", tuple(Dim(s, tuple(ax)) for s, ax in zip(shape, dims)),
                   tuple((a, U) for a in names if a in partial))
    return format_type(t, short_dtype=True)


def cases(n: int, seed: int, even: bool = False) -> list[tuple[str, str]]:
    """The fixed cases, then seeded random ones; with ``even``, every dim scaled by the world size."""
    rng = np.random.default_rng(seed)
    mesh = parse_mesh(MESH)
    out = list(FIXED_CASES)
    while len(out) < n:
        out.append(random_case(rng, mesh.names))
    if even:
        out = [(_scaled(s, mesh.size), _scaled(d, mesh.size)) for s, d in out]
    return out


def _scaled(text: str, k: int) -> str:
    t = parse(text)
    return format_type(t.replace(dims=tuple(Dim(d.size * k, d.axes) for d in t.dims)), short_dtype=True)


def measure(n: int, seed: int, budget_s: float | None = None, even: bool = False,
            gap_bytes: int | None = None) -> list[dict[str, Any]]:
    """One cold compile per case; ``budget_s`` and ``gap_bytes`` None: the planner's defaults."""
    caches = shardc_caches()
    rows = []
    kwargs: dict[str, Any] = {} if budget_s is None else {"budget_s": budget_s}
    if gap_bytes is not None:
        kwargs["gap_bytes"] = gap_bytes
    for src, dst in cases(n, seed, even):
        clear_shardc_caches(caches)
        s, d, m = parse(src), parse(dst), parse_mesh(MESH)
        with no_gc():
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                prog = shardc_compile(s, d, m, **kwargs)
                err = None
            except ValueError as e:
                prog, err = None, str(e).splitlines()[0]
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append({
            "src": src, "dst": dst, "ms": dt * 1e3, "cpu_ms": cpu * 1e3, "error": err,
            "bytes": None if prog is None else prog.cost.bytes_max,
            "collectives": None if prog is None else prog.cost.collectives,
            "optimal": None if prog is None else prog.optimal,
            "gap_bytes": None if prog is None else prog.gap_bytes,
        })
    return rows


def summarize(rows: Sequence[dict[str, Any]], budget_s: float) -> dict[str, Any]:
    limit = budget_s * 1e3 * 1.1
    out: dict[str, Any] = {"cases": len(rows)}
    for col in ("ms", "cpu_ms"):
        xs = sorted(r[col] for r in rows)
        out[col] = {"median": statistics.median(xs), "p90": xs[min(len(xs) - 1, int(0.9 * len(xs)))],
                    "max": xs[-1], "over_budget_plus_10pct": sum(x > limit for x in xs)}
    within = [r["gap_bytes"] for r in rows if r["optimal"] is False and r["gap_bytes"] is not None]
    return {
        **out,
        "not_proven_optimal": sum(r["optimal"] is False for r in rows),
        "proven_within_gap": len(within),
        "largest_gap_bytes": max(within, default=0),
        "budget_ran_out": sum(r["optimal"] is False and r["gap_bytes"] is None for r in rows),
        "bytes_total": sum(r["bytes"] or 0 for r in rows),
        "errors": sum(r["error"] is not None for r in rows),
        "slowest": [(r["src"], r["dst"], round(r["ms"], 1))
                    for r in sorted(rows, key=lambda r: -r["ms"])[:5]],
    }


def compare(rows: Sequence[dict[str, Any]], exact: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Case by case, ``rows`` against the same cases compiled at ``gap_bytes=0``."""
    pairs = [(r["bytes"], e["bytes"]) for r, e in zip(rows, exact) if r["bytes"] is not None and e["bytes"] is not None]
    return {
        "collectives_total": sum(e["collectives"] or 0 for e in exact),
        "more_bytes": sum(x > y for x, y in pairs),
        "fewer_bytes": sum(x < y for x, y in pairs),
        "most_bytes_more": max((x - y for x, y in pairs), default=0),
    }


def _proofs(summary: dict[str, Any]) -> str:
    proven = summary["cases"] - summary["not_proven_optimal"]
    return (f"proven cheapest {proven}, proven within the gap {summary['proven_within_gap']} "
            f"(at most {summary['largest_gap_bytes']} B), budget ran out {summary['budget_ran_out']}")


SWEEP = (0.005, 0.0125, 0.025, BUDGET_S, 0.1, 0.5)


def sweep(n: int, seed: int, budgets: Sequence[float] = SWEEP, even: bool = False,
          gap_bytes: int | None = None) -> list[dict[str, Any]]:
    """Per budget: the summary, and how many plans send more / fewer bytes than at the
    default budget (the busiest rank's bytes, case by case)."""
    runs = {b: measure(n, seed, b, even, gap_bytes) for b in budgets}
    base = runs[BUDGET_S] if BUDGET_S in runs else measure(n, seed, BUDGET_S, even, gap_bytes)
    out = []
    for b, rows in runs.items():
        pairs = [(r["bytes"], d["bytes"]) for r, d in zip(rows, base) if r["bytes"] is not None and d["bytes"] is not None]
        out.append({"budget_s": b, **summarize(rows, b),
                    "worse_than_default": sum(x > y for x, y in pairs),
                    "better_than_default": sum(x < y for x, y in pairs)})
    return out


def _print_sweep(table: Sequence[dict[str, Any]], n: int, seed: int) -> None:
    print(f"6-axis mesh {MESH}, {n} cases (seed {seed}), cold compiles at each budget (CPU time):")
    print(f"  {'budget_s':>8}  {'median':>9}  {'p90':>9}  {'max':>9}  {'proven':>6}  {'in gap':>6}  {'bytes':>6}  "
          f"{'worse':>5}  {'better':>6}  (than at the default {BUDGET_S})")
    for row in table:
        g = row["cpu_ms"]
        print(f"  {row['budget_s']:>8g}  {g['median']:>6.2f} ms  {g['p90']:>6.2f} ms  {g['max']:>6.1f} ms  "
              f"{row['cases'] - row['not_proven_optimal']:>6}  {row['proven_within_gap']:>6}  {row['bytes_total']:>6}  "
              f"{row['worse_than_default']:>5}  {row['better_than_default']:>6}")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description="shardc cold compile time on a 6-axis mesh against the budget")
    ap.add_argument("--cases", type=int, default=60, help="cases, the two fixed ones included (default 60)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=None, help="budget_s passed to compile (default: the planner's)")
    ap.add_argument("--gap-bytes", type=int, default=None,
                    help=f"gap_bytes passed to compile (default: the planner's, {DEFAULT_GAP_BYTES})")
    ap.add_argument("--json", metavar="PATH", help="write rows + summary as JSON ('-': stdout only)")
    ap.add_argument("--sweep", action="store_true", help=f"compile at the budgets {', '.join(map(str, SWEEP))} "
                    "and print what each buys")
    ap.add_argument("--even", action="store_true", help="scale every dim by the world size (64): blocks even "
                    "in every state")
    args = ap.parse_args(argv)
    shapes = "dims x 64, even blocks" if args.even else "dims of 1-9 elements"
    gap = DEFAULT_GAP_BYTES if args.gap_bytes is None else args.gap_bytes
    if args.sweep:
        table = sweep(args.cases, args.seed, even=args.even, gap_bytes=args.gap_bytes)
        if args.json != "-":
            print(f"({shapes}, gap_bytes={gap})")
            _print_sweep(table, args.cases, args.seed)
        if args.json == "-":
            print(json.dumps({"sweep": table}, indent=2))
        elif args.json:
            Path(args.json).write_text(json.dumps({"sweep": table}, indent=2))
        return {"sweep": table}
    rows = measure(args.cases, args.seed, args.budget, args.even, args.gap_bytes)
    summary = summarize(rows, args.budget or BUDGET_S)
    if args.gap_bytes != 0:  # the same cases proven exactly, in the same run: what the gap trades
        exact = measure(args.cases, args.seed, args.budget, args.even, 0)
        summary["exact"] = {**summarize(exact, args.budget or BUDGET_S), **compare(rows, exact)}
    if args.json == "-":
        print(json.dumps({"rows": rows, "summary": summary}, indent=2))
        return summary
    print(f"6-axis mesh {MESH}, {summary['cases']} cases (seed {args.seed}, {shapes}), cold compiles:")
    for col, name in (("ms", "wall"), ("cpu_ms", "cpu ")):
        g = summary[col]
        print(f"  {name}: median {g['median']:.2f} ms, p90 {g['p90']:.2f} ms, max {g['max']:.1f} ms, "
              f"over the budget + 10% ({(args.budget or BUDGET_S) * 1.1e3:.0f} ms): {g['over_budget_plus_10pct']}")
    print(f"  at gap_bytes={gap}: {_proofs(summary)}; errors: {summary['errors']}")
    print(f"  bytes (max rank) summed over the cases: {summary['bytes_total']}, collectives: "
          f"{sum(r['collectives'] or 0 for r in rows)} (--json: per case)")
    if "exact" in summary:
        e = summary["exact"]
        print(f"  the same cases at gap_bytes=0, in this run: cpu median {e['cpu_ms']['median']:.2f} ms, "
              f"p90 {e['cpu_ms']['p90']:.2f} ms; {_proofs(e)}")
        print(f"    bytes summed {e['bytes_total']}, collectives {e['collectives_total']}; at gap_bytes={gap} "
              f"{e['more_bytes']} cases send more bytes (at most {e['most_bytes_more']} B more), "
              f"{e['fewer_bytes']} fewer")
    for s, d, t in summary["slowest"]:
        print(f"  slow: {t:8.1f} ms  {s} -> {d}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    return summary


if __name__ == "__main__":
    main()
