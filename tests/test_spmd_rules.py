"""The SPMD type system's tables as code (torch-free): every allowed pair builds a program
whose backward (its kinds' duals) is the table's backward collective and its exact adjoint;
every other pair is refused, naming the rule and the fix."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from typed_data import pairing, random_arrays

from lowering.kinds import simulate_step
from lowering.layout import local_shape
from lowering.spmd.programs import backward_program, program_for
from lowering.spmd.rules import ALLOWED, BACKWARD, IDENTITY_ON_DIAGONAL, backward_of, check_pair
from lowering.spmd.types import I, LocalType, P, R, S, V, as_local_type
from spec_lang.dual import dual_type
from spec_lang.errors import SpecError
from spec_lang.parser import parse_mesh

LETTERS = {"R": [R], "I": [I], "V": [V], "P": [P], "S": [S(0), S(1)]}


def _pairs(op: str) -> list[tuple[LocalType, LocalType]]:
    out = []
    for a, b in sorted(ALLOWED[op]):
        for s, d in itertools.product(LETTERS[a], LETTERS[b]):
            if a == b == "S" and s == d:
                continue
            out.append((s, d))
    if op in ("all_reduce", "reduce_scatter"):
        out += [(P("avg"), d) for _, d in out]
    return out


CASES = [(op, s, d) for op in ALLOWED for s, d in _pairs(op)]
GROUPS = [("x=3", ("x",)), ("dp=2,tp=3", ("tp",)), ("dp=2,tp=3", ("dp", "tp")), ("dp=2,tp=3", ("tp", "dp"))]


def _program(op, s, d, mesh, group, uneven=False):
    m = parse_mesh(mesh)
    n = m.group_size(group)
    shape = (n, 4)
    size = None
    if s.kind == "S":
        size = n * shape[s.dim] - (1 if uneven else 0)
    return program_for(op, s, d, group, shape, "float64", m, size), m


@pytest.mark.parametrize("mesh,group", GROUPS, ids=[f"{m}:{'.'.join(g)}" for m, g in GROUPS])
@pytest.mark.parametrize("op,s,d", CASES, ids=[f"{o}({s!r},{d!r})" for o, s, d in CASES])
def test_backward_is_the_exact_adjoint(op, s, d, mesh, group) -> None:
    for uneven in (False, True) if s.kind == "S" else (False,):
        prog, m = _program(op, s, d, mesh, group, uneven)
        back = backward_program(prog)
        assert back.src == dual_type(prog.dst) and back.dst == dual_type(prog.src)
        assert prog.cost.collectives <= 1  # one collective per call, flattened over the group
        rng = np.random.default_rng(7)
        x = random_arrays(prog.src, m, rng)
        y = random_arrays(dual_type(prog.dst), m, rng)
        fx, by = x, y
        for st in prog.steps:
            fx = simulate_step(st, m, fx)
        for st in back.steps:
            by = simulate_step(st, m, by)
        lhs, rhs = pairing(prog.dst, m, fx, y), pairing(prog.src, m, x, by)
        assert lhs == (rhs if s.op == "sum" else pytest.approx(rhs, rel=1e-12))  # avg divides by n


@pytest.mark.parametrize("op,s,d", [c for c in CASES if c[1].op == "sum" and c[0] != "redistribute"],
                         ids=lambda v: repr(v))
def test_backward_is_the_tables_collective(op, s, d) -> None:
    prog, m = _program(op, s, d, "dp=2,tp=3", ("dp", "tp"))
    back = backward_program(prog)
    if (op, s.kind, d.kind) in {("reinterpret", "I", "V"), ("reinterpret", "I", "P")}:
        # compositions I -> R -> V|P: backward V|P -> P (pcast), then all_reduce(P, I)
        assert [st.kind for st in back.steps] == ["pcast", "all_reduce"]
        return
    b_op, b_src, b_dst = backward_of(op, s, d)
    shape = local_shape(prog.dst, m, 0)
    size = None
    if b_src.kind == "S":
        size = prog.dst.dims[b_src.dim].size
    want = program_for(b_op, b_src, b_dst, ("dp", "tp"), shape, "float64", m, size)
    if op == "all_to_all" and s == V:  # the mirror image: the same all_to_all, stacked on dim 1
        assert (back.src, back.dst) == (want.src, want.dst)
        assert [st.kind for st in back.steps] == [st.kind for st in want.steps]
        return
    assert [(st.kind, st.src, st.dst) for st in back.steps] == [(st.kind, st.src, st.dst) for st in want.steps]


def test_backward_table_has_every_direct_row() -> None:
    for (op, a, b), (bop, ba, bb) in BACKWARD.items():
        assert (a, b) in ALLOWED[op] and (ba, bb) in ALLOWED[bop]
        if op != "all_to_all":  # the backward of the backward is the forward (table read right to left)
            fwd = BACKWARD.get((bop, ba, bb))
            if fwd is not None:  # convert(R,I) and convert(I,R) are reinterprets: compare the types
                assert fwd[1:] == (a, b)


def _identity(op: str, a: str, b: str) -> bool:
    """The diagonal of reinterpret, convert and redistribute: nothing to do (reinterpret takes no S(i))."""
    return a == b and op in IDENTITY_ON_DIAGONAL and not (op == "reinterpret" and a == "S")


REFUSED = [(op, a, b) for op in ALLOWED for a in "RIVPS" for b in "RIVPS"
           if (a, b) not in ALLOWED[op] and not _identity(op, a, b)]


@pytest.mark.parametrize("op", IDENTITY_ON_DIAGONAL)
@pytest.mark.parametrize("t", [R, I, V, P, P("avg"), S(0), S(1)], ids=repr)
def test_the_diagonal_is_nothing_to_do(op, t) -> None:
    """src == dst: the tables' "-", an empty program (the input as it is, its backward too)."""
    if op == "reinterpret" and t.kind == "S":
        with pytest.raises(SpecError, match="does not take S"):
            check_pair(op, t, t)
        return
    assert check_pair(op, t, t) == "identity"
    m = parse_mesh("dp=2,tp=3")
    prog = program_for(op, t, t, ("tp",), (3, 4), "float64", m, 9 if t.kind == "S" else None)
    assert prog.steps == () and prog.src == prog.dst
    assert backward_program(prog).steps == ()
    for other in ("all_gather", "all_reduce", "reduce_scatter", "all_to_all"):  # a real op there, or none
        if other == "all_to_all" and t == V:
            assert check_pair(other, t, t) == "all_to_all"  # the transpose of the mesh axis and dim 0
            continue
        with pytest.raises(SpecError):
            check_pair(other, t, t)


