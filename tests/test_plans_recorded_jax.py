"""Every case of ``bench/cases/redistribute.jsonl`` compiles under the JAX engine's cost model
(``jax_backend.default_cost_model`` of its mesh, 8 and 16 ranks) to the program recorded in
``tests/data/recorded_jax_plans.jsonl`` (``python bench/record_plans.py --jax``), and what the
search proved of it: a change that makes the timed search faster leaves every plan as it was."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import record_plans  # noqa: E402

from spec_lang.parser import parse_mesh  # noqa: E402

RECORDED = [json.loads(line) for line in record_plans.JAX_RECORD.read_text().splitlines() if line.strip()]
CASES = {c["id"]: c for c in (json.loads(line) for line in record_plans.CASES.read_text().splitlines() if line.strip())}


def test_every_case_is_recorded_on_8_and_16_ranks() -> None:
    assert [r["id"] for r in RECORDED] == list(CASES)
    sizes = {parse_mesh(c["mesh"]).size for c in CASES.values()}
    assert sizes == {8, 16}


@pytest.mark.parametrize("row", RECORDED, ids=lambda r: r["id"])
def test_jax_plan_is_as_recorded(row: dict) -> None:
    assert record_plans.plan_of(CASES[row["id"]], "jax") == row
