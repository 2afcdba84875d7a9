"""The holder-set term of the lower bound (``lowering.bounds.holder_set_need``): data held
by a set H of ranks and needed outside it leaves H at least once, so some member of H
sends ceil(count / |H|) of it. Checked against the skewed bench's bound, written from the
chunk rule alone (``bench/skewed.py``), and against every program the planner builds."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import cases

from lowering import compile, lower_bound, make_program, make_step
from lowering.bounds import holder_set_need, lower_bound_detail
from lowering.planner import fallback_program
from spec_lang.errors import SpecError
from spec_lang.parser import parse, parse_mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.skewed import independent_bound, skewed_case


def test_replicated_holders_must_each_send_their_share() -> None:
    # the row is held by the 3 ranks at dp=0 (replicated over w); each other rank lacks 2
    # elements at most (8 B), but 7 elements leave the holders: 3 from one of them (12 B)
    mesh, src, dst = "data_parallel=5,w=3", "i32[1@data_parallel,9]", "i32[1,9@data_parallel]{R:w}"
    detail = lower_bound_detail(parse(src), parse(dst), parse_mesh(mesh))
    assert detail["recv_max_bytes"] == 8 and detail["holder_set_bytes"] == 12
    assert lower_bound(src, dst, mesh) == 12 == independent_bound(mesh, src, "i32[1,9@data_parallel]")


def test_the_term_is_left_out_where_holders_are_not_one_class() -> None:
    # a pending sum: every rank holds a contribution; the other terms bound it
    assert holder_set_need(parse("f32[8]{U:x}"), parse("f32[8@x]"), parse_mesh("x=4")) == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_the_bound_is_the_chunk_rules_on_skewed_pairs(seed: int) -> None:
    mesh, src, dst = skewed_case(np.random.default_rng(seed))
    assert lower_bound(src, dst, mesh) == independent_bound(mesh, src, dst)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_no_skewed_program_is_priced_below_it(seed: int) -> None:
    mesh, src, dst = skewed_case(np.random.default_rng(seed))
    bound = lower_bound(src, dst, mesh)
    for prog in (compile(src, dst, mesh), fallback_program(parse(src), parse(dst), parse_mesh(mesh))):
        assert prog.cost.bytes_max >= bound, (str(prog), bound)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(max_axes=4, max_ranks=24, varying=True, explicit_i=True))
def test_no_program_or_one_step_relay_is_priced_below_it(case: tuple) -> None:
    src, dst, mesh = case
    bound = lower_bound(src, dst, mesh)
    assert compile(src, dst, mesh).cost.bytes_max >= bound
    if src.partial_axes or dst.partial_axes or src.axes_of_kind("V") or src.is_uneven or dst.is_uneven:
        return  # no relay takes the pair
    try:
        relay = make_program([make_step("relay", src, dst, mesh)], mesh)
    except SpecError:
        return  # nothing moves
    assert relay.cost.bytes_max >= bound, (str(relay), bound)
