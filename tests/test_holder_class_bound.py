"""Property test: the planner's holder-class floor never overshoots a real program.

The search's byte estimate and the fast path's proof use it, so it must be a lower bound
for every program the planner can build: at every state along a program, the bytes the
busiest rank has sent so far plus what the floor says is still due never exceed what the
program's busiest rank sends in the end. Checked on the searched program and on the
constructive fallback (a different route through other states)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from strategies import cases

from lowering.moves import erase
from lowering.planner import _class_floor, _sent_floor, compile, fallback_program


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(varying=True, explicit_i=True))
def test_the_holder_class_floor_never_overshoots_a_program(case: tuple) -> None:
    src, dst, mesh = case
    goal = erase(dst)
    for prog in (compile(src, dst, mesh, budget_s=5.0), fallback_program(src, dst, mesh)):
        final = prog.cost.bytes_sent_max
        assert _sent_floor(erase(src), goal, mesh) <= final, str(prog)
        sent = np.zeros(mesh.size, dtype=np.int64)
        for step in prog.steps:
            assert _class_floor(sent, erase(step.src), goal, mesh) <= final, (str(prog), str(step.src))
            sent = sent + np.asarray(step.bytes_sent or (0,) * mesh.size, dtype=np.int64)
        assert int(sent.max(initial=0)) == final


def test_the_floor_is_the_busiest_holder_on_a_small_uneven_tensor() -> None:
    # 3 elements on f (2 + 1), the one element of dims 1 and 2 on e=0, d=b=a=0, and a pending
    # sum over c: rank (f=0, e=0, d=b=a=0) alone holds its c-contribution to elements 0 and 1,
    # which other ranks need, so it sends 2 elements (8 bytes) at least; the world average
    # of the transfers (3 bytes) hides that
    from spec_lang.parser import parse, parse_mesh

    mesh = parse_mesh("a=2,b=2,c=2,d=2,e=2,f=2")
    src, dst = erase(parse("f32[3@f,1@e,1@(d,b,a)]{U:c}")), erase(parse("f32[3@(f,e),1,1]"))
    assert _sent_floor(src, dst, mesh) == 8
    assert compile(src, dst, mesh, budget_s=5.0).cost.bytes_sent_max >= 8
