"""Every step kind's JAX lowering against its numpy semantics (``lowering.simulate``).

Each step of the step-kind suite's pairs (every planned kind, even and uneven, the relay),
the reductions' ops, and the SPMD API's own kinds, run as one ``shard_map`` on 8 CPU
devices (conftest sets XLA_FLAGS) through ``jax_backend.engine.run_blocks``, which takes
one block per rank like the simulator. Also: which lowering each even collective gets.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from typed_data import random_arrays  # noqa: E402

import lowering  # noqa: E402
from jax_backend import LOWERINGS, box_exchange, describe  # noqa: E402
from jax_backend.engine import blocks_call, blocks_out, run_blocks  # noqa: E402
from jax_backend.lowerings import lower_step  # noqa: E402
from lowering.kinds.base import KINDS  # noqa: E402
from lowering.program import Program, Step  # noqa: E402
from spec_lang.ir import Mesh  # noqa: E402
from spec_lang.parser import parse_mesh  # noqa: E402

if len(jax.devices()) < 8:
    pytest.skip("jax sees fewer than 8 devices (XLA_FLAGS was set too late)", allow_module_level=True)

PAIRS = [
    ("dp=2,tp=4", "f32[12@(dp,tp),10]", "f32[12@tp,10]"),
    ("dp=2,tp=4", "f32[8,16]{U:tp}", "f32[8@tp,16]"),
    ("dp=2,tp=4", "f32[8@(dp,tp)]", "f32[8@(tp,dp)]"),
    ("dp=2,tp=4", "f32[8@dp,16@tp]", "f32[8,16]"),
    ("dp=2,tp=4", "f32[10@(dp,tp),3]", "f32[10,3@tp]{R:dp}"),
    ("dp=2,tp=3", "f32[7,5]{U:(dp,tp)}", "f32[7@tp,5@dp]"),
    ("dp=2,tp=2", "f32[6]{U:dp}", "f32[6]{R:dp}"),
    ("dp=2,tp=2", "f32[6]{U:dp}", "f32[6]"),
    ("dp=2,tp=2", "f32[6@tp]{R:dp}", "f32[6@tp]{U:dp}"),
    ("dp=2,tp=2", "f32[6@tp]", "f32[6]{U:tp}"),
    ("dp=2,tp=2", "f32[6]", "f32[6@tp]{R:dp}"),
    ("dp=2,tp=2", "f32[6]{R:tp}", "f32[6]{P(avg):tp}"),
    ("dp=2,tp=2", "f32[6]{P(avg):tp}", "f32[6@tp]"),
    ("x=4", "f32[7@x,10]", "f32[7,10@x]"),
    ("dp=2,tp=2", "f32[4,6]{V:dp}", "f32[4@tp,6]{V:dp}"),
    ("dp=2,tp=2,cp=2", "f32[6@dp,6@tp,5@cp]", "f32[6@dp,6,5]"),
    ("a=2,b=2,c=2", "f32[4@a,8@b]{U:c}", "f32[4,8@(b,c)]{R:a}"),
    ("dp=4,tp=2", "f32[16@(tp,dp),16]", "f32[16,16@dp]"),
    ("dp=2,tp=4", "f32[16@dp,8@tp]", "f32[16@tp,8@dp]"),
    ("dp=2,tp=4", "f32[16@dp,8]", "f32[16,8@(dp,tp)]"),
    ("dp=2,tp=4", "f32[8,8]{P(max):tp}", "f32[8@tp,8]"),
    ("dp=2,tp=4", "f32[8,8]{P(min):(dp,tp)}", "f32[8,8]"),
    ("dp=2,tp=4", "f32[8,8]{P(avg):tp}", "f32[8,8]"),
    ("dp=2,tp=4", "i32[8,8]{P(avg):(dp,tp)}", "i32[8@tp,8]"),
    # uneven placements: exact exchanges
    ("dp=3", "f32[8@dp<3,1,4>,2]", "f32[8@dp<2,4,2>,2]"),
    ("dp=3", "f32[8@dp<3,0,5>,2]", "f32[8,2]"),
    ("dp=3,tp=2", "f32[8,2]{U:dp}", "f32[8@dp<3,1,4>,2]"),
    ("dp=3,tp=2", "f32[8@dp<3,1,4>,12]{U:tp}", "f32[8@dp<3,1,4>,12]"),
    ("ep=2", "f32[32@ep<parts 4,6,4,2|2,4,8,2>,3]", "f32[32@ep<aligned 4,6,4,2|2,4,8,2>,3]"),
    ("dp=3,tp=2", "f32[4@dp<ragged 1,2,1 over 2>,6,4@tp]", "f32[4,6,4]{U:dp}"),
    ("dp=3,tp=2", "f32[4,6,4]{R:dp}", "f32[4@dp<ragged 1,2,1 over 2>,6,4]{U:tp}"),
    ("y=2,z=4", "f32[3,1@z]", "f32[3@z,1@y]"),
    ("dp=4,tp=2", "f32[4@(tp,dp),4]", "f32[4,4@tp]"),
]
TYPED = [  # the SPMD API's kinds (not planned: built by hand)
    ("pcast", "dp=2,tp=3", "f32[4]{R:tp}", "f32[4]{V:tp}"),
    ("pcast", "dp=2,tp=3", "f32[4,2]{V:(dp,tp)}", "f32[4,2]{U:(dp,tp)}"),
    ("stack", "dp=2,tp=3", "f32[4]{V:tp}", "f32[3@tp,4]"),
    ("stack", "dp=2,tp=3", "f32[3@tp,4]{R:dp}", "f32[4]{V:tp, R:dp}"),
    ("divide", "dp=2,tp=3", "f32[4,3@tp]{R:dp}", "f32[4,3@tp]{U:dp}"),
    ("divide", "dp=2,tp=4", "f32[5@tp,2]", "f32[5@tp,2]{U:dp}"),
]


def _steps() -> list[tuple[str, Mesh, Step]]:
    out = []
    for mesh, src, dst in PAIRS:
        m = parse_mesh(mesh)
        for i, s in enumerate(lowering.compile(src, dst, m).steps):
            out.append((f"{src}->{dst}#{i}:{s.kind}", m, s))
    for kind, mesh, src, dst in TYPED:
        m = parse_mesh(mesh)
        out.append((f"{src}->{dst}:{kind}", m, lowering.make_step(kind, src, dst, m)))
    return out


STEPS = _steps()


def _assert_runs_as_simulated(program: Program, xs: list[np.ndarray]) -> None:
    """The JAX run of ``program`` gives ``lowering.simulate``'s blocks, shape and values."""
    for a, b in zip(run_blocks(program, xs), lowering.simulate(program, xs), strict=True):
        assert a.shape == b.shape and np.array_equal(a, b)


