"""The search's states and keys, built fast, are the ones the checked constructors build.

``lowering.moves`` derives each next state with ``TensorType.derive`` (no re-validation),
and ``lowering.labels`` computes the search key from a label's cached max and sum and one
look at the holder classes. These tests walk the moves of random cases two levels deep
and compare every state with the checked constructor's, and every key with ``_key``
built term by term, as the planner once did."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from strategies import cases

from lowering.cost import DEFAULT_COST_MODEL, CostModel
from lowering.fallback import fallback_routes
from lowering.labels import SearchContext, _future, class_floor, receive_floor
from lowering.moves import erase, moves, with_dims, with_partial
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType
from spec_lang.parser import parse, parse_mesh


def _checked(t: TensorType) -> TensorType:
    return TensorType(t.dtype, t.dims, t.axis_types)


def _search_ends(case: tuple) -> tuple[TensorType, TensorType, Mesh, str]:
    """An even case's erased ends, mesh and reduce op, as the search sees them."""
    src, dst, mesh = case
    assume(not src.is_uneven and not dst.is_uneven)
    start, goal = erase(src), erase(dst)
    return start, goal, mesh, start.partial_op or goal.partial_op or "sum"


def _key(model: CostModel, time: float, moved: np.ndarray, colls: int, peak: int, future: float,
         extra: int, floor: int, item: int, whole: bool = True) -> tuple:
    """The search key from its terms, written plainly (``SearchContext.keys`` fuses them): the
    largest of the busiest rank's bytes, the class and receive floors (``floor``, the
    larger) and the world mean of bytes
    plus what is due (in whole elements where ``whole``), plus the spare-axis charge;
    one more collective where anything is due; the peak."""
    total = int(moved.max())
    if not model.bytes_first:
        return (time, total, colls, peak)
    if whole:
        elements = int(moved.sum()) // item + math.ceil(future / item - 1e-6)
        estimate = max(total, floor, item * -(-elements // len(moved)))
    else:
        estimate = max(total, floor, -(-int(moved.sum() + future) // len(moved)))
    return (estimate + extra, colls + int(future > 0), peak)


def _same(t: TensorType) -> None:
    c = _checked(t)
    assert (c.dtype, c.dims, c.axis_types) == (t.dtype, t.dims, t.axis_types), str(t)
    assert c == t and hash(c) == hash(t)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(varying=True, explicit_i=True))
def test_derived_states_are_what_the_checked_constructor_builds(case: tuple) -> None:
    start, goal, mesh, op = _search_ends(case)
    frontier = [start]
    for _ in range(2):
        nxt = []
        for state in frontier:
            for mv in moves(state, goal, mesh, op):
                _same(mv.dst)
                nxt.append(mv.dst)
        frontier = nxt[:12]
    for route in fallback_routes(start, goal, mesh, op):
        for state, mv in route:
            _same(state)
            _same(mv.dst)


def test_a_repeated_axis_still_goes_through_the_checks() -> None:
    t = erase(parse("f32[4@a,4]{U:b}"))
    with pytest.raises(SpecError, match="used twice"):
        with_dims(t, [("a",), ("a",)])
    with pytest.raises(SpecError, match="used twice"):
        with_partial(t, {"a"}, "sum", parse_mesh("a=2,b=2"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(varying=True, explicit_i=True))
def test_the_fused_key_is_the_key_term_by_term(case: tuple) -> None:
    # along the fallback routes (states with sends so far), order and bound agree with
    # ``_key`` fed the byte and whole-element class floors separately
    start, goal, mesh, op = _search_ends(case)
    ctx = SearchContext(start, goal, mesh, DEFAULT_COST_MODEL)
    for route in fallback_routes(start, goal, mesh, op)[:4]:
        lab = ctx.first
        for state, mv in route:
            lab = ctx.extend(lab, state, mv)
            assert lab is not None
            assert lab.moved_max == int(lab.moved.max()) and lab.moved_sum == int(lab.moved.sum()), str(state)
            here = mv.dst
            item = here.itemsize
            future = _future(here, goal, mesh)
            args = (DEFAULT_COST_MODEL, lab.time, lab.moved, lab.colls, lab.peak, future, lab.charge)
            recv_bytes = receive_floor(lab.moved, here, goal, mesh, whole=False)
            recv_whole = receive_floor(lab.moved, here, goal, mesh)
            order = _key(*args, max(class_floor(lab.moved, here, goal, mesh, whole=False), recv_bytes), item,
                         whole=False)
            bound = _key(*args, max(class_floor(lab.moved, here, goal, mesh), recv_whole), item)
            assert ctx.keys(lab, here) == (order, bound), str(here)
            # a cutoff at the bound prunes; just above it keeps the same keys
            assert ctx.keys(lab, here, bound) is None
            above = (bound[0], bound[1], bound[2] + 1)
            assert ctx.keys(lab, here, above) == (order, bound)
