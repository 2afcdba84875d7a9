"""Each step kind's one definition agrees with itself and with the planner.

* the type rule accepts every step the planner emits and derives the same dims and op;
* the per-rank pieces put exactly the price on the wire;
* the dual steps are the exact adjoint of the step in the numpy semantics
  (``<F x, y>_dst == <x, B y>_src`` on integer data, no finite differences);
* every pair a kind does not take is refused with a SpecError that names the rule.
"""

from __future__ import annotations

import numpy as np
import pytest
from typed_data import pairing, random_arrays

from lowering import compile, make_program, make_step
from lowering.kinds import KINDS, simulate_step, wire_bytes
from lowering.planner import dual_steps
from lowering.program import Step
from spec_lang.dual import dual_type
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh
from spec_lang.parser import parse_mesh

PAIRS = [
    ("dp=2,tp=4", "f32[12@(dp,tp),10]", "f32[12@tp,10]"),
    ("dp=2,tp=4", "f32[8,16]{U:tp}", "f32[8@tp,16]"),
    ("dp=2,tp=4", "f32[8@(dp,tp)]", "f32[8@(tp,dp)]"),
    ("dp=2,tp=4", "f32[8@dp,16@tp]", "f32[8,16]"),
    ("dp=2,tp=4", "f32[10@(dp,tp),3]", "f32[10,3@tp]{R:dp}"),
    ("dp=2,tp=3", "f32[7,5]{U:(dp,tp)}", "f32[7@tp,5@dp]"),
    ("dp=2,tp=3", "f32[7,5]{U:(dp,tp)}", "f32[7,5]{R:(dp,tp)}"),
    ("dp=2,tp=2", "f32[6]{U:dp}", "f32[6]{R:dp}"),
    ("dp=2,tp=2", "f32[6]{U:dp}", "f32[6]"),
    ("dp=2,tp=2", "f32[6@tp]{R:dp}", "f32[6@tp]{U:dp}"),
    ("dp=2,tp=2", "f32[6@tp]", "f32[6]{U:tp}"),
    ("dp=2,tp=2", "f32[6]", "f32[6@tp]{R:dp}"),
    ("dp=2,tp=2", "f32[6]{R:dp}", "f32[6@dp]"),
    ("dp=2,tp=2", "f32[6]{R:dp}", "f32[6]"),
    ("dp=2,tp=2", "f32[6]", "f32[6]{R:dp}"),
    ("dp=2,tp=2", "f32[6]{R:tp}", "f32[6]{P(avg):tp}"),
    ("dp=2,tp=2", "f32[6]{P(avg):tp}", "f32[6@tp]"),
    ("x=4", "f32[7@x,10]", "f32[7,10@x]"),
    ("x=3", "f32[7@x,5]", "f32[7,5]{R:x}"),
    ("dp=2,tp=2", "f32[4,6]{V:dp}", "f32[4@tp,6]{V:dp}"),
    ("dp=2,tp=2,cp=2", "f32[6@dp,6@tp,5@cp]", "f32[6@dp,6,5]"),
    ("a=2,b=3,c=2", "f32[5@a,7@(b,c)]{U:c}", "f32[5,7@b]{R:a}") if False else
    ("a=2,b=3,c=2", "f32[5@a,7@b]{U:c}", "f32[5,7@(b,c)]{R:a}"),
    # uneven placements: exact exchanges
    ("dp=3", "f32[8@dp<3,1,4>,2]", "f32[8@dp<2,4,2>,2]"),
    ("dp=3", "f32[8@dp<3,0,5>,2]", "f32[8,2]"),
    ("dp=3,tp=2", "f32[8,2]{U:dp}", "f32[8@dp<3,1,4>,2]"),
    ("dp=3,tp=4", "f32[8@dp<3,1,4>,12]{P(avg):tp}", "f32[8@dp<0,4,4>,12@tp]"),
    ("dp=3,tp=2", "f32[8@dp<3,1,4>,12]{U:tp}", "f32[8@dp<3,1,4>,12]"),
    ("ep=2", "f32[32@ep<parts 4,6,4,2|2,4,8,2>,3]", "f32[32@ep<aligned 4,6,4,2|2,4,8,2>,3]"),
    ("dp=3,tp=2", "f32[4@dp<ragged 1,2,1 over 2>,6,4@tp]", "f32[4,6,4]{U:dp}"),
    ("dp=3,tp=2", "f32[4,6,4]{R:dp}", "f32[4@dp<ragged 1,2,1 over 2>,6,4]{U:tp}"),
    # balanced sources on plain layouts: the replicas over y take turns serving z's needers
    ("y=2,z=4", "f32[3,1@z]", "f32[3@z,1@y]"),
    # a two-phase relay: few holders, many needers (each group of needers splits its own way)
    ("dp=4,tp=2", "f32[4@(tp,dp),4]", "f32[4,4@tp]"),
]


