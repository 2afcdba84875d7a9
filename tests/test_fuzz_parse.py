"""Fuzzing the three parsers: only SpecError escapes, nothing hangs, printing round-trips.

The deadline makes a pathological (e.g. backtracking) input fail loudly instead of
hanging CI; lark's LALR parser should be linear, and this holds it to that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spec_lang import (
    DTYPES,
    AxisType,
    Dim,
    SpecError,
    TensorType,
    format_type,
    parse,
    parse_mesh,
    parse_shard_order,
)

FUZZ = settings(max_examples=300, deadline=1000, suppress_health_check=[HealthCheck.too_slow])

SEEDS = {
    parse: [
        "float32[8@dp,16]{U:tp}", "f32[8@(dp,tp),16]", "f32[8,16@(tp,dp)]", "f32[8@dp,tp]",
        "f32[8]{U:cp, R:tp}", "f32[8]{U:(cp,tp)}", "f32[8]{V:(dp,tp)}", "bf16[4]{P(avg):x}",
        "i8[]", "f32[8@dp,tp,4]{P(max):(a,b), R:c}",
    ],
    parse_mesh: ["dp=2,tp=4", "a=2,b=2,c=2,d=2", "x=8", "dp = 2 , tp = 4"],
    parse_shard_order: ["{0: [1], 1: ['dp', 'tp']}", '{0: ["tp", 0]}', "{}", "{2: [tp, dp,],}"],
}
ALPHABET = "f32bf16int8[]@(),{}:=URIVP(avgmxsu) dptcx_'\"0123456789\t\n#-"


def _only_spec_errors(fn: Callable[[str], Any], text: str) -> Any:
    try:
        return fn(text)
    except SpecError as e:
        assert e.message
        if e.pos is not None:
            assert 0 <= e.pos <= len(text)
        return None


@st.composite
def mutated(draw: st.DrawFn, seeds: list[str]) -> str:
    """A valid string with a few random edits (delete, insert, replace, duplicate)."""
    s = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(s)))
        j = draw(st.integers(i, min(len(s), i + 4)))
        op = draw(st.sampled_from(["del", "ins", "rep", "dup"]))
        ch = draw(st.text(ALPHABET, min_size=1, max_size=3))
        if op == "del":
            s = s[:i] + s[j:]
        elif op == "ins":
            s = s[:i] + ch + s[i:]
        elif op == "rep":
            s = s[:i] + ch + s[j:]
        else:
            s = s[:j] + s[i:j] + s[j:]
    return s


@FUZZ
@given(st.text(max_size=80))
def test_random_text_type(text: str) -> None:
    _only_spec_errors(parse, text)


@FUZZ
@given(st.text(ALPHABET, max_size=60))
def test_random_dsl_chars(text: str) -> None:
    for fn in (parse, parse_mesh, parse_shard_order):
        _only_spec_errors(fn, text)


@FUZZ
@given(mutated(SEEDS[parse]))
def test_mutated_types(text: str) -> None:
    t = _only_spec_errors(parse, text)
    if t is not None:  # whatever parses must print to something that parses back to it
        assert parse(str(t)) == t


@FUZZ
@given(mutated(SEEDS[parse_mesh]))
def test_mutated_meshes(text: str) -> None:
    m = _only_spec_errors(parse_mesh, text)
    if m is not None:
        assert parse_mesh(str(m)) == m
        assert all(s >= 1 for s in m.sizes)


@FUZZ
@given(mutated(SEEDS[parse_shard_order]))
def test_mutated_shard_orders(text: str) -> None:
    order = _only_spec_errors(parse_shard_order, text)
    if order is not None:
        assert all(isinstance(k, int) for k in order)


def test_deep_nesting_is_a_spec_error() -> None:
    for fn in (parse, parse_mesh, parse_shard_order):
        for text in ("(" * 5000, "{" * 5000, "f32[" + "8," * 5000):
            _only_spec_errors(fn, text)


# ---- round trip over generated types ------------------------------------------------------

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,4}", fullmatch=True)
KINDS = [AxisType("R"), AxisType("I"), AxisType("V"), AxisType("P", "sum")]


@st.composite
def tensor_types(draw: st.DrawFn) -> TensorType:
    """Random valid types: each axis used once, on a dim or in one annotation group."""
    axes = draw(st.lists(NAMES, unique=True, max_size=6))
    ndim = draw(st.integers(0, 4))
    dims: list[list[str]] = [[] for _ in range(ndim)]
    axis_types: list[tuple[str, AxisType]] = []
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    # at most one non-sum op per type; complex numbers have no order, so no max or min
    pop = draw(st.sampled_from(["avg"] if dtype.startswith("complex") else ["avg", "max", "min"]))
    for a in axes:
        where = draw(st.integers(-1, ndim - 1))
        if where >= 0:
            dims[where].append(a)
        elif draw(st.booleans()):
            kind = draw(st.sampled_from([*KINDS, AxisType("P", pop)]))
            if kind.kind == "P" and any(t.kind == "P" and t.op != kind.op for _, t in axis_types):
                kind = AxisType("R")
            axis_types.append((a, kind))
    sizes = draw(st.lists(st.integers(0, 10**4), min_size=ndim, max_size=ndim))  # bytes stay in int64
    return TensorType(dtype, tuple(Dim(s, tuple(d)) for s, d in zip(sizes, dims, strict=True)), tuple(axis_types))


@settings(max_examples=400, deadline=1000)
@given(tensor_types(), st.booleans())
def test_round_trip(t: TensorType, short: bool) -> None:
    text = format_type(t, short_dtype=short)
    back = parse(text)
    assert back == t
    assert str(back) == str(parse(str(t)))  # the canonical print is a fixed point
    assert back.shape == t.shape and back.dtype == t.dtype
