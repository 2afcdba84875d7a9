"""Plan speed: shardc's compile time, cold and cached, against DTensor's planners' planning time.

* shardc cold: every lru_cache of ``lowering`` and ``spec_lang`` cleared (planner, layout
  boxes, groups, lower bound, parsed types and meshes; not the loaded grammar), the types
  re-parsed untimed, then one ``lowering.compile(src, dst, mesh)`` on the fresh objects.
* shardc cached: ``lowering.compile(src_text, dst_text, mesh_text)`` again (a cache hit).
* DTensor cold: ``clear_redistribute_planner_cache()`` and ``_gen_transform_infos.cache_clear()``,
  then ``_gen_transform_infos`` + ``_optimize_transform_infos`` (what redistribute runs).
* DTensor cached: the same two calls again (the first is a functools.cache hit).

Medians over repetitions per case; the targets are a cold median < 1 ms and a cached
median < 20 µs for meshes of up to 4 axes (the redistribute cases); the 1024-rank cases are reported
against the same targets, separately.

    PYTHONPATH=. .venv/bin/python bench/plan_speed.py [--quick] [--json PATH|-]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.dtensor_planners import PLANNERS, DTensorPlanners, load_cases, plan_wall_time
from lowering.placements import format_placements, placement_specs
from lowering.planner import compile as shardc_compile
from spec_lang.parser import parse, parse_mesh

COLD_TARGET_S = 1e-3
CACHED_TARGET_S = 20e-6
# a few redistributions on 1024 ranks (4 axes, and one flat axis)
LARGE_CASES: tuple[tuple[str, str, str, str], ...] = (
    ("big-4ax-a2a", "a=4,b=4,c=8,d=8", "f32[1024@(a,b),512@(c,d)]", "f32[1024@(c,d),512@(a,b)]"),
    ("big-4ax-gather", "a=4,b=4,c=8,d=8", "f32[1024@(a,b,c,d),64]", "f32[1024,64]"),
    ("big-4ax-reverse", "a=4,b=4,c=8,d=8", "f32[1024@(a,b,c,d),64]", "f32[1024@(d,c,b,a),64]"),
    ("big-4ax-rs", "a=4,b=4,c=8,d=8", "f32[1024,512]{U:(a,b)}", "f32[1024@(c,d),512]"),
    ("big-1ax-a2a", "x=1024", "f32[4096@x,64]", "f32[4096,64@x]"),
    ("big-1ax-uneven", "x=1024", "f32[1000@x,64]", "f32[1000,64@x]"),
    ("big-1ax-rs", "x=1024", "f32[4096,64]{U:x}", "f32[4096@x,64]"),
)
QUICK_CASE_IDS = ("rd-pub-001", "rd-pub-011", "rd-pub-018", "rd-pub-023", "rd-pub-045", "rd-pub-055",
                    "rd-pub-063", "rd-pub-079")
QUICK_LARGE_IDS = ("big-1ax-a2a",)


@dataclass
class SpeedResult:
    id: str
    mesh: str
    src: str
    dst: str
    ranks: int
    axes: int
    large: bool
    shardc_cold_s: float
    shardc_cached_s: float
    shardc_cold_all_s: list[float] = field(default_factory=list)
    dtensor: dict[str, dict[str, float | str | None]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ---- shardc timing ---------------------------------------------------------------------------


def shardc_caches() -> list[Callable[..., Any]]:
    """Every lru_cache'd function of the loaded lowering / spec_lang modules (not the grammar)."""
    for name in ("lowering.planner", "lowering.layout.per_rank", "lowering.bounds", "lowering.cost",
                 "lowering.moves", "spec_lang.parser"):
        importlib.import_module(name)
    found: dict[int, Callable[..., Any]] = {}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith(("lowering", "spec_lang")):
            continue
        for attr, obj in vars(mod).items():
            if attr != "_lark" and callable(getattr(obj, "cache_clear", None)) and hasattr(obj, "cache_info"):
                found[id(obj)] = obj
    return list(found.values())


def clear_shardc_caches(caches: Sequence[Callable[..., Any]]) -> None:
    for fn in caches:
        fn.cache_clear()  # type: ignore[attr-defined]


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The garbage collector off while timing (as timeit does); a full collection with torch
    loaded costs ~0.1 s and would land on a random repetition."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def time_shardc_cold(src: str, dst: str, mesh: str, reps: int, caches: Sequence[Callable[..., Any]]) -> list[float]:
    """Seconds per cold compile (all caches cleared, fresh types), one per repetition."""
    out = []
    for _ in range(reps):
        clear_shardc_caches(caches)
        s, d, m = parse(src), parse(dst), parse_mesh(mesh)
        with no_gc():
            t0 = time.perf_counter()
            shardc_compile(s, d, m)
            out.append(time.perf_counter() - t0)
    return out


