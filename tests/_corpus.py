"""Locate the shared oracle corpus: ``../shared/corpus`` beside the repo root.

CI runs a clean clone with ``shared/`` checked out next to it, so the path is
relative to the repository, never absolute. Tests skip (with the path they
looked at) only when the corpus is really absent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS_DIR = (REPO_ROOT / ".." / "shared" / "corpus").resolve()


def load_corpus(name: str) -> list[dict[str, Any]]:
    """The cases of ``name`` (e.g. ``layouts_public.jsonl``), or a pytest skip if it is absent."""
    path = CORPUS_DIR / name
    if not path.is_file():
        pytest.skip(f"oracle corpus not found at {path} (expected ../shared/corpus beside the repo root)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def corpus_params(name: str) -> list[Any]:
    """pytest params (one per case, id = case id) for parametrize at collection time.

    When the corpus is absent this is a single param that skips with the path looked at.
    """
    path = CORPUS_DIR / name
    if not path.is_file():
        reason = f"oracle corpus not found at {path} (expected ../shared/corpus beside the repo root)"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="no-corpus")]
    cases = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [pytest.param(c, id=c["id"]) for c in cases]
