"""``shardc calibrate``: a quick real run on 4 gloo ranks writes a model that compile and
``shardc plan --cost-model`` accept; bad flags are refused before any rank starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lowering
from lowering.cost import CostModel
from torch_backend.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(150)
def test_calibrate_on_4_gloo_ranks_writes_a_model_compile_accepts(tmp_path: Path) -> None:
    out = tmp_path / "gloo.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "torch_backend.cli", "calibrate", "--backend", "gloo",
                        "--mesh", "dp=2,tp=2", "--sizes", "1K,4K", "--iters", "2", "--out", str(out), "--json"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=140)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["ok"] is True and report["out"] == str(out)
    # 3 groups (dp, tp, dp+tp) x 2 sizes x 4 collectives, each one collective step
    assert len(report["samples"]) == 24
    assert {tuple(sorted(s["axes"])) for s in report["samples"]} == {("dp",), ("tp",), ("dp", "tp")}
    assert all(s["seconds"] > 0 and s["bytes_max"] > 0 for s in report["samples"])
    data = json.loads(out.read_text())
    assert data == report["model"] and data["backend"] == "gloo" and data["mesh"] == "dp=2,tp=2"
    assert [(g["axes"], g["group_size"]) for g in data["fit"]["groups"]] == [(["dp"], 2), (["tp"], 2),
                                                                          (["dp", "tp"], 4)]
    model = CostModel.load(out)
    assert {a for a, _ in model.alpha} == {"dp", "tp"} and model.groups[0][0] == ("dp", "tp")
    prog = lowering.compile("f32[16]{U:(dp,tp)}", "f32[16@(dp,tp)]", "dp=2,tp=2", cost_model=str(out))
    assert prog.cost.time_s == pytest.approx(sum(model.step_time(s.axes, s.bytes_max, s.is_collective)
                                                 for s in prog.steps))


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv, needle", [
    (["--mesh", "dp=2", "--sizes", "1K,zz"], "bad message size 'zz'"),
    (["--mesh", "dp=2", "--sizes", "4K"], "2 or more distinct message sizes"),
    (["--mesh", "dp=2", "--iters", "0"], "--iters must be >= 1"),
    (["--mesh", "dp=1"], "nothing to calibrate"),
    (["--mesh", "dp=2", "--out", "/nonexistent-dir/m.json"], "cannot write the cost model"),
    (["--mesh", "dp=2,dp=2"], "dp"),
    (["--mesh", "dp=2", "--timeout", "inf"], "--timeout must be a positive finite number"),
    (["--mesh", "dp=16,tp=32"], "a local run starts one process per rank"),
])
def test_bad_calibrate_flags_are_refused_before_any_rank_starts(capsys: pytest.CaptureFixture[str],
                                                                argv: list[str], needle: str) -> None:
    rc, out, err = _main(capsys, "calibrate", *argv, "--json")
    assert rc == 2
    data = json.loads(out)
    assert data["ok"] is False and needle in data["error"] and data["hint"]
    assert needle in err


def test_plan_takes_a_cost_model_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    model = CostModel(alpha=(("dp", 1e-4), ("tp", 1e-6)), beta=(("dp", 1e-9), ("tp", 1e-10)),
                      groups=((("dp", "tp"), 2e-4, 2e-9),))
    path.write_text(json.dumps(model.to_json()))
    src, dst = "f32[64,16]{U:tp}", "f32[64@tp,16]"
    rc, out, _ = _main(capsys, "plan", "--mesh", "dp=2,tp=4", src, dst, "--cost-model", str(path), "--json")
    assert rc == 0
    want = lowering.compile(src, dst, "dp=2,tp=4", cost_model=model)
    assert json.loads(out)["cost"]["time_s"] == pytest.approx(want.cost.time_s)
    rc, out, _ = _main(capsys, "plan", "--mesh", "dp=2,tp=4", src, dst, "--cost-model", str(path),
                       "--alpha", "1e-6", "--json")
    assert rc == 2 and "replaces --alpha" in json.loads(out)["error"]
    rc, out, _ = _main(capsys, "plan", "--mesh", "dp=2,tp=4", src, dst, "--cost-model", str(tmp_path / "no.json"),
                       "--json")
    assert rc == 2 and "cannot read the cost model file" in json.loads(out)["error"]
