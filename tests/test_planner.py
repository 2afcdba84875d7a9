"""The planner on worked examples, its cost figures, caching, and its refusals."""

from __future__ import annotations

import json

import pytest

from lowering import CostModel, compile, lower_bound
from spec_lang import SpecError

MESH = "dp=2,tp=4"


def kinds(prog) -> list[str]:
    return [s.kind for s in prog.steps]


def test_axis_order_swap_is_one_permute_at_the_lower_bound() -> None:
    prog = compile("f32[8@(dp,tp)]", "f32[8@(tp,dp)]", MESH)
    assert kinds(prog) == ["permute"]
    assert prog.steps[0].axes == ("dp", "tp")
    assert prog.cost.bytes_max == lower_bound("f32[8@(dp,tp)]", "f32[8@(tp,dp)]", MESH) == 4
    assert prog.cost.collectives == 1


def test_pending_sum_to_shard_is_a_reduce_scatter_not_all_reduce_plus_slice() -> None:
    prog = compile("f32[8,16]{U:tp}", "f32[8@tp,16]", "tp=4")
    assert kinds(prog) == ["reduce_scatter"]
    assert prog.steps[0].op == "sum"
    # (n-1)/n of the 512-byte buffer
    assert prog.cost.bytes_max == 384


def test_small_reduction_is_not_split_over_a_spare_axis() -> None:
    # dp is spare (both types replicate it): splitting saves 128 B for one more collective,
    # less than the 64 KiB a collective over a spare axis is charged, so one reduce_scatter
    prog = compile("f32[8,16]{U:tp}", "f32[8@tp,16]", MESH)
    assert kinds(prog) == ["reduce_scatter"] and prog.steps[0].axes == ("tp",)
    assert prog.cost.bytes_max == 384 and prog.cost.collectives == 1


def test_large_reduction_is_split_over_a_spare_axis() -> None:
    src, dst = "bf16[4096,4096]{U:tp}", "bf16[4096@tp,4096]"
    prog = compile(src, dst, MESH)
    assert kinds(prog) == ["slice", "reduce_scatter", "all_gather"]
    assert prog.steps[0].axes == prog.steps[2].axes == ("dp",)
    assert prog.cost.bytes_max == lower_bound(src, dst, MESH) == 16 * 2**20  # single RS: 24 MiB


def test_slow_spare_axis_keeps_a_large_reduction_whole() -> None:
    # dp ten times slower than tp: the split would send 4 MiB over dp to save 28 MiB on tp
    src, dst, mesh = "bf16[4096,8192]{U:tp}", "bf16[4096@tp,8192]", "dp=2,tp=8"
    model = CostModel.make(beta={"dp": 2e-11, "tp": 2.2e-12})
    assert kinds(compile(src, dst, mesh, cost_model=model)) == ["reduce_scatter"]
    assert kinds(compile(src, dst, mesh)) == ["slice", "reduce_scatter", "all_gather"]


@pytest.mark.parametrize("charge", [0, 127])
def test_spare_axis_charge_sets_where_the_split_starts(charge: int) -> None:
    # the split saves exactly 128 B here: taken when the charge is below it
    model = CostModel.make(spare_axis_bytes=charge)
    prog = compile("f32[8,16]{U:tp}", "f32[8@tp,16]", MESH, cost_model=model)
    assert prog.cost.bytes_max == lower_bound("f32[8,16]{U:tp}", "f32[8@tp,16]", MESH) == 256
    assert prog.cost.collectives == 2
    equal = compile("f32[8,16]{U:tp}", "f32[8@tp,16]", MESH, cost_model=CostModel.make(spare_axis_bytes=128))
    assert equal.cost.collectives == 1  # a tie keeps the fewer collectives


def test_spare_axes_are_those_both_types_replicate() -> None:
    from lowering.labels import spare_axes
    from spec_lang import parse, parse_mesh

    mesh = parse_mesh("dp=2,cp=2,tp=2")
    assert spare_axes(parse("f32[8,16]{U:tp}"), parse("f32[8@tp,16]"), mesh) == ("dp", "cp")
    assert spare_axes(parse("f32[8@cp,16]{V:dp}"), parse("f32[8,16]{V:dp}"), mesh) == ("tp",)


def test_gathers_of_two_dims_are_one_flattened_collective() -> None:
    prog = compile("f32[8@dp,16@tp]", "f32[8,16]", MESH)
    assert kinds(prog) == ["all_gather"]
    assert prog.steps[0].dims == (0, 1) and prog.steps[0].axes == ("dp", "tp")
    assert prog.cost.bytes_max == 7 * 64  # (n-1) * b over the 8-rank group


def test_pending_sum_onto_two_dims_is_one_reduce_scatter() -> None:
    src, dst = "f32[8,16]{U:(dp,tp)}", "f32[8@tp,16@dp]"
    prog = compile(src, dst, MESH)
    assert kinds(prog) == ["reduce_scatter"]
    assert prog.steps[0].dims == (0, 1) and prog.steps[0].axes == ("tp", "dp")
    assert prog.cost.bytes_max == lower_bound(src, dst, MESH) == 448


