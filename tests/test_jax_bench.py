"""Smoke test of bench/jax_vs_xla.py on two small recorded cases: its figures are real (the
outputs equal reshard's, shardc's HLO bytes at most XLA's and at least the bound, fewer
where XLA is above it)."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
ROOT = Path(__file__).resolve().parents[1]


def test_jax_vs_xla_cases_and_one_run() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    bench = importlib.import_module("bench.jax_vs_xla")
    cases = {c[0]: c for c in bench.cases(small=True)}
    assert len(cases) >= 40 and "rd-pub-008" not in cases  # P(avg) has no JAX form
    assert all(m.count("=") <= 3 for _, m, _, _ in cases.values())
    rng = np.random.default_rng(0)
    for cid in ("rd-pub-007", "rd-pub-016"):  # a pending sum, a merged exchange: XLA above the bound
        r = bench.run_case(*cases[cid], reps=2, rng=rng)
        assert r["equal"] and r["device_put_equal"] is not False
        assert r["bound"] <= r["shardc_bytes"] < r["xla_bytes"], r
        assert r["shardc_s"] > 0 and r["xla_s"] > 0 and r["shardc_first_s"] > 0


def test_the_16_device_cases_run_in_a_second_process() -> None:
    import os
    import subprocess

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    bench = importlib.import_module("bench.jax_vs_xla")
    wide = {c[0]: c for c in bench.cases(small=True, devices=16)}
    assert len(wide) >= 8 and all(c[1] == "a=2,b=2,c=2,d=2" for c in wide.values())
    assert not set(wide) & {c[0] for c in bench.cases(small=False)}
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "jax_vs_xla.py"), "--devices", "16", "--only",
                          "rd-pub-044", "--reps", "2", "--tiny-reps", "2"], env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert "16 cpu devices" in out and "outputs equal to reshard's: 1/1" in out, out


def test_fast_calls_are_timed_for_the_budget_not_a_few_reps() -> None:
    """A large case gets ``reps // 4`` reps (3 at ``--reps 10``); where its calls are fast
    (big-gather: ~2 ms) the median of 3 swung to 1.22x XLA's time on the shared machine. The
    calls go on until they have taken the budget, interleaved as before."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    bench = importlib.import_module("bench.jax_vs_xla")
    calls = {"a": 0, "b": 0}

    class Done:
        def block_until_ready(self) -> None:
            pass

    def timed(name: str, pause: float) -> object:
        def fn(_: object) -> Done:
            calls[name] += 1
            time.sleep(pause)
            return Done()
        return fn

    got = bench.walls([timed("a", 0.001), timed("b", 0.002)], None, 3, budget_s=0.1)
    assert calls["a"] == calls["b"] >= 20, calls  # ~0.1 s / 3 ms a rep, interleaved
    assert got[0] < got[1]
    calls.update(a=0, b=0)
    bench.walls([timed("a", 0.0), timed("b", 0.0)], None, 5)  # no budget: the reps
    assert calls == {"a": 5, "b": 5}
