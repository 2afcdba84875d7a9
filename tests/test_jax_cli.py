"""``shardc plan --engine jax`` shows the program lowered to one shard_map (its lax calls),
planned with the JAX engine's cost model; ``shardc run --engine jax --check`` runs it on
this process's JAX devices (8 CPU devices: conftest) and checks it against the simulator."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("jax")

from torch_backend.cli import main


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_plan_engine_jax_shows_the_lax_calls(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--engine", "jax", "--mesh", "dp=2,tp=4", "f32[2048,2048]{U:tp}", "f32[2048@tp,2048]"]
    rc, out, _ = _main(capsys, *argv)
    assert rc == 0 and "lowered to one jax.shard_map" in out
    assert "lax.psum_scatter(x, 'tp', scatter_dimension=0, tiled=True)" in out  # one, under the JAX model
    assert "JAX engine's measured cost model" in out
    rc, out, _ = _main(capsys, *argv, "--json")
    data = json.loads(out)
    assert rc == 0 and [s["kind"] for s in data["steps"]] == ["reduce_scatter"] and any("psum_scatter" in c
                                                                                      for c in data["jax"])
    rc, out, _ = _main(capsys, "plan", "--mesh", "dp=2,tp=4", *argv[5:])
    assert rc == 0 and "lax." not in out and "slice(dp)" in out  # bytes-first splits it over dp


@pytest.mark.parametrize("src,dst,mesh", [
    ("f32[16@(tp,dp),16]", "f32[16,16@dp]", "dp=4,tp=2"),
    ("f32[8@dp<3,1,4>,2]", "f32[8@dp<2,4,2>,2]", "dp=3"),  # uneven: ppermute rounds
])
def test_run_engine_jax_checks_against_the_simulator(capsys: pytest.CaptureFixture[str], src: str, dst: str,
                                                     mesh: str) -> None:
    rc, out, err = _main(capsys, "run", "--engine", "jax", "--check", "--bench", "2", "--mesh", mesh, src, dst)
    assert rc == 0, err
    assert "ran on" in out and "JAX devices" in out and "check: every rank holds" in out and "median of 2" in out
    rc, out, err = _main(capsys, "run", "--engine", "jax", "--check", "--json", "--mesh", mesh, src, dst)
    report = json.loads(out)
    assert rc == 0 and report["ok"] is True and report["check"] is True and report["engine"] == "jax"


def test_engine_jax_refuses_a_cross_mesh_move(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("plan", "run"):
        rc, out, err = _main(capsys, cmd, "--engine", "jax", "--mesh", "a=2@[0-1]", "--to-mesh", "b=2@[2-3]",
                             "f32[4@a]", "f32[4@b]")
        assert rc != 0 and "--engine jax" in out + err
