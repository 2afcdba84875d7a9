"""The CLI papercuts of issue 25: ``show`` on empty dims, rank lists kept whole, long 1-D
rows folded; ``plan`` with a model of another mesh, a non-JSON model, its predicted time
and compact JSON; ``run`` quoting what was typed and refusing a dtype torch cannot hold
before any rank starts; ``run`` and ``calibrate`` without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lowering
from lowering import CostModel, local_slices
from spec_lang import SpecError
from torch_backend.cli import main

REPO = Path(__file__).resolve().parents[1]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _cells(line: str) -> list[str]:
    """The cells of a table line, the header's (heavy rules) or a body line's."""
    return [c.strip() for c in line.replace("\u2503", "\u2502").split("\u2502")[1:-1]]


def _holders(type_text: str, mesh_text: str, lo: int, hi: int) -> str:
    """The oracle: ranks whose dim-0 slice covers [lo, hi), from the layout algebra."""
    ranks = [r for r, s in enumerate(local_slices(type_text, mesh_text)) if s[0].start <= lo and hi <= s[0].stop]
    return ",".join(map(str, ranks))


# ---- show -------------------------------------------------------------------------------


@pytest.mark.parametrize("type_text", ["f32[0@dp]", "f32[4,0]", "f32[0]{U:dp}", "f32[2,0@dp,3]"])
def test_show_draws_an_empty_tensor(capsys: pytest.CaptureFixture[str], type_text: str) -> None:
    rc, out, err = _run(capsys, "show", type_text, "--mesh", "dp=4", "--no-color", "--width", "80")
    assert rc == 0, err
    assert "an empty tensor (dim" in out and "has size 0)" in out


def test_show_cuts_the_other_dims_of_an_empty_tensor(capsys: pytest.CaptureFixture[str]) -> None:
    """f32[0,4@dp]: dim 1 is cut into four columns, one per rank, as local_slices says."""
    rc, out, _ = _run(capsys, "show", "f32[0,4@dp]", "--mesh", "dp=4", "--no-color", "--width", "80")
    assert rc == 0
    header = next(_cells(line) for line in out.splitlines() if line.startswith("\u2503"))
    rows = [_cells(line) for line in out.splitlines() if line.startswith("\u2502")]
    slices = local_slices("f32[0,4@dp]", "dp=4")
    assert header[1:] == [f"{s[1].start}:{s[1].stop}" for s in slices]
    assert rows == [["0:0", "0", "1", "2", "3"]]


def test_show_keeps_a_rank_list_that_fits_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """'10,26' fits a tile 5 wide: no line break after its comma, at any width."""
    type_text, mesh_text = "f32[16@dp]", "tp=2,dp=16"
    rc, out, _ = _run(capsys, "show", type_text, "--mesh", mesh_text, "--no-color", "--width", "200")
    assert rc == 0 and "band" not in out
    rows = [_cells(line) for line in out.splitlines() if line.startswith("\u2502")]
    assert len(rows) == 1, "one line of tiles, none wrapped"
    assert rows[0][1:] == [_holders(type_text, mesh_text, i, i + 1) for i in range(16)]


def test_show_folds_a_long_1d_row(capsys: pytest.CaptureFixture[str]) -> None:
    """64 blocks in 80 columns: rows of tiles in one table (about half the lines of one
    band per row), each tile its slice over its rank, in order, every rank once."""
    type_text, mesh_text = "f32[64@dp]", "dp=64"
    rc, out, _ = _run(capsys, "show", type_text, "--mesh", mesh_text, "--no-color")
    assert rc == 0
    lines = out.splitlines()
    assert len(lines) <= 30 and max(map(len, lines)) <= 80
    rows = [_cells(line) for line in lines if line.startswith("\u2502")]
    tiles = []
    for label_row, rank_row in zip(rows[::2], rows[1::2], strict=True):
        spans = label_row[1:]
        assert label_row[0] == f"{spans[0].split(':')[0]}:{[s for s in spans if s][-1].split(':')[1]}"
        tiles += [(s, r) for s, r in zip(spans, rank_row[1:], strict=True) if s]
    want = [(f"{s[0].start}:{s[0].stop}", str(r)) for r, s in enumerate(local_slices(type_text, mesh_text))]
    assert tiles == want
    assert "note: folded into rows of tiles to fit 80 columns" in out


def test_show_folds_around_blocks_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "show", "f32[200@dp]", "--mesh", "dp=100", "--no-color")
    assert rc == 0
    rows = [_cells(line) for line in out.splitlines() if line.startswith("\u2502")]
    gap = [r for r in rows if r[0] == "..."]
    assert len(gap) == 1 and set(gap[0]) == {"..."}
    labels = [r[0] for r in rows if r[0] not in ("", "...")]
    assert labels[0].startswith("0:") and labels[-1].endswith(":200")
    assert "36 of its 100 blocks not drawn" in out


# ---- plan and the cost model ----------------------------------------------------------------


def _model_file(tmp_path: Path, mesh: str) -> Path:
    alpha, beta = {"dp": 1e-5, "tp": 2e-6}, {"dp": 1e-9, "tp": 1e-10}
    axes = [part.split("=")[0].strip() for part in mesh.split(",")]
    data = CostModel.make(alpha={a: alpha[a] for a in axes}, beta={a: beta[a] for a in axes}).to_json()
    path = tmp_path / "model.json"
    path.write_text(json.dumps({**data, "mesh": mesh}))
    return path


def test_plan_refuses_a_model_calibrated_on_another_mesh(capsys, tmp_path: Path) -> None:
    path = _model_file(tmp_path, "dp=4,tp=2")
    rc, out, err = _run(capsys, "plan", "--mesh", "dp=2,tp=4", "f32[8@dp]", "f32[8]", "--cost-model", str(path))
    assert rc == 2 and out == ""
    assert "the cost model was calibrated on the mesh dp=4,tp=2, not dp=2,tp=4" in err
    assert "shardc calibrate --mesh dp=2,tp=4" in err
    rc, _, _ = _run(capsys, "plan", "--mesh", "dp=4,tp=2", "f32[8@dp]", "f32[8]", "--cost-model", str(path))
    assert rc == 0


def test_a_loaded_model_keeps_its_mesh(tmp_path: Path) -> None:
    model = CostModel.load(_model_file(tmp_path, "dp=4, tp=2"))
    assert model.mesh == "dp=4,tp=2"
    with pytest.raises(SpecError, match="calibrated on the mesh dp=4,tp=2, not dp=2,tp=4"):
        lowering.compile("f32[8@dp]", "f32[8]", "dp=2,tp=4", cost_model=model)
    with pytest.raises(SpecError, match="calibrated on the mesh"):
        lowering.compile_many(["f32[8@dp]"], ["f32[8]"], "dp=2,tp=4", cost_model=model)
    assert lowering.compile("f32[8@dp]", "f32[8]", "dp=4,tp=2", cost_model=model).cost.collectives == 1
    assert CostModel.from_json(model.to_json()) == model
    with pytest.raises(SpecError, match="the cost model's mesh is not a mesh"):
        CostModel.from_json({"mesh": "dp=two"})


def test_a_non_json_model_file_shows_one_line(capsys, tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    path.write_text("root:x:0:0:root:/root:/bin/bash\n" + "daemon:x:1:1::/usr/sbin:/bin/false\n" * 50)
    rc, _, err = _run(capsys, "plan", "--mesh", "dp=2", "f32[8@dp]", "f32[8]", "--cost-model", str(path))
    assert rc == 2
    assert f"the cost model file '{path}' is not valid JSON: Expecting value (line 1, column 1)" in err
    assert "    root:x:0:0:root:/root:/bin/bash\n    ^\n" in err
    assert "daemon" not in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"alpha": {"dp": 1e-5},\n "beta": {"dp": 1e-9,}}\n')
    with pytest.raises(SpecError) as e:
        CostModel.load(bad)
    assert "(line 2, column 22)" in e.value.message
    assert e.value.text == ' "beta": {"dp": 1e-9,}}' and e.value.text[e.value.pos] == "}"


def test_plan_with_a_cost_model_prints_its_predicted_time(capsys, tmp_path: Path) -> None:
    path = _model_file(tmp_path, "dp=2")
    rc, out, _ = _run(capsys, "plan", "--mesh", "dp=2", "f32[8@dp]", "f32[8]", "--cost-model", str(path))
    assert rc == 0
    # one ring all_gather over dp: each rank sends its 4 floats (16 B); alpha + beta * bytes
    assert "[16 B/rank]" in out
    assert f"predicted time: {(1e-5 + 1e-9 * 16) * 1e6:.1f} us (the cost model {path})" in out
    rc, out, _ = _run(capsys, "plan", "--mesh", "dp=2", "f32[8@dp]", "f32[8]", "--alpha", "2e-2")
    assert rc == 0 and f"predicted time: {(2e-2 + 1e-10 * 16) * 1e3:.2f} ms (--alpha/--beta)" in out
    rc, out, _ = _run(capsys, "plan", "--mesh", "dp=2", "f32[8@dp]", "f32[8]")
    assert rc == 0 and "predicted time" not in out, "the bytes-first default predicts no time"


def test_plan_json_is_compact_on_a_big_mesh(capsys: pytest.CaptureFixture[str]) -> None:
    src, dst, mesh = "f32[1024@(dp,tp)]", "f32[1024@(tp,dp)]", "dp=32,tp=32"
    rc, out, _ = _run(capsys, "plan", "--mesh", mesh, src, dst, "--json")
    assert rc == 0
    assert len(out.splitlines()) < 40
    data = json.loads(out)
    prog = lowering.compile(src, dst, mesh)
    assert {k: v for k, v in data.items() if k not in ("ok", "lower_bound", "ratio_to_lower_bound")} == json.loads(
        json.dumps(prog.to_json()))
    assert data["steps"][0]["in_shapes"] == [[1]] * 1024


# ---- run ----------------------------------------------------------------------------------


def _no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_backend import launcher

    def started(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(launcher, "prepare_local_ranks", started)
    monkeypatch.setattr(launcher, "launch_local", started)


def test_run_errors_quote_the_types_as_typed(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_launch(monkeypatch)
    rc, out, err = _run(capsys, "run", "--mesh", "dp=4", "f32[9@dp]", "f32[8@dp]", "--json")
    assert rc == 2
    info = json.loads(out)
    assert "global shapes differ" in info["error"]
    assert info["text"] == "f32[8@dp]" and info["position"] == 3
    assert "float32" not in err
    rc, out, _ = _run(capsys, "run", "--mesh", "dp=4", "f32[9@zz]", "f32[9]", "--dtype", "bf16", "--json")
    assert rc == 2 and json.loads(out)["text"] == "f32[9@zz]"


@pytest.mark.parametrize("argv", [
    ["f32[9@dp]", "f32[9]", "--dtype", "i4"],
    ["i4[9@dp]", "i4[9]"],
    ["f32[9@dp]", "f32[9]", "--dtype", "u2"],
])
def test_run_refuses_a_dtype_torch_cannot_hold_before_any_rank(capsys, monkeypatch, argv: list[str]) -> None:
    _no_launch(monkeypatch)
    rc, out, err = _run(capsys, "run", "--mesh", "dp=4", *argv)
    assert rc == 2 and out == ""
    assert "has no torch equivalent that can hold data" in err and "hint:" in err


def test_every_dtype_torch_holds_runs() -> None:
    """The torch-free list that run checks is what torch has (the pinned release)."""
    torch = pytest.importorskip("torch")
    from spec_lang.ir import DTYPES
    from torch_backend.dtypes import TORCH_DTYPES
    from torch_backend.held_dtypes import TORCH_HELD

    assert set(TORCH_DTYPES) == set(TORCH_HELD) <= set(DTYPES)
    for name in TORCH_HELD:
        torch.zeros(2, dtype=TORCH_DTYPES[name]).clone()  # a copy kernel exists


# ---- without torch ----------------------------------------------------------------------------

# a finder that says torch is not installed, ahead of the real ones
_NO_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTorch())
from torch_backend.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _shardc(argv: list[str], code: str = _NO_TORCH, pythonpath: str = str(REPO)) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("argv", [
    ["run", "--mesh", "dp=2", "f32[8@dp]", "f32[8]"],
    ["calibrate", "--mesh", "dp=2"],
])
def test_run_and_calibrate_without_torch_name_the_extra(argv: list[str]) -> None:
    p = _shardc(argv)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert f"error: shardc {argv[0]} runs programs with torch, which is not installed" in p.stderr
    assert "pip install 'shardc[torch]'" in p.stderr
    p = _shardc([*argv, "--json"])
    assert p.returncode == 2 and "shardc[torch]" in json.loads(p.stdout)["hint"]


@pytest.mark.timeout(200)
def test_plan_needs_no_torch_and_a_broken_torch_is_named(tmp_path: Path) -> None:
    p = _shardc(["plan", "--mesh", "dp=2", "f32[8@dp]", "f32[8]"])
    assert p.returncode == 0 and "all_gather" in p.stdout
    # a torch that is found but does not import (its compiled part missing)
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch._C'\", name='torch._C')\n")
    code = "import sys; from torch_backend.cli import main; sys.exit(main(sys.argv[1:]))"
    p = _shardc(["run", "--mesh", "dp=2", "f32[8@dp]", "f32[8]", "--backend", "auto"], code=code,
                pythonpath=os.pathsep.join([str(tmp_path), str(REPO)]))
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and "No module named 'torch._C'" in p.stderr
    assert "pip install 'shardc[torch]'" in p.stderr


# ---- shardc run --backend auto: the program first; a quick exit -------------------------------

# stdout that notes, as the program's first line is written, whether torch was imported by then
_NOTE_TORCH = """
import sys
real = sys.stdout
class Out:
    def write(self, s):
        if s.startswith("program on mesh"):
            real.write(f"<torch imported: {'torch' in sys.modules}>\\n")
        return real.write(s)
    def __getattr__(self, name):
        return getattr(real, name)
