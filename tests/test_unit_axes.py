"""Mesh axes of size 1 move nothing: the planner emits no collective over them, and two
layouts equal up to them (a dim sharded over one rank, a sum over one rank) compile to an
empty program. Checked against the layouts' blocks (every rank holds the same elements)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from strategies import cases

from lowering import compile, simulate
from lowering.layout import boxes
from spec_lang.ir import Dim, TensorType
from spec_lang.parser import parse_mesh


def test_a_gather_over_one_rank_is_no_step() -> None:
    prog = compile("f32[8@dp]", "f32[8]", "dp=1")
    assert prog.steps == () and prog.cost.collectives == 0
    assert "(no steps: every rank already holds its destination block)" in str(prog)


def test_the_same_layout_spelt_with_a_unit_axis_is_no_step() -> None:
    # 8@(dp,tp) and 8@(tp,dp) on dp=1 give every rank the same block: no permute
    prog = compile("f32[8@(dp,tp)]", "f32[8@(tp,dp)]", "dp=1,tp=4")
    assert prog.steps == ()
    # a sum pending over one rank is its value; I and R differ only where the axis has 2+ ranks
    assert compile("f32[8@tp]{U:dp}", "f32[8@(tp,dp)]", "dp=1,tp=4").steps == ()
    assert [s.kind for s in compile("f32[8@dp]{R:tp}", "f32[8]", "dp=1,tp=4").steps] == ["reinterpret"]


def test_a_collective_keeps_only_the_axes_that_move() -> None:
    prog = compile("f32[8@(dp,tp)]", "f32[8]", "dp=1,tp=4")
    assert [(s.kind, s.axes) for s in prog.steps] == [("all_gather", ("tp",))]
    out = simulate(prog, [np.arange(2.0) + 2 * r for r in range(4)])
    assert all(np.array_equal(o, np.arange(8.0)) for o in out)


def _moved_around(t: TensorType, mesh, draw) -> TensorType:
    """``t`` with its unit axes taken off, then put back on random dims (or left replicated)."""
    unit = [a for a, n in zip(mesh.names, mesh.sizes) if n == 1]
    dims = [[a for a in d.axes if a not in unit] for d in t.dims]
    for a in unit:
        if a in t.sharded_axes or a not in {x for x, _ in t.axis_types}:
            k = draw(st.integers(-1, len(dims) - 1))
            if k >= 0:
                dims[k].insert(draw(st.integers(0, len(dims[k]))), a)
    types = tuple((a, at) for a, at in t.axis_types if a not in unit or at.kind != "R")
    return TensorType(t.dtype, tuple(Dim(d.size, tuple(ax)) for d, ax in zip(t.dims, dims)),
                      tuple((a, at) for a, at in types if not any(a in ax for ax in dims)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(varying=True), st.data())
def test_no_collective_runs_over_unit_axes_alone(case: tuple, data: st.DataObject) -> None:
    src, dst, mesh = case
    assume(1 in mesh.sizes)
    for prog in (compile(src, dst, mesh), compile(src, _moved_around(src, mesh, data.draw), mesh)):
        for step in prog.steps:
            assert not step.is_collective or mesh.group_size(step.axes) > 1, str(prog)
    # the source against itself with its unit axes moved: the same blocks, so no step moves data
    other = _moved_around(src, mesh, data.draw)
    assert (boxes(other, mesh) == boxes(src, mesh)).all()
    assert compile(src, other, mesh).cost.collectives == 0


def test_the_budget_case_gets_the_fallbacks_fewest_collectives() -> None:
    # one reduce_scatter then one exchange straight to the goal: the fallback's route, the
    # search's first incumbent (it once returned 3 collectives for the same bytes)
    mesh = parse_mesh("dp=16,tp=8,cp=8,pp=2")
    prog = compile("bf16[4096@(dp,tp),4096@cp]{U:pp}", "bf16[4096@cp,4096@(tp,dp)]", mesh)
    assert (prog.cost.bytes_max, prog.cost.collectives) == (49152, 2)
