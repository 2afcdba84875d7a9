"""The IR validates itself: objects built directly (not parsed) with random fields.

Only SpecError may escape a constructor, and every object it accepts is canonical:
it prints, parses back to an equal object, and prints the same again. Then one test
per refusal, asserting its message.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from lowering import compile
from lowering.layout import local_shape
from spec_lang import SpecError, format_type, parse, parse_mesh, parse_shard_order
from spec_lang.ir import DTYPES, MAX_MESH_AXES, MAX_WORLD, AxisType, Dim, Mesh, TensorType
from spec_lang.split import Split

AXES = ["dp", "tp", "cp", "a", "b", "_x1"]
BAD_AXES = ["", "1x", "a-b", "dp ", 3, None, ["dp"]]
LONG = sorted(DTYPES)
SHORT = sorted(s for s, _ in DTYPES.values())
BAD_DTYPES = ["", "f33", "float8", "F32", "float32 ", "int", 32, None, [], {"f32": 1}]

# mostly valid fields, so that both accepted and refused objects are common
sizes = st.one_of(
    st.integers(0, 64),
    st.integers(0, 10**4),
    st.sampled_from([-1, -3, True, False, 2.0, np.int64(4), np.int32(0), 2**62, 2**63, 2**70]),
)
axis_names = st.sampled_from(AXES * 6 + BAD_AXES)
axis_lists = st.one_of(
    st.lists(axis_names, max_size=3).map(tuple),
    st.lists(axis_names, max_size=2),
    st.sampled_from(AXES),  # a bare string is refused, not split into letters
)
kinds = st.sampled_from(["R", "I", "V", "P", "U"] * 3 + ["X", "", "p", None, ["R"]])
ops = st.sampled_from(["sum"] * 8 + ["avg", "max", "min", "prod", "", None, ["sum"]])


def _try(fn, *args):
    """``fn(*args)``, or None if it raised SpecError (anything else propagates and fails)."""
    try:
        return fn(*args)
    except SpecError as e:
        assert str(e) and e.message
        return None


@st.composite
def raw_splits(draw: st.DrawFn, size: object) -> tuple | None:
    """Mostly no split; else a Split's fields, often summing to ``size``, sometimes bad."""
    if type(size) is not int or draw(st.integers(0, 1)):
        return None
    k = draw(st.integers(0, 3))
    kind = draw(st.sampled_from(["sizes", "ragged", "parts"] * 3 + ["bogus"]))
    good = {"sizes": (size - k, k), "ragged": (1, k % 2), "parts": ((size - k, 0), (k, 0)), "bogus": (1,)}[kind]
    values = draw(st.sampled_from([good] * 8 + [(-1, 2), "12", ((1,), (2, 3)), (), (True, 1)]))
    span = draw(st.sampled_from([1] * 8 + [2, 0, -1]))
    return kind, values, span, draw(st.sampled_from([kind == "parts" and k % 2 == 0] * 6 + [True, 1]))


@st.composite
def raw_types(draw: st.DrawFn) -> tuple:
    dtype = draw(st.sampled_from(LONG + SHORT + BAD_DTYPES))
    dims = []
    for _ in range(draw(st.integers(0, 4))):
        size = draw(sizes)
        dims.append((size, draw(axis_lists), draw(raw_splits(size))))
    ann = [(draw(axis_names), draw(kinds), draw(ops)) for _ in range(draw(st.integers(0, 3)))]
    return dtype, dims, ann, draw(st.booleans())


def _build(dtype: object, dims: list, ann: list, as_list: bool) -> TensorType | None:
    built_dims = []
    for size, axes, raw_split in dims:
        split = None if raw_split is None else _try(Split, *raw_split)
        if raw_split is not None and split is None:
            return None
        d = _try(Dim, size, axes, split)
        if d is None:
            return None
        built_dims.append(d)
    pairs = []
    for name, kind, op in ann:
        at = _try(AxisType, kind) if op == "sum" else _try(AxisType, kind, op)
        if at is None:
            return None
        pairs.append((name, at))
    if as_list:
        return _try(TensorType, dtype, built_dims, pairs)
    return _try(TensorType, dtype, tuple(built_dims), tuple(pairs))


