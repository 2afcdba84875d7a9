"""Every public entry of lowering and torch_backend answers wrong-typed or mismatched
arguments with a SpecError that names the problem (never an AttributeError, a TypeError
or numpy's broadcast error from deep inside)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

import lowering
import spec_lang
from lowering.placements import PlacementSpec
from spec_lang.errors import SpecError

torch = pytest.importorskip("torch")

import torch_backend  # noqa: E402 - after the importorskip

GATHER = ("f32[8@dp]", "f32[8]", "dp=2")
HUGE_MESH = "dp=1000000000000000000"


def _step() -> Any:
    return lowering.make_step("all_gather", *GATHER)


def _program() -> Any:
    return lowering.compile(*GATHER)


CASES: list[tuple[str, Callable[[], Any], str]] = [
    ("boxes, axis off the mesh", lambda: lowering.boxes(spec_lang.parse("f32[8@xx]"), spec_lang.parse_mesh("dp=2")),
     "'xx' is not on the mesh"),
    ("local_shapes, uneven axis off the mesh",
     lambda: lowering.local_shapes(spec_lang.parse("f32[8@dp<3,5>]"), spec_lang.parse_mesh("tp=2")),
     "'dp' is not on the mesh"),
    ("local_shape, rank off the mesh", lambda: lowering.local_shape("f32[8@dp]", "dp=2", 5), "rank 5 is not on"),
    ("local_shape, malformed type", lambda: lowering.local_shape("f32[8@", "dp=2", 0), "malformed type"),
    ("dual_type, malformed type", lambda: torch_backend.dual_type("f32[8@"), "malformed type"),
    ("dual_type, not a type", lambda: torch_backend.dual_type(3), "expected a type string"),
    ("format_type, not a type", lambda: spec_lang.format_type(3), "expected a type string"),
    ("make_step, axes not names", lambda: lowering.make_step("all_gather", *GATHER, axes=3),
     "axes must be mesh axis names"),
    ("make_program, not a step", lambda: lowering.make_program([1], "dp=2"), "step 1 is a int, not a Step"),
    ("make_program, another mesh", lambda: lowering.make_program([_step()], "dp=4"),
     "priced on a mesh of 2 ranks"),
    ("make_program, an axis off the mesh", lambda: lowering.make_program([_step()], "tp=2"),
     "'dp' is not on the mesh"),
    ("rank_pieces, rank off the mesh", lambda: lowering.rank_pieces(_step(), spec_lang.parse_mesh("dp=2"), 9),
     "rank 9 is not on"),
    ("rank_pieces, members off the group", lambda: lowering.rank_pieces(_step(), "dp=2", 0, members=(9,)),
     "are not rank 0's group"),
    ("rank_pieces, members not ranks", lambda: lowering.rank_pieces(_step(), "dp=2", 0, members="01"),
     "are not rank 0's group"),
    ("make_step, padded not a flag", lambda: lowering.make_step("all_gather", *GATHER, padded="yes"),
     "padded must be True, False or None"),
    ("rank_pieces, not a step", lambda: lowering.rank_pieces("x", "dp=2", 0), "expected a Step"),
    ("check_type, axis off the mesh, as strings", lambda: lowering.check_type("f32[8@xx]", "dp=2"),
     "'xx' is not on the mesh"),
    ("check_type, malformed type", lambda: lowering.check_type("f32[8@", "dp=2"), "malformed type"),
    ("check_type, not a type", lambda: lowering.check_type(3, "dp=2"), "expected a type string"),
    ("check_type, malformed mesh", lambda: lowering.check_type("f32[8@dp]", "dp="), "malformed mesh"),
    ("from_placements, a string for the shape", lambda: lowering.from_placements("S(0)", "dp=2", "88", "f32"),
     "shape must be a sequence of ints, got '88'"),
    ("from_placements, a float size", lambda: lowering.from_placements("S(0)", "dp=2", (8.5,), "f32"),
     "shape must hold ints, got 8.5"),
    ("from_placements, a negative size", lambda: lowering.from_placements("S(0)", "dp=2", (-8,), "f32"),
     "shape holds a negative size -8"),
    ("check_placements, ndim not an int", lambda: lowering.check_placements("S(0)", None, "dp=2", "x"),
     "ndim must be"),
    ("check_placements, ndim negative", lambda: lowering.check_placements("S(0)", None, "dp=2", -1),
     "ndim must be"),
    ("compile_many, a string for the list", lambda: lowering.compile_many("f32[8@dp]", ["f32[8]"], "dp=2"),
     "takes a list of source types"),
    ("simulate, not a program", lambda: lowering.simulate("x", []), "expected a compiled Program"),
    ("execute, not a program", lambda: torch_backend.execute("x", torch.zeros(4)), "expected a compiled Program"),
    ("execute, not a tensor", lambda: torch_backend.execute(_program(), [1.0]), "expected a torch.Tensor"),
    ("backward_program, not a program", lambda: torch_backend.backward_program("x"), "expected a compiled Program"),
    ("redistribute, a timeout that is not a number",
     lambda: torch_backend.redistribute(torch.zeros(4), *GATHER, timeout="60"), "timeout must be a positive"),
    ("redistribute, a negative timeout",
     lambda: torch_backend.redistribute(torch.zeros(4), *GATHER, timeout=-1), "timeout must be a positive"),
    ("redistributor, a zero timedelta",
     lambda: torch_backend.redistributor(*GATHER, timeout=timedelta(0)), "timeout must be a positive"),
    ("context, a timeout too long for a timedelta",
     lambda: torch_backend.context("dp=2", timeout=1e300), "longer than the longest allowed"),
    ("redistribute_many, a string for the list",
     lambda: torch_backend.redistribute_many([torch.zeros(4)], "f32[8@dp]", ["f32[8]"], "dp=2"),
     "takes a list of source types"),
    # an empty string or () for the destination types indexed past its end (issue 34)
    *[(f"redistribute_many, {d!r} for the destination types",
       lambda d=d: torch_backend.redistribute_many([torch.zeros(4)], ["f32[8@dp]"], d, "dp=2"), fragment)
      for d, fragment in (("", "takes a list of destination types, got str"),
                          ((), "1 source types and 0 destination types"))],
    ("spmd.typeof, not a tensor", lambda: torch_backend.spmd.typeof("f32[8@dp]"), "spmd.typeof takes a tensor"),
    ("spmd.typeof, a list", lambda: torch_backend.spmd.typeof([torch.zeros(2)]), "takes a tensor, got list"),
    # sizes that cannot be laid out: refused before anything is allocated (issue 25)
    *[(f"{name}, a mesh of 10**18 ranks", call, "more than the 1,048,576 (2**20) a mesh may have") for name, call in [
        ("compile", lambda: lowering.compile("f32[8@dp]", "f32[8]", HUGE_MESH)),
        ("make_step", lambda: lowering.make_step("all_gather", "f32[8@dp]", "f32[8]", HUGE_MESH)),
        ("rank_pieces", lambda: lowering.rank_pieces(_step(), HUGE_MESH, 0)),
        ("local_shapes", lambda: lowering.local_shapes("f32[8@dp]", HUGE_MESH)),
        ("boxes", lambda: lowering.boxes("f32[8@dp]", HUGE_MESH)),
        ("to_placements", lambda: lowering.to_placements("f32[8@dp]", HUGE_MESH)),
    ]],
    ("parse, a byte count of 4,501 digits",
     lambda: spec_lang.parse("f32[" + ",".join(["999999999999999999"] * 250) + "]"),
     "byte count (a number of 4,501 digits) does not fit in int64"),
    ("from_placements, a dim of 5,000 digits", lambda: lowering.from_placements("S(" + "9" * 5000 + ")", "dp=2", (8,)),
     "tensor dim 999999999999... (5000 digits) is too large"),
    ("from_placements, a split_factor of 20 digits",
     lambda: lowering.from_placements("_S(0," + "9" * 20 + "),S(0)", "dp=2,tp=2", (8,)),
     "split_factor 99999999999999999999 (20 digits) is too large"),
    ("check_placements, a placement dim past int64",
     lambda: lowering.check_placements([PlacementSpec("S", 10**5000)], None, "dp=2", 1),
     "a placement's dim must be an int that fits in int64, got a number of 5,001 digits"),
    ("check_placements, ndim 10**30", lambda: lowering.check_placements("S(0)", None, "dp=2", 10**30),
     "got a number of 31 digits"),
    ("from_placements, None for the placements", lambda: lowering.from_placements(None, "dp=2", (8,)),
     "placements must be a list with one placement per mesh dim, or their text, got NoneType"),
    ("from_placements, a shard_order keyed by a name",
     lambda: lowering.from_placements("S(0)", "dp=2", (8,), shard_order={"a": 1}), "shard_order key 'a' is not"),
    ("from_placements, a shard_order entry that is not a list",
     lambda: lowering.from_placements("S(0)", "dp=2", (8,), shard_order={0: 1}), "shard_order[0] must be a list"),
    *[(f"from_placements, a numpy array {a.tolist()} for the shard_order",
       lambda a=a: lowering.from_placements("S(0)", "dp=2", (8,), shard_order=a), "shard_order must be a dict")
      for a in (np.array([0]), np.array([[0, 0]]), np.zeros(0))],
    ("simulate, None for the inputs", lambda: lowering.simulate(_program(), None), "simulate takes one array per rank"),
    ("make_step, a bytearray kind", lambda: lowering.make_step(bytearray(b"all_gather"), *GATHER),
     "unknown step kind"),
    ("CostModel.load, a bytearray path", lambda: lowering.CostModel.load(bytearray(b"m.json")),
     "named by a str or a path, got bytearray"),
    ("compile, a cost model path with a NUL", lambda: lowering.compile(*GATHER, cost_model="a\x00b"),
     "cannot read the cost model file 'a\\x00b'"),
    ("DynamicShard, a set of chunk sizes", lambda: lowering.DynamicShard(0, {7, 0, 3}),
     "must be a sequence of ints in order, got a set"),
    ("DynamicShard, a dict of chunk sizes", lambda: lowering.DynamicShard(0, {0: 3, 1: 5}),
     "must be a sequence of ints in order, got a dict"),
    ("from_placements, a bytearray shape", lambda: lowering.from_placements("S(0)", "dp=2", bytearray(b"\x08")),
     "shape must be a sequence of ints"),
    ("DynamicShard, a size of 5,000 digits", lambda: lowering.DynamicShard(0, (10**5000 - 1,)),
     "holds the size a number of 5,000 digits, which does not fit in int64"),
    ("AxisType, a numpy array", lambda: spec_lang.AxisType(np.array(["R", "P"])), "the local type must be a str"),
    # a number past Python's 4,300-digit int-string limit is named by its length, not printed
    ("local_shape, a rank of 5,001 digits", lambda: lowering.local_shape("f32[8@dp]", "dp=2", 10**5000),
     "rank a number of 5,001 digits is not on"),
    ("rank_pieces, members of 5,001 digits", lambda: lowering.rank_pieces(_step(), "dp=2", 0, members=(0, 10**5000)),
     "members a tuple holding a number too long to print are not rank 0's group"),
    ("DynamicShard, a dim of 5,001 digits", lambda: lowering.DynamicShard(10**5000, (3, 5)),
     "dim must be an int >= 0 (below 2**63), got a number of 5,001 digits"),
    ("PartitionedShard, 10**5000 partitions", lambda: lowering.PartitionedShard(0, 10**5000, ((1,), (2,))),
     "num_partitions must be an int >= 1, got a number of 5,001 digits"),
    ("compile, a budget of 5,001 digits", lambda: lowering.compile(*GATHER, budget_s=10**5000),
     "budget_s must be a positive finite number of seconds, got a number of 5,001 digits"),
    ("compile, a gap past int64", lambda: lowering.compile(*GATHER, gap_bytes=2**63),
     "gap_bytes must be >= 0 and below 2**63"),
    ("redistributor, a timeout of 5,001 digits", lambda: torch_backend.redistributor(*GATHER, timeout=10**5000),
     "timeout must be a positive finite number of seconds, got a number of 5,001 digits"),
    ("CostModel.make, an alpha of 5,001 digits", lambda: lowering.CostModel.make(alpha=10**5000),
     "alpha must be finite and >= 0, got a number of 5,001 digits"),
    ("check_placements, a shard_order dim of 5,001 digits",
     lambda: lowering.check_placements("S(0)", {10**5000: [0]}, "dp=2", 1),
     "shard_order tensor dim a number of 5,001 digits is out of range"),
    ("check_placements, a shard_order mesh dim of 5,001 digits",
     lambda: lowering.check_placements("S(0)", {0: [10**5000]}, "dp=2", 1),
     "mesh dim a number of 5,001 digits is out of range"),
]


@pytest.mark.parametrize("call,fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument_is_a_spec_error(call: Callable[[], Any], fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        call()
    assert fragment in str(info.value), str(info.value)
    assert info.value.hint, "every SpecError says how to fix it"


def test_typeof_of_a_number_is_untyped() -> None:
    """A Python number holds one value on every rank: untyped, like a plain tensor."""
    assert torch_backend.spmd.typeof(3) == {} == torch_backend.spmd.typeof(torch.zeros(2))


def test_strings_are_accepted_where_ir_is() -> None:
    """The layout entries take the DSL's strings as well as IR objects, like compile."""
    t, m = spec_lang.parse("f32[9@(dp,tp)]"), spec_lang.parse_mesh("dp=2,tp=2")
    assert lowering.local_shapes("f32[9@(dp,tp)]", "dp=2,tp=2") == lowering.local_shapes(t, m) == (
        (3,), (2,), (2,), (2,))
    assert lowering.local_shape("f32[9@(dp,tp)]", "dp=2,tp=2", 1) == (2,)
    np.testing.assert_array_equal(lowering.boxes("f32[9@(dp,tp)]", "dp=2,tp=2"), lowering.boxes(t, m))
    assert spec_lang.format_type("f32[8@dp]{U:tp}") == "float32[8@dp]{U:tp}"
    assert torch_backend.dual_type("f32[8@dp]{U:tp}") == torch_backend.dual_type(spec_lang.parse("f32[8@dp]{U:tp}"))
    assert lowering.check_type("f32[9@(dp,tp)]", "dp=2,tp=2") is None
    assert lowering.check_type(t, m) is None
    step = _step()
    assert lowering.rank_pieces(step, "dp=2", 1) == lowering.rank_pieces(step, spec_lang.parse_mesh("dp=2"), 1)
    assert lowering.rank_pieces(step, "dp=2", 1, members=(1, 0)).members == (1, 0)  # a process group's order


