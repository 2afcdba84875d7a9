"""A program's price is comparable with its lower bound, and never below it.

A step takes as long as its busiest link direction, so each rank pays, per step, the
larger of what it sends and what it receives (``Step.bytes_moved``); a program's price
(``Cost.bytes_max``) is the busiest rank's sum. The lower bound counts what the neediest
rank must receive and the transfers over the world, which that price covers in every
program: plain, uneven and partial pairs alike."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import cases
from strategies_uneven import uneven_pairs

from lowering import compile, lower_bound
from spec_lang.ir import Mesh, TensorType


def _check(src: TensorType, dst: TensorType, mesh: Mesh) -> None:
    prog = compile(src, dst, mesh)
    bound = lower_bound(src, dst, mesh)
    assert prog.cost.bytes_max >= bound, (str(prog), bound)
    moved = np.zeros(mesh.size, dtype=np.int64)
    for step in prog.steps:
        larger = np.maximum(np.asarray(step.bytes_sent, dtype=np.int64), np.asarray(step.bytes_recv, dtype=np.int64))
        # a relay's two phases each cost their busier direction: at least the larger total
        assert (np.asarray(step.bytes_moved) >= larger).all()
        moved += np.asarray(step.bytes_moved, dtype=np.int64)
    assert prog.cost.bytes_max == int(moved.max(initial=0)) >= prog.cost.bytes_sent_max


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(cases(varying=True, explicit_i=True), cases(reducing=True), uneven_pairs()))
def test_no_program_is_priced_below_its_lower_bound(case: tuple) -> None:
    _check(*case)


def test_an_uneven_exchange_is_priced_by_its_busiest_receiver() -> None:
    # rank (dp=tp=0, cp=1) must receive 14 floats, and the exchange makes it; the busiest
    # sender sends 12: the price is 56 B, at the bound, and 48 B is the sent figure
    mesh = "dp=2,tp=2,cp=2,pp=2"
    src, dst = "f32[7@(tp,dp),5@cp]{P(avg):pp}", "f32[7,5@(dp,tp)]{P(avg):pp}"
    prog = compile(src, dst, mesh)
    assert lower_bound(src, dst, mesh) == 56
    assert (prog.cost.bytes_max, prog.cost.bytes_sent_max) == (56, 48)
    assert "56 B (busiest rank, sent or received), 48 B sent (max rank)" in str(prog)
    assert prog.to_json()["cost"]["bytes_max"] == 56
