"""The uneven splits meet the rest: the DSL round trip, the layout against the placements'
own semantics (an independent oracle) and numpy, DTensor placements both ways, each rule's
SpecError, the CLI and the test data."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from uneven_oracle import indices, local_shape, runs

from lowering import (
    DynamicShard,
    PartitionedShard,
    RaggedShard,
    check_placements,
    from_placements,
    local_indices,
    local_shapes,
    local_slices,
    to_placements,
)
from lowering.checks import resolve
from lowering.placements import format_placements, parse_placements, placement_specs
from lowering.uneven_placements import placement_of, split_of
from spec_lang import SpecError, parse
from spec_lang.ir import AxisType, Dim, Mesh, TensorType
from spec_lang.jax_interop import jax_refusal
from spec_lang.split import Split

REPO = Path(__file__).resolve().parents[1]
SPLITS = ((4, 6, 4, 2), (2, 4, 8, 2))
NAMES = ("a", "b", "c")


# ---- random uneven types ---------------------------------------------------------------


@st.composite
def splits(draw: st.DrawFn, n: int, kind: str | None = None) -> tuple[Split, tuple[int, ...]]:
    """A split for a mesh axis of ``n`` ranks and the leading dims it needs (the prefix for
    ragged, else the one split dim)."""
    kind = kind or draw(st.sampled_from(["sizes", "ragged", "parts"]))
    if kind == "sizes":
        sizes = tuple(draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)))
        return Split("sizes", sizes), (sum(sizes),)
    if kind == "ragged":
        units = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        assume(sum(units) > 0)
        span = draw(st.integers(1, 3))
        rest = [draw(st.integers(1, 3)) for _ in range(span - 1)]
        lead = sum(units) * draw(st.integers(1, 3))
        return Split("ragged", tuple(units), span=span), (lead, *rest)
    aligned = draw(st.booleans())
    parts = n * draw(st.integers(1, 2)) if aligned else draw(st.integers(1, 4))
    rows = tuple(tuple(draw(st.lists(st.integers(0, 4), min_size=parts, max_size=parts))) for _ in range(n))
    return Split("parts", rows, aligned=aligned), (sum(map(sum, rows)),)


@st.composite
def uneven_types(draw: st.DrawFn, annotations: bool = True) -> tuple[TensorType, Mesh]:
    """A type with one uneven split, plain sharded dims on other mesh axes, and P/R/V
    annotations on the rest; the split axis sits anywhere in the mesh."""
    k = draw(st.integers(1, 3))
    mesh = Mesh(NAMES[:k], tuple(draw(st.sampled_from([1, 2, 3, 4])) for _ in range(k)))
    axis = draw(st.sampled_from(mesh.names))
    split, lead = draw(splits(mesh.axis_size(axis)))
    d = 0 if split.kind == "ragged" else draw(st.integers(0, 2))
    trailing = [draw(st.integers(1, 6)) for _ in range(draw(st.integers(0, 2)))]
    shape = [draw(st.integers(1, 6)) for _ in range(d)] + list(lead) + trailing
    axes: list[list[str]] = [[] for _ in shape]
    axes[d] = [axis]
    free = [i for i in range(len(shape)) if i != d and not (split.kind == "ragged" and i < split.span)]
    op = draw(st.sampled_from(["sum", "avg", "max", "min"]))
    types = []
    for a in draw(st.permutations([a for a in mesh.names if a != axis])):
        choice = draw(st.sampled_from(["dim", "P", "R", "V", "I"] if annotations else ["dim", "P", "I"]))
        if choice == "dim" and free:
            axes[draw(st.sampled_from(free))].append(a)
        elif choice in ("P", "R", "V"):
            types.append((a, AxisType(choice, op) if choice == "P" else AxisType(choice)))
    dims = tuple(Dim(s, tuple(ax), split if i == d else None) for i, (s, ax) in enumerate(zip(shape, axes)))
    return TensorType(draw(st.sampled_from(["f32", "bf16", "i64"])), dims, tuple(types)), mesh


@settings(max_examples=300, deadline=None)
@given(uneven_types())
def test_uneven_types_print_and_parse_back(case: tuple[TensorType, Mesh]) -> None:
    t, mesh = case
    text = str(t)
    assert parse(text) == t and str(parse(text)) == text
    assert resolve(text, mesh)[0] == t
    assert jax_refusal(t, mesh) and "uneven split" in jax_refusal(t, mesh)


# ---- the layout against the placements' own semantics ------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.data())
def test_local_indices_are_the_placements_indices_on_one_axis(n: int, data: st.DataObject) -> None:
    split, lead = data.draw(splits(n))
    d = 0 if split.kind == "ragged" else data.draw(st.integers(0, 1))
    shape = (3,) * d + lead + tuple(data.draw(st.lists(st.integers(1, 4), max_size=2)))
    dims = tuple(Dim(s, ("x",), split) if i == d else Dim(s) for i, s in enumerate(shape))
    t, mesh = TensorType("f32", dims), Mesh(("x",), (n,))
    p = placement_of(d, split)
    want = indices(p, shape, n)
    got = local_indices(t, mesh)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert list(local_shapes(t, mesh)) == [local_shape(p, shape, n, s) for s in range(n)]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.data())
def test_local_slices_cut_each_uneven_local_tensor_or_say_why(n: int, data: st.DataObject) -> None:
    """Where every rank's local tensor is one slice of the global tensor (the placements'
    runs end to end, flattened runs never), ``local_slices`` gives it; elsewhere a SpecError."""
    split, lead = data.draw(splits(n))
    d = 0 if split.kind == "ragged" else data.draw(st.integers(0, 1))
    shape = (3,) * d + lead + tuple(data.draw(st.lists(st.integers(1, 4), max_size=2)))
    dims = tuple(Dim(s, ("x",), split) if i == d else Dim(s) for i, s in enumerate(shape))
    t, mesh = TensorType("f32", dims), Mesh(("x",), (n,))
    p = placement_of(d, split)
    held = [[(a, b) for a, b in rs if b > a] for rs in runs(p, shape, n)]
    one_slice = split.kind != "ragged" or split.span == 1
    one_slice = one_slice and all(x[1] == y[0] for rs in held for x, y in zip(rs, rs[1:]))
    if not one_slice:
        with pytest.raises(SpecError, match="not one slice|not a slice") as info:
            local_slices(t, mesh)
        assert "local_indices" in (info.value.hint or "")
        return
    full = np.arange(math.prod(shape)).reshape(shape)
    for s, (sl, want) in enumerate(zip(local_slices(t, mesh), indices(p, shape, n), strict=True)):
        assert full[sl].shape == local_shape(p, shape, n, s)
        assert full[sl].reshape(-1).tolist() == want.tolist(), s


def test_local_slices_of_the_partitioned_worked_example() -> None:
    aligned = "f32[32@ep<aligned 4,6,4,2|2,4,8,2>]"  # shard 0 [P00 P10 P01 P11] = rows 0:16, end to end
    assert local_slices(aligned, "ep=2") == [(slice(0, 16),), (slice(16, 32),)]
    with pytest.raises(SpecError, match="rank 0 holds 4 runs of dim 0 that do not follow each other"):
        local_slices("f32[32@ep<parts 4,6,4,2|2,4,8,2>]", "ep=2")  # shard 0 [P00 P01 P02 P03]
    with pytest.raises(SpecError, match="1-D, a flattened run"):
        local_slices("f32[4@dp<ragged 1,2,1 over 2>,6]", "dp=3")


def _chunk(size: int, parts: int, c: int) -> slice:
    """torch.chunk's piece ``c`` of ``parts`` (the even rule, written out independently)."""
    step = -(-size // parts) if size else 0
    return slice(min(c * step, size), min((c + 1) * step, size))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.booleans(), st.data())
