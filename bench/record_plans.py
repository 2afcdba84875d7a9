"""Record the program shardc compiles for every case in ``bench/cases/redistribute.jsonl``.

A refactor of the planning layer must leave every plan as it was: ``tests/test_plans_recorded.py``
compiles the same cases and compares them with the file this writes. Each case is compiled
under the default (bytes-first) model and under an alpha-beta model, since the two search
differently. Re-record only when a plan is meant to change, and say why in the commit::

    python bench/record_plans.py            # writes tests/data/recorded_plans.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "bench" / "cases" / "redistribute.jsonl"
RECORD = ROOT / "tests" / "data" / "recorded_plans.jsonl"
MODELS = ("bytes", "alpha")


def plan_of(case: dict[str, Any], model: str) -> dict[str, Any]:
    """The program for one case under one model, as comparable data: each step and the cost."""
    import lowering

    cost_model = None if model == "bytes" else lowering.CostModel(default_alpha=5e-6, default_beta=1 / 12.5e9)
    prog = lowering.compile(case["src"], case["dst"], case["mesh"], cost_model=cost_model)
    return {
        "id": case["id"], "model": model,
        "steps": [{"kind": s.kind, "axes": list(s.axes), "dims": list(s.dims), "src": str(s.src),
                   "dst": str(s.dst), "op": s.op, "padded": s.padded} for s in prog.steps],
        "bytes_max": prog.cost.bytes_max,
        "bytes_sent_max": prog.cost.bytes_sent_max,
        "collectives": prog.cost.collectives,
    }


def record() -> list[dict[str, Any]]:
    cases = [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]
    return [plan_of(c, m) for c in cases for m in MODELS]


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    rows = record()
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    print(f"recorded {len(rows)} plans in {RECORD.relative_to(ROOT)}")