def test_every_kind_is_lowered_and_exercised() -> None:
    one_mesh = {k for k, v in KINDS.items() if not v.crosses}  # the JAX engine runs programs on one mesh
    assert set(LOWERINGS) == one_mesh
    assert {s.kind for _, _, s in STEPS} == one_mesh


@pytest.mark.parametrize("name,mesh,step", STEPS, ids=[n for n, _, _ in STEPS])
def test_lowering_matches_simulate(name: str, mesh: Mesh, step: Step) -> None:
    program = lowering.make_program([step], mesh)
    xs = random_arrays(step.src, mesh, np.random.default_rng(len(name)))
    xs = [x.astype(np.int32 if step.src.dtype == "int32" else np.float32) for x in xs]
    want = lowering.simulate(program, xs)
    got = run_blocks(program, xs)
    for r, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.shape == b.shape and np.array_equal(a, b), f"rank {r}: {a} != {b}"


@pytest.mark.parametrize("src,dst,mesh,call", [
    ("f32[16,16]{U:tp}", "f32[16@tp,16]", "dp=2,tp=4", "lax.psum_scatter(x, 'tp', scatter_dimension=0"),
    ("f32[16@(dp,tp),8]", "f32[16@dp,8]", "dp=2,tp=4", "lax.all_gather(x, 'tp', axis=0, tiled=True)"),
    ("f32[16,8]{U:(dp,tp)}", "f32[16,8]", "dp=2,tp=4", "lax.psum(x, ('dp', 'tp'))"),
    ("f32[16@tp,8]", "f32[16,8@tp]", "dp=2,tp=4", "lax.all_to_all(x, 'tp', split_axis=1, concat_axis=0"),
    ("f32[16,8]", "f32[16@tp,8]", "dp=2,tp=4", "lax.dynamic_slice_in_dim"),
    # a merged exchange where every member sends every other a piece: one all_to_all
    ("f32[16@(tp,dp),16]", "f32[16,16@dp]", "dp=4,tp=2", "lax.all_to_all(take(cells(x, [2, 4]), send[me]), ('dp', 'tp'), 0, 0"),
])
def test_even_collectives_become_their_lax_call(src: str, dst: str, mesh: str, call: str) -> None:
    text = "\n".join(describe(lowering.compile(src, dst, mesh)))
    assert call in text and "ppermute" not in text, text