def test_an_uneven_axis_composed_with_a_shard_is_the_product(n: int, m: int, split_first: bool,
                                                            data: st.DataObject) -> None:
    """Axis ``x`` splits one dim unevenly, axis ``y`` shards another with the chunk rule:
    a rank's local tensor is the placement's local tensor, then y's chunk of the other dim."""
    split, lead = data.draw(splits(n))
    d = 0 if split.kind == "ragged" else data.draw(st.integers(0, 1))
    shape = (data.draw(st.integers(1, 4)),) * d + lead + tuple(data.draw(st.lists(st.integers(1, 5), min_size=1,
                                                                                    max_size=2)))
    covered = range(split.span) if split.kind == "ragged" else [d]
    e = data.draw(st.sampled_from([i for i in range(len(shape)) if i not in covered]))
    dims = tuple(Dim(s, ("x",), split) if i == d else Dim(s, ("y",) if i == e else ()) for i, s in enumerate(shape))
    mesh = Mesh(("x", "y"), (n, m)) if split_first else Mesh(("y", "x"), (m, n))
    t = TensorType("f32", dims)
    p = placement_of(d, split)
    full = np.arange(math.prod(shape)).reshape(shape)
    got = local_indices(t, mesh)
    for r in range(mesh.size):
        cx, cy = mesh.coords(r)[mesh.index("x")], mesh.coords(r)[mesh.index("y")]
        local = full.reshape(-1)[indices(p, shape, n)[cx]]
        if isinstance(p, RaggedShard):  # positions of the flattened prefix, each with the trailing dims
            k = len(p.dims)
            local = local.reshape(-1, *shape[k:])
            sl = [slice(None)] * local.ndim
            sl[e - k + 1] = _chunk(shape[e], m, cy)
            want = local[tuple(sl)]
            if k > 1:
                want = want.reshape(-1)
        else:
            local = local.reshape(local_shape(p, shape, n, cx))
            sl = [slice(None)] * local.ndim
            sl[e] = _chunk(shape[e], m, cy)
            want = local[tuple(sl)]
        assert got[r].tolist() == want.reshape(-1).tolist(), r
        assert local_shapes(t, mesh)[r] == want.shape