sys.stdout = Out()
from torch_backend.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(200)
def test_run_auto_prints_the_program_before_importing_torch() -> None:
    # deciding auto (NCCL or gloo) imports torch: 1.3-5 s that --backend gloo does not wait for
    p = _shardc(["run", "--mesh", "dp=2", "f32[8@dp]", "f32[8]", "--backend", "auto"], code=_NOTE_TORCH)
    assert p.returncode == 0, p.stderr
    assert "<torch imported: False>\nprogram on mesh dp=2" in p.stdout
    assert "ran on 2 ranks (gloo, cpu): ok" in p.stdout


# the console script's exit, in a process that imported torch as shardc run does
_EXIT = """
import atexit, sys
class Teardown:
    def __del__(self):
        print("<interpreter teardown>", flush=True)
keep = Teardown()
atexit.register(lambda: print("<exit handlers>", flush=True))
import torch
sys.argv = ["shardc", "parse", "f32[8@dp]", "--mesh", "dp=2"]
from torch_backend.cli import command
command()
"""


@pytest.mark.timeout(200)
def test_the_command_exits_without_tearing_torch_down() -> None:
    # the teardown (the collector over torch's objects, its Python-registered operators leaving
    # the dispatcher) is what kept shardc run alive 1-2 s after its report
    p = _shardc([], code=_EXIT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.endswith("shape (4,)\n<exit handlers>\n"), p.stdout  # all output, exit handlers run
    assert "<interpreter teardown>" not in p.stdout
