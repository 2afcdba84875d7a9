"""Every case of ``bench/cases/redistribute.jsonl`` compiles to the program recorded in
``tests/data/recorded_plans.jsonl`` (by ``bench/record_plans.py``), under the bytes-first and
an alpha-beta model: a change of the planning layer that is not meant to change plans
leaves them byte-identical, step for step."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import record_plans  # noqa: E402

RECORDED = [json.loads(line) for line in record_plans.RECORD.read_text().splitlines() if line.strip()]
CASES = {c["id"]: c for c in (json.loads(line) for line in record_plans.CASES.read_text().splitlines() if line.strip())}


def test_every_case_is_recorded() -> None:
    assert {(r["id"], r["model"]) for r in RECORDED} == {(i, m) for i in CASES for m in record_plans.MODELS}


@pytest.mark.parametrize("row", RECORDED, ids=lambda r: f"{r['id']}-{r['model']}")
def test_plan_is_as_recorded(row: dict) -> None:
    assert record_plans.plan_of(CASES[row["id"]], row["model"]) == row