def _blocks(lm: Any, layout: str) -> Any:
    """Rank r's block of f32[8@dp] on dp=2, as a LocalTensor of dense or sparse (COO) tensors."""
    from torch.distributed._local_tensor import LocalTensor

    with lm.disable():
        blocks = {r: torch.arange(4.0) + 4 * r for r in range(2)}
        return LocalTensor({r: b.to_sparse() if layout == "sparse" else b for r, b in blocks.items()})


SP = torch_backend.spmd
TORCH_CASES: list[tuple[str, str, Callable[[Any], Any], str]] = [
    # a sparse tensor fails with the tensor checks, never inside the first collective
    ("redistribute", "sparse", lambda x: torch_backend.redistribute(x, *GATHER), "layout is torch.sparse_coo"),
    ("redistributor", "sparse", lambda x: torch_backend.redistributor(*GATHER)(x), "layout is torch.sparse_coo"),
    ("redistribute_many", "sparse", lambda x: torch_backend.redistribute_many([x], [GATHER[0]], [GATHER[1]], "dp=2"),
     "layout is torch.sparse_coo"),
    ("spmd.all_gather", "sparse", lambda x: SP.all_gather(x, "dp", src=SP.S(0), dst=SP.R, mesh="dp=2"),
     "layout is torch.sparse_coo"),
    ("spmd.convert", "sparse", lambda x: SP.convert(x, "dp", src=SP.S(0), dst=SP.P, mesh="dp=2"),
     "layout is torch.sparse_coo"),
    ("spmd.redistribute", "sparse", lambda x: SP.redistribute(x, "dp", src=SP.S(0), dst=SP.R, mesh="dp=2"),
     "layout is torch.sparse_coo"),
    ("execute", "sparse", lambda x: torch_backend.execute(_program(), x), "layout is torch.sparse_coo"),
    ("redistribute, a plain sparse tensor", "dense",
     lambda x: torch_backend.redistribute(torch.zeros(8).to_sparse(), "f32[8]", "f32[8@dp]", "dp=2"),
     "layout is torch.sparse_coo"),
    ("distribute", "dense", lambda x: torch_backend.distribute(torch.zeros(8).to_sparse(), "dp=2", "f32[8@dp]"),
     "layout is torch.sparse_coo"),
    # agree= is a bool: "no" is truthy, 0 and numpy's False are not bools
    ("redistribute, agree='no'", "dense", lambda x: torch_backend.redistribute(x, *GATHER, agree="no"),
     "agree must be True, False or None, got str 'no'"),
    ("redistribute, agree=0", "dense", lambda x: torch_backend.redistribute(x, *GATHER, agree=0),
     "agree must be True, False or None, got int 0"),
    ("redistributor, agree=np.False_", "dense", lambda x: torch_backend.redistributor(*GATHER, agree=np.False_),
     "agree must be True, False or None, got numpy.bool"),
    ("redistribute_many, agree='no'", "dense",
     lambda x: torch_backend.redistribute_many([x], [GATHER[0]], [GATHER[1]], "dp=2", agree="no"),
     "agree must be True, False or None"),
    ("uneven_type, dim None", "dense", lambda x: torch_backend.uneven_type(x, "dp=2", "dp", None),
     "dim None is not a dim of the local tensor"),
]