def _assert_canonical(t: TensorType) -> None:
    text = str(t)
    back = parse(text)
    assert back == t and hash(back) == hash(t)
    assert str(back) == text
    assert parse(format_type(t, short_dtype=True)) == t
    # canonical fields: long dtype, plain ints, tuples, no explicit I, each axis once
    assert t.dtype in DTYPES
    assert isinstance(t.dims, tuple) and all(type(d.size) is int and d.size >= 0 for d in t.dims)
    assert all(isinstance(d.axes, tuple) for d in t.dims)
    assert isinstance(t.axis_types, tuple) and all(at.kind != "I" for _, at in t.axis_types)
    used = list(t.sharded_axes) + [a for a, _ in t.axis_types]
    assert len(used) == len(set(used))
    assert len({at.op for _, at in t.axis_types if at.kind == "P"}) <= 1
    assert not (t.dtype.startswith("complex") and any(at.op in ("max", "min") for _, at in t.axis_types))
    assert t.numel * t.itemsize < 2**63
    # equality ignores annotation order
    assert TensorType(t.dtype, t.dims, tuple(reversed(t.axis_types))) == t


@settings(max_examples=600, deadline=None)
@given(raw_types())
def test_only_spec_error_escapes_and_accepted_types_round_trip(raw: tuple) -> None:
    t = _build(*raw)
    event("refused" if t is None else "accepted, uneven" if any(d.split for d in t.dims) else "accepted")
    if t is not None:
        _assert_canonical(t)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(AXES * 4 + BAD_AXES),
                       st.sampled_from([*range(1, 9)] * 4 + [0, -2, True, 2**62, 2**64])), max_size=4),
    st.booleans(),
)
def test_mesh_only_spec_error_escapes_and_accepted_meshes_round_trip(axes: list, ragged: bool) -> None:
    names = tuple(a for a, _ in axes)
    sizes = tuple(n for _, n in axes)[: len(axes) - 1 if ragged and len(axes) > 1 else len(axes)]
    m = _try(Mesh, names, sizes)
    event("accepted" if m is not None else "refused")
    if m is not None:
        assert parse_mesh(str(m)) == m and str(parse_mesh(str(m))) == str(m)
        assert all(type(s) is int and s >= 1 for s in m.sizes) and m.size <= MAX_WORLD


# ---- canonical forms -------------------------------------------------------------------


def test_explicit_invariant_is_the_unannotated_type() -> None:
    plain = parse("f32[8@dp,4]")
    for t in (parse("f32[8@dp,4]{I:tp}"), parse("f32[8@dp,4]{I:(tp,cp)}"),
              TensorType("float32", (Dim(8, ("dp",)), Dim(4)), (("tp", AxisType("I")),))):
        assert t == plain and hash(t) == hash(plain) and str(t) == "float32[8@dp,4]"
        assert t.axis_type("tp") == AxisType("I")
    prog = compile("f32[8@dp]{I:tp}", "f32[8@dp]", "dp=2,tp=2")
    assert prog.steps == ()  # no empty reinterpret step
    assert parse("f32[8]{U:dp, I:tp}") == parse("f32[8]{U:dp}")


def test_constructors_canonicalise_equivalent_spellings() -> None:
    t = TensorType("f32", [Dim(np.int64(8), ["dp"])], [("tp", AxisType("U"))])
    assert t == parse("float32[8@dp]{U:tp}") and t.dtype == "float32"
    assert type(t.dims[0].size) is int and t.dims[0].axes == ("dp",)
    assert AxisType("U") == AxisType("P", "sum") and AxisType("U").code == "U"
    assert Mesh(["dp", "tp"], [np.int64(2), 4]) == parse_mesh("dp=2,tp=4")
    # annotation order does not matter, and the print groups them
    a = TensorType("f32", (Dim(8),), (("tp", AxisType("R")), ("dp", AxisType("P"))))
    b = TensorType("f32", (Dim(8),), (("dp", AxisType("P")), ("tp", AxisType("R"))))
    assert a == b and hash(a) == hash(b) and str(a) == str(b) == "float32[8]{U:dp, R:tp}"


