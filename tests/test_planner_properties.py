"""Property test: simulate(compile(src, dst)) gives exactly the dst shards, on random cases."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_oracle import expected, reduce_partial, shards_of
from strategies import cases

from lowering.planner import compile
from lowering.simulator import simulate


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(0, 2**31))
def test_simulated_program_gives_destination_shards(case: tuple, seed: int) -> None:
    src, dst, mesh = case
    prog = compile(src, dst, mesh)
    rng = np.random.default_rng(seed)
    full = rng.integers(-20, 20, size=src.shape).astype(np.float64)
    outs = simulate(prog, shards_of(full, src, mesh, rng))
    want = expected(full, dst, mesh)
    got = reduce_partial(outs, dst, mesh)
    for r, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, (str(prog), r)
        if "avg" in (src.partial_op, dst.partial_op):
            # a mean over 3 ranks is not exact in binary floating point
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-9, err_msg=f"rank {r}\n{prog}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"rank {r}\n{prog}")
    # the per-rank shapes the program states are the ones it produces
    if prog.steps:
        assert [tuple(o.shape) for o in outs] == list(prog.steps[-1].out_shapes)


def _charged(prog, charge: int) -> int:
    from lowering.labels import spare_collectives

    return prog.cost.bytes_max + charge * spare_collectives(prog)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from([16, 256, 65536]))
def test_spare_axis_charge_trades_bytes_consistently(case: tuple, charge: int) -> None:
    # each model's plan is optimal under its own objective, so neither beats the other there;
    # the charged model's search has a gap (1/64 of the charge), within which it proved its plan
    from lowering.cost import CostModel

    src, dst, mesh = case
    pure = compile(src, dst, mesh, cost_model=CostModel.make(spare_axis_bytes=0), budget_s=5.0)
    charged = compile(src, dst, mesh, cost_model=CostModel.make(spare_axis_bytes=charge), budget_s=5.0)
    assert pure.optimal and charged.gap_bytes is not None and charged.gap_bytes <= charge // 64
    assert pure.cost.bytes_max <= charged.cost.bytes_max, (str(pure), str(charged))
    assert _charged(charged, charge) <= _charged(pure, charge) + charged.gap_bytes, (str(pure), str(charged))
    if charged.cost.bytes_max > pure.cost.bytes_max + charged.gap_bytes:
        # the charge buys its bytes back in collectives over spare axes (a relay through a
        # spare axis, or a reduction split over it, is what the bytes-only plan has more of)
        from lowering.labels import spare_collectives

        assert spare_collectives(charged) < spare_collectives(pure), (str(pure), str(charged))
