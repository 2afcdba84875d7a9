"""The type DSL: every form jax.typeof prints, canonical printing, and caret errors."""

from __future__ import annotations

import pytest

from spec_lang import AxisType, Dim, SpecError, TensorType, format_type, parse, parse_mesh, parse_shard_order

P_SUM = AxisType("P", "sum")


@pytest.mark.parametrize(
    ("text", "dtype", "dims", "ann"),
    [
        ("float32[8@dp,16]", "float32", [(8, ("dp",)), (16, ())], {}),
        ("f32[8@dp,16]", "float32", [(8, ("dp",)), (16, ())], {}),
        ("bfloat16[4]", "bfloat16", [(4, ())], {}),
        ("bf16[4]", "bfloat16", [(4, ())], {}),
        ("int8[2,3]", "int8", [(2, ()), (3, ())], {}),
        ("i64[]", "int64", [], {}),
        ("f32[8@(dp,tp),16]", "float32", [(8, ("dp", "tp")), (16, ())], {}),
        ("f32[8,16@(tp,dp)]", "float32", [(8, ()), (16, ("tp", "dp"))], {}),
        ("f32[8@dp,tp]", "float32", [(8, ("dp", "tp"))], {}),  # seed short form: one dim
        ("f32[8@dp,tp,4]", "float32", [(8, ("dp", "tp")), (4, ())], {}),
        ("float32[8@dp,16]{U:tp}", "float32", [(8, ("dp",)), (16, ())], {"tp": P_SUM}),
        ("f32[8]{R:tp}", "float32", [(8, ())], {"tp": AxisType("R")}),
        ("f32[8]{U:cp, R:tp}", "float32", [(8, ())], {"cp": P_SUM, "tp": AxisType("R")}),
        ("f32[8]{U:(cp,tp)}", "float32", [(8, ())], {"cp": P_SUM, "tp": P_SUM}),
        ("f32[8]{V:(dp,tp)}", "float32", [(8, ())], {"dp": AxisType("V"), "tp": AxisType("V")}),
        ("f32[8]{I:tp}", "float32", [(8, ())], {}),  # an explicit I is the unannotated type
        ("f32[8]{P(avg):tp}", "float32", [(8, ())], {"tp": AxisType("P", "avg")}),
        ("f32[8]{P(max):(dp,tp)}", "float32", [(8, ())], {"dp": AxisType("P", "max"), "tp": AxisType("P", "max")}),
        ("f32[8]{P( min ):tp}", "float32", [(8, ())], {"tp": AxisType("P", "min")}),
        ("f32[8]{P(sum):tp}", "float32", [(8, ())], {"tp": P_SUM}),
        (" f32 [ 8 @ ( dp , tp ) , 16 ] { U : cp } ", "float32", [(8, ("dp", "tp")), (16, ())], {"cp": P_SUM}),
    ],
)
def test_accepts_jax_forms(text: str, dtype: str, dims: list, ann: dict) -> None:
    t = parse(text)
    assert t.dtype == dtype
    assert t.dims == tuple(Dim(s, a) for s, a in dims)
    assert dict(t.axis_types) == ann
    assert parse(str(t)) == t
    assert parse(format_type(t, short_dtype=True)) == t


@pytest.mark.parametrize(
    ("text", "printed"),
    [
        ("f32[8@dp,16]{U:tp}", "float32[8@dp,16]{U:tp}"),  # exactly what JAX prints
        ("f32[8@dp,tp]", "float32[8@(dp,tp)]"),
        ("f32[8]{R:tp, U:cp}", "float32[8]{U:cp, R:tp}"),  # unreduced before reduced, as JAX
        ("f32[8]{P:tp}", "float32[8]{U:tp}"),
    ],
)
def test_canonical_print(text: str, printed: str) -> None:
    assert str(parse(text)) == printed


def test_equality_ignores_annotation_order() -> None:
    assert parse("f32[8]{U:cp, R:tp}") == parse("f32[8]{R:tp, U:cp}")
    assert parse("f32[8]{U:(cp,tp)}") == parse("f32[8]{U:(tp,cp)}")
    assert parse("f32[8@(dp,tp)]") != parse("f32[8@(tp,dp)]")  # shard order matters
    assert parse("f32[8]") != parse("f32[8]{R:tp}")


def test_type_passes_through() -> None:
    t = TensorType("float32", (Dim(4, ("x",)),))
    assert parse(t) is t


# ---- errors: a SpecError with a caret (.pos) at the problem and a hint --------------------