# ---- refusals --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: TensorType("f33", (Dim(8),)), "unknown dtype 'f33'"),
        (lambda: TensorType(None, (Dim(8),)), "unknown dtype None"),
        (lambda: TensorType("f32", (8,)), "dims must be Dim objects"),
        (lambda: TensorType("f32", "8"), "dims must be a tuple"),
        (lambda: TensorType("f32", (Dim(8),), (("tp", "U"),)), "must be an AxisType"),
        (lambda: TensorType("f32", (Dim(8),), ("tp",)), "(mesh axis, AxisType) pairs"),
        (lambda: Dim(True), "must be an int, got bool"),
        (lambda: Dim(-1), "dim size -1 is negative"),
        (lambda: Dim(2.0), "must be an int, got float"),
        (lambda: Dim(2**63), "does not fit in int64"),
        (lambda: Dim(8, "dp"), "got the string 'dp'"),
        (lambda: Dim(8, ("dp", "1x")), "'1x' is not an identifier"),
        (lambda: Dim(8, (3,)), "must be a str"),
        (lambda: AxisType("X"), "unknown local type 'X'"),
        (lambda: AxisType("P", "prod"), "unknown reduce op 'prod'"),
        (lambda: AxisType("R", "max"), "local type R has no reduce op"),
        (lambda: TensorType("c64", (Dim(8),), (("dp", AxisType("P", "max")),)), "complex numbers have no order"),
        (lambda: Mesh(("dp",), (0,)), "mesh axis 'dp' has size 0"),
        (lambda: Mesh(("dp",), (True,)), "must be an int, got bool"),
        (lambda: Mesh(("dp", "dp"), (2, 2)), "mesh axis 'dp' is repeated"),
        (lambda: Mesh(("d p",), (2,)), "not an identifier"),
        (lambda: Mesh(("dp",), (2, 2)), "differ in length"),
        (lambda: Mesh((), ()), "at least one axis"),
        (lambda: Mesh(tuple(f"a{i}" for i in range(64)), (1,) * 64), f"at most {MAX_MESH_AXES}"),
        (lambda: Mesh(("a", "b"), (2**32, 2**32)), "more than the 1,048,576 (2**20) a mesh may have"),
        (lambda: Mesh(("a", "b"), (1024, 1025)), "mesh axis 'b' takes it past"),
        (lambda: Mesh(("a",), (10**18,)), "rank count (1000000000000000000) is more than"),
        (lambda: AxisType(np.array(["R", "P"])), "the local type must be a str, got ndarray"),
        (lambda: AxisType("P", np.array(["sum"])), "the reduce op must be a str, got ndarray"),
        (lambda: Dim(10**5000), "a number of 5,001 digits does not fit in int64"),
        (lambda: Dim(8, ("dp",), Split("sizes", (3, 5)), 10**5000), "got a number of 5,001 digits"),
    ],
)
def test_constructor_refusals(build, needle: str) -> None:
    with pytest.raises(SpecError) as info:
        build()
    assert needle in info.value.message
    assert info.value.hint or "differ in length" in needle or "must be a tuple" in needle


@pytest.mark.parametrize(
    ("dims", "ann", "why"),
    [
        ([(8, ("dp", "dp"))], (), "listed twice on one dim"),
        ([(8, ("dp",)), (4, ("dp",))], (), "shards dim 0 and dim 1"),
        ([(8, ("dp",))], (("dp", "R"),), "shards dim 0 and is R"),
        ([(8, ())], (("dp", "P"), ("dp", "R")), "is U and is R"),
        ([(8, ())], (("dp", "I"), ("dp", "I")), "is I and is I"),
    ],
)
def test_a_repeated_mesh_axis_is_refused_not_a_numpy_error(dims: list, ann: tuple, why: str) -> None:
    with pytest.raises(SpecError, match="used twice in one type") as info:
        TensorType("f32", tuple(Dim(n, ax) for n, ax in dims), tuple((a, AxisType(k)) for a, k in ann))
    assert why in info.value.message and info.value.subject == "dp"


def test_mixed_reduce_ops_are_refused() -> None:
    with pytest.raises(SpecError, match=r"mixed reduce ops \['max', 'sum'\]") as info:
        TensorType("f32", (Dim(8),), (("dp", AxisType("P")), ("tp", AxisType("P", "max"))))
    assert "reduce one op first" in info.value.hint
    with pytest.raises(SpecError, match="mixed reduce ops") as info:
        parse("f32[8]{U:dp, P(max):tp}")
    assert info.value.pos == len("f32[8]{U:dp, P(max):")  # the caret is at the axis of the second op
    with pytest.raises(SpecError, match="mixed reduce ops"):
        compile("f32[8]{U:dp, P(max):tp}", "f32[8]", "dp=2,tp=2")


@pytest.mark.parametrize("big", [2**31, 2**32])
def test_byte_counts_past_int64_are_refused(big: int) -> None:
    for text in (f"f32[{big}@dp,2147483648]", f"f32[2147483648,{big}@dp]"):
        with pytest.raises(SpecError, match="does not fit in int64") as info:
            parse(text)
        assert str(4 * big * 2**31) in info.value.message and "2**63" in info.value.message
    # the largest type that fits is accepted: 2**61 f32 elements are 2**63 - ... bytes
    assert parse("i8[9223372036854775807]").numel == 2**63 - 1
    with pytest.raises(SpecError, match="does not fit in int64"):
        parse("i16[4611686018427387904]")


