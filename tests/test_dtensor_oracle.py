"""DTensor as an oracle: to_placements + distribute_tensor put on every rank what
``local_slices`` says, under ``LocalTensorMode`` with the fake process group.

distribute_tensor takes no shard_order, so a non-mesh order within a dim goes in its
``_StridedShard`` form. That form follows the chunk rule for even dims and for many
uneven ones, but not all: ``KNOWN_MISMATCH`` lists the grid cases where it differs
(found by running this grid on torch 2.13), and the tests assert both sides, so a
change in torch shows up here. The shard_order form itself is checked against torch's
own converters in both directions.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from _cases import case_params

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed._local_tensor")
from torch.distributed._local_tensor import LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor  # noqa: E402
from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry  # noqa: E402
from torch.distributed.tensor.placement_types import _StridedShard  # noqa: E402

from lowering import check_placements, from_placements, local_slices, to_placements  # noqa: E402
from lowering.placements import format_placements, parse_placements, placement_specs  # noqa: E402
from spec_lang import Mesh, SpecError, parse, parse_mesh  # noqa: E402

MESHES = ("dp=2,tp=4", "dp=4,tp=2", "a=2,b=2,c=2", "x=2,y=2")
SIZES = (16, 9, 10, 5, 13)

# (mesh, type) where the _StridedShard form disagrees with the chunk rule (torch 2.13).
KNOWN_MISMATCH = {
    ("dp=4,tp=2", "f32[9@(tp,dp),3]"),
    ("a=2,b=2,c=2", "f32[9@(b,c,a),3]"), ("a=2,b=2,c=2", "f32[10@(b,c,a),3]"),
    ("a=2,b=2,c=2", "f32[5@(b,c,a),3]"), ("a=2,b=2,c=2", "f32[13@(b,c,a),3]"),
    ("a=2,b=2,c=2", "f32[9@(c,b,a),3]"), ("a=2,b=2,c=2", "f32[10@(c,b,a),3]"),
    ("a=2,b=2,c=2", "f32[5@(c,b,a),3]"), ("a=2,b=2,c=2", "f32[13@(c,b,a),3]"),
}


def _grid() -> list[tuple[str, str]]:
    out = []
    for mesh in MESHES:
        m = parse_mesh(mesh)
        for k in range(1, m.ndim + 1):
            for axes in itertools.permutations(m.names, k):
                group = axes[0] if k == 1 else "(" + ",".join(axes) + ")"
                out += [(mesh, f"f32[{n}@{group},3]") for n in SIZES]
        a, b = m.names[0], m.names[-1]
        out.append((mesh, f"f32[6@{b},7@{a}]"))
        if m.ndim == 3:
            out += [(mesh, "f32[5@c,13@(b,a)]"), (mesh, "f32[8@(c,a),2,4@b]"), (mesh, "f32[7,9@(b,c)]")]
    return out


GRID = _grid()


@pytest.fixture
def device_mesh(fake_pg: Callable[[int], None]) -> Callable[[str], Any]:
    """``device_mesh("dp=2,tp=4")``: a named DeviceMesh over a fake world of the mesh's size."""

    def make(text: str) -> Any:
        m = parse_mesh(text)
        fake_pg(m.size)
        return init_device_mesh("cpu", m.sizes, mesh_dim_names=m.names)

    return make


def _distribute(t_text: str, mesh_text: str, dm: Any, placements: list[Any]) -> tuple[Any, list[Any]]:
    t, m = parse(t_text), parse_mesh(mesh_text)
    full = torch.arange(float(t.numel)).reshape(t.shape)
    with LocalTensorMode(m.size):
        dt = distribute_tensor(full, dm, placements, src_data_rank=None)
        ranks = dt.to_local()._local_tensors  # once: each to_local is a dispatch over every rank
        local = [ranks[r].clone() for r in range(m.size)]
    return full, local


def _agrees(full: Any, local: list[Any], t_text: str, mesh_text: str) -> bool:
    return all(torch.equal(loc, full[sl]) for loc, sl in zip(local, local_slices(t_text, mesh_text), strict=True))