def time_calls(fn: Callable[[], Any], reps: int) -> float:
    """Median seconds of ``fn()`` after one warm-up call."""
    fn()
    times = []
    with no_gc():
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---- DTensor timing ---------------------------------------------------------------------------


def dtensor_inputs(case: dict[str, Any]) -> dict[str, Any]:
    """The case's DTensor placements (the recorded ones, or derived from the types for extra cases)."""
    if "anchor_inputs" in case:
        return case["anchor_inputs"]["dtensor"]
    out: dict[str, Any] = {}
    for side in ("src", "dst"):
        specs, order = placement_specs(parse(case[side]), parse_mesh(case["mesh"]))
        out[side] = format_placements(specs)
        if order:
            out[f"{side}_order"] = {str(k): v for k, v in order.items()}
    return out


def time_dtensor(planners: DTensorPlanners, case: dict[str, Any], cold_reps: int,
                 cached_reps: int) -> dict[str, dict[str, float | str | None]]:
    """{planner: {cold_s, cached_s, error}} for DTensor's default and min-cost planners."""
    out: dict[str, dict[str, float | str | None]] = {}
    try:
        src, dst, _, _ = planners.case_specs({**case, "anchor_inputs": {"dtensor": dtensor_inputs(case)}})
    except Exception as e:
        return {p: {"cold_s": None, "cached_s": None, "error": f"{type(e).__name__}: {e}"} for p in PLANNERS}
    for p in PLANNERS:
        try:
            with no_gc():
                cold = statistics.median(plan_wall_time(planners, src, dst, p, cold=True) for _ in range(cold_reps))
            cached = time_calls(lambda p=p: plan_wall_time(planners, src, dst, p, cold=False), cached_reps)
            out[p] = {"cold_s": cold, "cached_s": cached, "error": None}
        except Exception as e:
            out[p] = {"cold_s": None, "cached_s": None, "error": f"{type(e).__name__}: {e}"}
    return out


# ---- one case ----------------------------------------------------------------------------------


def measure(case: dict[str, Any], planners: DTensorPlanners, caches: Sequence[Callable[..., Any]],
            cold_reps: int, cached_reps: int, large: bool) -> SpeedResult:
    src, dst, mesh = case["src"], case["dst"], case["mesh"]
    colds = time_shardc_cold(src, dst, mesh, cold_reps, caches)
    cached = time_calls(lambda: shardc_compile(src, dst, mesh), cached_reps)
    m = parse_mesh(mesh)
    return SpeedResult(
        id=case["id"], mesh=mesh, src=src, dst=dst, ranks=m.size, axes=m.ndim, large=large,
        shardc_cold_s=statistics.median(colds), shardc_cached_s=cached, shardc_cold_all_s=colds,
        dtensor=time_dtensor(planners, case, cold_reps, cached_reps),
    )


# ---- summary -----------------------------------------------------------------------------------