def test_uneven_two_dim_gather_after_a_reduce_scatter() -> None:
    # rd-pub-070: DTensor needs 216 B in 2 collectives; gathering cp and tp in one uneven
    # ring after the reduce_scatter sends 198 B, also in 2
    prog = compile("bf16[6@dp,6,5@cp]{U:tp}", "bf16[6@dp,6,5]", "dp=2,cp=2,tp=2")
    assert kinds(prog) == ["reduce_scatter", "all_gather"]
    assert prog.steps[1].dims == (1, 2)
    assert prog.cost.bytes_max == 198 and prog.cost.collectives == 2


def test_latency_heavy_model_prefers_fewer_collectives() -> None:
    model = CostModel.make(default_alpha=1e-3, default_beta=1e-10)
    prog = compile("f32[8,16]{U:tp}", "f32[8@tp,16]", MESH, cost_model=model)
    assert kinds(prog) == ["reduce_scatter"]
    assert prog.cost.collectives == 1


def test_uneven_gather_is_priced_as_an_exact_ring() -> None:
    prog = compile("f32[5@x]", "f32[5]", "x=8")
    assert kinds(prog) == ["all_gather"]
    assert prog.cost.bytes_max == 20  # the lower bound; padding would send 28
    assert prog.steps[0].in_shapes == ((1,),) * 5 + ((0,),) * 3


def test_flattened_gather_in_shard_order() -> None:
    prog = compile("f32[8@(tp,dp),16]", "f32[8,16]", MESH)
    assert kinds(prog) == ["all_gather"]
    assert prog.steps[0].axes == ("tp", "dp")


def test_replicated_to_partial_is_a_local_zero_fill() -> None:
    prog = compile("f32[4]", "f32[4]{U:tp}", MESH)
    assert kinds(prog) == ["zero_fill"]
    assert prog.cost.bytes_max == 0 and prog.cost.collectives == 0


def test_program_text_and_json() -> None:
    prog = compile("f32[8@(dp,tp)]", "f32[8@(tp,dp)]", MESH)
    text = str(prog)
    assert "permute(dp,tp)" in text and "float32[8@(tp,dp)]" in text and "B/rank" in text
    data = json.loads(prog.to_json_str())
    assert data["cost"]["bytes_max"] == 4
    assert data["steps"][0]["out_shapes"] == [[1]] * 8


def test_compile_is_cached() -> None:
    a = compile("f32[8@dp,16@tp]", "f32[8@tp,16@dp]", MESH)
    b = compile("f32[8@dp,16@tp]", "f32[8@tp,16@dp]", MESH)
    assert a is b


def test_peak_is_bounded_by_endpoints_plus_one_step() -> None:
    prog = compile("f32[16,4@(dp,tp)]", "f32[16@tp,4]", "dp=4,tp=2")
    src_max = max(4 * (s[0] * s[1]) for s in prog.steps[0].in_shapes)
    dst_max = max(4 * (s[0] * s[1]) for s in prog.steps[-1].out_shapes)
    step_max = max(4 * (s[0] * s[1]) for st in prog.steps for s in st.out_shapes)
    assert prog.cost.peak_bytes_max <= max(src_max, dst_max) + step_max


def test_bad_cost_model_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="cost_model must be"):
        compile("f32[8@dp]", "f32[8]", MESH, cost_model=3.5)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="cannot read the cost model file 'fast'"):  # a str is a path
        compile("f32[8@dp]", "f32[8]", MESH, cost_model="fast")
    with pytest.raises(SpecError, match="not on the mesh"):
        compile("f32[8@dp]", "f32[8]", MESH, cost_model=CostModel.make(alpha={"pp": 1e-6}))
    with pytest.raises(SpecError, match="spare_axis_bytes must be >= 0"):
        compile("f32[8@dp]", "f32[8]", MESH, cost_model=CostModel.make(spare_axis_bytes=-1))


@pytest.mark.parametrize(
    ("src", "dst", "mesh", "needle"),
    [
        ("f32[8]", "f32[9]", MESH, "global shapes differ"),
        ("f32[8]", "bf16[8]", MESH, "dtypes differ"),
        ("f32[8@pp]", "f32[8]", MESH, "not on the mesh"),
        ("f32[8]{P(max):tp}", "f32[8]{U:tp}", MESH, "pending max into a pending sum"),
        ("f32[8@tp]", "f32[8]{P(max):tp}", MESH, "convert(S, P) only for sum"),
        ("f32[8]{V:tp}", "f32[8]", MESH, "varying axes differ"),
        ("f32[8@", "f32[8]", MESH, "malformed type"),
    ],
)
def test_bad_input_is_a_spec_error(src: str, dst: str, mesh: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        compile(src, dst, mesh)