@pytest.mark.parametrize(("mesh", "text"), GRID)
def test_distribute_matches_local_slices(mesh: str, text: str, device_mesh: Callable[[str], Any]) -> None:
    dm = device_mesh(mesh)
    placements, order = to_placements(text, mesh)
    strided, none = to_placements(text, mesh, strided=True)
    assert none == {}
    if not order:  # mesh order: the plain placements are already what distribute_tensor takes
        assert [str(p) for p in placements] == [str(p) for p in strided]
        full, local = _distribute(text, mesh, dm, placements)
        assert _agrees(full, local, text, mesh)
    full, local = _distribute(text, mesh, dm, strided)
    assert _agrees(full, local, text, mesh) == ((mesh, text) not in KNOWN_MISMATCH)
    # every form comes back to the type
    t = parse(text)
    assert from_placements(placements, mesh, t.shape, "f32", order) == t
    assert from_placements(strided, mesh, t.shape) == t
    assert from_placements(strided, dm, t.shape, torch.float32) == t  # a DeviceMesh is a mesh too


def test_known_mismatches_are_in_the_grid() -> None:
    assert KNOWN_MISMATCH <= set(GRID)


def test_known_mismatch_exact(device_mesh: Callable[[str], Any]) -> None:
    """The strided form of 9@(tp,dp) on dp=4,tp=2 moves the last row from rank 7 to rank 6."""
    mesh, text = "dp=4,tp=2", "f32[9]"
    t = "f32[9@(tp,dp)]"
    strided, _ = to_placements(t, mesh, strided=True)
    assert format_placements(strided) == "_S(0,2),S(0)"
    _, local = _distribute(text, mesh, device_mesh(mesh), strided)
    got = [loc.tolist() for loc in local]
    assert got == [[0, 1], [5], [2, 3], [6], [4], [7], [8], []]
    chunk = [[*range(s[0].start, s[0].stop)] for s in local_slices(t, mesh)]
    assert chunk == [[0, 1], [5], [2, 3], [6], [4], [7], [], [8]]


def test_known_mismatch_not_contiguous(device_mesh: Callable[[str], Any]) -> None:
    """With three axes the strided form can even give a rank non-contiguous rows."""
    mesh, t = "a=2,b=2,c=2", "f32[9@(b,c,a)]"
    strided, _ = to_placements(t, mesh, strided=True)
    _, local = _distribute("f32[9]", mesh, device_mesh(mesh), strided)
    assert local[2].tolist() == [4.0, 6.0]
    assert local_slices(t, mesh)[2] == (slice(5, 6),)


@pytest.mark.parametrize(("mesh", "text"), [g for g in GRID if "@(" in g[1]])
def test_strided_form_matches_torch_converters(mesh: str, text: str, device_mesh: Callable[[str], Any]) -> None:
    dm = device_mesh(mesh)
    m = parse_mesh(mesh)
    placements, order = to_placements(text, mesh)
    strided, _ = to_placements(text, mesh, strided=True)
    full_order = {d: [m.names[i] for i in range(m.ndim) if placements[i] == Shard(d)] for d in range(parse(text).ndim)}
    full_order.update(order)
    torch_order = tuple(
        ShardOrderEntry(tensor_dim=d, mesh_dims=tuple(m.index(a) for a in axes)) for d, axes in sorted(full_order.items()) if axes
    )
    want = DTensorSpec._convert_shard_order_to_StridedShard(torch_order, tuple(placements), dm)
    assert tuple(strided) == want
    assert DTensorSpec._maybe_convert_StridedShard_to_shard_order(tuple(strided), dm) == torch_order


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
@pytest.mark.parametrize(("mesh", "text"), [("dp=2,tp=4", "f32[8@tp,3]{{{}:dp}}"), ("a=2,b=2,c=2", "f32[6@(c,a)]{{{}:b}}")])
def test_partial(mesh: str, text: str, op: str, device_mesh: Callable[[str], Any]) -> None:
    text = text.format("U" if op == "sum" else f"P({op})")
    m = parse_mesh(mesh)
    t = parse(text)
    placements, _ = to_placements(t, mesh, strided=True)
    pax = t.partial_axes[0]
    assert placements[m.index(pax)] == Partial(op)
    full, local = _distribute(str(t), mesh, device_mesh(mesh), placements)
    slices = local_slices(t, mesh)
    for r in range(m.size):  # reducing the partial group's locals gives the block
        c = list(m.coords(r))
        group = []
        for i in range(m.axis_size(pax)):
            c[m.index(pax)] = i
            group.append(local[m.rank_of(tuple(c))])
        stack = torch.stack(group)
        red = {"sum": stack.sum(0), "avg": stack.mean(0), "max": stack.amax(0), "min": stack.amin(0)}[op]
        assert torch.allclose(red, full[slices[r]])
    assert from_placements(placements, mesh, t.shape) == t


