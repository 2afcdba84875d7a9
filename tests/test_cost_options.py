"""Cost-model options are validated where they are made: CostModel and the CLI flags."""

from __future__ import annotations

import json
import math

import pytest

from lowering import CostModel, compile
from spec_lang import SpecError
from torch_backend.cli import main

MESH = "dp=2,tp=4"


def test_a_scalar_alpha_or_beta_is_every_axis_value() -> None:
    m = CostModel.make(alpha=5e-6, beta=2e-10)
    assert m == CostModel.make(default_alpha=5e-6, default_beta=2e-10)
    assert m.alpha_of(("dp", "tp")) == 5e-6 and m.beta_of(("tp",)) == 2e-10
    prog = compile("f32[8@dp]", "f32[8]", MESH, cost_model=m)
    assert prog.cost.time_s == pytest.approx(5e-6 + 2e-10 * prog.cost.bytes_max)


def test_ints_and_numpy_numbers_are_accepted_as_floats() -> None:
    np = pytest.importorskip("numpy")
    m = CostModel.make(alpha={"dp": np.float64(1e-6), "tp": 0}, beta=1, spare_axis_bytes=np.int64(7))
    assert m.alpha == (("dp", 1e-6), ("tp", 0.0)) and m.default_beta == 1.0 and m.spare_axis_bytes == 7
    assert all(type(v) is float for _, v in m.alpha) and type(m.spare_axis_bytes) is int


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"alpha": -1}, "alpha must be finite and >= 0, got -1.0"),
        ({"alpha": math.nan}, "alpha must be finite and >= 0, got nan"),
        ({"beta": math.inf}, "beta must be finite and >= 0, got inf"),
        ({"alpha": {"dp": "fast"}}, "alpha of mesh axis 'dp' must be a number, got str 'fast'"),
        ({"beta": {"dp": -1e-9}}, "beta of mesh axis 'dp' must be finite and >= 0"),
        ({"beta": {"dp": True}}, "must be a number, got bool"),
        ({"alpha": "fast"}, "alpha must be a number or a dict"),
        ({"alpha": {1: 1e-6}}, "mesh axis names are str"),
        ({"default_alpha": None}, "default_alpha must be a number"),
        ({"default_beta": math.nan}, "default_beta must be finite"),
        ({"spare_axis_bytes": -1}, "spare_axis_bytes must be >= 0, got -1"),
        ({"spare_axis_bytes": 1.5}, "spare_axis_bytes must be an int"),
        ({"spare_axis_bytes": True}, "spare_axis_bytes must be an int"),
    ],
)
def test_bad_cost_models_are_spec_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(SpecError) as info:
        CostModel.make(**kwargs)
    assert needle in info.value.message and info.value.hint


def test_the_constructor_checks_too() -> None:
    with pytest.raises(SpecError, match="gives mesh axis 'dp' twice"):
        CostModel(beta=(("dp", 1e-9), ("dp", 2e-9)))
    with pytest.raises(SpecError, match="pairs"):
        CostModel(alpha={"dp": 1e-6})  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="must be finite"):
        CostModel(default_beta=-1.0)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    ("argv", "needle", "caret"),
    [
        (["--beta", "dp=1e-9,dp=2e-9"], "--beta gives mesh axis 'dp' twice", "dp=1e-9,dp=2e-9\n            ^"),
        (["--alpha", "nan", "--json"], "bad --alpha value: alpha must be finite and >= 0, got nan", None),
        (["--alpha", "-1"], "alpha must be finite and >= 0, got -1.0", None),
        (["--alpha", "tp=1e-6,dp=inf"], "alpha of mesh axis 'dp' must be finite", "tp=1e-6,dp=inf\n            ^"),
        (["--beta", "dp=1e-9,dp"], "bad --beta value", None),
    ],
)
def test_bad_cost_flags_are_refused_and_json_never_sees_nan(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                             needle: str, caret: str | None) -> None:
    rc, out, err = _run(capsys, "plan", "--mesh", MESH, "f32[8@dp]", "f32[8]", *argv)
    assert rc == 2 and "NaN" not in out and "Infinity" not in out
    assert needle in err
    if caret is not None:
        assert caret in err


def test_a_scalar_alpha_flag_reaches_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "plan", "--mesh", MESH, "f32[8@dp]", "f32[8]", "--alpha", "1e-3", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["cost"]["time_s"] == pytest.approx(1e-3 + 1e-10 * data["cost"]["bytes_max"])