@pytest.mark.parametrize("src,dst,mesh,calls", [
    # members that talk to one or two peers: ppermute rounds of box pieces (a padded
    # all_to_all would send 3.5x the bytes: over PAD_CAP)
    ("f32[16@dp,8@tp]", "f32[16@tp,8@dp]", "dp=2,tp=4", 2),
    # large pieces: the padding would cost more than the rounds' latency
    ("f32[4096@dp,2048@tp]", "f32[4096@tp,2048@dp]", "dp=2,tp=4", 2),
    # whole blocks to one peer each: one ppermute of the block itself
    ("f32[16@(dp,tp),8]", "f32[16@(tp,dp),8]", "dp=2,tp=4", 1),
])
def test_sparse_exchanges_become_ppermute_rounds(src: str, dst: str, mesh: str, calls: int) -> None:
    # rounds: each a ppermute, or (small pieces moved within pairs of ranks) an all_to_all
    # within those pairs; never a dense or padded all_to_all over the step's axes
    lines = describe(lowering.compile(src, dst, mesh))[1:]
    rounds = [ln for ln in lines if "lax.ppermute(" in ln or "axis_index_groups" in ln]
    assert len(rounds) == calls, lines
    assert not any("all_to_all(" in ln and "axis_index_groups" not in ln for ln in lines), lines
    assert any("lax.ppermute(x," in ln for ln in lines) == (calls == 1), lines


def _forget_lowerings() -> None:
    box_exchange.box_plan.cache_clear()


@pytest.mark.parametrize("src,dst,mesh", [
    ("f32[8@(dp,tp),12]", "f32[8@tp,12@dp]", "dp=4,tp=2"),
    ("f32[4@dp,8@tp,8]", "f32[4,8@dp,8@tp]", "dp=2,tp=4"),
])
def test_small_sparse_exchanges_are_one_padded_all_to_all(src: str, dst: str, mesh: str,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          request: pytest.FixtureRequest) -> None:
    # each ppermute round pays a collective's latency (~0.15 ms on XLA:CPU): 4 rounds of tiny
    # pieces could move in one all_to_all, but it sends 1.75x their bytes, more than the
    # shipped cap allows (which keeps shardc at or below XLA's bytes): rounds by default
    program = lowering.compile(src, dst, mesh)
    assert box_exchange.PAD_CAP < 1.75
    assert "lax.ppermute(" in "\n".join(describe(program))
    # with a looser cap the padded all_to_all runs, its values still the kind's
    monkeypatch.setattr(box_exchange, "PAD_CAP", 2.0)
    request.addfinalizer(_forget_lowerings)  # later tests lower these steps under the shipped cap
    _forget_lowerings()
    text = "\n".join(describe(program))
    assert "ppermute" not in text and text.count("lax.all_to_all(") == 1, text
    xs = [x.astype(np.float32) for x in random_arrays(program.steps[0].src, program.mesh, np.random.default_rng(0))]
    _assert_runs_as_simulated(program, xs)


