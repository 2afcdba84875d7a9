"""Calibration's fit and the cost model's JSON form (torch-free): exact recovery of alpha and
beta from synthetic samples, the probes are the collectives they name, round trips, and
every bad input is a SpecError with a hint."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowering
from lowering.calibration import (
    PROBE_MODEL,
    Sample,
    calibration_json,
    fit_line,
    fit_model,
    groups_of,
    parse_sizes,
    probes,
)
from lowering.cost import DEFAULT_COST_MODEL, CostModel, as_cost_model
from spec_lang import parse_mesh
from spec_lang.errors import SpecError

MESH = parse_mesh("dp=2,tp=4")


@settings(max_examples=50, deadline=None)
@given(alpha=st.floats(0, 1e-3), beta=st.floats(1e-12, 1e-7),
       sizes=st.lists(st.integers(1, 1 << 24), min_size=2, max_size=6, unique=True))
def test_fit_line_recovers_alpha_and_beta_exactly(alpha: float, beta: float, sizes: list[int]) -> None:
    x = np.array(sizes, dtype=float)
    a, b, r2 = fit_line(x, alpha + beta * x)
    assert a == pytest.approx(alpha, rel=1e-6, abs=1e-12)
    assert b == pytest.approx(beta, rel=1e-6)
    assert r2 == pytest.approx(1.0, abs=1e-6)


def test_fit_line_clamps_at_zero() -> None:
    x = np.array([1e3, 1e4, 1e5])
    a, b, _ = fit_line(x, 3e-10 * x - 1e-7)  # a negative intercept: refit through the origin
    assert a == 0.0 and b > 0
    a, b, _ = fit_line(x, 5e-6 - 1e-12 * x)  # falling with size: a constant
    assert b == 0.0 and a == pytest.approx(5e-6, rel=1e-2)


@pytest.mark.parametrize("x, y, needle", [
    ([1e3], [1e-6], "2 or more distinct byte counts"),
    ([1e3, 1e3], [1e-6, 2e-6], "2 or more distinct byte counts"),
    ([1e3, 1e4], [1e-6, float("nan")], "finite"),
    ([1e3, 1e4], [1e-6, -1.0], "finite and >= 0"),
])
def test_fit_line_refuses_what_cannot_be_fitted(x: list[float], y: list[float], needle: str) -> None:
    with pytest.raises(SpecError, match=needle) as e:
        fit_line(x, y)
    assert e.value.hint


def _synthetic(truth: dict[tuple[str, ...], tuple[float, float]]) -> list[Sample]:
    """Samples priced exactly by ``truth`` at the probes' real byte counts."""
    out = []
    for p in probes(MESH, (1 << 10, 1 << 16, 1 << 20)):
        for s in lowering.compile(p.src, p.dst, MESH, cost_model=PROBE_MODEL).steps:
            alpha, beta = truth[tuple(sorted(s.axes))]
            out.append(Sample(s.axes, s.kind, s.bytes_sent_max, alpha + beta * s.bytes_sent_max))
    return out


def test_fit_model_recovers_every_group_and_prices_steps_as_measured() -> None:
    truth = {("dp",): (20e-6, 1e-9), ("tp",): (5e-6, 2e-10), ("dp", "tp"): (40e-6, 3e-9)}
    model, fits = fit_model(_synthetic(truth), MESH)
    assert [(f.axes, f.group_size) for f in fits] == [(("dp",), 2), (("tp",), 4), (("dp", "tp"), 8)]
    for f in fits:
        alpha, beta = truth[f.axes]
        assert f.alpha == pytest.approx(alpha, rel=1e-6) and f.beta == pytest.approx(beta, rel=1e-6)
        assert f.r2 == pytest.approx(1.0) and f.samples == 12
    # a flattened group is priced by its own fit, in either axis order, not by its slowest axis
    for axes in (("dp", "tp"), ("tp", "dp")):
        assert model.step_time(axes, 1000, True) == pytest.approx(40e-6 + 3e-6)
    assert model.step_time(("tp",), 1000, True) == pytest.approx(5e-6 + 2e-7)
    assert model.step_time(("tp",), 1000, False) == 0.0
    assert not model.bytes_first