def _rows(t: str, mesh: str) -> list[list[int]]:
    """Each rank's rows of dim 0, in local order (for 1-d types: its elements)."""
    return [idx.tolist() for idx in local_indices(t, mesh)]


def test_the_partitioned_worked_example_in_the_dsl() -> None:
    r = lambda a, b: list(range(a, b))  # noqa: E731
    # global order P00 P10 P01 P11 P02 P12 P03 P13 = [0:4] [4:6] [6:12] [12:16] [16:20] [20:28] [28:30] [30:32]
    un = _rows("f32[32@ep<parts 4,6,4,2|2,4,8,2>]", "ep=2")
    assert un[0] == r(0, 4) + r(6, 12) + r(16, 20) + r(28, 30)  # [P00, P01, P02, P03]
    assert un[1] == r(4, 6) + r(12, 16) + r(20, 28) + r(30, 32)  # [P10, P11, P12, P13]
    al = _rows("f32[32@ep<aligned 4,6,4,2|2,4,8,2>]", "ep=2")
    assert al[0] == r(0, 4) + r(4, 6) + r(6, 12) + r(12, 16)  # [P00:4, P10:2, P01:6, P11:4]
    assert al[1] == r(16, 20) + r(20, 28) + r(28, 30) + r(30, 32)  # [P02:4, P12:8, P03:2, P13:2]
    for aligned, got in ((False, un), (True, al)):
        p = PartitionedShard(0, 4, SPLITS, aligned)
        assert got == [i.tolist() for i in indices(p, (32,), 2)]
        assert [len(g) for g in got] == [sum(p.local_splits(s)) for s in range(2)]


def test_the_doc_examples_of_each_form() -> None:
    assert _rows("f32[10@dp<3,0,7>]", "dp=3") == [[0, 1, 2], [], list(range(3, 10))]
    assert _rows("f32[8@dp<ragged 1,2,1>]", "dp=3") == [[0, 1], [2, 3, 4, 5], [6, 7]]
    # over 2: 6 prefix positions (2x3) of 4 elements, 2 positions per rank
    idx = _rows("f32[2@dp<ragged 1,1,1 over 2>,3,4]", "dp=3")
    assert idx == [list(range(0, 8)), list(range(8, 16)), list(range(16, 24))]


# ---- DTensor placements both ways --------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(uneven_types(annotations=False))
def test_placements_round_trip(case: tuple[TensorType, Mesh]) -> None:
    pytest.importorskip("torch")
    t, mesh = case
    placements, order = to_placements(t, mesh)
    assert from_placements(placements, mesh, t.shape, t.dtype, order) == t
    assert to_placements(from_placements(placements, mesh, t.shape, t.dtype, order), mesh) == (placements, order)
    # the torch-free text form reads back to the same type
    specs, order = placement_specs(t, mesh)
    text = format_placements(specs)
    assert parse_placements(text) == specs
    assert from_placements(text, mesh, t.shape, t.dtype, order) == t


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.data())
def test_split_and_placement_convert_both_ways(n: int, data: st.DataObject) -> None:
    split, _ = data.draw(splits(n))
    d = 0 if split.kind == "ragged" else data.draw(st.integers(0, 3))
    p = placement_of(d, split)
    assert split_of(p) == (d, split)
    assert placement_of(*split_of(p)) == p


