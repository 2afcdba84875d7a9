"""Smoke test of bench/cross_mesh_plan.py at a small scale (16 ranks a mesh, one run)."""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cross_mesh_plan_bench_reports_every_case() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    mod = importlib.import_module("bench.cross_mesh_plan")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rows = mod.main(["--ranks", "16", "--runs", "1", "--parts", "2"])
    by = {r["case"]: r for r in rows}
    assert list(by) == [c[0] for c in mod.cases(16)]
    for name, r in by.items():
        assert r["compile_ms"] > 0 and r["rank_part_ms"] > 0 and len(r["rank_part_ms_all"]) == 2, name
        assert r["bytes"] >= r["bound"] > 0, name
        assert name in out.getvalue()
    # every source row goes to every destination column: n * n messages, and each
    # destination rank lacks its whole column of 16 f32 (it holds nothing on the source)
    a2a = by["all-to-all"]
    assert a2a["messages"] == 16 * 16 and a2a["bound"] == 16 * 4 and a2a["rounds"] == ["send_across"]
    assert a2a["rank_part_messages"] == [16, 16]  # rank 0 sends its row to all, rank 31 receives its column
    # the same 16 ranks reshaped: rank r holds rows [4r, 4r+4) of a 64x64 f32 on fsdp and
    # wants rows [8d, 8d+8), cols [32t, 32t+32) on dp=8,tp=2 (r = 2d + t): what it lacks
    lack = []
    for r in range(16):
        d, t = divmod(r, 2)
        rows_kept = len(set(range(4 * r, 4 * r + 4)) & set(range(8 * d, 8 * d + 8)))
        lack.append((8 - rows_kept) * 32 * 4)
    assert by["reshape fsdp->dp,tp"]["bound"] == max(lack) == by["reshape fsdp->dp,tp"]["bytes"]
    # a pending sum is finished on the source mesh first
    assert by["pending sum"]["steps"] and by["pending sum"]["rounds"] == ["send_across"]
