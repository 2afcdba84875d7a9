"""The two-phase relay (``lowering.kinds.relay``): exact, priced as it moves, at the byte
bound on the layouts where few ranks hold what many need, forward and backward, in numpy
and in torch (LocalTensorMode)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from planner_oracle import expected
from strategies import cases
from torch_utils import adjoint, as_numpy, from_local, local_mode, random_blocks, to_local

from lowering import CostModel, compile, lower_bound, make_program, make_step, simulate
from lowering.kinds import simulate_step, wire_bytes
from spec_lang.errors import SpecError
from spec_lang.parser import parse, parse_mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.skewed import skewed_cases

KNOWN = ("dp=4,tp=2", "f32[4@(tp,dp),4]", "f32[4,4@tp]")

# plain pairs a relay takes (one group, several groups, a spare axis among the relay's axes)
RELAYS = [
    ("dp=4,tp=2", "f32[4@(tp,dp),4]", "f32[4,4@tp]", None),
    ("y=4,x=4", "i64[1@x,24]", "i64[1,24@x]", ("y", "x")),
    ("cp=4,y=8", "f32[16,1@y]", "f32[16@y,1]", None),
    ("data_parallel=5,w=3", "i32[1@data_parallel,9]", "i32[1,9@data_parallel]{R:w}", None),
    ("a=2,b=3,c=2", "f32[5@(b,c),7]", "f32[5,7@(c,b)]", None),
    ("a=2,b=3,c=2", "f32[6@a,4]", "f32[6,4@(b,c)]", ("a", "b", "c")),
]


def _global(t: str, mesh: str) -> np.ndarray:
    shape = parse(t).shape
    return np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) - 7


def test_the_known_case_reaches_the_bound() -> None:
    mesh, src, dst = KNOWN
    p = compile(src, dst, mesh)
    assert [s.kind for s in p.steps] == ["relay"]
    assert p.cost.bytes_max == lower_bound(src, dst, mesh) == 32
    assert p.cost.collectives == 2  # two phases, two exchanges
    # each phase is priced by its busier direction: 8 B, then 24 B, at every rank
    step = p.steps[0]
    assert step.bytes_moved == (32,) * 8 and step.bytes_max == 32


@pytest.mark.parametrize("mesh,src,dst,axes", RELAYS)
def test_relay_moves_exactly_what_the_types_say(mesh: str, src: str, dst: str, axes: tuple | None) -> None:
    m = parse_mesh(mesh)
    step = make_step("relay", src.replace("i64", "f64").replace("i32", "f64").replace("f32", "f64"),
                     dst.replace("i64", "f64").replace("i32", "f64").replace("f32", "f64"), m, axes=axes)
    full = _global(str(step.src), mesh)
    xs = expected(full, step.src, m)
    ys = simulate_step(step, m, xs)
    for r, (y, w) in enumerate(zip(ys, expected(full, step.dst, m))):
        np.testing.assert_array_equal(y, w, err_msg=f"rank {r}")
    # the pieces put the price on the wire, both ways; each rank's cost is at most its
    # total sent plus received and at least the larger of the two
    assert wire_bytes(step, m) == step.bytes_sent
    assert wire_bytes(step, m, received=True) == step.bytes_recv
    for s, g, mv in zip(step.bytes_sent, step.bytes_recv, step.bytes_moved):
        assert max(s, g) <= mv <= s + g
    assert step.bytes_max >= lower_bound(step.src, step.dst, m)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(cases(max_axes=3, max_ranks=16, even=True))
def test_relay_on_random_pairs_matches_the_oracle(case: tuple) -> None:
    src, dst, mesh = case
    assume(not src.partial_axes and not dst.partial_axes and not src.axes_of_kind("V"))
    try:
        step = make_step("relay", src, dst, mesh)
    except SpecError:
        assume(False)
        raise
    full = np.arange(int(np.prod(src.shape)), dtype=np.int64).reshape(src.shape)
    ys = simulate_step(step, mesh, expected(full, step.src, mesh))
    for y, w in zip(ys, expected(full, step.dst, mesh)):
        np.testing.assert_array_equal(y, w)
    assert wire_bytes(step, mesh) == step.bytes_sent


@pytest.mark.parametrize("mesh,src,dst,axes", RELAYS[:4])
def test_relay_runs_in_torch_like_numpy(fake_pg, mesh: str, src: str, dst: str, axes: tuple | None) -> None:
    from torch_backend.executor import execute

    m = parse_mesh(mesh)
    f64 = [t.replace("i64", "f64").replace("i32", "f64").replace("f32", "f64") for t in (src, dst)]
    program = make_program([make_step("relay", f64[0], f64[1], m, axes=axes)], m)
    blocks = random_blocks(program.src, m, np.random.default_rng(3))
    want = simulate(program, as_numpy(blocks))
    with local_mode(fake_pg, m.size) as lm:
        x = to_local(lm, blocks)
        y = execute(program, x)
        outs, after = from_local(y), from_local(x)
    for r, (o, w) in enumerate(zip(outs, want)):
        np.testing.assert_array_equal(o.numpy(), w, err_msg=f"rank {r}")
    for a, b in zip(after, blocks):
        assert np.array_equal(a.numpy(), b.numpy()), "the input was modified"


def test_the_known_case_forward_and_backward_in_torch(fake_pg) -> None:
    # redistribute (the planner's relay) forward, and its gradient, as the exact adjoint
    mesh, src, dst = KNOWN
    assert [s.kind for s in compile(src.replace("f32", "f64"), dst.replace("f32", "f64"), mesh).steps] == ["relay"]
    lhs, rhs = adjoint(fake_pg, mesh, src.replace("f32", "f64"), dst.replace("f32", "f64"))
    assert lhs == rhs


def test_refusals_name_the_rule() -> None:
    with pytest.raises(SpecError, match="varying"):
        make_step("relay", "f32[8@tp]{V:dp}", "f32[8]{V:dp}", "dp=2,tp=4", axes=("dp", "tp"))
    with pytest.raises(SpecError, match="does not hold"):
        make_step("relay", "f32[8@tp,4]", "f32[8,4@tp]", "dp=2,tp=4", axes=("dp",))


def _skewed_relays(n: int) -> list[tuple[str, str, str]]:
    """Skewed pairs (``bench/skewed.py``) whose pure-bytes plan relays, as f64."""
    out = []
    for mesh, src, dst in skewed_cases(120, 3):
        s, d = (str(parse(t).replace(dtype="float64")) for t in (src, dst))
        if any(st.kind == "relay" for st in compile(s, d, mesh, cost_model=CostModel.make(spare_axis_bytes=0)).steps):
            out.append((mesh, s, d))
    return out[:n]


SKEWED_RELAYS = _skewed_relays(6)


def test_some_skewed_plans_relay() -> None:
    assert len(SKEWED_RELAYS) >= 3


@pytest.mark.parametrize("mesh,src,dst", SKEWED_RELAYS)
def test_skewed_relay_programs_run_in_torch(fake_pg, mesh: str, src: str, dst: str) -> None:
    # whole programs (slices, relays, gathers) under LocalTensorMode against the global array
    from torch_backend.executor import execute

    m = parse_mesh(mesh)
    program = compile(src, dst, m, cost_model=CostModel.make(spare_axis_bytes=0))
    full = _global(src, mesh)
    blocks = [torch.from_numpy(np.ascontiguousarray(b)) for b in expected(full, program.src, m)]
    with local_mode(fake_pg, m.size) as lm:
        y = execute(program, to_local(lm, blocks))
        outs = from_local(y)
    for r, (o, w) in enumerate(zip(outs, expected(full, program.dst, m))):
        np.testing.assert_array_equal(o.numpy(), w, err_msg=f"rank {r}")