def test_placements_from_objects_and_back() -> None:
    torch = pytest.importorskip("torch")
    from torch.distributed.tensor import Partial, Replicate, Shard

    cases = [
        ([DynamicShard(0, (3, 0, 7)), Shard(1)], "dp=3,tp=2", (10, 4), "float32[10@dp<3,0,7>,4@tp]"),
        ([RaggedShard((0, 1), (1, 2, 1)), Replicate()], "dp=3,tp=2", (4, 6, 8), "float32[4@dp<ragged 1,2,1 over 2>,6,8]"),
        ([Shard(1), RaggedShard((0,), (1, 3))], "tp=2,dp=2", (8, 6), "float32[8@dp<ragged 1,3>,6@tp]"),
        ([PartitionedShard(0, 4, SPLITS), Partial("avg")], "ep=2,tp=2", (32,), "float32[32@ep<parts 4,6,4,2|2,4,8,2>]{P(avg):tp}"),
        ([PartitionedShard(1, 4, SPLITS, aligned=True)], "ep=2", (3, 32), "float32[3,32@ep<aligned 4,6,4,2|2,4,8,2>]"),
    ]
    for placements, mesh, shape, want in cases:
        t = from_placements(placements, mesh, shape, torch.float32)
        assert str(t) == want
        assert to_placements(t, mesh) == (placements, {})
        assert to_placements(t, mesh, strided=True) == (placements, {})


# ---- every rule, its SpecError -----------------------------------------------------------


