"""A git revision of this repository unpacked beside the working tree, so a benchmark
measures both in one run (``--baseline REV`` of ``cli_run.py`` and ``first_call.py``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def archive(rev: str, into: str) -> Path:
    """The tree of ``rev`` (``git archive``) unpacked into the folder ``into``."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=data, check=True)
    return Path(into)


def trees(baseline: str | None, into: str) -> dict[str, Path]:
    """The trees a ``--baseline`` benchmark measures, by name: this one, and ``baseline``'s
    unpacked into ``into`` where one is given."""
    found = {"this tree": ROOT}
    if baseline:
        found[baseline] = archive(baseline, into)
    return found
