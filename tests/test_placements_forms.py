"""Placements and shard_order in every form users bring: the bracketed text of the docs,
torch's own ``ShardOrderEntry`` tuples (in and out), and every row of docs/dsl.md's
check_placements table, read from the doc itself so that the table cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lowering.placements import check_placements, from_placements, parse_placements, to_placements
from spec_lang import SpecError, parse

REPO = Path(__file__).resolve().parents[1]
TABLE_MESH = "dp=2,cp=2,tp=2"  # what the doc says its rows use, with a 3-d tensor


def _doc_rows() -> list[tuple[str, str, str | None, str]]:
    """(rule, placements, shard_order or None, error) for each row of the rules table."""
    text = (REPO / "docs" / "dsl.md").read_text()
    start = text.index("| rule | placements | shard_order | error |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rule, placements, order, error = cells
        code = [re.fullmatch(r"`(.*)`", c) for c in (placements, order, error)]
        rows.append((rule, code[0][1], code[1][1] if code[1] else None, code[2][1]))
    return rows


ROWS = _doc_rows()


def test_the_doc_table_is_read() -> None:
    assert len(ROWS) >= 12
    prose = " ".join((REPO / "docs" / "dsl.md").read_text().split())
    assert f"on the mesh `{TABLE_MESH}` with a 3-d tensor" in prose


@pytest.mark.parametrize("rule,placements,order,error", ROWS, ids=[r[0] for r in ROWS])
def test_every_doc_row_gives_its_error(rule: str, placements: str, order: str | None, error: str) -> None:
    with pytest.raises(SpecError) as info:
        check_placements(placements, order, TABLE_MESH, 3)
    assert error in info.value.message, rule
    assert info.value.hint


@pytest.mark.parametrize("text,want", [
    ("[S(0), R, S(0)]", "S(0),R,S(0)"),
    ("(S(0), R, S(0))", "S(0),R,S(0)"),
    ("[_S(0,2), S(1), S(0)]", "_S(0,2),S(1),S(0)"),
    ("S(0),P(avg),R", "S(0),P(avg),R"),
    (" [ P , _S(1, split_factor=4) ] ", "P(sum),_S(1,4)"),
    ("S(0) R,,P(max)", "S(0),R,P(max)"),
    ("DynamicShard( 1 , (3, 0, 7), ) R", "DynamicShard(1,[3,0,7]),R"),
    ("[RaggedShard(dims=[0, 1], local_units=(1, 2, 1))]", "RaggedShard([0,1],[1,2,1])"),
    ("PartitionedShard(dim=0, num_partitions=2, splits=((1, 2), (3, 3)), aligned=True)",
     "PartitionedShard(0,2,[[1,2],[3,3]],aligned=True)"),
])
def test_text_forms(text: str, want: str) -> None:
    assert ",".join(str(p) for p in parse_placements(text)) == want


def test_unbalanced_brackets_are_refused() -> None:
    with pytest.raises(SpecError, match="malformed placements: it ends too early") as info:
        parse_placements("[S(0), R")
    assert info.value.pos == len("[S(0), R")


torch = pytest.importorskip("torch")
from torch.distributed.tensor import Partial, Replicate, Shard  # noqa: E402
from torch.distributed.tensor._dtensor_spec import ShardOrderEntry  # noqa: E402


def test_check_placements_takes_torch_shard_order() -> None:
    order = (ShardOrderEntry(tensor_dim=0, mesh_dims=(2, 0)),)
    specs, out = check_placements([Shard(0), Replicate(), Shard(0)], order, TABLE_MESH, 2)
    assert out == {0: (2, 0)}
    # torch lists mesh-order dims too, and plain (dim, mesh_dims) pairs work the same
    _, out = check_placements([Shard(0), Shard(1), Shard(0)], ((0, (2, 0)), (1, (1,))), TABLE_MESH, 2)
    assert out == {0: (2, 0), 1: (1,)}


@pytest.mark.parametrize("order,match", [
    ((ShardOrderEntry(0, (2,)),), r"missing \['dp'\]"),
    ((ShardOrderEntry(0, (2, 0)), ShardOrderEntry(0, (0, 2))), "appears twice"),
    ((ShardOrderEntry(0, (2, 7)),), "mesh dim 7 is out of range"),
    (((0,),), "is not a ShardOrderEntry"),
])
def test_torch_shard_order_errors(order: tuple, match: str) -> None:
    with pytest.raises(SpecError, match=match) as info:
        check_placements([Shard(0), Replicate(), Shard(0)], order, TABLE_MESH, 2)
    assert info.value.hint


@pytest.mark.parametrize("text", [
    "f32[8@(tp,dp),4@cp]", "f32[8@(dp,tp),4]{U:cp}", "f32[8,4]", "f32[8@(tp,cp,dp)]", "f32[8@tp,4@(cp,dp)]",
])
def test_torch_format_round_trips_through_dtensor_spec(text: str) -> None:
    """to_placements(..., shard_order_format='torch') is what DTensorSpec holds: torch's own
    conversion of it to _StridedShard gives our strided form, and from_placements reads it back."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    placements, order = to_placements(text, TABLE_MESH, shard_order_format="torch")
    t = parse(text)
    assert order == tuple(
        ShardOrderEntry(d, tuple("dp cp tp".split().index(a) for a in dim.axes))
        for d, dim in enumerate(t.dims) if dim.axes
    )
    assert from_placements(placements, TABLE_MESH, t.shape, "f32", order) == t

    class _Mesh:  # what the conversion reads of a DeviceMesh
        shape = (2, 2, 2)
        ndim = 3

        def size(self, i: int) -> int:
            return 2

    strided, none = to_placements(text, TABLE_MESH, strided=True, shard_order_format="torch")
    assert none is None
    assert list(DTensorSpec._convert_shard_order_to_StridedShard(order, tuple(placements), _Mesh())) == strided


def test_partial_placements_in_torch_format() -> None:
    placements, order = to_placements("f32[8@tp]{P(avg):dp}", TABLE_MESH, shard_order_format="torch")
    assert placements == [Partial("avg"), Replicate(), Shard(0)] and order == (ShardOrderEntry(0, (2,)),)


def test_unknown_shard_order_format() -> None:
    with pytest.raises(SpecError, match="unknown shard_order_format"):
        to_placements("f32[8@tp]", TABLE_MESH, shard_order_format="jax")
