"""Property test: the planner's holder-class floor never overshoots a real program.

The search's byte estimate and the fast path's proof use it, so it must be a lower bound
for every program the planner can build: at every state along a program, the bytes the
busiest rank has sent so far plus what the floor says is still due never exceed what the
program's busiest rank sends in the end. Checked on the searched program and on the
constructive fallback (a different route through other states)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from strategies import cases

from lowering.labels import class_floor
from lowering.moves import erase
from lowering.planner import _floor, compile, fallback_program
from spec_lang.ir import Mesh, TensorType


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(varying=True, explicit_i=True))
def test_the_holder_class_floor_never_overshoots_a_program(case: tuple) -> None:
    src, dst, mesh = case
    goal = erase(dst)
    for prog in (compile(src, dst, mesh, budget_s=5.0), fallback_program(src, dst, mesh)):
        final = prog.cost.bytes_max
        assert _floor(erase(src), goal, mesh) <= final, str(prog)
        moved = np.zeros(mesh.size, dtype=np.int64)
        for step in prog.steps:
            assert class_floor(moved, erase(step.src), goal, mesh) <= final, (str(prog), str(step.src))
            moved = moved + np.asarray(step.bytes_moved or (0,) * mesh.size, dtype=np.int64)
        assert int(moved.max(initial=0)) == final


def test_the_floor_is_the_busiest_holder_on_a_small_uneven_tensor() -> None:
    # 3 elements on f (2 + 1), the one element of dims 1 and 2 on e=0, d=b=a=0, and a pending
    # sum over c: rank (f=0, e=0, d=b=a=0) alone holds its c-contribution to elements 0 and 1,
    # which other ranks need, so it sends 2 elements (8 bytes) at least; the world average
    # of the transfers (3 bytes) hides that
    from spec_lang.parser import parse, parse_mesh

    mesh = parse_mesh("a=2,b=2,c=2,d=2,e=2,f=2")
    src, dst = erase(parse("f32[3@f,1@e,1@(d,b,a)]{U:c}")), erase(parse("f32[3@(f,e),1,1]"))
    assert _floor(src, dst, mesh) == 8
    assert compile(src, dst, mesh, budget_s=5.0).cost.bytes_max >= 8


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(varying=True, explicit_i=True))
def test_the_world_floor_never_overshoots_a_program(case: tuple) -> None:
    # the search's world estimate (``_future``, with the floor for goals with new partial
    # axes) plus what the world has sent so far never exceeds what the program sends in all
    from lowering.labels import _future

    src, dst, mesh = case
    goal = erase(dst)
    for prog in (compile(src, dst, mesh, budget_s=5.0), fallback_program(src, dst, mesh)):
        total = sum(int(np.sum(step.bytes_sent or 0)) for step in prog.steps)
        sent = 0
        for step in prog.steps:
            assert sent + _future(erase(step.src), goal, mesh) <= total, (str(prog), str(step.src))
            sent += int(np.sum(step.bytes_sent or 0))


def test_a_goal_with_new_partial_axes_has_a_floor() -> None:
    # the goal is a sum over f: the two ranks differing on f hold their block between them,
    # so every element of it must reach one of them. Moving a 4-element dim from e to d,
    # the (c, d, e) pairs with d != e hold none of their 2 elements: 4 pairs x 2. With a
    # sum pending over c, no pair holds the other c-contribution: 8 pairs x 2 elements.
    # The lower bound counts it too: a pair receives its 2 elements, one at least each
    from lowering.bounds import lower_bound_detail, new_partial_transfers
    from spec_lang.parser import parse, parse_mesh

    mesh = parse_mesh("c=2,d=2,e=2,f=2")
    src, dst = erase(parse("f32[4@e]")), erase(parse("f32[4@d]{U:f}"))
    assert lower_bound_detail(src, dst, mesh)["bytes"] == 4
    assert new_partial_transfers(src, dst, mesh) == 8
    reducing = erase(parse("f32[4@e]{U:c}"))
    assert new_partial_transfers(reducing, dst, mesh) == 16
    for s in (src, reducing):
        prog = compile(s, dst, mesh, budget_s=5.0)
        assert sum(int(np.sum(step.bytes_sent)) for step in prog.steps) >= new_partial_transfers(s, dst, mesh) * 4


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(varying=True, explicit_i=True))
def test_the_search_key_never_overshoots_a_route(case: tuple) -> None:
    src, dst, mesh = case
    assume(not src.is_uneven and not dst.is_uneven)
    _route_keys_never_overshoot(src, dst, mesh)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(max_axes=4, max_ranks=24, varying=True, explicit_i=True, even=True))
def test_on_even_layouts_the_search_key_never_overshoots_a_route(case: tuple) -> None:
    # dims a multiple of the world size: every block even, and the floors tighter
    src, dst, mesh = case
    _route_keys_never_overshoot(src, dst, mesh)


def _route_keys_never_overshoot(src: TensorType, dst: TensorType, mesh: Mesh) -> None:
    # the whole key (bytes in whole elements, collectives, peak) at every state along each
    # constructive route is at most the route's final key: the search may stop on it
    from lowering.checks import check_partial_conversion
    from lowering.cost import DEFAULT_COST_MODEL
    from lowering.fallback import fallback_routes
    from lowering.labels import SearchContext

    start, goal = erase(src), erase(dst)
    ctx = SearchContext(start, goal, mesh, DEFAULT_COST_MODEL)
    for route in fallback_routes(start, goal, mesh, check_partial_conversion(src, dst)):
        labels = [ctx.first]
        for state, mv in route:
            labels.append(ctx.extend(labels[-1], state, mv))
        end = labels[-1]  # what the route costs, the spare-axis charge included
        final = (int(end.moved.max(initial=0)) + end.charge, end.colls, end.peak)
        assert ctx.path_key(route) == final
        for (state, _), lab in zip(route, labels):
            assert ctx.key(lab, state) <= final, (str(state), route)