@pytest.mark.parametrize(
    ("text", "pos", "words"),
    [
        ("f32[8@(dp,tp)", 13, "ends too early"),
        ("f32[8,,16]", 6, "unexpected"),
        ("f32[8]{X:tp}", 7, "unexpected 'X'"),
        ("f32[8@]", 6, "unexpected"),
        ("f32(8)", 3, "unexpected"),
        ("q32[8]", 0, "unknown dtype"),
        ("F32[8]", 0, "unknown dtype 'F32'"),  # not the generic "expected a dtype" (issue 34)
        ("Float32[8@dp]", 0, "unknown dtype 'Float32'"),
        # a check of an uneven split puts its caret on the split, not on '[' (issue 34)
        ("f32[10@dp<ragged 1,2,1>]", 9, "does not divide by the 4 units"),
        ("f32[4,10@dp<ragged 1,2, 1>]", 11, "must be on dim 0"),
        ("f32[10@dp<3,7>,4@tp<1,3>]", 19, "both split unevenly"),
        ("f32[8@dp,dp]", 9, "used twice"),
        ("f32[8@dp]{U:dp}", 12, "used twice"),
        ("f32[8@(tp,dp)]{R:(cp,tp)}", 21, "used twice"),
        ("f32[8]{P(foo):tp}", 7, "unknown reduce op"),
        ("f32[8]{U:a, P(max):b}", 19, "mixed reduce ops"),
        ("f32[8#]", 5, "unexpected character '#'"),
        ("", 0, "ends too early"),
    ],
)
def test_type_errors(text: str, pos: int, words: str) -> None:
    with pytest.raises(SpecError) as info:
        parse(text)
    e = info.value
    assert words in e.message
    assert e.pos == pos
    assert e.hint
    lines = str(e).splitlines()
    assert lines[1] == f"    {text}"
    assert lines[2] == "    " + " " * pos + "^"  # the caret sits under the problem


@pytest.mark.parametrize(("text", "hint"), [("F32[8]", "dtypes are lower case: write 'f32'"),
                                            ("Float32[8]", "dtypes are lower case: write 'float32'"),
                                            ("FP32[8]", "f32, bf16")])
def test_capitalised_dtype_hint(text: str, hint: str) -> None:
    with pytest.raises(SpecError, match="unknown dtype") as info:
        parse(text)
    assert hint in info.value.hint


def test_unknown_axis_against_mesh() -> None:
    from lowering.checks import resolve

    with pytest.raises(SpecError) as info:
        resolve("f32[8@dp,16@zz]", "dp=2,tp=4")
    assert "'zz' is not on the mesh" in info.value.message
    assert info.value.pos == "f32[8@dp,16@zz]".index("zz")
    assert "dp, tp" in info.value.hint


@pytest.mark.parametrize(
    ("text", "pos", "words"),
    [
        ("dp=2,dp=4", 5, "repeated"),
        ("dp=0", 3, "size 0"),
        ("dp", 2, "ends too early"),
        ("dp=2,", 5, "ends too early"),
        ("dp=x", 3, "unexpected"),
        ("dp:2", 2, "unexpected ':'"),
        ("dp=2;tp=4", 4, "unexpected character ';'"),
    ],
)
def test_mesh_errors(text: str, pos: int, words: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_mesh(text)
    assert words in info.value.message
    assert info.value.pos == pos
    assert info.value.hint


def test_mesh_ok() -> None:
    m = parse_mesh("dp=2, tp=4")
    assert m.names == ("dp", "tp") and m.sizes == (2, 4) and m.size == 8
    assert str(m) == "dp=2,tp=4"
    assert m.coords(5) == (1, 1) and m.rank_of((1, 1)) == 5


def test_shard_order_forms() -> None:
    assert parse_shard_order("{0: [1], 1: ['dp', 'tp']}") == {0: (1,), 1: ("dp", "tp")}
    assert parse_shard_order('{1: ["dp", 2,], }') == {1: ("dp", 2)}
    assert parse_shard_order("{0: [tp, dp]}") == {0: ("tp", "dp")}
    assert parse_shard_order("{}") == {}


@pytest.mark.parametrize(
    ("text", "pos", "words"),
    [
        ("{0: [1], 0: [2]}", 9, "appears twice"),
        ("{0: [1]", 7, "ends too early"),
        ("{a: [1]}", 1, "unexpected 'a'"),
        ("{0: 1}", 4, "unexpected '1'"),
        ("[0]", 0, "unexpected"),
    ],
)
def test_shard_order_errors(text: str, pos: int, words: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_shard_order(text)
    assert words in info.value.message
    assert info.value.pos == pos
    assert info.value.hint


@pytest.mark.parametrize("bad", [None, 3, b"f32[8]"])
def test_non_string_inputs(bad: object) -> None:
    for fn in (parse, parse_mesh, parse_shard_order):
        with pytest.raises(SpecError):
            fn(bad)  # type: ignore[arg-type]


# ---- the built parser, kept in the user's cache directory -----------------------------------


def test_the_built_parser_is_cached_and_a_bad_cache_is_rebuilt(tmp_path, monkeypatch) -> None:
    from spec_lang import parser

    def tree(text: str) -> object:
        return parser._lark().parse(text, start="type_start")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    parser._lark.cache_clear()
    try:
        built = tree("f32[10@dp<ragged 1,2,1>]")
        (cached,) = (tmp_path / "shardc").glob("grammar-*.lark")
        assert not list((tmp_path / "shardc").glob("*.part"))  # written whole, then renamed
        parser._lark.cache_clear()
        loaded = tree("f32[10@dp<ragged 1,2,1>]")
        assert loaded == built
        # the positions that carets come from survive the cache
        assert loaded.children[0].children[1].children[1].children[0].children[1].meta.start_pos == 9
        cached.write_bytes(b"not a parser")  # a bad file: built again, and replaced
        parser._lark.cache_clear()
        assert tree("f32[8@dp]") == parser._lark.__wrapped__().parse("f32[8@dp]", start="type_start")
        assert cached.read_bytes() != b"not a parser"
        (tmp_path / "file").write_text("")  # a cache directory that cannot be made: built every time
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
        parser._lark.cache_clear()
        assert tree("f32[8@dp]") == parser._lark.__wrapped__().parse("f32[8@dp]", start="type_start")
    finally:
        parser._lark.cache_clear()
