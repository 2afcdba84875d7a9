"""The SPMD type system's own step kinds (``pcast``, ``stack``) meet the same checks as
every kind in tests/test_step_kinds.py: the type rule rebuilds the step, the dual is the
exact adjoint in the numpy semantics, refused pairs name the rule, and the torch runner
agrees with the numpy semantics under LocalTensorMode."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_utils import from_local, local_mode, to_local
from typed_data import pairing, random_arrays

from lowering import make_program, make_step
from lowering.kinds import KINDS, simulate_step
from lowering.planner import dual_steps
from spec_lang.dual import dual_type
from spec_lang.errors import SpecError
from spec_lang.parser import parse_mesh
from torch_backend.executor import execute

PAIRS = [
    ("pcast", "dp=2,tp=3", "f64[4]{R:tp}", "f64[4]{V:tp}"),
    ("pcast", "dp=2,tp=3", "f64[4,2]{V:(dp,tp)}", "f64[4,2]{U:(dp,tp)}"),
    ("pcast", "dp=2,tp=3", "f64[6@dp]{R:tp}", "f64[6@dp]{U:tp}"),
    ("stack", "dp=2,tp=3", "f64[4]{V:tp}", "f64[3@tp,4]"),
    ("stack", "dp=2,tp=3", "f64[3@tp,4]{R:dp}", "f64[4]{V:tp, R:dp}"),
    ("stack", "dp=2,tp=3", "f64[2,5]{V:(tp,dp)}", "f64[2,6@(tp,dp),5]"),
    ("divide", "dp=2,tp=4", "f64[4,3@dp]{R:tp}", "f64[4,3@dp]{U:tp}"),
    ("divide", "dp=2,tp=4", "f64[5@tp,2]", "f64[5@tp,2]{U:dp}"),
    ("divide", "dp=2,tp=4", "f64[6]{R:(dp,tp)}", "f64[6]{U:(dp,tp)}"),
    ("divide", "dp=2,tp=4", "f64[6]{U:dp, R:tp}", "f64[6]{U:(dp,tp)}"),
]


def test_the_new_kinds_are_not_planned() -> None:
    assert not KINDS["pcast"].planned and not KINDS["stack"].planned and not KINDS["divide"].planned


@pytest.mark.parametrize("kind,mesh,src,dst", PAIRS)
def test_rule_dual_and_runner(fake_pg, kind: str, mesh: str, src: str, dst: str) -> None:
    m = parse_mesh(mesh)
    step = make_step(kind, src, dst, m)
    assert step.kind == kind and make_step(kind, step.src, step.dst, m, axes=step.axes) == step
    assert step.bytes_sent == (0,) * m.size
    rng = np.random.default_rng(1)
    x = random_arrays(step.src, m, rng)
    y = random_arrays(dual_type(step.dst), m, rng)
    fx = simulate_step(step, m, x)
    back = dual_steps(step, m)
    assert back[0].src == dual_type(step.dst) and back[-1].dst == dual_type(step.src)
    by = y
    for b in back:
        by = simulate_step(b, m, by)
    assert pairing(step.dst, m, fx, y) == pairing(step.src, m, x, by)
    with local_mode(fake_pg, m.size) as lm:
        out = from_local(execute(make_program(step, m), to_local(lm, [torch.tensor(a) for a in x])))
    for r in range(m.size):
        np.testing.assert_array_equal(out[r].numpy(), fx[r])


@pytest.mark.parametrize("kind,src,dst,rule", [
    ("pcast", "f64[4]{V:tp}", "f64[4]{R:tp}", "goes from V to R"),
    ("pcast", "f64[4]{U:tp}", "f64[4]{R:tp}", "goes from U to R"),
    ("pcast", "f64[4]", "f64[4]{R:tp}", "goes from I to R"),
    ("pcast", "f64[4]{R:tp}", "f64[4]{P(avg):tp}", "goes from R to P\\(avg\\)"),
    ("pcast", "f64[4]{R:tp}", "f64[4]{R:tp}", "no axis changes"),
    ("pcast", "f64[4@tp]", "f64[4]{V:tp}", "dim sharding must stay"),
    ("stack", "f64[4]{R:tp}", "f64[3@tp,4]", "V axes stacked"),
    ("stack", "f64[4]{V:tp}", "f64[4@tp,4]", "V axes stacked"),
    ("stack", "f64[4]{V:tp}", "f64[3@dp,4]", "V axes stacked"),
    ("divide", "i64[4]{R:tp}", "i64[4]{U:tp}", "cannot hold a share"),
    ("divide", "f64[4]{R:tp}", "f64[4]{P(max):tp}", "not a pending max"),
    ("divide", "f64[4@tp]", "f64[4]{U:tp}", "dims' sharding must stay"),
])
def test_refused_pairs_name_the_rule(kind: str, src: str, dst: str, rule: str) -> None:
    with pytest.raises(SpecError, match=f"{kind} cannot take .*{rule}"):
        make_step(kind, src, dst, "dp=2,tp=3")
