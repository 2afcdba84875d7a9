"""Planning time under the JAX engine's cost model: ``lowering.compile`` of a new pair, as the
first call of ``jax_backend.redistribute`` pays it.

Each repetition empties every cache of ``lowering`` and ``jax_backend`` (the plans, the
priced moves, the lowered calls' prices) but the mesh's cost model, which a new pair on a
known mesh finds loaded, re-parses the types untimed, then times one ``compile`` under
``jax_backend.default_cost_model(mesh)``, the collector off. Median per case, in ms of the
process's CPU time (a loaded machine inflates it less than wall time; planning is one
thread), beside the program found (the steps, so a speed-up that changed a plan shows)::

    python bench/plan_speed_jax.py [--reps 5] [--only ID ...] [--devices 16] [--json PATH]

``--devices 16``: only the cases on 16-rank meshes; 8 (the default): those up to 8 ranks;
0: all. No JAX device is needed (the cost model and the lowerings' choices are plain Python).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jax_backend.default_model import default_cost_model
from lowering.caching import clear_caches
from lowering.planner import compile as shardc_compile
from spec_lang.parser import parse, parse_mesh

CASES = Path(__file__).resolve().parent / "cases" / "redistribute.jsonl"


def forget() -> None:
    """Empty shardc's caches but the meshes' cost models and fits (as ``bench/jax_vs_xla.py``'s
    ``forget``, and the lowered calls' prices too: a new pair prices its own steps)."""
    clear_caches()
    for name, module in list(sys.modules.items()):
        if name.startswith("jax_backend"):
            for attr, value in list(vars(module).items()):
                if attr not in ("_model_for", "fitted_model", "_median_model") and callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()


def time_case(case: dict[str, Any], reps: int) -> tuple[list[float], list[str]]:
    """CPU seconds per cold compile of ``case``, and its program's steps."""
    model = default_cost_model(parse_mesh(case["mesh"]))
    out, steps = [], []
    for _ in range(reps):
        forget()
        s, d, m = parse(case["src"]), parse(case["dst"]), parse_mesh(case["mesh"])
        gc.disable()
        try:
            t0 = time.process_time()
            prog = shardc_compile(s, d, m, cost_model=model)
            out.append(time.process_time() - t0)
        finally:
            gc.enable()
        steps = [st.describe() for st in prog.steps]
    return out, steps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", nargs="*", help="case ids")
    ap.add_argument("--devices", type=int, default=0, help="8: meshes of up to 8 ranks; 16: of 9 to 16; 0: all")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    cases = [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]
    if args.only:
        cases = [c for c in cases if c["id"] in args.only]
    if args.devices:
        lo = 0 if args.devices <= 8 else 8
        cases = [c for c in cases if lo < parse_mesh(c["mesh"]).size <= args.devices]
    rows = []
    for c in cases:
        times, steps = time_case(c, args.reps)
        rows.append({"id": c["id"], "mesh": c["mesh"], "ms": 1e3 * statistics.median(times),
                     "best_ms": 1e3 * min(times), "steps": steps})
        print(f"{c['id']:>12} {c['mesh']:>16} {rows[-1]['ms']:8.2f} ms (best {rows[-1]['best_ms']:.2f})  "
              + "; ".join(steps), flush=True)
    ms = [r["ms"] for r in rows]
    print(f"{len(rows)} cases: median {statistics.median(ms):.2f} ms, total {sum(ms):.1f} ms, "
          f"max {max(ms):.2f} ms ({max(rows, key=lambda r: r['ms'])['id']})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