@pytest.mark.parametrize("src,dst,mesh", [
    ("f32[8192@(dp,tp),12288]", "f32[8192@tp,12288@dp]", "dp=4,tp=2"),
    ("f32[4096@dp,8192@tp,8192]", "f32[4096,8192@dp,8192@tp]", "dp=2,tp=4"),
])
def test_rounds_are_as_few_as_the_busiest_rank_needs(src: str, dst: str, mesh: str) -> None:
    # Konig: a bipartite graph's edges colour in max-degree colours (greedy took 5 on the first)
    from jax_backend.box_exchange import box_plan

    t, m = lowering.resolve(src, mesh)
    plan = box_plan(lowering.compile(src, dst, mesh).steps[0], m)
    assert plan is not None and getattr(plan, "packed", None) is None
    sent = [rd for rd in plan.rounds if not rd.local]
    degree = max(sum(1 for rd in sent for q, r in rd.pairs if q != r and v in ((q, r)[side],)) for v in range(m.size)
                 for side in (0, 1))
    assert len(sent) == degree == 4


@pytest.mark.parametrize("mesh,src,dst", [
    ("dp=4,tp=2", "f32[4@(tp,dp),4]", "f32[4,4@tp]"),
    ("dp=4,tp=2", "f32[16@(tp,dp),6]", "f32[16,6@tp]"),
    ("x=8", "f32[8@x,3]", "f32[8,3]"),
])
def test_relay_sends_what_its_plan_prices(mesh: str, src: str, dst: str) -> None:
    # two phases (holder -> owner, owner -> needers), not direct sends from the holders
    from jax_backend.tables import step_tables

    m = parse_mesh(mesh)
    step = lowering.make_step("relay", src, dst, m)
    tables = step_tables(step, m)
    sent = np.zeros(m.size, dtype=np.int64)
    for rd in (*tables.rounds, *getattr(tables, "fan_out", ())):
        for q, r in rd.perm:
            sent[q] += rd.received(r)  # what r receives from q
    assert sent.tolist() == KINDS["relay"].price(step.src, step.dst, m, step.axes).tolist()
    program = lowering.make_program([step], m)
    xs = [x.astype(np.float32) for x in random_arrays(step.src, m, np.random.default_rng(1))]
    _assert_runs_as_simulated(program, xs)


@pytest.mark.parametrize("mesh,src,dst", [
    ("dp=4,tp=2", "f32[8@dp]", "f32[8@tp]"),
    ("dp=4,tp=2", "f32[16,16,16@dp]", "f32[16,16,16@tp]"),
    ("dp=2,tp=4", "f32[16@dp,8]", "f32[16,8@(dp,tp)]"),
])
def test_replicated_sources_send_box_pieces(mesh: str, src: str, dst: str) -> None:
    # members holding one box hold the same values: one of them sends each piece (box
    # pieces, tables as small as the mesh), not the per-element tables (the steps' own
    # lowerings: the engine runs the first pair's whole program as whole blocks gathered
    # within groups, test_jax_redistribute)
    program = lowering.compile(src, dst, mesh)
    text = "\n".join(c for s in program.steps for c in lower_step(s, program.mesh).calls)
    assert ("dynamic_slice(x" in text or "take(cells(x" in text) and "lax.ppermute(x," not in text, text
    sent = np.zeros(program.mesh.size, dtype=np.int64)
    from jax_backend.box_exchange import box_plan

    plan = box_plan(program.steps[0], program.mesh)
    assert plan is not None
    for rd in plan.rounds:
        for q, r in rd.pairs:
            sent[q] += int(np.prod(rd.shape)) if q != r else 0
    assert sent.max() * 4 <= program.cost.bytes_sent_max
    xs = [x.astype(np.float32) for x in random_arrays(program.steps[0].src, program.mesh, np.random.default_rng(2))]
    _assert_runs_as_simulated(program, xs)


@pytest.mark.parametrize("mesh,src,dst", [
    ("dp=2,cp=2,tp=2", "i32[32,4@tp]", "i32[32@tp,4]"),
    ("dp=2,cp=2,tp=2", "f32[4@cp,8]{U:(dp,tp)}", "f32[4,8@cp]{U:(dp,tp)}"),
])
def test_a_swap_within_pairs_is_one_all_to_all(mesh: str, src: str, dst: str) -> None:
    # each member keeps half and swaps half with its one peer: lax.all_to_all over the pair
    # (as XLA's reshard), not a ppermute plus the kept half's copy
    program = lowering.compile(src, dst, mesh)
    text = "\n".join(describe(program))
    assert "ppermute" not in text and "lax.all_to_all(" in text, text
    xs = random_arrays(program.steps[0].src, program.mesh, np.random.default_rng(3))
    xs = [x.astype(np.int32 if program.src.dtype == "int32" else np.float32) for x in xs]
    _assert_runs_as_simulated(program, xs)


