"""The CLI as a newcomer meets it: ``--version``, JSON refusals under ``--json``, big meshes
summarised by ``parse``, and ``show`` pictures that fit 80 columns with every rank whole."""

from __future__ import annotations

import json
import re

import pytest

from lowering.layout import local_shapes
from spec_lang import parse, parse_mesh
from torch_backend.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert re.fullmatch(r"shardc \d+\.\d+\.\d+.*\n", out), out


@pytest.mark.parametrize("argv,error,position", [
    (["parse", "f32[8@(dp,tp]", "--json"], "malformed type", 12),
    (["parse", "f32[8@zz]", "--mesh", "dp=2", "--json"], "'zz' is not on the mesh", 6),
    (["plan", "f32[8@dp]", "f32[9]", "--mesh", "dp=2", "--json"], "global shapes differ", 3),
    (["plan", "f32[8@dp]", "f32[8]", "--mesh", "dp=2,dp=4", "--json"], "repeated", 5),
    (["run", "f32[8@zz]", "f32[8]", "--mesh", "dp=2", "--json"], "'zz' is not on the mesh", None),
    (["run", "f32[8@dp]", "f32[8]", "--mesh", "dp=2", "--timeout", "nan", "--json"],
     "--timeout must be a positive finite number", None),
    (["run", "f32[8@dp]", "f32[8]", "--mesh", "dp=2", "--timeout", "1e300", "--json"],
     "longer than the longest allowed", None),
    (["run", "f32[8@dp]", "f32[8]", "--mesh", "dp=1024", "--json"], "a local run starts one process per rank", None),
    (["run", "u16[8@tp]{U:dp}", "u16[8]", "--mesh", "dp=2,tp=2", "--json"],
     "reduction of uint16 cannot be carried out", None),
    (["run", "f32[8]{U:dp}", "f32[8]", "--mesh", "dp=2", "--dtype", "f8_e5m2", "--json"],
     "reduction of float8_e5m2 cannot be carried out", None),
    # a mesh that cannot be laid out is refused, not a MemoryError (issue 25)
    (["plan", "f32[8@dp]", "f32[8]", "--mesh", "dp=1000000000000000000", "--json"],
     "more than the 1,048,576 (2**20) a mesh may have", 0),
    (["run", "f32[8@dp]", "f32[8]", "--mesh", "dp=1000000000000000000", "--json"],
     "more than the 1,048,576 (2**20) a mesh may have", 0),
    (["parse", "f32[8@dp]", "--mesh", "tp=2,dp=1000000000000000000", "--json"],
     "more than the 1,048,576 (2**20) a mesh may have", 5),
])
def test_json_refusal(capsys: pytest.CaptureFixture[str], argv: list[str], error: str, position: int | None) -> None:
    if argv[0] == "run":
        pytest.importorskip("torch")
    rc, out, err = _run(capsys, *argv)
    assert rc == 2
    info = json.loads(out)
    assert info["ok"] is False and error in info["error"]
    assert info["hint"]
    if position is not None:
        assert info["position"] == position
    assert "error:" in err  # the human form still goes to stderr


