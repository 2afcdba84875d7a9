"""The benchmark and oracle cases kept in the repo: ``bench/cases/*.jsonl``.

Each file is regenerated from the live anchors (DTensor's planners, JAX/XLA) by
``bench/regen_cases.py``; tests only read them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CASES_DIR = REPO_ROOT / "bench" / "cases"


def load_cases(name: str) -> list[dict[str, Any]]:
    """The cases of ``name`` (``redistribute.jsonl`` or ``layouts.jsonl``), one dict per line."""
    path = CASES_DIR / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def case_params(name: str) -> list[Any]:
    """pytest params (one per case, id = case id) for parametrize at collection time."""
    return [pytest.param(c, id=c["id"]) for c in load_cases(name)]