def _steps() -> list[tuple[str, Mesh, Step]]:
    out = []
    for mesh, src, dst in PAIRS:
        m = parse_mesh(mesh)
        for i, s in enumerate(compile(src, dst, m).steps):
            out.append((f"{src}->{dst}#{i}", m, s))
    return out


STEPS = _steps()


def test_every_kind_is_exercised() -> None:
    assert {s.kind for _, _, s in STEPS} == {k for k, v in KINDS.items() if v.planned}


@pytest.mark.parametrize("name,mesh,step", STEPS, ids=[n for n, _, _ in STEPS])
def test_type_rule_rebuilds_the_planners_step(name: str, mesh: Mesh, step: Step) -> None:
    again = make_step(step.kind, step.src, step.dst, mesh, axes=step.axes, padded=step.padded)
    assert again == step
    assert again.bytes_sent == step.bytes_sent and again.bytes_recv == step.bytes_recv
    assert wire_bytes(step, mesh) == step.bytes_sent
    assert wire_bytes(step, mesh, received=True) == step.bytes_recv


@pytest.mark.parametrize("name,mesh,step", STEPS, ids=[n for n, _, _ in STEPS])
def test_dual_is_the_exact_adjoint(name: str, mesh: Mesh, step: Step) -> None:
    rng = np.random.default_rng(len(name))
    back = dual_steps(step, mesh)
    assert back[0].src == dual_type(step.dst) and back[-1].dst == dual_type(step.src)
    x = random_arrays(step.src, mesh, rng)
    y = random_arrays(dual_type(step.dst), mesh, rng)
    fx = simulate_step(step, mesh, x)
    by = y
    for b in back:
        by = simulate_step(b, mesh, by)
    assert pairing(step.dst, mesh, fx, y) == pairing(step.src, mesh, x, by)