def test_show_refuses_a_mesh_too_big_to_lay_out(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(capsys, "show", "f32[8@dp]", "--mesh", "dp=1000000000000000000")
    assert rc == 2 and "more than the 1,048,576 (2**20) a mesh may have" in err and "hint:" in err
    assert "Traceback" not in err + out


def test_json_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", "f32[8]", "--json"])
    out = capsys.readouterr().out
    assert info.value.code == 2
    data = json.loads(out)
    assert data["ok"] is False and "required" in data["error"]


def test_json_success_says_ok(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["parse", "f32[8@dp]", "--mesh", "dp=2", "--json"],
                 ["plan", "f32[8@dp]", "f32[8]", "--mesh", "dp=2", "--json"]):
        rc, out, _ = _run(capsys, *argv)
        assert rc == 0 and json.loads(out)["ok"] is True


def test_parse_summarises_big_meshes(capsys: pytest.CaptureFixture[str]) -> None:
    type_text, mesh_text = "f32[10@(dp,tp),7@cp]", "dp=4,tp=8,cp=3"
    rc, out, _ = _run(capsys, "parse", type_text, "--mesh", mesh_text, "--json")
    info = json.loads(out)
    assert rc == 0 and info["ranks"] is None
    # the summary against the layout algebra: counts and rank sets per distinct shape
    shapes = local_shapes(parse(type_text), parse_mesh(mesh_text))
    assert sum(s["count"] for s in info["local_shapes"]) == 96
    for s in info["local_shapes"]:
        holders = [r for r, sh in enumerate(shapes) if list(sh) == s["shape"]]
        assert s["count"] == len(holders)
    first = info["local_shapes"][0]
    assert first["shape"] == [1, 3] and first["ranks"].startswith("0-1,3-4,6-7,24-25")
    rc, out, _ = _run(capsys, "parse", type_text, "--mesh", mesh_text)
    assert "96 ranks, 4 distinct local shape(s) (--all lists every rank)" in out
    assert "  shape (1, 1) on 10 rank(s): 2,5,8,26,29,32,50,53,56,74" in out
    assert "... (6 more runs)" in out
    rc, out, _ = _run(capsys, "parse", type_text, "--mesh", mesh_text, "--all")
    assert out.count("\n  rank ") == 96


def test_parse_a_million_ranks_is_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "parse", "f32[8@dp]", "--mesh", "dp=1000000")
    assert rc == 0
    assert "1,000,000 ranks, 2 distinct local shape(s)" in out
    assert "shape (0,) on 999,992 rank(s): 8-999999" in out
    assert len(out.splitlines()) < 15


@pytest.mark.parametrize("type_text,mesh_text", [
    ("f32[16@(dp,tp)]", "dp=4,tp=4"),
    ("f32[4@dp,64@tp]", "dp=2,tp=16"),
    ("f32[64@(dp,tp,cp)]", "dp=4,tp=4,cp=4"),
    ("f32[4@dp,6,8@tp]{R:cp}", "dp=2,cp=2,tp=2"),
])
def test_show_fits_80_columns_with_every_rank_whole(capsys, type_text: str, mesh_text: str) -> None:
    rc, out, _ = _run(capsys, "show", type_text, "--mesh", mesh_text, "--no-color", "--width", "80")
    assert rc == 0
    assert "\u2026" not in out, "no rank number or label is cut"
    assert max(len(line) for line in out.splitlines()) <= 80
    tiles = [c.strip() for line in out.splitlines() if line.startswith("\u2502") for c in line.split("\u2502")[2:-1]]
    drawn = sorted(int(r) for c in tiles for r in c.split(",") if r.isdigit())
    world = parse_mesh(mesh_text).size
    if parse(type_text).ndim <= 2 and "{" not in type_text:
        assert drawn == list(range(world)), "each rank drawn once, whole"
    if "(band" in out:
        assert "so drawn in bands" in out


def test_show_wide_console_draws_one_grid(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "show", "f32[16@(dp,tp)]", "--mesh", "dp=4,tp=4", "--no-color", "--width", "200")
    assert rc == 0 and "band" not in out
    assert sum(line.startswith("\u2502") for line in out.splitlines()) == 1


def test_show_huge_dim_leaves_out_the_middle(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "show", "f32[200@dp]", "--mesh", "dp=100", "--no-color")
    assert rc == 0
    assert "note: dim 0: 36 of its 100 blocks not drawn (the middle ones)" in out
    assert " 99 " in out and " 0 " in out


@pytest.mark.parametrize("width", ["0", "-5", "10"])
def test_show_width_must_be_sensible(capsys: pytest.CaptureFixture[str], width: str) -> None:
    rc, _, err = _run(capsys, "show", "f32[8@dp]", "--mesh", "dp=2", "--width", width)
    assert rc == 2 and f"--width {width} is too narrow" in err and "hint:" in err


