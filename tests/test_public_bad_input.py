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
from spec_lang.errors import SpecError

torch = pytest.importorskip("torch")

import torch_backend  # noqa: E402 - after the importorskip

GATHER = ("f32[8@dp]", "f32[8]", "dp=2")


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
    ("spmd.typeof, not a tensor", lambda: torch_backend.spmd.typeof("f32[8@dp]"), "spmd.typeof takes a tensor"),
    ("spmd.typeof, a list", lambda: torch_backend.spmd.typeof([torch.zeros(2)]), "takes a tensor, got list"),
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