def test_probes_are_the_collectives_they_name() -> None:
    for mesh in ("x=8", "dp=2,tp=4", "dp=2,cp=2,tp=2"):
        m = parse_mesh(mesh)
        for p in probes(m, (1 << 10, 1 << 22)):
            steps = lowering.compile(p.src, p.dst, m, cost_model=PROBE_MODEL).steps
            assert len(steps) == 1 and set(steps[0].axes) == set(p.axes), p
            # an all_to_all between 2 ranks is a point-to-point exchange
            want = "permute" if p.kind == "all_to_all" and m.group_size(p.axes) == 2 else p.kind
            assert steps[0].kind == want, p


def test_groups_of_a_mesh() -> None:
    assert groups_of(MESH) == [("dp",), ("tp",), ("dp", "tp")]
    assert groups_of(parse_mesh("dp=2,pp=1,tp=2")) == [("dp",), ("tp",), ("dp", "tp")]
    assert len(groups_of(parse_mesh("dp=2,cp=2,tp=2"))) == 7
    assert groups_of(parse_mesh("a=2,b=2,c=2,d=2"))[-1] == ("a", "b", "c", "d")


def test_parse_sizes() -> None:
    assert parse_sizes("4M,1K, 16k,1024") == (1024, 16384, 4 << 20)
    for bad, needle in [("1K,x", "bad message size 'x'"), ("1K,-4", "bad message size"), ("1K", "2 or more"),
                        ("1K,1024", "2 or more"), ("1K,,2K", "bad message size"), ("1K,1G", "bad message size '1G'")]:
        with pytest.raises(SpecError, match=needle) as e:
            parse_sizes(bad)
        assert e.value.hint and e.value.text == bad


def test_json_round_trip_and_compile_takes_every_form(tmp_path) -> None:
    model = CostModel.make(alpha={"dp": 2e-5, "tp": 5e-6}, beta={"dp": 1e-9, "tp": 2e-10},
                           default_alpha=1e-5, default_beta=1e-9, spare_axis_bytes=4096)
    model = CostModel(model.alpha, model.beta, model.default_alpha, model.default_beta, model.spare_axis_bytes,
                      groups=((("tp", "dp"), 4e-5, 3e-9),))
    assert model.groups == ((("dp", "tp"), 4e-5, 3e-9),)  # kept sorted
    data = json.loads(json.dumps(model.to_json()))
    assert CostModel.from_json(data) == model
    assert CostModel.from_json(json.dumps(data)) == model
    path = tmp_path / "model.json"
    path.write_text(json.dumps(data))
    assert CostModel.load(path) == model
    src, dst = "f32[64,8]{U:dp}", "f32[64@(dp,tp),8]"
    want = lowering.compile(src, dst, MESH, cost_model=model)
    for form in (data, str(path), path):
        assert lowering.compile(src, dst, MESH, cost_model=form) == want
    joint = lowering.compile_many([src], [dst], MESH, cost_model=str(path))
    assert joint.cost.time_s == pytest.approx(want.cost.time_s)


def test_calibration_json_is_a_model_with_its_fit() -> None:
    truth = {("dp",): (20e-6, 1e-9), ("tp",): (5e-6, 2e-10), ("dp", "tp"): (40e-6, 3e-9)}
    model, fits = fit_model(_synthetic(truth), MESH)
    data = json.loads(json.dumps(calibration_json(model, fits, backend="gloo", mesh=MESH, sizes=[1024, 2048],
                                                  iters=3)))
    assert data["backend"] == "gloo" and data["mesh"] == "dp=2,tp=4"
    assert [g["group_size"] for g in data["fit"]["groups"]] == [2, 4, 8]
    assert CostModel.from_json(data) == model


def test_the_default_model_stays_bytes_first() -> None:
    assert DEFAULT_COST_MODEL.bytes_first and CostModel().groups == ()
    assert CostModel.from_json({}) == DEFAULT_COST_MODEL
    assert as_cost_model(None) is None
    # a group entry that prices like the default keeps the model bytes-first
    assert CostModel(groups=((("dp", "tp"), 0.0, 1e-10),)).bytes_first


