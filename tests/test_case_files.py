"""The case files in ``bench/cases`` are what ``bench/regen_cases.py`` makes of its inputs:
same cases, same order, input fields unchanged (an edited input without a re-run fails)."""

from __future__ import annotations

import pytest
from _cases import load_cases


@pytest.mark.parametrize("name,fields", [
    ("redistribute", ("id", "mesh", "src", "dst", "dtype_bytes", "note", "tags", "anchor_inputs")),
    ("layouts", ("id", "mesh", "type")),
])
def test_outputs_follow_their_inputs(name: str, fields: tuple[str, ...]) -> None:
    inputs, outputs = load_cases(f"{name}_inputs.jsonl"), load_cases(f"{name}.jsonl")
    assert [c["id"] for c in outputs] == [c["id"] for c in inputs]
    for i, o in zip(inputs, outputs):
        assert {f: o[f] for f in fields} == {f: i[f] for f in fields}, i["id"]
    if name == "layouts":
        assert all(o["dtensor"] | i["dtensor"] == o["dtensor"] for i, o in zip(inputs, outputs))


def test_every_redistribution_has_its_anchors() -> None:
    for c in load_cases("redistribute.jsonl"):
        assert c["lower_bound"]["bytes"] >= 0, c["id"]
        for planner in ("dtensor_default", "dtensor_min_cost"):
            assert "error" not in c[planner] and c[planner]["collectives"] >= 0, (c["id"], planner)
        assert (c["xla"] is None) == ("xla_reason" in c), c["id"]