def _pct(values: Sequence[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _group(results: Sequence[SpeedResult]) -> dict[str, Any]:
    if not results:
        return {}
    cold = [r.shardc_cold_s for r in results]
    cached = [r.shardc_cached_s for r in results]
    out: dict[str, Any] = {
        "cases": len(results),
        "shardc_cold_median_s": statistics.median(cold),
        "shardc_cold_best_median_s": statistics.median(min(r.shardc_cold_all_s) for r in results),
        "shardc_cold_p90_s": _pct(cold, 0.9),
        "shardc_cold_max_s": max(cold),
        "shardc_cold_slowest": [(r.id, r.shardc_cold_s) for r in sorted(results, key=lambda r: -r.shardc_cold_s)[:5]],
        "shardc_cold_cases_over_target": sum(c >= COLD_TARGET_S for c in cold),
        "shardc_cached_median_s": statistics.median(cached),
        "shardc_cached_max_s": max(cached),
        "cold_target_met": statistics.median(cold) < COLD_TARGET_S,
        "cached_target_met": statistics.median(cached) < CACHED_TARGET_S,
    }
    for p in PLANNERS:
        ok = [r.dtensor[p] for r in results if r.dtensor.get(p, {}).get("error") is None]
        if ok:
            out[f"dtensor_{p}_cold_median_s"] = statistics.median(float(d["cold_s"]) for d in ok)
            out[f"dtensor_{p}_cached_median_s"] = statistics.median(float(d["cached_s"]) for d in ok)
        out[f"dtensor_{p}_errors"] = [r.id for r in results if r.dtensor.get(p, {}).get("error")]
    return out


def summarize(results: Sequence[SpeedResult]) -> dict[str, Any]:
    return {
        "targets": {"cold_s": COLD_TARGET_S, "cached_s": CACHED_TARGET_S},
        "cases": _group([r for r in results if not r.large]),
        "large": _group([r for r in results if r.large]),
    }


# ---- output --------------------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:.3f}"


def _us(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e6:.1f}"


def render(results: Sequence[SpeedResult], console: Any) -> None:
    from rich.table import Table

    table = Table(title="planning time, medians (cold in ms, cached in µs)")
    for col in ("case", "mesh", "ranks", "shardc cold ms", "shardc cached µs", "DT default cold ms",
                "DT default cached µs", "DT min-cost cold ms", "DT min-cost cached µs"):
        table.add_column(col, overflow="fold")
    for r in results:
        cold = _ms(r.shardc_cold_s)
        if r.shardc_cold_s >= COLD_TARGET_S:
            cold = f"[yellow]{cold}[/yellow]"
        row = [r.id, r.mesh, str(r.ranks), cold, _us(r.shardc_cached_s)]
        for p in PLANNERS:
            d = r.dtensor.get(p, {})
            if d.get("error"):
                row += ["[red]error[/red]", "—"]
            else:
                row += [_ms(d.get("cold_s")), _us(d.get("cached_s"))]  # type: ignore[arg-type]
        table.add_row(*row)
    console.print(table)


def _group_lines(name: str, g: dict[str, Any]) -> list[str]:
    if not g:
        return []
    ok = {True: "met", False: "NOT met"}
    lines = [
        f"{name}: {g['cases']} cases",
        f"  shardc cold   median {_ms(g['shardc_cold_median_s'])} ms (target < {_ms(COLD_TARGET_S)} ms: "
        f"{ok[g['cold_target_met']]}), p90 {_ms(g['shardc_cold_p90_s'])} ms, max {_ms(g['shardc_cold_max_s'])} ms, "
        f"{g['shardc_cold_cases_over_target']} case(s) over 1 ms; median of per-case best "
        f"{_ms(g['shardc_cold_best_median_s'])} ms",
        "  slowest cold: " + ", ".join(f"{i} {_ms(t)} ms" for i, t in g["shardc_cold_slowest"]),
        f"  shardc cached median {_us(g['shardc_cached_median_s'])} µs (target < {_us(CACHED_TARGET_S)} µs: "
        f"{ok[g['cached_target_met']]}), max {_us(g['shardc_cached_max_s'])} µs",
    ]
    for p in PLANNERS:
        if f"dtensor_{p}_cold_median_s" in g:
            lines.append(f"  DTensor {p:8s} cold median {_ms(g[f'dtensor_{p}_cold_median_s'])} ms, cached median "
                         f"{_us(g[f'dtensor_{p}_cached_median_s'])} µs"
                         + (f", errors {g[f'dtensor_{p}_errors']}" if g[f"dtensor_{p}_errors"] else ""))
    return lines


def render_summary(summary: dict[str, Any], console: Any) -> None:
    for line in _group_lines("cases (<= 4 axes, <= 16 ranks)", summary["cases"]) + _group_lines(
            "1024 ranks", summary["large"]):
        console.print(line, highlight=False)


# ---- main ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="shardc vs DTensor planning time")
    ap.add_argument("--quick", action="store_true", help="a small subset, few repetitions")
    ap.add_argument("--cold-reps", type=int, default=None, help="cold repetitions per case (default 7, quick 3)")
    ap.add_argument("--cached-reps", type=int, default=None, help="cached repetitions (default 200, quick 50)")
    ap.add_argument("--large-reps", type=int, default=None, help="cold repetitions on 1024 ranks (default 3, quick 1)")
    ap.add_argument("--no-large", action="store_true", help="skip the 1024-rank cases")
    ap.add_argument("--json", metavar="PATH", help="write results + summary as JSON ('-': stdout, no tables)")
    return ap.parse_args(argv)


def select(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cases = [c for c in load_cases() if not args.quick or c["id"] in QUICK_CASE_IDS]
    large = [] if args.no_large else [
        {"id": i, "mesh": m, "src": s, "dst": d} for i, m, s, d in LARGE_CASES
        if not args.quick or i in QUICK_LARGE_IDS
    ]
    return cases, large


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns ``{"cases": [SpeedResult...], "summary": {...}}``."""
    from rich.console import Console

    args = parse_args(argv)
    cold_reps = args.cold_reps or (3 if args.quick else 7)
    cached_reps = args.cached_reps or (50 if args.quick else 200)
    large_reps = args.large_reps or (1 if args.quick else 3)
    cases, large = select(args)
    caches = shardc_caches()
    t0 = time.perf_counter()
    with DTensorPlanners() as planners:
        results = [measure(c, planners, caches, cold_reps, cached_reps, False) for c in cases]
        results += [measure(c, planners, caches, large_reps, cached_reps, True) for c in large]
    summary = summarize(results)
    summary["wall_s"] = time.perf_counter() - t0
    console = Console(width=None if sys.stdout.isatty() else 200, quiet=args.json == "-")
    render(results, console)
    render_summary(summary, console)
    console.print(f"benchmark wall time {summary['wall_s']:.1f} s", highlight=False)
    if args.json:
        text = json.dumps({"cases": [r.to_json() for r in results], "summary": summary}, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)
    return {"cases": results, "summary": summary}


if __name__ == "__main__":
    main()
    sys.exit(0)