def test_replicate_and_reduced() -> None:
    pl, order = to_placements("f32[8@tp]{R:dp}", "dp=2,tp=4")
    assert pl == [Replicate(), Shard(0)] and order == {}
    back = from_placements(pl, "dp=2,tp=4", (8,))
    assert back == parse("f32[8@tp]")  # R and I are both Replicate: DTensor has no gradient type
    assert from_placements([Replicate(), Replicate()], "dp=2,tp=4", (8,)) == parse("f32[8]")


def test_shard_order_form() -> None:
    pl, order = to_placements("f32[8@(tp,dp),4@cp]", "dp=2,cp=2,tp=2")
    assert pl == [Shard(0), Shard(1), Shard(0)] and order == {0: ["tp", "dp"]}
    pl, order = to_placements("f32[16@(d,c,b,a)]", Mesh(("a", "b", "c", "d"), (2, 2, 2, 2)), strided=True)
    assert pl == [_StridedShard(0, split_factor=8), _StridedShard(0, split_factor=4), _StridedShard(0, split_factor=2), Shard(0)]
    # the string and dict forms of shard_order say the same
    t = parse("f32[8@(tp,dp),4@cp]")
    for so in ({0: ["tp", "dp"]}, {0: [2, 0]}, "{0: ['tp', 'dp']}", "{0: [tp, 0]}"):
        assert from_placements([Shard(0), Shard(1), Shard(0)], "dp=2,cp=2,tp=2", (8, 4), shard_order=so) == t
    assert placement_specs(t, parse_mesh("dp=2,cp=2,tp=2"))[1] == {0: ["tp", "dp"]}


# ---- check_placements: every seed-003 rule has its own error ----------------------------------

MESH3 = "dp=2,cp=2,tp=2"
S0_S1_S0 = [Shard(0), Shard(1), Shard(0)]


@pytest.mark.parametrize(
    ("placements", "order", "words", "caret"),
    [
        ([Shard(0), Shard(0)], None, "2 placements for a 3-d mesh", None),
        ([Shard(0), Shard(3), Replicate()], None, "tensor dim 3, out of range", "S(3)"),
        ("S(0),S(1),P(foo)", None, "unknown Partial reduce op", "P(foo)"),
        ([_StridedShard(0, split_factor=2), Shard(1), Shard(0)], {0: ["tp", "dp"]}, "_StridedShard", "_S(0,2)"),
        (S0_S1_S0, "{5: [tp, dp]}", "tensor dim 5 is out of range", "5"),
        (S0_S1_S0, "{0: [tp, 7]}", "mesh dim 7 is out of range", "7"),
        (S0_S1_S0, "{0: ['tp', 'zz']}", "unknown mesh dim 'zz'", "zz"),
        (S0_S1_S0, "{0: [tp, tp, dp]}", "repeated", "tp, dp"),
        (S0_S1_S0, "{0: [tp, dp], 1: [0]}", "repeated", "0]}"),
        ([Shard(0), Partial(), Shard(0)], "{0: [tp, cp, dp]}", "placement is Partial", "cp"),
        ([Shard(0), Replicate(), Shard(0)], "{0: [tp, cp, dp]}", "placement is Replicate", "cp"),
        (S0_S1_S0, "{0: [tp, cp]}", "inconsistent", "cp"),
        (S0_S1_S0, "{0: [tp]}", "must list every mesh dim", "0:"),
        (S0_S1_S0, "{2: []}", "is empty", "2:"),
        (S0_S1_S0, "{0: [tp, dp]", "ends too early", None),
    ],
)
def test_check_placements_rules(placements: Any, order: Any, words: str, caret: str | None) -> None:
    with pytest.raises(SpecError) as info:
        check_placements(placements, order, MESH3, 3)
    e = info.value
    assert words in e.message, e.message
    assert e.hint
    if caret is not None:
        assert e.text is not None and e.pos is not None
        assert e.text[e.pos:].startswith(caret), str(e)


