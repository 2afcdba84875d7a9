"""The executor on every step kind (hand-built programs), under LocalTensorMode,
against the numpy reference interpreter, exactly."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from programs_for_tests import one_step  # noqa: E402
from torch_utils import as_numpy, from_local, local_mode, random_blocks, to_local  # noqa: E402

from lowering import make_program, make_step, rank_pieces  # noqa: E402
from lowering.kinds import wire_bytes  # noqa: E402
from lowering.kinds.base import flat_offset  # noqa: E402
from lowering.simulator import simulate  # noqa: E402
from torch_backend.data import all_blocks, global_tensor  # noqa: E402
from torch_backend.executor import execute  # noqa: E402

# (kind, axes, dims, src, dst, mesh, op, padded)
CASES = {
    "gather-dim0": ("all_gather", "tp", 0, "f64[8@tp,4]", "f64[8,4]", "dp=2,tp=4", None, None),
    "gather-dim1": ("all_gather", "dp", 1, "f64[4,8@dp]", "f64[4,8]", "dp=2,tp=2", None, None),
    "gather-flat-listed": ("all_gather", ("tp", "dp"), 0, "f64[8@(tp,dp),3]", "f64[8,3]", "dp=2,tp=4", None, None),
    "gather-uneven": ("all_gather", ("dp", "tp"), 0, "f64[10@(dp,tp)]", "f64[10]", "dp=2,tp=4", None, None),
    "gather-uneven-groups-differ": ("all_gather", "dp", 1, "f64[3,10@(tp,dp)]", "f64[3,10@tp]", "dp=2,tp=4",
                                    None, None),
    "gather-two-dims": ("all_gather", ("dp", "tp"), (0, 1), "f64[8@dp,12@tp]", "f64[8,12]", "dp=2,tp=4",
                        None, None),
    "gather-two-dims-uneven": ("all_gather", ("tp", "cp"), (1, 2), "f64[6@dp,6@tp,5@cp]", "f64[6@dp,6,5]",
                               "dp=2,cp=2,tp=2", None, None),
    "rs-two-dims": ("reduce_scatter", ("tp", "dp"), (0, 1), "f64[8,6]{U:(dp,tp)}", "f64[8@tp,6@dp]",
                    "dp=2,tp=4", None, None),
    "rs-two-dims-padded": ("reduce_scatter", ("tp", "dp"), (0, 1), "f64[7,5]{U:(dp,tp)}", "f64[7@tp,5@dp]",
                           "dp=2,tp=3", None, None),
    "rs-dim0": ("reduce_scatter", "tp", 0, "f64[8,3]{U:tp}", "f64[8@tp,3]", "dp=2,tp=4", None, None),
    "rs-flat-dim1": ("reduce_scatter", ("dp", "tp"), 1, "f64[3,16]{U:(dp,tp)}", "f64[3,16@(dp,tp)]", "dp=2,tp=4",
                     None, None),
    "rs-listed": ("reduce_scatter", ("tp", "dp"), 0, "f64[8]{U:(dp,tp)}", "f64[8@(tp,dp)]", "dp=2,tp=4", None, None),
    "rs-padded": ("reduce_scatter", "tp", 0, "f64[10,2]{U:tp}", "f64[10@tp,2]", "dp=2,tp=4", None, None),
    "rs-exact": ("reduce_scatter", "tp", 0, "f64[10,2]{U:tp}", "f64[10@tp,2]", "dp=2,tp=4", None, False),
    "rs-avg-padded": ("reduce_scatter", "tp", 0, "f64[10]{P(avg):tp}", "f64[10@tp]", "dp=2,tp=4", None, None),
    "rs-max-exact": ("reduce_scatter", "tp", 0, "f64[10]{P(max):tp}", "f64[10@tp]", "dp=2,tp=4", None, False),
    "rs-min-padded": ("reduce_scatter", "tp", 0, "f64[10]{P(min):tp}", "f64[10@tp]", "dp=2,tp=4", None, None),
    "rs-avg-exact": ("reduce_scatter", "dp", 1, "f64[2,5]{P(avg):dp}", "f64[2,5@dp]", "dp=2,tp=2", None, False),
    "ar-sum-flat": ("all_reduce", ("dp", "tp"), (), "f64[5,3]{U:(dp,tp)}", "f64[5,3]", "dp=2,tp=4", None, None),
    "ar-avg": ("all_reduce", "dp", (), "f64[6@tp]{P(avg):dp}", "f64[6@tp]", "dp=2,tp=4", None, None),
    "ar-max": ("all_reduce", "tp", (), "f64[3]{P(max):tp}", "f64[3]", "dp=2,tp=4", None, None),
    "ar-min": ("all_reduce", "tp", (), "f64[3]{P(min):tp}", "f64[3]", "dp=2,tp=4", None, None),
    "a2a": ("all_to_all", "tp", (0, 1), "f64[8@tp,12]", "f64[8,12@tp]", "dp=2,tp=4", None, None),
    "a2a-uneven": ("all_to_all", "x", (0, 1), "f64[7@x,10]", "f64[7,10@x]", "x=4", None, None),
    "a2a-3d": ("all_to_all", ("dp", "tp"), (0, 2), "f64[8@(dp,tp),3,5]", "f64[8@tp,3,5@dp]", "dp=2,tp=4",
               None, None),
    "permute": ("permute", ("dp", "tp"), 0, "f64[8@(dp,tp)]", "f64[8@(tp,dp)]", "dp=2,tp=4", None, None),
    "permute-uneven": ("permute", ("dp", "tp"), 0, "f64[5@(dp,tp),2]", "f64[5@(tp,dp),2]", "dp=2,tp=2",
                       None, None),
    # balanced sources: the replicas over y split the sending (the rule that picks them is
    # the same in the pieces the runner packs as in the simulator's)
    "a2av-balanced": ("all_to_allv", ("y", "z"), (0, 1), "f64[6,1@z]", "f64[6@z,1@y]", "y=4,z=8", None, None),
    "slice": ("slice", "tp", 1, "f64[4,8]", "f64[4,8@tp]", "dp=2,tp=4", None, None),
    "zero_fill": ("zero_fill", "dp", (), "f64[4@tp]", "f64[4@tp]{U:dp}", "dp=2,tp=2", None, None),
    "zero_pad": ("zero_pad", "tp", 0, "f64[10@tp]", "f64[10]{U:tp}", "dp=2,tp=4", None, None),
    "reinterpret": ("reinterpret", "dp", (), "f64[4]{R:dp}", "f64[4]", "dp=2", None, None),
    "alone-gather": ("all_gather", "dp", 0, "f64[8@dp]", "f64[8]", "dp=1,tp=4", None, None),
    "alone-rs": ("reduce_scatter", "dp", 0, "f64[8]{U:dp}", "f64[8@dp]", "dp=1,tp=2", None, None),
    "alone-ar": ("all_reduce", "dp", (), "f64[3]{U:dp}", "f64[3]", "dp=1,tp=2", None, None),
}


def run_local(fake_pg, program, blocks):
    with local_mode(fake_pg, program.mesh.size) as lm:
        x = to_local(lm, blocks)
        y = execute(program, x)
        after = from_local(x)
        outs = from_local(y)
        aliased = any(
            a.numel() and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            for a, b in zip(y._local_tensors.values(), x._local_tensors.values())
        )
    return outs, after, aliased


@pytest.mark.parametrize("name", sorted(CASES))
def test_step_kind_matches_simulator(fake_pg, name):
    kind, axes, dims, src, dst, mesh, op, padded = CASES[name]
    program = one_step(kind, axes, dims, src, dst, mesh, op, padded)
    blocks = random_blocks(program.src, program.mesh, np.random.default_rng(len(name)))
    want = simulate(program, as_numpy(blocks))
    outs, after, aliased = run_local(fake_pg, program, blocks)
    for r, (o, w) in enumerate(zip(outs, want)):
        assert o.shape == w.shape, f"rank {r}"
        np.testing.assert_array_equal(o.numpy(), w, err_msg=f"rank {r}")
    for a, b in zip(after, blocks):
        assert torch.equal(a, b), "the input was modified"
    assert not aliased, "the output shares memory with the input"


def test_multi_step_program(fake_pg):
    mesh = "dp=2,tp=4"
    steps = [
        make_step("slice", "f64[10,6]{U:tp}", "f64[10,6@dp]{U:tp}", mesh),
        make_step("reduce_scatter", "f64[10,6@dp]{U:tp}", "f64[10@tp,6@dp]", mesh),
        make_step("all_gather", "f64[10@tp,6@dp]", "f64[10@tp,6]", mesh),
    ]
    program = make_program(steps, mesh)
    blocks = random_blocks(program.src, program.mesh, np.random.default_rng(7))
    want = simulate(program, as_numpy(blocks))
    outs, _, _ = run_local(fake_pg, program, blocks)
    for o, w in zip(outs, want):
        np.testing.assert_array_equal(o.numpy(), w)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "i8", "u8", "i32", "i64", "bool"])
@pytest.mark.parametrize("name", ["gather-uneven", "rs-padded", "rs-max-exact", "ar-avg", "a2a-uneven", "permute"])
def test_dtypes(fake_pg, dtype, name):
    kind, axes, dims, src, dst, mesh, op, padded = CASES[name]
    program = one_step(kind, axes, dims, src.replace("f64", dtype), dst.replace("f64", dtype), mesh, op, padded)
    blocks = all_blocks(program.src, program.mesh, global_tensor(program.src))

    def np_of(t):
        return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()

    want = simulate(program, [np_of(b) for b in blocks])
    outs, _, _ = run_local(fake_pg, program, blocks)
    for r, (o, w) in enumerate(zip(outs, want)):
        assert o.dtype == blocks[0].dtype
        np.testing.assert_array_equal(np_of(o), w.astype(np_of(o).dtype), err_msg=f"rank {r}")


def test_wire_bytes_equal_the_cost_of_hand_built_steps():
    for name, (kind, axes, dims, src, dst, mesh, op, padded) in CASES.items():
        program = one_step(kind, axes, dims, src, dst, mesh, op, padded)
        step = program.steps[0]
        assert wire_bytes(step, program.mesh) == step.bytes_sent, name
        assert wire_bytes(step, program.mesh, received=True) == step.bytes_recv, name


def test_flat_offset():
    assert flat_offset((slice(2, 4), slice(0, 5)), (6, 5)) == 10
    assert flat_offset((slice(1, 2), slice(1, 3)), (6, 5)) == 6
    assert flat_offset((slice(0, 2), slice(1, 3)), (6, 5)) is None
    assert flat_offset((slice(0, 1), slice(0, 3), slice(0, 4)), (1, 3, 4)) == 0
    assert flat_offset((slice(0, 0), slice(0, 3)), (6, 3)) == 0


def test_uneven_gather_plan_is_an_exact_ring():
    # f32[10@(dp,tp)] -> f32[10]: blocks 2,2,1,0 per dp row; rank 2 forwards all but its
    # successor's (empty) piece, and the ring runs in the step's listed group order
    program = one_step("all_gather", ("tp", "dp"), 0, "f32[10@(tp,dp)]", "f32[10]", "dp=2,tp=4")
    step = program.steps[0]
    members = tuple(range(8))
    plans = [rank_pieces(step, program.mesh, r, members) for r in range(8)]
    assert all(not p.even for p in plans)
    assert plans[0].listed == (0, 4, 1, 5, 2, 6, 3, 7)
    assert tuple(4 * p.wire_elems for p in plans) == step.bytes_sent
