"""One local SPMD type for the IR, the SPMD rules and the torch API, and the grammar as the
one reader of local types, placements and uneven placements: every bad text gets a caret.

The carets' oracle is written into each case: ``^`` marks where the caret must be (it is
removed before the text is read)."""

from __future__ import annotations

import pytest

import lowering.spmd as lspmd
from lowering import from_placements
from lowering.placements import as_spec, parse_placements
from lowering.spmd.types import REDUCE_OPS as SPMD_REDUCE_OPS
from spec_lang import AxisType, Dim, LocalType, SpecError, TensorType, parse, parse_local_type
from spec_lang.ir import REDUCE_OPS


def test_one_class_for_every_local_type() -> None:
    assert AxisType is LocalType is lspmd.LocalType
    assert SPMD_REDUCE_OPS is REDUCE_OPS
    t = parse("f32[8@dp,4]{U:tp, R:cp, V:ep}")
    assert (t.axis_type("tp"), t.axis_type("cp"), t.axis_type("ep"), t.axis_type("xx")) == (
        lspmd.P, lspmd.R, lspmd.V, lspmd.I)
    assert parse("f32[8]{P(max):tp}").axis_type("tp") == lspmd.P("max") == parse_local_type("P(max)")
    assert AxisType("U") == lspmd.as_local_type("U") == lspmd.P and AxisType("U").code == "U"
    assert lspmd.S(1).base == "V" and lspmd.S(1).code == "S(1)" and repr(lspmd.P("avg")) == "P('avg')"


@pytest.mark.parametrize("build,match", [
    (lambda: LocalType("X"), "unknown local type 'X'"),
    (lambda: LocalType("P", "prod"), "unknown reduce op 'prod'"),
    (lambda: LocalType("S"), "local type S needs tensor dim"),
    (lambda: LocalType("R", dim=0), "local type R has no tensor dim"),
    (lambda: lspmd.S(True), r"S\(True\) needs a tensor dim >= 0"),
    (lambda: lspmd.S(10**5000), r"S\(a number of 5,001 digits\) needs a tensor dim >= 0"),
    (lambda: TensorType("f32", (Dim(8),), (("tp", lspmd.S(0)),)), "a type writes a split as a sharded dim"),
])
def test_the_one_class_checks_its_fields(build, match: str) -> None:
    with pytest.raises(SpecError, match=match) as info:
        build()
    assert info.value.hint


def _marked(case: str) -> tuple[str, int]:
    return case.replace("^", ""), case.index("^")


@pytest.mark.parametrize("case,message", [
    ("^Q", "'Q' is not a local SPMD type"),
    ("P(^prod)", "unknown reduce op 'prod'"),
    ("R^(avg)", "local SPMD type R takes no arguments"),
    ("U^(max)", "local SPMD type U takes no arguments"),  # U is P(sum)
    ("S(1, ^2)", "local SPMD type S takes 1 argument, not 2"),
    ("S^", "local SPMD type S needs its arguments"),
    ("P(avg^", "it ends too early"),
    ("S(^-1)", "needs a tensor dim >= 0"),
    ("R ^R", "unexpected 'R'"),
    ("S(^" + "9" * 25 + ")", "tensor dim 999999999999... (25 digits) is too large"),
])
def test_local_type_text_errors_have_a_caret(case: str, message: str) -> None:
    text, pos = _marked(case)
    with pytest.raises(SpecError) as info:
        parse_local_type(text, "src")
    e = info.value
    assert e.message.startswith("src: ") and message in e.message and e.hint
    assert (e.text, e.pos) == (text, pos), str(e)


@pytest.mark.parametrize("case,message", [
    ("[S(0), R^", "malformed placements: it ends too early (expected ']')"),
    ("S(0),^RR", "'RR' is not a placement"),
    ("^Shard(0)", "'Shard' is not a placement"),
    ("S(1^.5)", "unexpected character '.'"),
    ("_S(0^)", "placement _S needs its split_factor"),
    ("_S(0, ^x=3)", "placement _S has no argument 'x'"),
    ("[R, ^DynamicShard(0,[3,-1])]", "negative size -1"),
    ("DynamicShard(0,[1,2],^3)", "placement DynamicShard takes 2 arguments, not 3"),
    ("R, DynamicShard(0, [3, 0, 7], ^chunk_sizes=[2])", "placement DynamicShard gets its chunk_sizes twice"),
    ("DynamicShard(dim=0, ^[3, 7])", "takes no positional argument after a keyword one"),
    ("RaggedShard(^)", "placement RaggedShard needs its dims"),
    ("PartitionedShard(0,2,[[1,2],[3,3]],aligned=True^", "it ends too early"),
    ("[R,^P(foo)]", "unknown Partial reduce op 'foo'"),
    ("S(^" + "9" * 25 + ")", "tensor dim 999999999999... (25 digits) is too large"),
])
def test_placement_text_errors_have_a_caret(case: str, message: str) -> None:
    text, pos = _marked(case)
    with pytest.raises(SpecError) as info:
        parse_placements(text)
    e = info.value
    assert message in e.message and e.hint
    assert (e.text, e.pos) == (text, pos), str(e)


def test_the_public_entries_show_the_caret_in_the_text_given() -> None:
    with pytest.raises(SpecError, match="it ends too early") as info:
        from_placements("[S(0), R", "dp=2,tp=2", (8,))
    assert (info.value.text, info.value.pos) == ("[S(0), R", 8)
    with pytest.raises(SpecError, match="'Q' is not a placement") as info:
        as_spec("Q")
    assert (info.value.text, info.value.pos) == ("Q", 0)
    with pytest.raises(SpecError, match="unexpected ','") as info:  # one placement, not a list
        as_spec("S(0),R")
    assert info.value.pos == 4