def test_run_prints_the_program_before_the_ranks_start(capsys, monkeypatch) -> None:
    """The program is on stdout before any rank starts; progress goes to stderr as plain
    lines when stderr is not a terminal; the report follows."""
    pytest.importorskip("torch")
    from torch_backend import launcher

    seen: dict[str, str] = {}

    def fake_launch(spec, world, on_progress=None, rank_fn=None):
        seen["stdout_before_launch"], seen["stderr_before_launch"] = capsys.readouterr()
        for state in ({"up": 3, "joined": 0}, {"up": 8, "joined": 8}, {"up": 8, "joined": 8, "done": 8}):
            on_progress({"up": 0, "joined": 0, "bench": 0, "done": 0, "failed": 0, **state})
        reports = {r: {"rank": r, "ok": True, "time_s": 1e-4, "device": "cpu"} for r in range(world)}
        return launcher.RunResult(ok=True, world=world, backend=spec.backend, reports=reports)

    monkeypatch.setattr(launcher, "launch_local", fake_launch)
    monkeypatch.setattr(launcher, "under_torchrun", lambda: False)
    rc = main(["run", "--mesh", "dp=2,tp=4", "f32[12@(dp,tp),10]", "f32[12@tp,10]", "--backend", "gloo"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert seen["stdout_before_launch"].startswith("program on mesh dp=2,tp=4")
    assert "program on mesh" not in out, "printed once, first"
    assert out.startswith("ran on 8 ranks (gloo, cpu): ok")
    err = seen["stderr_before_launch"] + err
    lines = [line.split("] ", 1)[1] for line in err.splitlines() if line.startswith("shardc run: [")]
    assert lines == ["starting 8 ranks (gloo)", "8 ranks started",
                     "process group ready (gloo); running the program", "all ranks reported"], err


def test_run_progress_counts_ranks_as_they_start(capsys, monkeypatch) -> None:
    from torch_backend.cli import progress

    clock = iter(float(t) for t in range(0, 100, 3))
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    p = progress.RunProgress(4, "gloo", 5, rich=False, plain=True)
    for state in ({"up": 1}, {"up": 2}, {"up": 4, "joined": 4}, {"up": 4, "joined": 4, "bench": 5},
                  {"up": 4, "joined": 4, "bench": 5, "failed": 1}):
        p({"up": 0, "joined": 0, "bench": 0, "done": 0, "failed": 0, **state})
    p.close()
    said = [line.split("] ", 1)[1] for line in capsys.readouterr().err.splitlines()]
    assert said == ["starting 4 ranks (gloo)", "1/4 ranks started", "2/4 ranks started", "4 ranks started",
                    "process group ready (gloo); running the program", "5 timed runs done",
                    "a rank failed; collecting the reports", "all ranks reported"]


def test_show_wraps_long_rank_lists_inside_tiles(capsys: pytest.CaptureFixture[str]) -> None:
    """Replicated axes make long rank lists: they wrap at commas in their tile (one band)
    rather than cutting the grid into bands or a rank number in two."""
    rc, out, _ = _run(capsys, "show", "f32[10@tp]", "--mesh", "dp=3,tp=4,cp=5", "--no-color", "--width", "80")
    assert rc == 0 and "band" not in out
    assert max(len(line) for line in out.splitlines()) <= 80
    columns: dict[int, str] = {}
    for line in out.splitlines():
        if line.startswith("\u2502"):
            for j, cell in enumerate(line.split("\u2502")[2:-1]):
                columns[j] = columns.get(j, "") + cell.strip()
    # the layout algebra: block 0:3 (tp=0) is held by the ranks whose tp coordinate is 0
    assert columns == {0: "0-4,20-24,40-44", 1: "5-9,25-29,45-49", 2: "10-14,30-34,50-54",
                       3: "15-19,35-39,55-59"}, out