@pytest.mark.parametrize("layout,call,fragment", [c[1:] for c in TORCH_CASES], ids=[c[0] for c in TORCH_CASES])
def test_bad_tensor_argument_is_a_spec_error_before_any_collective(fake_pg, monkeypatch, layout: str,
                                                                     call: Callable[[Any], Any], fragment: str) -> None:
    """Under LocalTensorMode on a fake world of 2; a collective reached is a test failure."""
    from torch_utils import local_mode

    from torch_backend import comm

    def reached(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a collective ran before the bad argument was refused")

    for name in ("all_gather", "all_reduce", "all_to_all", "reduce_scatter", "p2p"):
        monkeypatch.setattr(comm, name, reached)
    with local_mode(fake_pg, 2) as lm:
        x = _blocks(lm, layout)
        with pytest.raises(SpecError) as info:
            call(x)
    assert fragment in str(info.value), str(info.value)
    assert info.value.hint, "every SpecError says how to fix it"


@pytest.mark.parametrize("axis", [np.array(["dp", "tp"]), np.array(["dp"]), 0])
def test_uneven_type_axis_not_a_name(fake_pg: Callable[[int], None], axis: Any) -> None:
    # a numpy array's `in` compared elementwise: a ValueError, or a one-name array taken for the name
    fake_pg(2)
    with pytest.raises(SpecError, match=r"axis must be a mesh axis name \(a str\), got "):
        torch_backend.uneven_type(torch.zeros(4), "dp=2", axis)