@pytest.mark.parametrize("kind,src,dst", [
    ("all_gather", "f32[8@tp]", "f32[8@tp]{R:dp}"),  # nothing gathered
    ("all_gather", "f32[8@(dp,tp)]", "f32[8@tp]"),  # dp is not the minor end
    ("all_gather", "f32[8@tp]{U:dp}", "f32[8]"),  # a reduction is not a gather
    ("reduce_scatter", "f32[8]", "f32[8@tp]"),  # nothing pending
    ("reduce_scatter", "f32[8]{U:tp}", "f32[8]"),  # reduced axis shards no dim
    ("all_reduce", "f32[8]{R:tp}", "f32[8]"),  # all_reduce from R
    ("all_reduce", "f32[8]{U:tp}", "f32[8@tp]"),  # dims change
    ("all_to_all", "f32[8@tp,4]", "f32[8@tp,4]{R:dp}"),  # no block moves
    ("all_to_all", "f32[8,4]", "f32[8,4@tp]"),  # tp does not shard the source
    ("slice", "f32[8@tp]", "f32[8]"),  # slicing removes nothing
    ("slice", "f32[8]{U:tp}", "f32[8@tp]"),  # P is not replicated
    ("zero_fill", "f32[8]{U:tp}", "f32[8]"),  # convert out of P
    ("zero_fill", "f32[8]", "f32[8]{P(max):tp}"),  # not a sum
    ("zero_pad", "f32[8@tp]", "f32[8]"),  # removed axis must become P
    ("reinterpret", "f32[8@tp]", "f32[8]"),  # dims change
    ("reinterpret", "f32[8]", "f32[8]{U:tp}"),  # R -> P(sum) changes the value
    ("permute", "f32[8@tp,4]", "f32[8,4@tp]"),  # more than one sender per receiver
    ("all_to_allv", "f32[8]{U:tp}", "f32[8@tp<1,3,4,0>]"),  # it would finish a reduction
    ("reduce_scatterv", "f32[8@tp<1,3,4,0>]", "f32[8]"),  # nothing pending
    ("all_to_allv", "f32[8@tp<1,3,4,0>]", "f32[8@tp<1,3,4,0>]{V:dp}"),  # V axes change
    ("relay", "f32[8]{U:tp}", "f32[8@tp]"),  # it would finish a reduction
    ("relay", "f32[8@tp<1,3,4,0>]", "f32[8]"),  # uneven
    ("relay", "f32[8@tp]", "f32[8@tp]{R:dp}"),  # nothing moves
])
def test_refused_pairs_name_the_rule(kind: str, src: str, dst: str) -> None:
    with pytest.raises(SpecError, match=kind):
        make_step(kind, src, dst, "dp=2,tp=4")


def test_unknown_kind_and_axes() -> None:
    with pytest.raises(SpecError, match="unknown step kind 'gather'"):
        make_step("gather", "f32[8@tp]", "f32[8]", "tp=4")
    with pytest.raises(SpecError, match="not on the mesh"):
        make_step("all_gather", "f32[8@tp]", "f32[8]", "tp=4", axes="dp")
    with pytest.raises(SpecError, match="not 'dp'|not \\['dp'\\]"):
        make_step("all_gather", "f32[8@tp]", "f32[8]", "dp=2,tp=4", axes="dp")


def test_make_step_derives_dims_op_and_group_order() -> None:
    s = make_step("reduce_scatter", "f32[8,6]{P(avg):(dp,tp)}", "f32[8@tp,6@dp]", "dp=2,tp=4")
    assert (s.axes, s.dims, s.op, s.padded) == (("tp", "dp"), (0, 1), "avg", False)
    s = make_step("all_gather", "f32[10@(dp,tp)]", "f32[10]", "dp=2,tp=4", axes=("tp", "dp"))
    assert s.axes == ("tp", "dp") and s.bytes_sent_max > 0
    assert make_step("all_to_all", "f32[8@(dp,tp)]", "f32[8@(tp,dp)]", "dp=2,tp=4").kind == "permute"


def test_make_program_chains_and_prices() -> None:
    mesh = "dp=2,tp=4"
    a = make_step("slice", "f32[8,6]{U:tp}", "f32[8,6@dp]{U:tp}", mesh)
    b = make_step("reduce_scatter", "f32[8,6@dp]{U:tp}", "f32[8@tp,6@dp]", mesh)
    p = make_program([a, b], mesh)
    assert p.cost.bytes_max == b.bytes_max and p.cost.collectives == 1
    with pytest.raises(SpecError, match="starts at"):
        make_program([b, a], mesh)


def test_unpadded_reduce_scatter_is_priced_exactly() -> None:
    padded = make_step("reduce_scatter", "f32[10]{U:tp}", "f32[10@tp]", "tp=4")
    exact = make_step("reduce_scatter", "f32[10]{U:tp}", "f32[10@tp]", "tp=4", padded=False)
    assert padded.padded and not exact.padded
    # pieces 3,3,3,1: padded, 3 chunks of 3; exact, every piece but the rank's own
    assert padded.bytes_sent == (36, 36, 36, 36)
    assert exact.bytes_sent == (28, 28, 28, 36)
