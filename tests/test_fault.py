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


# a rank that exits just before the program's first step, after the groups are made: the
# issue's dp=2,tp=4 (a reduce_scatter over tp, then an all_to_all over both axes, so the
# survivors fail at different times and in different groups) and the smaller dp=2,tp=2
EXIT_RUNS = [("dp=2,tp=2", SRC, DST)] * 2 + [("dp=2,tp=4", "f32[16@dp,8]{U:tp}", "f32[16@tp,8]")] * 2


@pytest.mark.timeout(400)
def test_a_rank_that_exits_is_reported_died_every_time():
    verdicts = []
    for mesh, src, dst in EXIT_RUNS:
        env = dict(os.environ, PYTHONPATH=str(REPO), SHARDC_FAULT="rank=3,step=0,kind=exit")
        p = subprocess.run([sys.executable, "-m", "torch_backend.cli", "run", "--mesh", mesh, src, dst, "--json",
                            "--timeout", str(TIMEOUT)], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=150)
        data = json.loads(p.stdout)
        verdicts.append((mesh, data["failed_rank"], data["error"].splitlines()[0]))
        # every survivor failed in a collective (or in making a group), never in its own code
        assert all(rep["error"].startswith("CollectiveError: ") for rep in data["rank_reports"]), data["rank_reports"]
    assert all(v[1:] == (3, "rank 3 died (exit code 17) without a report") for v in verdicts), verdicts


class _Proc:
    """A rank process as the launcher sees it: its exit code (None while it runs)."""

    def __init__(self, exitcode: int | None) -> None:
        self.exitcode, self.sentinel = exitcode, None


class _Queue:
    """The reports' queue, scripted: each get() gives the next report, or None for Empty."""

    def __init__(self, script: list) -> None:
        self.script = list(script)

    def get(self, timeout: float | None = None) -> dict:
        import queue

        if not self.script or self.script[0] is None:
            self.script = self.script[1:]
            raise queue.Empty
        return self.script.pop(0)


def test_an_exit_seen_while_a_late_report_arrives_is_a_death():
    """The race behind "rank 3 hung" for a rank that had exited: the launcher saw rank 3's
    exit while the last survivor's report was still on its way, took that report, and then,
    every rank still running having been named by the others, called rank 3 hung."""
    from torch_backend.launcher import collect, merge

    def report(r: int) -> dict:
        return {"rank": r, "ok": False, "collective": True,
                "error": "CollectiveError: ...\nat fault: rank 3 (it did not report this failure within 12 s: it died, "
                         "hangs, or never reached this collective)"}

    procs = [_Proc(None), _Proc(None), _Proc(None), _Proc(17)]
    reports, died, hung = collect(procs, _Queue([report(0), report(1), None, report(2)]), TIMEOUT, 4)
    res = merge(reports, died, hung, 4, "gloo")
    assert (died, hung, res.failed_rank) == ({3: 17}, [], 3)
    assert res.message.splitlines()[0] == "rank 3 died (exit code 17) without a report"