@pytest.mark.parametrize("mesh,src,dst", [
    ("dp=2,tp=4", "f32[16@dp,16@tp]", "f32[16@tp,16@dp]"),
    ("dp=2,tp=4", "f32[4096@dp,2048@tp]", "f32[4096@tp,2048@dp]"),
])
def test_rounds_on_one_grid_assemble_by_cells(mesh: str, src: str, dst: str) -> None:
    # pieces that are cells of one grid on both blocks: the output is the received pieces
    # stacked and laid out by one transpose, with no spare slab and no per-piece writes (a
    # dynamic_update_slice per 4 MiB piece ran big-transpose at 1.3-2x XLA's time)
    from jax_backend.box_exchange import box_plan

    program = lowering.compile(src, dst, mesh)
    plan = box_plan(program.steps[0], program.mesh)
    assert plan is not None and getattr(plan, "grid", None) is not None and plan.spare == 0
    assert "uncells(take(stack(pieces), place[me]))" in "\n".join(describe(program))
    if program.src.numel <= 4096:
        xs = [x.astype(np.float32) for x in random_arrays(program.src, program.mesh, np.random.default_rng(4))]
        _assert_runs_as_simulated(program, xs)


def test_the_cost_model_prices_what_the_box_lowering_runs() -> None:
    # box_calls (what the JAX cost model reads, without tables) agrees with box_plan (what runs)
    from jax_backend.box_exchange import box_calls, box_plan

    pairs = [("dp=2,tp=4", "f32[16@dp,16@tp]", "f32[16@tp,16@dp]"),
             ("dp=4,tp=2", "f32[8@(dp,tp),12]", "f32[8@tp,12@dp]"),
             ("dp=2,tp=4", "f32[4@dp,8@tp,8]", "f32[4,8@dp,8@tp]"),
             ("dp=2,cp=2,tp=2", "f32[8@(cp,tp),16@dp]", "f32[8@tp,16@(dp,cp)]"),
             ("dp=4,tp=2", "f32[16@(tp,dp),16]", "f32[16,16@dp]"),
             ("dp=4,tp=2", "f32[8@dp]", "f32[8@tp]"),
             ("dp=2,tp=4", "f32[16@(dp,tp),8]", "f32[16@(tp,dp),8]")]
    for mesh, src, dst in pairs:
        m = parse_mesh(mesh)
        for step in lowering.compile(src, dst, mesh).steps:
            plan, calls = box_plan(step, m), box_calls(step, m)
            if plan is None:
                assert calls is None
                continue
            assert calls is not None
            if plan.dense is not None or plan.packed is not None:
                assert calls[0] == "all_to_all", (src, dst, calls)
            else:
                sent = [rd for rd in plan.rounds if not rd.local]
                assert calls == ("ppermute", len(sent), sum(rd.groups is not None for rd in sent)), (src, dst, calls)


@pytest.mark.parametrize("mesh,src,dst", [
    ("x=8", "f32[16,8]", "f32[16@x,8]"),
    ("dp=2,tp=4", "f32[8,16]", "f32[8@(tp,dp),16]"),
    ("dp=2,tp=4", "f16[32@tp]", "f16[32@(tp,dp)]"),
])
def test_an_even_slicev_is_a_dynamic_slice(mesh: str, src: str, dst: str) -> None:
    # the JAX planner may name an even slice slicev: it runs as slice's dynamic_slice, not a
    # per-element local gather
    m = parse_mesh(mesh)
    program = lowering.make_program([lowering.make_step("slicev", src, dst, m)], m)
    text = "\n".join(describe(program))
    assert "lax.dynamic_slice_in_dim" in text and "local gather" not in text, text
    xs = [x.astype(np.float32) for x in random_arrays(program.src, m, np.random.default_rng(5))]
    _assert_runs_as_simulated(program, xs)


