"""The receive-side floor of the search: a rank's bytes so far plus what it must still
receive (``lowering.bounds.receive_need``) bound its final bytes.

It rests on one property of the step kinds, checked here move by move: every move
prices each rank at least what it takes off its receive need (a step costs a rank the
larger of what it sends and what it receives), even and uneven blocks alike."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from strategies import cases

from lowering.bounds import lower_bound, receive_need
from lowering.checks import check_partial_conversion
from lowering.cost import DEFAULT_COST_MODEL
from lowering.fallback import fallback_routes
from lowering.kinds import kind_of
from lowering.labels import SearchContext, move_bytes, receive_floor
from lowering.moves import erase, moves
from lowering.planner import compile
from spec_lang.parser import parse, parse_mesh


def test_receive_need_counts_what_each_rank_lacks() -> None:
    mesh = parse_mesh("x=2,y=2")  # ranks (x, y) in row-major order
    need = receive_need(erase(parse("f32[8@x]")), erase(parse("f32[8@y]")), mesh)
    # (0,0) holds [0,4) and needs it; (0,1) holds [0,4) and needs [4,8); (1,0) the reverse
    assert need.tolist() == [0, 4, 4, 0]
    # a pending sum: every rank must hear the other contribution on its whole goal block
    pending = receive_need(erase(parse("f32[8]{U:x}")), erase(parse("f32[8@y]")), mesh)
    assert pending.tolist() == [4, 4, 4, 4]
    # a goal with a new partial axis: any member of the sum may hold the values
    assert receive_need(erase(parse("f32[8@x]")), erase(parse("f32[8]{U:y}")), mesh).tolist() == [0] * 4


def test_an_uneven_ring_is_priced_by_what_it_receives() -> None:
    # all_gather of 5@x on x=4: the ranks hold 2,2,1,0 and a ring rank sends all but its
    # successor's block, so rank 3 receives 5 elements and sends 5 - 2 = 3: the step costs
    # it 5 (its busier direction), which is what it takes off its receive need
    mesh = parse_mesh("x=4")
    src, dst = erase(parse("f32[5@x]")), erase(parse("f32[5]"))
    [gather] = [mv for mv in moves(src, dst, mesh, "sum") if mv.kind == "all_gather"]
    drop = receive_need(src, dst, mesh) - receive_need(gather.dst, dst, mesh)
    assert kind_of("all_gather").price(src, gather.dst, mesh, gather.axes)[3] == 3
    assert kind_of("all_gather").received(src, gather.dst, mesh, gather.axes).tolist() == [3, 3, 4, 5]
    assert drop[3] == 5 and move_bytes(src, gather, mesh)[3] == 5


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(cases(max_axes=4, max_ranks=24, varying=True, explicit_i=True, even=True),
                 cases(max_axes=4, max_ranks=24, varying=True, explicit_i=True)), st.integers(0, 2**31))
def test_every_move_costs_what_it_takes_off_the_need(case: tuple, seed: int) -> None:
    # the property the floor rests on, for every move out of the start and out of every state
    # of the constructive routes (the states a search passes through first): a move costs a
    # rank at least what it takes off its receive need, and the floor, from any bytes so
    # far, never drops along a move (the ranks differing only on the goal's new partial
    # axes share their need: any of them may hold the values)
    src, dst, mesh = case
    assume(not src.is_uneven and not dst.is_uneven)
    start, goal = erase(src), erase(dst)
    op = check_partial_conversion(src, dst)
    states = {start} | {s for route in fallback_routes(start, goal, mesh, op) for s, _ in route}
    rng = np.random.default_rng(seed)
    item = start.itemsize
    for state in states:
        need = receive_need(state, goal, mesh)
        sent = rng.integers(0, 3 * max(1, int(need.max(initial=0))) + 1, mesh.size)
        for mv in moves(state, goal, mesh, op):
            price = move_bytes(state, mv, mesh)
            got = kind_of(mv.kind).received(state, mv.dst, mesh, mv.axes)
            # the search's price of a move is the larger of what each rank sends and receives
            # (per phase, summed, for a relay's two: between that and the sum of the two)
            sent_now = kind_of(mv.kind).price(state, mv.dst, mesh, mv.axes)
            if kind_of(mv.kind).launches == 1:
                assert (price == np.maximum(sent_now, got)).all()
            assert (np.maximum(sent_now, got) <= price).all() and (price <= sent_now + got).all()
            if not set(goal.partial_axes) - set(state.partial_axes):
                drop = need - receive_need(mv.dst, goal, mesh)
                assert (drop <= got).all(), (str(state), mv.kind, mv.axes, str(mv.dst))
            for before in (np.zeros(mesh.size, dtype=np.int64), sent * item):
                after = before + price * item
                assert receive_floor(before, state, goal, mesh) <= receive_floor(after, mv.dst, goal, mesh), (
                    str(state), mv.kind, mv.axes, str(mv.dst))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(cases(max_axes=4, max_ranks=24, varying=True, explicit_i=True, even=True),
                 cases(max_axes=4, max_ranks=24, varying=True, explicit_i=True)))
def test_the_receive_floor_never_overshoots_a_program(case: tuple) -> None:
    # the searched program's own steps, with the bytes it reports: the floor at each step's
    # input is at most what the busiest rank moves in the end (the constructive routes'
    # keys: tests/test_holder_class_bound.py)
    src, dst, mesh = case
    assume(not src.is_uneven and not dst.is_uneven)
    start, goal = erase(src), erase(dst)
    assert SearchContext(start, goal, mesh, DEFAULT_COST_MODEL)._need_of is not None  # the floor is on
    prog = compile(src, dst, mesh, budget_s=5.0)
    moved = np.zeros(mesh.size, dtype=np.int64)
    for step in prog.steps:
        floor = receive_floor(moved, erase(step.src), goal, mesh)
        assert floor <= prog.cost.bytes_max, (str(prog), str(step.src))
        moved = moved + np.asarray(step.bytes_moved or (0,) * mesh.size, dtype=np.int64)
    assert int(moved.max(initial=0)) == prog.cost.bytes_max


def test_the_floor_proves_an_exchange_at_the_receive_bound_within_the_budget() -> None:
    # slice a, then one all_to_all over all six axes: the busiest rank receives its whole goal
    # block, which the mean over ranks (some keep a piece of it) cannot show; the receive
    # floor proves it cheapest at the default budget
    mesh = parse_mesh("a=2,b=2,c=2,d=2,e=2,f=2")
    src, dst = "f32[128@(d,c),512@e,320@(b,f)]", "f32[128@(b,f),512,320@a]"
    prog = compile(src, dst, mesh)
    assert prog.optimal
    assert prog.cost.bytes_max == lower_bound(src, dst, mesh) == 10485760
    assert prog.cost.collectives == 1
