"""``shardc run --to-mesh``: a cross-mesh move on local gloo ranks (the union's size), each
rank's block checked against the destination's slice of the same global tensor (the
worker's ``--check``, from the layout's definition), and bad input refused before any
rank starts."""

from __future__ import annotations

import json

import pytest

from torch_backend.cli import main

pytest.importorskip("torch")


def test_run_to_mesh_checks_every_rank(capsys: pytest.CaptureFixture[str]) -> None:
    # a pending sum on ranks 0-3 finished there, then sent to a tp=2 mesh on ranks 4 and 5
    rc = main(["run", "--mesh", "dp=2,tp=2", "--to-mesh", "tp=2@[4,5]", "f32[8,8@dp]{U:tp}", "f32[8,8@tp]",
               "--check", "--bench", "2", "--json", "--backend", "gloo", "--timeout", "30"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] and out["check"] is True, out
    assert out["ranks"] == 6 and [s["kind"] for s in out["steps"]] == ["send_across"], out
    assert out["time_s"] > 0


def test_run_to_mesh_text(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--mesh", "fsdp=4@[0-3]", "--to-mesh", "rep=2,tp=2@[4-7]", "f32[8@fsdp,4]",
               "f32[8,4@tp]{R:rep}", "--check", "--backend", "gloo", "--timeout", "30"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.startswith("program from mesh fsdp=4 to mesh rep=2,tp=2@[4-7]"), out
    assert "ran on 8 ranks (gloo, cpu): ok" in out
    assert "check: every rank holds its block of float32[8,4@tp]{R:rep} on rep=2,tp=2@[4-7], the others None" in out


def test_run_to_mesh_refuses_a_bad_mesh_before_any_rank(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--mesh", "dp=2", "--to-mesh", "tp=2@[3,3]", "f32[8@dp]", "f32[8@tp]", "--check"])
    err = capsys.readouterr().err
    assert rc == 2 and "^" in err and "hint:" in err, err
    assert "starting" not in err