def _table_entries(tables: object) -> int:
    """Every index-table entry a step's tables hold (arrays inside dataclasses and tuples)."""
    import dataclasses

    if isinstance(tables, np.ndarray):
        return int(tables.size)
    if isinstance(tables, (tuple, list)):
        return sum(_table_entries(v) for v in tables)
    if dataclasses.is_dataclass(tables):
        return sum(_table_entries(getattr(tables, f.name)) for f in dataclasses.fields(tables))
    return 0


@pytest.mark.parametrize("mesh,src,dst", [
    ("dp=3", "f32[3000@dp<1000,400,1600>,8]", "f32[3000@dp<400,1600,1000>,8]"),  # runs
    ("dp=3", "f32[6,3000@dp<1000,400,1600>]", "f32[6,3000@dp<400,1600,1000>]"),  # 2-D boxes
    ("dp=3,tp=2", "f32[8,2400]{U:dp}", "f32[8,2400@dp<1000,400,1000>]"),  # a reduction
])
def test_uneven_tables_hold_pieces_not_elements(mesh: str, src: str, dst: str) -> None:
    # the exact exchange's tables grow with the pieces: one large uneven block compiles as
    # fast as a small one, and still gives simulate's blocks
    from jax_backend.tables import step_tables

    m = parse_mesh(mesh)
    program = lowering.compile(src, dst, m)
    for step in program.steps:
        elements = sum(int(np.prod(s)) for s in lowering.local_shapes(step.src, m))
        assert _table_entries(step_tables(step, m)) < 400 <= elements // 25
    xs = [x.astype(np.float32) for x in random_arrays(program.src, m, np.random.default_rng(2))]
    _assert_runs_as_simulated(program, xs)


def test_runs_name_the_pairs_in_order() -> None:
    from jax_backend.tables import expand_runs, runs_of

    rng = np.random.default_rng(3)
    box = np.arange(7 * 9).reshape(7, 9)[2:6, 3:8].reshape(-1)  # a box of a row-major block
    cases = [(box, np.arange(box.size) + 5), (rng.permutation(40), np.arange(40)), (np.arange(0), np.arange(0)),
             (np.concatenate([box, box + 100]), np.arange(2 * box.size) * 2)]
    for src, dst in cases:
        runs = runs_of(src, dst)
        assert np.array_equal(expand_runs(runs[:, [0, 1, 4, 5]]), src)
        assert np.array_equal(expand_runs(runs[:, [2, 3, 4, 5]]), dst)
    assert len(runs_of(box, np.arange(box.size))) == 1  # a box: one entry, 4 runs of 5


TABLE_STEPS = [(n, m, s) for n, m, s in STEPS if lower_step(s, m).flat]  # the exact exchange's


@pytest.mark.parametrize("name,mesh,step", TABLE_STEPS, ids=[n for n, _, _ in TABLE_STEPS])
def test_runs_as_slices_match_simulate(monkeypatch: pytest.MonkeyPatch, name: str, mesh: Mesh, step: Step) -> None:
    # every round as slices of runs (what a large round runs), not an element table
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec

    from jax_backend import tables

    monkeypatch.setattr(tables, "SMALL", 0)
    program = lowering.make_program([step], mesh)
    xs = [x.astype(np.int32 if step.src.dtype == "int32" else np.float32)
          for x in random_arrays(step.src, mesh, np.random.default_rng(len(name)))]
    _, x = blocks_call(program, xs)
    width = x.shape[0] // mesh.size
    run = tables.table_exchange(tables.step_tables(step, mesh), mesh.names)

    def body(b: jax.Array) -> jax.Array:
        y = run(b)
        return jnp.pad(y, (0, width - y.shape[0]))

    spec = PartitionSpec(mesh.names)
    fn = jax.jit(jax.shard_map(body, mesh=x.sharding.mesh, in_specs=spec, out_specs=spec, check_vma=False))
    for r, (a, b) in enumerate(zip(blocks_out(program, fn(x)), lowering.simulate(program, xs), strict=True)):
        assert a.shape == b.shape and np.array_equal(a, b), f"rank {r}: {a} != {b}"


