"""Where a cold compile's time goes, on the cases of bench/plan_budget.py.

Each part is one of the planner's functions, timed inclusively (wall clock) on every call
while the cases compile cold, and reported in ms per case. The first five run mostly
inside the search loop; the fallback's routes are priced through ``move_bytes`` too, and
the goal's floors read, outside it. The timers add about 0.3 us a call.

Beside the parts, for every case the search did not prove: the bytes floor of the search
key at the start (what the key's bytes term says before any move) against the program's
bytes. Where that floor sits far below, only a floor that proves sooner can end the
search sooner; a cheaper move only reaches the same cut-off sooner.

    PYTHONPATH=. .venv/bin/python bench/plan_parts.py [--cases 60] [--seed 0] [--even] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import plan_budget
from bench.plan_budget import MESH

# (what it is, module, function): looked up through the module at each call, so a
# wrapper put on the module attribute sees every call
PARTS = (
    ("pricing a move (the kind's price)", "lowering.labels", "move_bytes"),
    ("the mean floor of a state", "lowering.labels", "_future"),
    ("the holder-class floor of a state", "lowering.labels", "_classes_in_bytes"),
    ("generating a state's moves", "lowering.planner", "_moves"),
    ("the live bytes of a move (peak)", "lowering.labels", "_live_max"),
    ("the search loop (most of the five above)", "lowering.planner", "_search_labels"),
    ("building the fallback routes", "lowering.planner", "fallback_routes"),
    ("assembling the program", "lowering.planner", "_assemble"),
)


@contextmanager
def timed_parts(spent: Counter[str]) -> Iterator[None]:
    """Wrap every part for the duration: ``spent[name]`` adds up the seconds inside it."""
    saved: list[tuple[Any, str, Callable[..., Any]]] = []

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0
        return timed

    try:
        for _, module, name in PARTS:
            mod = importlib.import_module(module)
            saved.append((mod, name, getattr(mod, name)))
            setattr(mod, name, wrap(name, getattr(mod, name)))
        yield
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


def measure(n: int, seed: int, even: bool, repeat: int) -> dict[str, Any]:
    """The budget bench's cold compiles (``plan_budget.measure``), ``repeat`` times, with the
    parts timed; then, outside the timing, the start's bytes floor of each case not proven."""
    from lowering.cost import DEFAULT_COST_MODEL
    from lowering.labels import SearchContext
    from lowering.moves import erase
    from spec_lang.parser import parse, parse_mesh

    spent: Counter[str] = Counter()
    with timed_parts(spent):
        rows = [row for _ in range(repeat) for row in plan_budget.measure(n, seed, even=even)]
    mesh = parse_mesh(MESH)
    not_proven = []
    for row in rows[:n]:
        if row["gap_bytes"] is None:  # the search ran out of its budget
            start, goal = erase(parse(row["src"])), erase(parse(row["dst"]))
            ctx = SearchContext(start, goal, mesh, DEFAULT_COST_MODEL)
            not_proven.append({"floor_at_start": ctx.key(ctx.first, start)[0], "bytes": row["bytes"],
                               "src": row["src"], "dst": row["dst"]})
    times = [row["ms"] for row in rows]
    return {
        "compiles": len(rows),
        "mean_ms": statistics.mean(times),
        "median_ms": statistics.median(times),
        "parts_ms": {name: spent[name] / len(rows) * 1e3 for _, _, name in PARTS},
        "not_proven": not_proven,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description="where a cold compile's time goes, part by part")
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--even", action="store_true", help="the cases with every dim 64 times longer")
    ap.add_argument("--repeat", type=int, default=3, help="compiles of every case (default 3)")
    args = ap.parse_args(argv)
    out = measure(args.cases, args.seed, args.even, args.repeat)
    print(f"6-axis mesh {MESH}, {args.cases} cases (seed {args.seed}{', even' if args.even else ''}), "
          f"{out['compiles']} cold compiles: mean {out['mean_ms']:.2f} ms, median {out['median_ms']:.2f} ms "
          "(wall, timers included)")
    print("  inclusive ms per case:")
    for (what, _, name), ms in zip(PARTS, out["parts_ms"].values()):
        print(f"    {ms:6.2f}  {what} ({name})")
    gaps = out["not_proven"]
    below = sum(g["floor_at_start"] < g["bytes"] for g in gaps)
    print(f"  not proven: {len(gaps)}; in {below} of them the key's bytes floor at the start is below the "
          "program's bytes:")
    for g in sorted(gaps, key=lambda g: g["floor_at_start"] / max(g["bytes"], 1))[:5]:
        print(f"    floor {g['floor_at_start']:>10} B  program {g['bytes']:>10} B  {g['src']} -> {g['dst']}")
    return out


if __name__ == "__main__":
    main()
