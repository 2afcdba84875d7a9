"""Record the program shardc compiles for every case in ``bench/cases/redistribute.jsonl``.

A refactor of the planning layer must leave every plan as it was: ``tests/test_plans_recorded.py``
compiles the same cases and compares them with the file this writes. Each case is compiled
under the default (bytes-first) model and under an alpha-beta model, since the two search
differently. Re-record only when a plan is meant to change, and say why in the commit::

    python bench/record_plans.py            # writes tests/data/recorded_plans.jsonl
    python bench/record_plans.py --jax      # writes tests/data/recorded_jax_plans.jsonl

``--jax``: the same cases under the JAX engine's cost model (``jax_backend.default_cost_model``
of each case's mesh: a timed model whose steps are priced as they lower), which
``tests/test_plans_recorded_jax.py`` compares; a change of the JAX lowerings' choices or
fits may change those plans, and is re-recorded the same way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "bench" / "cases" / "redistribute.jsonl"
RECORD = ROOT / "tests" / "data" / "recorded_plans.jsonl"
JAX_RECORD = ROOT / "tests" / "data" / "recorded_jax_plans.jsonl"
MODELS = ("bytes", "alpha")


def plan_of(case: dict[str, Any], model: str) -> dict[str, Any]:
    """The program for one case under one model, as comparable data: each step and the cost."""
    import lowering

    if model == "jax":
        from jax_backend.default_model import default_cost_model

        cost_model = default_cost_model(case["mesh"])
    else:
        cost_model = None if model == "bytes" else lowering.CostModel(default_alpha=5e-6, default_beta=1 / 12.5e9)
    prog = lowering.compile(case["src"], case["dst"], case["mesh"], cost_model=cost_model)
    extra = {"optimal": prog.optimal, "gap_bytes": prog.gap_bytes} if model == "jax" else {}
    return {
        "id": case["id"], "model": model, **extra,
        "steps": [{"kind": s.kind, "axes": list(s.axes), "dims": list(s.dims), "src": str(s.src),
                   "dst": str(s.dst), "op": s.op, "padded": s.padded} for s in prog.steps],
        "bytes_max": prog.cost.bytes_max,
        "bytes_sent_max": prog.cost.bytes_sent_max,
        "collectives": prog.cost.collectives,
    }


def record(models: tuple[str, ...] = MODELS) -> list[dict[str, Any]]:
    cases = [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]
    return [plan_of(c, m) for c in cases for m in models]


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    jax = "--jax" in sys.argv[1:]
    rows = record(("jax",) if jax else MODELS)
    out = JAX_RECORD if jax else RECORD
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    print(f"recorded {len(rows)} plans in {out.relative_to(ROOT)}")
