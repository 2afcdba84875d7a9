"""A rank that raises, dies or hangs mid-program: the others stop with a clear error
within the collective timeout, and ``shardc run`` names the failed rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
# the collective timeout given to shardc run: it bounds only the program's collectives on
# tiny tensors (well under a second, even cold on a busy machine; a rank that is late anyway
# makes the others stop early, and the hung rank is still the one that never reports);
# joining the group, which waits for every rank to import torch, has its own start-up allowance
TIMEOUT = 2
HANG_S = 600  # how long the "sleep" fault sleeps: far longer than any run may take
# on dp=2,tp=2 the program's last step (today its only one, all_to_all(dp,tp)) is where the fault hits
SRC, DST = "f32[12@(dp,tp),10]", "f32[12@tp,10]"


def run_with_fault(fault: str) -> tuple[dict, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), SHARDC_FAULT=fault)
    p = subprocess.run([sys.executable, "-m", "torch_backend.cli", "run", "--mesh", "dp=2,tp=2", SRC, DST,
                        "--json", "--timeout", str(TIMEOUT)], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=150)  # < HANG_S: a launcher that waits for a hung rank fails here
    assert p.returncode == 1, (p.stdout, p.stderr)
    return json.loads(p.stdout), p.stderr


def _program_steps() -> int:
    import lowering

    return len(lowering.compile(SRC, DST, "dp=2,tp=2").steps)


@pytest.mark.timeout(160)
@pytest.mark.parametrize("kind,rank", [("raise", 2), ("exit", 1), ("sleep", 3)])
def test_failed_rank_is_named(kind, rank):
    step = _program_steps() - 1
    fault = f"rank={rank},step={step},kind={kind}" + (f",seconds={HANG_S}" if kind == "sleep" else "")
    data, _ = run_with_fault(fault)
    assert data["ok"] is False
    assert data["failed_rank"] == rank, data["error"]
    err = data["error"]
    first = err.splitlines()[0]
    assert first.startswith(f"rank {rank} "), err
    assert {"raise": "injected fault", "exit": "died", "sleep": "hung"}[kind] in first
    # the surviving ranks' own errors name the culprit too (read from the launcher's store)
    assert f"rank {rank}" in err.split("collective errors", 1)[-1], err
    # each survivor gave up on the stuck step: after about the collective timeout, and well
    # before the hung rank would have woken (order, not a tight time: 2 busy cores)
    waits = [r["failed_after_s"] for r in data["rank_reports"] if "failed_after_s" in r]
    assert waits and max(waits) < HANG_S / 4, waits