def test_check_placements_each_error_is_distinct() -> None:
    """The rule messages differ, so a user can tell which rule broke."""
    msgs = []
    for p, o in [
        ([Shard(0), Partial(), Shard(0)], {0: ["tp", "cp", "dp"]}),
        ([Shard(0), Replicate(), Shard(0)], {0: ["tp", "cp", "dp"]}),
        (S0_S1_S0, {0: ["tp", "cp"]}),
        (S0_S1_S0, {0: ["tp"]}),
        (S0_S1_S0, {0: ["tp", "tp"]}),
    ]:
        with pytest.raises(SpecError) as info:
            check_placements(p, o, MESH3, 2)
        msgs.append(info.value.message.split(";")[0].split("(")[0])
    assert len(set(msgs)) == len(msgs), msgs


def test_check_placements_accepts() -> None:
    # sparse: dim 1 (mesh order) is not mentioned, names and indices mix, strings work
    specs, order = check_placements([Shard(0), Shard(1), Shard(0), Shard(1)], {0: [2, "a"]}, "a=2,b=2,c=2,d=2", 2)
    assert order == {0: (2, 0)}
    assert check_placements("S(0),S(-1),R", "{}", MESH3, 2)[0][1].dim == 1  # negative dims normalized
    assert check_placements(S0_S1_S0, None, MESH3, 2)[1] == {}
    assert check_placements(S0_S1_S0, {0: ["dp", "tp"]}, MESH3, 2)[1] == {0: (0, 2)}  # mesh order, spelled out


def test_from_placements_errors() -> None:
    with pytest.raises(SpecError, match="matches no order"):
        from_placements([_StridedShard(0, split_factor=3), Shard(0)], "dp=2,tp=4", (8,))
    with pytest.raises(SpecError, match="mixed Partial reduce ops"):
        from_placements([Partial("sum"), Partial("max")], "dp=2,tp=4", (8,))
    with pytest.raises(SpecError, match="unknown dtype"):
        from_placements([Replicate(), Replicate()], "dp=2,tp=4", (8,), dtype="complex32")
    with pytest.raises(SpecError, match="shape"):
        from_placements([Replicate(), Replicate()], "dp=2,tp=4", "abc")
    with pytest.raises(SpecError, match="unsupported placement"):
        from_placements([object(), Replicate()], "dp=2,tp=4", (8,))
    with pytest.raises(SpecError, match="Varying"):
        to_placements("f32[8]{V:tp}", "dp=2,tp=4")
    with pytest.raises(SpecError, match="not on the mesh"):
        to_placements("f32[8@zz]", "dp=2,tp=4")


def test_unnamed_device_mesh(fake_pg: Callable[[int], None]) -> None:
    fake_pg(4)
    dm = init_device_mesh("cpu", (2, 2))
    with pytest.raises(SpecError, match="mesh_dim_names"):
        from_placements([Shard(0), Replicate()], dm, (4,))


@pytest.mark.parametrize("case", case_params("layouts.jsonl"))
def test_dtensor_matches_field(case: dict[str, Any], device_mesh: Callable[[str], Any]) -> None:
    """distribute_tensor with the listed placements_used agrees with the slices iff ``matches``."""
    mesh, text = case["mesh"], case["type"]
    strided, _ = to_placements(text, mesh, strided=True)
    assert format_placements(strided) == format_placements(parse_placements(case["dtensor"]["placements_used"]))
    full, local = _distribute(text, mesh, device_mesh(mesh), strided)
    assert _agrees(full, local, text, mesh) == case["dtensor"]["matches"]