@pytest.mark.parametrize("mesh,src,dst,pairs", [
    ("dp=2,tp=4", "f32[8@dp,16@tp]", "f32[8@tp,16@dp]", 2),  # rd-pub-016: both rounds are swaps
    ("dp=2,cp=2,tp=2", "f32[8@(dp,cp,tp),16]", "f32[8@(tp,cp,dp),16]", 1),  # whole blocks swapped
])
def test_rounds_within_pairs_are_one_all_to_all_of_two(mesh: str, src: str, dst: str, pairs: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # a round where every rank moves pieces with one partner runs as an all_to_all within
    # pairs of ranks (~0.07 ms on XLA:CPU against a ppermute's ~0.19): same pieces, same values
    from jax_backend.box_exchange import box_calls, box_plan

    program = lowering.compile(src, dst, mesh)
    text = "\n".join(describe(program))
    assert text.count("axis_index_groups") == pairs and "lax.ppermute(" not in text, text
    step, m = program.steps[0], program.mesh
    assert box_calls(step, m) == ("ppermute", pairs, pairs)
    xs = [x.astype(np.float32) for x in random_arrays(program.src, m, np.random.default_rng(7))]
    _assert_runs_as_simulated(program, xs)
    # the same rounds written piece by piece at per-rank corners (where the pieces are no grid)
    monkeypatch.setattr(box_exchange, "_grid", lambda *a: None)
    _forget_jitted()
    assert box_plan(step, m).grid is None
    _assert_runs_as_simulated(program, xs)
    _forget_jitted()


def _forget_jitted() -> None:
    """Empty the box plans and the jitted programs (``run_blocks`` keeps one per program)."""
    from jax_backend import engine

    for module in (box_exchange, engine):
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


def test_pair_groups_put_every_rank_in_one_pair() -> None:
    from jax_backend.box_exchange import PAIR_MAX, pair_groups

    assert pair_groups(((0, 1), (1, 0), (3, 2), (4, 4)), 6, 4) == ((0, 1), (2, 3), (4, 5))
    assert pair_groups(((0, 1), (1, 2)), 4, 4) is None  # rank 1 moves pieces with 0 and 2
    assert pair_groups(((0, 1), (1, 0)), 3, 4) is None  # an odd world has no pairs for all
    assert pair_groups(((0, 1), (1, 0)), 2, PAIR_MAX + 1) is None


def test_table_rounds_within_pairs_are_one_all_to_all_of_two() -> None:
    # the exact exchange of uneven pieces: a round where every rank moves pieces with one
    # partner is an all_to_all within pairs, not a ppermute; its values are simulate's
    program = lowering.compile("f32[10@dp<3,7>,4]", "f32[10@dp<6,4>,4]", "dp=2,tp=2")
    xs = [x.astype(np.float32) for x in random_arrays(program.src, program.mesh, np.random.default_rng(3))]
    _assert_runs_as_simulated(program, xs)
    fn, x = blocks_call(program, xs)
    hlo = fn.lower(x).compile().as_text()
    assert "all-to-all" in hlo and "collective-permute" not in hlo, hlo


def test_table_rounds_are_as_few_as_the_busiest_rank_needs() -> None:
    # rd-pub-075's relay on a=2,b=2,c=2,d=2: its owners fan out 24 pieces of one size, each
    # rank sending and receiving at most 2; greedy colouring took 3 rounds, Konig's takes 2
    # (one ppermute fewer, and the busiest rank's bytes summed over the rounds at the bound)
    from collections import Counter

    from jax_backend.tables import step_tables

    m = parse_mesh("a=2,b=2,c=2,d=2")
    step = lowering.make_step("relay", "f32[16@d,8@a,16]", "f32[16,8@(c,d,a),16@b]", m)
    fan_out = step_tables(step, m).fan_out
    moves = [(q, r) for rd in fan_out for q, r in rd.perm if q != r]
    busiest = max(Counter(e for q, r in moves for e in ((0, q), (1, r))).values())
    assert len(moves) == 24 and busiest == 2 and len(fan_out) == 2
    assert len(set(moves)) == len(moves)  # each transfer in one round