def test_byte_counts_of_thousands_of_digits_are_refused_with_a_caret_on_the_dim() -> None:
    """250 dims of 18 nines: the byte count has 4,501 digits, past Python's 4,300-digit
    int-string limit, so the message gives its length; the caret is on the dim whose size
    takes the running count past 2**63 (4 * big**2 >= 2**63: the second)."""
    big = "999999999999999999"
    text = "f32[" + ",".join([big] * 250) + "]"
    with pytest.raises(SpecError, match=r"byte count \(a number of 4,501 digits\) does not fit in int64") as info:
        parse(text)
    assert info.value.pos == len("f32[" + big + ",")
    with pytest.raises(SpecError, match="a number of 4,501 digits"):  # built in code: the same rule
        TensorType("f32", tuple(Dim(int(big)) for _ in range(250)))
    # the running count in bytes (f32: 4 per element) passes 2**63 at the third dim
    with pytest.raises(SpecError, match=r"byte count \(36893488147419103232\)") as info:
        parse("f32[2,4,1152921504606846976,1]")
    assert info.value.pos == len("f32[2,4,")
    assert parse("i8[3037000500,3037000500,0]").numel == 0  # a zero dim: no bytes at all


def test_the_parser_marks_ir_errors_with_a_caret() -> None:
    cases = [
        ("f32[8@dp,4@dp]", "f32[8@dp,4@".__len__()),
        ("f32[8@(dp,dp)]", "f32[8@(dp,".__len__()),
        ("f32[8@dp]{R:dp}", "f32[8@dp]{R:".__len__()),
        ("q32[8]", 0),
        ("f32[8]{P(prod):dp}", "f32[8]{".__len__()),
        ("f32[8@f32,4@f32]", "f32[8@f32,4@".__len__()),  # an axis named like the dtype
        ("dp[8@dp]", 0),
    ]
    for text, pos in cases:
        with pytest.raises(SpecError) as info:
            parse(text)
        assert info.value.text == text and info.value.pos == pos, (text, info.value)
    with pytest.raises(SpecError, match="is repeated") as info:
        parse_mesh("dp=2,tp=2,dp=4")
    assert info.value.pos == len("dp=2,tp=2,")
    with pytest.raises(SpecError, match="has size 0") as info:
        parse_mesh("dp=2,tp=0")
    assert info.value.pos == len("dp=2,tp=")


@pytest.mark.parametrize("digits", [20, 4301, 10_000])
def test_numbers_past_int64_and_the_int_string_limit_are_spec_errors(digits: int) -> None:
    n = "9" * digits
    for fn, text, pos in [
        (parse, f"f32[{n}]", 4),
        (parse_mesh, f"dp={n}", 3),
        (parse_shard_order, f"{{0: [{n}]}}", 5),
        (parse_shard_order, f"{{{n}: [0]}}", 1),
    ]:
        with pytest.raises(SpecError, match=f"{digits} digits") as info:
            fn(text)
        assert info.value.pos == pos and "too large" in info.value.message


def test_mesh_of_64_axes_is_a_spec_error() -> None:
    text = ",".join(f"a{i}=1" for i in range(64))
    with pytest.raises(SpecError, match="at most 63") as info:
        parse_mesh(text)
    assert info.value.pos == text.index("a63=")  # the first axis too many
    assert parse_mesh(",".join(f"a{i}=1" for i in range(63))).ndim == 63


def test_local_shape_refuses_a_rank_off_the_mesh() -> None:
    t, m = parse("f32[8@dp]"), parse_mesh("dp=2")
    assert local_shape(t, m, 1) == (4,)
    for rank in (2, -1, "0", True, 1.5):
        with pytest.raises(SpecError, match="is not on the mesh dp=2"):
            local_shape(t, m, rank)  # type: ignore[arg-type]


def test_dead_helpers_are_gone() -> None:
    assert not hasattr(TensorType, "is_even") and not hasattr(AxisType, "is_partial")


def test_pickled_ir_ships_no_memoised_values_and_comes_back_equal() -> None:
    import dataclasses
    import pickle

    t, m = parse("f32[8@dp,16]{U:tp}"), parse_mesh("dp=2,tp=4")
    hash(t), hash(m), t.sharded_axes, m.size  # fill the memos
    for obj in (t, m, t.dims[0]):
        state = obj.__getstate__()
        assert set(state) == {f.name for f in dataclasses.fields(obj)}, state
        back = pickle.loads(pickle.dumps(obj))
        assert back == obj and hash(back) == hash(obj)