def _doc_rows() -> list[tuple[str, str, str, str]]:
    text = (REPO / "docs" / "dsl.md").read_text()
    start = text.index("| rule | type | mesh | error |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        rows.append(tuple(re.fullmatch(r"`(.*)`", c)[1] if c.startswith("`") else c for c in cells))
    return rows


DOC_ROWS = _doc_rows()


def test_the_doc_rules_table_is_read() -> None:
    assert len(DOC_ROWS) >= 11


@pytest.mark.parametrize("rule,text,mesh,error", DOC_ROWS, ids=[r[0] for r in DOC_ROWS])
def test_every_doc_rule_gives_its_error(rule: str, text: str, mesh: str, error: str) -> None:
    with pytest.raises(SpecError) as info:
        resolve(text, mesh)
    e = info.value
    assert error in e.message, rule
    assert e.hint and e.text == text and e.pos is not None and 0 <= e.pos < len(text)


BAD_PLACEMENTS = [
    # (placements, mesh, shape, message, the placement the caret is under)
    ("DynamicShard(0,[3,0,7]),S(0)", "dp=3,tp=2", (10, 4), "also shards tensor dim 0", "S(0)"),
    ("S(0),DynamicShard(0,[3,0,7])", "tp=2,dp=3", (10, 4), "also shards tensor dim 0", "DynamicShard"),
    ("DynamicShard(0,[3,0,7]),DynamicShard(0,[5,5])", "dp=3,tp=2", (10, 4), "also shards tensor dim 0",
     "DynamicShard(0,[5"),
    ("S(1),RaggedShard([0,1],[1,1])", "dp=2,tp=2", (4, 6), "which the RaggedShard on 'tp' flattens", "RaggedShard"),
    ("PartitionedShard(1,2,[[1,2],[3,4]]),_S(1,2)", "ep=2,tp=2", (2, 10), "also shards tensor dim 1", "_S"),
    ("DynamicShard(0,[3,0,6]),S(1)", "dp=3,tp=2", (10, 4), "sum to 9, but dim 0 has 10", "DynamicShard"),
    ("R,PartitionedShard(0,2,[[1,2],[3,3]])", "dp=2,ep=2", (10,), "splits sum to 9, but dim 0 has 10",
     "PartitionedShard"),
    ("R,DynamicShard(0,[3,7])", "tp=2,dp=3", (10,), "2 chunk sizes for mesh axis 'dp' of 3 ranks", "DynamicShard"),
    ("RaggedShard([0],[1,1,2]),R", "dp=2,tp=2", (8,), "3 local units for mesh axis 'dp' of 2 ranks", "RaggedShard"),
    ("PartitionedShard(0,2,[[1,2],[3,4],[0,0]])", "ep=2", (10,), "3 rows of splits for mesh axis 'ep' of 2 ranks",
     "PartitionedShard"),
    ("RaggedShard([0],[1,2])", "dp=2", (10,), "does not divide by the 3 units", "RaggedShard"),
    ("DynamicShard(2,[3,7])", "dp=2", (10,), "shards tensor dim 2, out of range for a 1-d tensor", "DynamicShard"),
    ("R,DynamicShard(0,[3,-1])", "dp=2,tp=2", (2,), "negative size -1", "DynamicShard"),
    ("RaggedShard([1],[1,1]),R", "dp=2,tp=2", (4, 4), "must be a prefix", "RaggedShard"),
    ("R,RaggedShard([0,2],[1,1])", "dp=2,tp=2", (4, 4), "must be a prefix", "RaggedShard"),
    ("PartitionedShard(0,3,[[1,2,3],[1,1,1]],aligned=True)", "ep=2", (9,), "divisible by the 2 shards",
     "PartitionedShard"),
    ("DynamicShard(0,[1,2],3)", "dp=2", (3,), "DynamicShard takes 2 arguments, not 3", "3)"),
]


@pytest.mark.parametrize("text,mesh,shape,message,under", BAD_PLACEMENTS, ids=[b[3] for b in BAD_PLACEMENTS])
def test_bad_uneven_placements_are_spec_errors_with_a_caret(text: str, mesh: str, shape: tuple[int, ...],
                                                            message: str, under: str) -> None:
    with pytest.raises(SpecError) as info:
        from_placements(text, mesh, shape)
    e = info.value
    assert message in e.message and e.hint
    assert e.text is not None and e.pos is not None and e.text[e.pos:].startswith(under), str(e)


SAME_RULE = [
    # (placements, the type string of the same split, mesh, shape, the words both say)
    ("R,DynamicShard(0,[3,7])", "f32[10@dp<3,7>]", "tp=2,dp=3", (10,), "gives 2 chunk sizes for mesh axis 'dp' of 3"),
    ("DynamicShard(0,[3,0,6])", "f32[10@dp<3,0,6>]", "dp=3", (10,), "DynamicShard chunk sizes sum to 9, but"),
    ("PartitionedShard(0,2,[[1,2],[3,3]])", "f32[10@ep<parts 1,2|3,3>]", "ep=2", (10,),
     "PartitionedShard splits sum to 9, but"),
    ("PartitionedShard(0,2,[[1,2],[3,4],[0,0]])", "f32[10@ep<parts 1,2|3,4|0,0>]", "ep=2", (10,),
     "gives 3 rows of splits for mesh axis 'ep' of 2 ranks"),
    ("RaggedShard([0],[1,2])", "f32[10@dp<ragged 1,2>]", "dp=2", (10,), "(10 positions) does not divide by the 3"),
]


@pytest.mark.parametrize("placements,text,mesh,shape,words", SAME_RULE, ids=[c[4] for c in SAME_RULE])
def test_a_placement_and_its_type_string_break_a_rule_in_the_same_words(
        placements: str, text: str, mesh: str, shape: tuple[int, ...], words: str) -> None:
    """One rule, checked in one place (``Split``), whichever way the split was written."""
    with pytest.raises(SpecError) as by_placement:
        from_placements(placements, mesh, shape)
    with pytest.raises(SpecError) as by_type:
        resolve(text, mesh)
    assert words in by_placement.value.message and words in by_type.value.message


def test_bad_uneven_placement_objects_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="negative size -1"):
        DynamicShard(0, (3, -1))
    with pytest.raises(SpecError, match="must be a prefix"):
        RaggedShard((1,), (1, 1))
    with pytest.raises(SpecError, match="also shards tensor dim 0") as info:
        from_placements([DynamicShard(0, (3, 7)), "S(0)"], "dp=2,tp=2", (10,))
    assert info.value.text == "DynamicShard(0,[3,7]),S(0)" and info.value.pos == len("DynamicShard(0,[3,7]),")
    with pytest.raises(SpecError, match="sum to 9, but dim 0 has 10"):
        check_placements([DynamicShard(0, (2, 7))], None, "dp=2", 1, (10,))
    # without the shape, only the rules that need no sizes
    assert check_placements([DynamicShard(0, (2, 7))], None, "dp=2", 1)[0][0].uneven == DynamicShard(0, (2, 7))


# ---- the CLI and the test data -------------------------------------------------------------


def _cli(*argv: str) -> str:
    import contextlib
    import io

    from torch_backend.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


def test_parse_lists_each_ranks_blocks() -> None:
    info = json.loads(_cli("parse", "f32[32@ep<parts 4,6,4,2|2,4,8,2>,4@tp]", "--mesh", "ep=2,tp=2", "--json"))
    assert info["jax"] is None and "uneven split" in info["jax_refusal"]
    assert info["placements"] == "PartitionedShard(0,4,[[4,6,4,2],[2,4,8,2]]),S(1)"
    r0 = info["ranks"][0]
    assert r0["blocks"] == [[[0, 4], [0, 2]], [[6, 12], [0, 2]], [[16, 20], [0, 2]], [[28, 30], [0, 2]]]
    assert r0["cat"] == 0 and r0["shape"] == [16, 2]
    assert info["local_shapes"] == [{"shape": [16, 2], "count": 4, "ranks": "0-3"}]
    text = _cli("parse", "f32[2@dp<ragged 1,1,1 over 2>,3,4]", "--mesh", "dp=3")
    assert "rank   1 (dp=1): [0:1, 2:3, 0:4] [1:2, 0:1, 0:4] shape (8,)" in text
    assert "(flattened, then concatenated)" in text


def test_show_draws_every_block_and_lists_them() -> None:
    text = _cli("show", "f32[28@ep<parts 4,2,6,4|2,4,2,4>]", "--mesh", "ep=2", "--no-color", "--width", "120")
    # global order P00 P10 P01 P11 P02 P12 P03 P13 = [0:4] [4:6] [6:8] [8:12] [12:18] [18:20] [20:24] [24:28]
    lines = [line for line in text.splitlines() if line.startswith("  rank")]
    assert lines == ["  rank   0 (ep=0): [0:4] [6:8] [12:18] [20:24] shape (16,)",
                     "  rank   1 (ep=1): [4:6] [8:12] [18:20] [24:28] shape (12,)"]
    assert "each rank's blocks, in local order (concatenated along dim 0):" in text
    header = next(line for line in text.splitlines() if "│ dim 0" in line)
    assert [c.strip() for c in header.strip().strip("│").split("│")][1:] == ["0", "1"] * 4
    aligned = _cli("show", "f32[28@ep<aligned 4,2,6,4|2,4,2,4>]", "--mesh", "ep=2", "--no-color", "--width", "120")
    assert "  rank   0 (ep=0): [0:4] [4:6] [6:8] [8:12] shape (12,)" in aligned
    header = next(line for line in aligned.splitlines() if "│ dim 0" in line)
    assert [c.strip() for c in header.strip().strip("│").split("│")][1:] == ["0"] * 4 + ["1"] * 4
    empty = _cli("show", "f32[10@dp<3,0,7>,4@tp]", "--mesh", "dp=3,tp=2", "--no-color")
    assert "ranks holding no elements (uneven split): 2-3" in empty


def test_the_test_data_cuts_each_ranks_blocks() -> None:
    torch = pytest.importorskip("torch")
    from torch_backend.data import block, global_tensor

    for text, mesh in [("f32[32@ep<aligned 4,6,4,2|2,4,8,2>,4@tp]{U:dp}", "ep=2,tp=2,dp=2"),
                       ("i64[2@dp<ragged 1,1,1 over 2>,3,4@tp]", "dp=3,tp=2"),
                       ("bf16[10@dp<3,0,7>,2]{V:tp}", "dp=3,tp=2"),
                       ("f32[4@dp<ragged 0,1 over 2>,2]", "dp=2")]:
        t, m = resolve(text, mesh)
        g = global_tensor(t)
        flat = t.replace(axis_types=tuple((a, at) for a, at in t.axis_types if at.kind != "P"))
        for r, idx in enumerate(local_indices(t, m)):
            x = block(flat, m, g, r)
            assert tuple(x.shape) == local_shapes(t, m)[r]
            if not t.axes_of_kind("V"):
                assert torch.equal(x.reshape(-1), g.reshape(-1)[torch.as_tensor(idx, dtype=torch.long)])
            assert tuple(block(t, m, g, r).shape) == tuple(x.shape)
