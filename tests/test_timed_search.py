"""The search under a timed model (the JAX engine's): the engine prices only the moves that
could still beat the best plan, since its price of a step (the ``lax`` calls it lowers to) is
the costliest term a search computes. What prunes them is a floor of every completion:
``CostModel.engine_floor`` (the least the engine charges a collective that moves bytes) once
for the move and once more where a transfer is still due, and the bytes above the cap that
any completion moves. The plans are the recorded ones (``tests/test_plans_recorded_jax.py``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import lowering
from jax_backend import default_cost_model
from lowering.cost import CostModel
from lowering.program import Step
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh
from spec_lang.parser import parse_mesh

CASES = {c["id"]: c for c in map(json.loads, (Path(__file__).resolve().parents[1] / "bench" / "cases"
                                              / "redistribute.jsonl").read_text().splitlines())}


def _priced(case: dict[str, Any]) -> tuple[CostModel, list[tuple[Step, Mesh, int]], lowering.Program]:
    """The JAX engine's model for the case's mesh, every step its search had the engine price
    (with the bytes it was priced at), and the program."""
    model = default_cost_model(parse_mesh(case["mesh"]))
    engine = model.engine_time
    assert engine is not None
    seen: list[tuple[Step, Mesh, int]] = []

    def counted(m: CostModel, step: Step, mesh: Mesh, bytes_max: int) -> float | None:
        seen.append((step, mesh, bytes_max))
        return engine(m, step, mesh, bytes_max)

    # a new engine function: a new model, planned afresh (the planner's cache is per model)
    program = lowering.compile(case["src"], case["dst"], case["mesh"],
                               cost_model=dataclasses.replace(model, engine_time=counted))
    return model, seen, program


@pytest.mark.parametrize("cid", ["rd-pub-040", "rd-pub-046", "rd-pub-075", "rd-pub-080"])
def test_the_engine_prices_few_moves(cid: str) -> None:
    # before the floors the engine priced 356 (rd-pub-040) to 555 (rd-pub-075) steps here
    model, seen, program = _priced(CASES[cid])
    assert 0 < len(seen) <= 60
    plain = lowering.compile(CASES[cid]["src"], CASES[cid]["dst"], CASES[cid]["mesh"], cost_model=model)
    assert program.steps == plain.steps


@pytest.mark.parametrize("cid", sorted(CASES))
def test_the_engine_floor_is_a_floor(cid: str) -> None:
    model, seen, _ = _priced(CASES[cid])
    assert model.engine_floor > 0
    for step, mesh, bytes_max in seen:
        if bytes_max:
            assert model.collective_time(step, mesh, bytes_max) >= model.engine_floor + model.beta_of(step.axes) * bytes_max


def test_the_engine_floor_is_checked() -> None:
    with pytest.raises(SpecError, match="engine_floor"):
        CostModel(engine_floor=-1e-6)
    assert CostModel().engine_floor == 0.0