@pytest.mark.parametrize("data, needle", [
    ("{not json", "not valid JSON"),
    ([1, 2], "a cost model is a JSON object"),
    ({"alpah": {"dp": 1e-6}}, "unknown key"),
    ({"format": "other/2"}, "format"),
    ({"alpha": [1e-6]}, "alpha must be an object"),
    ({"alpha": {"dp": -1.0}}, "finite and >= 0"),
    ({"beta": {"dp": "fast"}}, "must be a number"),
    ({"default_beta": float("inf")}, "finite and >= 0"),
    ({"spare_axis_bytes": 1.5}, "must be an int"),
    ({"groups": {"axes": ["dp", "tp"]}}, "groups must be a list"),
    ({"groups": [{"axes": ["dp", "tp"], "alpha": 1e-6}]}, "groups must be a list"),
    ({"groups": [{"axes": "dp,tp", "alpha": 1e-6, "beta": 1e-9}]}, "a list of mesh axis names"),
    ({"groups": [{"axes": ["dp"], "alpha": 1e-6, "beta": 1e-9}]}, "2 or more distinct"),
    ({"groups": [{"axes": ["dp", "dp"], "alpha": 1e-6, "beta": 1e-9}]}, "2 or more distinct"),
    ({"groups": [{"axes": ["dp", "tp"], "alpha": 1e-6, "beta": 1e-9},
                 {"axes": ["tp", "dp"], "alpha": 1e-6, "beta": 1e-9}]}, "twice"),
    ({"groups": [{"axes": ["dp", "tp"], "alpha": None, "beta": 1e-9}]}, "alpha of group"),
])
def test_bad_model_json_is_a_spec_error(data: object, needle: str) -> None:
    with pytest.raises(SpecError, match=needle) as e:
        CostModel.from_json(data)
    assert e.value.hint


def test_compile_refuses_a_bad_cost_model(tmp_path) -> None:
    with pytest.raises(SpecError, match="cannot read the cost model file") as e:
        lowering.compile("f32[8@dp]", "f32[8]", MESH, cost_model=str(tmp_path / "missing.json"))
    assert "shardc calibrate" in e.value.hint
    with pytest.raises(SpecError, match="cost_model must be a lowering.CostModel, a dict or a path"):
        lowering.compile("f32[8@dp]", "f32[8]", MESH, cost_model=5)  # type: ignore[arg-type]
    other = {"groups": [{"axes": ["dp", "cp"], "alpha": 1e-6, "beta": 1e-9}]}  # calibrated on another mesh
    with pytest.raises(SpecError, match="names axis 'cp', which is not on the mesh") as e:
        lowering.compile("f32[8@dp]", "f32[8]", MESH, cost_model=other)
    assert "calibrated on" in e.value.hint


def test_the_benchmarks_spearman_matches_the_closed_form() -> None:
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from bench.calibration import average_ranks, spearman

    rng = np.random.default_rng(0)
    for _ in range(20):
        x, y = rng.permutation(12), rng.permutation(12)  # no ties: 1 - 6 sum d^2 / (n (n^2 - 1))
        d = x - y
        assert spearman(x, y) == pytest.approx(1 - 6 * float(np.sum(d * d)) / (12 * (144 - 1)))
    assert list(average_ranks([3.0, 1.0, 3.0, 2.0])) == [2.5, 0.0, 2.5, 1.0]
    assert spearman([1, 2, 3], [1e-3, 5e-3, 2e-3]) == pytest.approx(0.5)
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_a_model_calibrated_on_another_mesh_is_refused(tmp_path) -> None:
    data = CostModel.make(alpha={"dp": 1e-5, "tp": 1e-6}).to_json()
    data["mesh"] = "dp=4, tp=2"
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    for form in (data, str(path)):
        with pytest.raises(SpecError, match="calibrated on the mesh dp=4,tp=2, not dp=2,tp=4") as e:
            lowering.compile("f32[8@dp]", "f32[8]", MESH, cost_model=form)
        assert "shardc calibrate --mesh dp=2,tp=4" in e.value.hint
        with pytest.raises(SpecError, match="calibrated on the mesh"):
            lowering.compile_many(["f32[8@dp]"], ["f32[8]"], "dp=2,tp=4", cost_model=form)
        assert lowering.compile("f32[8@dp]", "f32[8]", "dp=4,tp=2", cost_model=form).cost.collectives == 1
    with pytest.raises(SpecError, match="mesh string"):
        lowering.compile("f32[8@dp]", "f32[8]", MESH, cost_model={**data, "mesh": 8})
    assert CostModel.load(path) == CostModel.from_json(data)  # loading alone does not judge the mesh
