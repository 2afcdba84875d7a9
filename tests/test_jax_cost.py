"""The JAX engine's cost model: measured on the JAX devices (``shardc calibrate --engine
jax``), local steps' copies included (``CostModel.local_beta``), shipped per mesh as the
engine's default; under it a pending sum reduced onto a sharded dim is one psum_scatter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lowering
from jax_backend import default_cost_model
from jax_backend.default_model import MODELS, model_path
from lowering.cost import CostModel
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
