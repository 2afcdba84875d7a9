"""The JAX engine's cost model: measured on the JAX devices (``shardc calibrate --engine
jax``), local steps' copies included (``CostModel.local_beta``), shipped per mesh as the
engine's default; under it a pending sum reduced onto a sharded dim is one psum_scatter."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lowering
from jax_backend import default_cost_model
from jax_backend.default_model import MODELS, model_path
from jax_backend.fits import call_alpha
from lowering.cost import CostModel
from spec_lang.errors import SpecError
from spec_lang.parser import parse_mesh

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mesh", ["dp=2,tp=4", "dp=4,tp=2", "dp=2,cp=2,tp=2"])
@pytest.mark.parametrize("n", [64, 2048])
def test_a_pending_sum_onto_a_sharded_dim_is_one_psum_scatter(mesh: str, n: int) -> None:
    src, dst = f"f32[{n},{n}]{{U:tp}}", f"f32[{n}@tp,{n}]"
    model = default_cost_model(parse_mesh(mesh))
    assert model.mesh == mesh and model.local_beta > 0 and not model.bytes_first
    jax_plan = lowering.compile(src, dst, mesh, cost_model=model)
    assert [s.describe() for s in jax_plan.steps] == ["reduce_scatter(tp)[sum] dim 0"]
    if n == 2048 and mesh == "dp=2,tp=4":  # the bytes-first default splits it over the spare axis
        assert len(lowering.compile(src, dst, mesh).steps) == 3


def test_a_mesh_without_a_fit_gets_the_median_model() -> None:
    model = default_cost_model(parse_mesh("a=2,b=4"))
    assert model.mesh is None and model.default_alpha > 0 and model.local_beta > 0
    assert not model_path(parse_mesh("a=2,b=4")).exists() and len(list(MODELS.glob("*.json"))) >= 4


def test_local_beta_prices_local_steps_and_round_trips() -> None:
    model = CostModel(default_alpha=1e-4, default_beta=1e-9, local_beta=2e-9)
    assert CostModel.from_json(model.to_json()) == model and not model.bytes_first
    assert model.step_time(("tp",), 0, False, 1, 1000) == pytest.approx(2e-6)
    prog = lowering.compile("f32[16,8]", "f32[16@tp,8]", "dp=2,tp=4", cost_model=model)
    assert prog.cost.time_s == pytest.approx(2e-9 * 4 * 8 * 4)  # a slice writes its 4x8 f32 block
    assert CostModel().local_beta == 0.0 and "local_beta" not in CostModel().to_json()


@pytest.mark.timeout(150)
def test_calibrate_engine_jax_writes_a_model_with_local_beta(tmp_path: Path) -> None:
    out = tmp_path / "jax.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "torch_backend.cli", "calibrate", "--engine", "jax",
                        "--mesh", "dp=2,tp=2", "--sizes", "16K,4M", "--iters", "3", "--out", str(out), "--json"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=140)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert len(report["samples"]) == 24 and all(s["seconds"] > 0 for s in report["samples"])
    data = json.loads(out.read_text())
    assert data["backend"] == "jax-cpu" and data["mesh"] == "dp=2,tp=2" and "local_beta" in data
    model = CostModel.load(out)
    assert model.local_beta == data["local_beta"] and {a for a, _ in model.alpha} == {"dp", "tp"}


def _plan(src: str, dst: str, mesh: str) -> lowering.Program:
    return lowering.compile(src, dst, mesh, cost_model=default_cost_model(parse_mesh(mesh)))


def test_the_jax_model_charges_each_lowered_round() -> None:
    # a merged exchange lowered to 4 rounds pays 4 latencies, not the kind's 1: 3 ppermutes
    # and one all_to_all within pairs of ranks (a 2-member collective's latency);
    # a dense all_to_all over 2 members pays less than one over the whole mesh
    m = parse_mesh("dp=2,tp=4")
    model = default_cost_model(m)
    rounds = lowering.make_step("all_to_all", "f32[4@dp,8@tp,8]", "f32[4,8@dp,8@tp]", m)
    alpha = model.alpha_of(rounds.axes)
    assert model.collective_time(rounds, m, rounds.bytes_max) == pytest.approx(
        3 * alpha + call_alpha(model, rounds.axes, "all_to_all", 2, m.size) + model.beta_of(rounds.axes) * rounds.bytes_max)
    pair = lowering.make_step("all_to_all", "f32[8@dp,8]", "f32[8,8@dp]", m)
    world = lowering.make_step("all_to_all", "f32[8@(dp,tp),8]", "f32[8,8@(dp,tp)]", m)
    assert model.collective_time(pair, m, 0) < model.collective_time(world, m, 0) == pytest.approx(alpha)
    assert model.to_json() == CostModel.from_json(model.to_json()).to_json()  # the hook is not saved
    assert CostModel().engine_time is None and CostModel().bytes_first


@pytest.mark.parametrize("mesh,src,dst,steps", [
    # two ppermute rounds of the merged exchange, against one ppermute of whole blocks and
    # an all_gather over 2 members (XLA's own decomposition, the same bytes)
    ("dp=2,tp=4", "f32[8@(dp,tp),16]", "f32[8@tp,16]", ["permute(dp,tp) dim 0", "all_gather(dp) dim 0"]),
    ("dp=4,tp=2", "f32[8@dp]", "f32[8@tp]", ["all_to_allv(dp,tp) dim 0", "all_gather(dp) dim 0"]),
])
def test_fewer_rounds_at_the_same_bytes(mesh: str, src: str, dst: str, steps: list[str]) -> None:
    prog = _plan(src, dst, mesh)
    assert [s.describe() for s in prog.steps] == steps
    assert prog.cost.bytes_max == lowering.lower_bound(src, dst, mesh)


@pytest.mark.parametrize("mesh,src,dst", [
    ("dp=4,tp=2", "f32[8@(dp,tp),12]", "f32[8@tp,12@dp]"),  # rounds: 48 B; a gather first: 72 B
    ("dp=2,tp=4", "f32[4@dp,8@tp,8]", "f32[4,8@dp,8@tp]"),  # 4 rounds: 128 B; two all_to_alls: 160 B
    ("dp=4,tp=2", "f32[16,16,16@dp]", "f32[16,16,16@tp]"),  # an all_gather and a slice: 1.5x the bound
])
def test_an_exchange_keeps_to_the_bound(mesh: str, src: str, dst: str) -> None:
    # fewer collectives would be faster on XLA:CPU but send more than the bound (and than
    # XLA's own reshard on the last): the JAX model trades bytes only for a pending sum
    assert _plan(src, dst, mesh).cost.bytes_max == lowering.lower_bound(src, dst, mesh)
    model = dataclasses.replace(default_cost_model(parse_mesh(mesh)), bytes_cap=0.0)  # no limit
    assert lowering.compile(src, dst, mesh, cost_model=model).cost.bytes_max > lowering.lower_bound(src, dst, mesh)


def test_bytes_cap_round_trips_and_is_checked() -> None:
    model = CostModel(default_alpha=1e-4, bytes_cap=1.5)
    assert CostModel.from_json(model.to_json()) == model and model.to_json()["bytes_cap"] == 1.5
    assert "bytes_cap" not in CostModel().to_json()
    with pytest.raises(SpecError, match="bytes_cap"):
        CostModel(bytes_cap=-1)
    with pytest.raises(SpecError, match="engine_time"):
        CostModel(engine_time=3)  # type: ignore[arg-type]