@pytest.mark.parametrize("op,a,b", REFUSED, ids=lambda v: str(v))
def test_every_other_pair_is_refused(op, a, b) -> None:
    s, d = LETTERS[a][0], LETTERS[b][0]
    with pytest.raises(SpecError) as e:
        check_pair(op, s, d)
    msg = str(e.value)
    assert op in msg and "hint:" in msg
    assert ("is not a valid pair" in msg) or ("out of P" in msg)


@pytest.mark.parametrize("op,s,d,rule,fix", [
    ("all_reduce", R, R, "its source is P", "nothing to reduce"),
    ("all_reduce", V, R, "its source is P", r"reinterpret\(x, axis, src=V, dst=P\) first"),
    ("reduce_scatter", I, S(0), "source P", "nothing to reduce; from I to S.0. use spmd.convert.x, axis, src=I, dst=S.0..$"),
    ("convert", P, R, "cannot convert out of P", "all_reduce"),
    ("reinterpret", V, R, "reinterpret keeps every local tensor", "all_gather"),
    ("all_gather", P, R, "collects varying blocks", "all_reduce"),
    ("reinterpret", S(0), P, "does not take S", "convert"),
    ("all_to_all", S(1), S(1), "source and destination are equal", "nothing to do"),
    ("convert", R, P("avg"), "only a pending sum", "reinterpret"),
])
def test_refusals_name_the_rule_and_the_fix(op, s, d, rule, fix) -> None:
    with pytest.raises(SpecError, match=rule) as e:
        check_pair(op, s, d)
    import re

    assert re.search(fix, str(e.value).split("hint:")[1])


def test_types_compare_and_parse() -> None:
    assert P == P("sum") and P("avg") != P and S(0) == S(0) and S(0) != S(1) and S(0) != V
    assert as_local_type("U") == P and as_local_type("P(max)") == P("max") and as_local_type("S(2)") == S(2)
    assert as_local_type(" P( 'avg' ) ") == P("avg") and as_local_type(" S( 01 ) ") == S(1) and as_local_type("I") == I
    assert repr(P("avg")) == "P('avg')" and S(0).base == "V"
    for bad in ("Q", "S(-1)", 3):
        with pytest.raises(SpecError):
            as_local_type(bad)
    with pytest.raises(SpecError, match="takes no argument"):
        R("sum")
    with pytest.raises(SpecError, match="unknown reduce op"):
        P("prod")


def test_shape_errors_name_the_need() -> None:
    m = parse_mesh("x=3")
    with pytest.raises(SpecError, match="dim 0 of the group's size 3"):
        program_for("reduce_scatter", P, V, ("x",), (4, 2), "float64", m)
    with pytest.raises(SpecError, match="names dim 2"):
        program_for("convert", R, S(2), ("x",), (4, 2), "float64", m)
    with pytest.raises(SpecError, match="not on the mesh"):
        program_for("all_reduce", P, R, ("y",), (4, 2), "float64", m)
