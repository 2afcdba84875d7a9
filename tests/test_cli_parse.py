"""``shardc parse`` and ``shardc show`` through the CLI entry point main(argv)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torch_backend.cli import main

REPO = Path(__file__).resolve().parents[1]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_parse_text(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "parse", "f32[8@(tp,dp),16]{U:cp}", "--mesh", "dp=2,cp=2,tp=2")
    assert rc == 0
    assert "type:         float32[8@(tp,dp),16]{U:cp}" in out
    assert "short:        f32[8@(tp,dp),16]{U:cp}" in out
    assert "jax:          P(('tp', 'dp'), None, unreduced={'cp'})" in out
    assert "placements:   S(0),P(sum),S(0)" in out
    assert "shard_order:  {0: ['tp', 'dp']}" in out
    assert "strided:      _S(0,2),P(sum),S(0)" in out
    assert "rank   1 (dp=0,cp=0,tp=1): [4:6, 0:16] shape (2, 16)" in out
    assert out.count("rank ") == 8


def test_parse_without_mesh(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "parse", "bf16[4@x]{P(avg):y}")
    assert rc == 0
    assert "type:         bfloat16[4@x]{P(avg):y}" in out
    assert "not representable: P(avg)" in out
    assert "give --mesh" in out
    assert "rank" not in out


def test_parse_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "parse", "f32[10@(dp,tp)]", "--mesh", "dp=2,tp=4", "--json")
    assert rc == 0
    info = json.loads(out)
    assert info["type"] == "float32[10@(dp,tp)]"
    assert info["jax"] is None and "chunk rule" in info["jax_refusal"]
    assert info["placements"] == "S(0),S(0)" and info["shard_order"] == {} and info["strided_placements"] is None
    assert [r["shape"][0] for r in info["ranks"]] == [2, 2, 1, 0, 2, 2, 1, 0]  # the chunk rule
    assert info["ranks"][5]["coords"] == {"dp": 1, "tp": 1}
    assert info["ranks"][5]["slices"] == [[7, 9]]


def test_parse_varying_is_reported_not_fatal(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "parse", "f32[4]{V:x}", "--mesh", "x=2", "--json")
    info = json.loads(out)
    assert rc == 0 and info["placements"] is None and "Varying" in info["dtensor_refusal"]


def test_parse_errors_exit_2_with_caret(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(capsys, "parse", "f32[8@zz]", "--mesh", "dp=2")
    assert rc == 2 and out == ""
    assert "'zz' is not on the mesh" in err
    assert "    f32[8@zz]\n          ^" in err
    rc, _, err = _run(capsys, "parse", "f32[8@(dp,tp]")
    assert rc == 2 and "malformed type" in err and "hint:" in err


def test_show_2d(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "show", "f32[8@tp,16@dp]{U:cp}", "--mesh", "dp=2,cp=2,tp=2", "--no-color", "--width", "100")
    assert rc == 0
    assert "0:4" in out and "8:16" in out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    # tile (rows 0:4, cols 0:8) is held by dp=0,tp=0 for both cp: ranks 0 and 2
    assert any("0:4" in r and "0,2" in r and "4,6" in r for r in rows), out
    assert "cp: U - partial (sum)" in out


def test_show_1d_uneven(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "show", "f32[10@(dp,tp)]", "--mesh", "dp=2,tp=4", "--no-color", "--width", "120")
    assert rc == 0
    for seg in ("0:2", "2:4", "4:5", "5:7", "7:9", "9:10"):
        assert seg in out
    assert "ranks holding no elements (uneven chunk rule): 3,7" in out


def test_show_3d_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "show", "f32[4@dp,6,8@tp]{R:cp}", "--mesh", "dp=2,cp=2,tp=2", "--no-color", "--width", "120")
    assert rc == 0
    assert "the last two dims" in out
    assert "[0:2, :, :]" in out and "[2:4, :, :]" in out
    assert "cp: R - replicated" in out


def test_show_needs_mesh(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["show", "f32[8]"])


def test_cli_does_not_import_torch_or_jax() -> None:
    """parse and show stay light: neither torch nor jax is imported."""
    code = (
        "import sys; from torch_backend.cli import main; "
        "main(['parse', 'f32[8@(tp,dp)]{U:cp}', '--mesh', 'dp=2,cp=2,tp=2']); "
        "main(['show', 'f32[8@(tp,dp)]', '--mesh', 'dp=2,tp=2']); "
        "bad = [m for m in ('torch', 'jax') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
