"""The engine's latency choices: where shardc's bytes-first plan merges a collective over
several mesh axes into one ring over their flattened group, and one ring per axis moves the
same bytes in fewer ring steps, the engine runs the per-axis rings (DTensor's own choice
for a gather of two dims); an uneven gather runs as one exact exchange, not n-1 rounds of
point-to-point; and of plans of about the same bytes, the one with the fewest calls and
rounds. shardc's own plans (``lowering.compile``) are unchanged."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import lowering  # noqa: E402
from spec_lang.parser import parse, parse_mesh  # noqa: E402


def _pair(dm, placements, shape):
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    meta = TensorMeta(torch.Size(shape), (shape[1], 1), torch.float32)
    return (DTensorSpec(dm, tuple(placements), tensor_meta=meta),
            DTensorSpec(dm, (Replicate(),) * dm.ndim, tensor_meta=meta))


@pytest.mark.parametrize("shape", [(64, 32), (512, 512)])
def test_a_gather_over_two_axes_runs_one_ring_per_axis(fake_pg, shape):
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    from torch_backend.dtensor_specs import plan_pair

    fake_pg(8)
    with LocalTensorMode(8) as lm:
        dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        src, dst = _pair(dm, [Shard(0), Shard(1)], shape)
        pair = plan_pair(src, dst, lm)
    assert not isinstance(pair, str), pair
    own = lowering.compile(parse(f"f32[{shape[0]}@dp,{shape[1]}@tp]"), parse(f"f32[{shape[0]},{shape[1]}]"),
                           parse_mesh("dp=2,tp=4"))
    # shardc's own plan: one all_gather over the flattened (tp, dp) group, 7 ring steps
    assert [(s.kind, len(s.axes)) for s in own.steps] == [("all_gather", 2)]
    # the engine's: the same bytes, one ring per axis (1 + 3 ring steps)
    assert sorted((s.kind, s.axes) for s in pair.program.steps) == [("all_gather", ("dp",)), ("all_gather", ("tp",))]
    assert pair.program.cost.bytes_max == own.cost.bytes_max


def test_a_plan_with_no_merged_collective_is_shardcs_own(fake_pg):
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard

    from torch_backend.dtensor_specs import plan_pair

    fake_pg(8)
    with LocalTensorMode(8) as lm:
        dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        src, dst = _pair(dm, [Replicate(), Shard(1)], (64, 32))
        pair = plan_pair(src, dst, lm)
    own = lowering.compile(parse("f32[64,32@tp]"), parse("f32[64,32]"), parse_mesh("dp=2,tp=4"))
    assert not isinstance(pair, str)
    assert pair.program.steps == own.steps


def test_on_gloo_a_reduction_is_not_split_over_a_spare_axis_for_256_kib(fake_pg, monkeypatch):
    """``{U:tp} -> 8@tp`` on 2x4: shardc's own plan slices over dp (which both ends
    replicate), reduce_scatters half the data over tp and all_gathers it back over dp,
    saving 256 KiB for one more collective; on gloo, where a collective costs a
    millisecond or more, the engine runs DTensor's one reduce_scatter over tp."""
    import torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    from torch_backend.dtensor_specs import plan_pair

    fake_pg(8)
    own = lowering.compile(parse("f32[8,32768]{U:tp}"), parse("f32[8@tp,32768]"), parse_mesh("dp=2,tp=4"))
    assert [s.kind for s in own.steps] == ["slice", "reduce_scatter", "all_gather"]
    meta = TensorMeta(torch.Size((8, 32768)), (32768, 1), torch.float32)
    kinds = {}
    for backend in ("fake", "gloo"):
        monkeypatch.setattr(dist, "get_backend", lambda *a, backend=backend, **k: backend)
        with LocalTensorMode(8) as lm:
            dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
            pair = plan_pair(DTensorSpec(dm, (Replicate(), Partial()), tensor_meta=meta),
                             DTensorSpec(dm, (Replicate(), Shard(0)), tensor_meta=meta), lm)
        assert not isinstance(pair, str), pair
        kinds[backend] = [(s.kind, s.axes) for s in pair.program.steps]
    assert kinds["fake"] == [(s.kind, s.axes) for s in own.steps]
    assert kinds["gloo"] == [("reduce_scatter", ("tp",))]


def _engine_steps(mesh_shape, names, src_placements, dst_placements, shape, dtype):
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    from torch_backend.dtensor_specs import plan_pair

    stride = tuple(int(torch.tensor(shape[i + 1:]).prod()) for i in range(len(shape)))
    meta = TensorMeta(torch.Size(shape), stride, dtype)
    with LocalTensorMode(int(torch.tensor(mesh_shape).prod())) as lm:
        dm = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
        pair = plan_pair(DTensorSpec(dm, tuple(src_placements), tensor_meta=meta),
                         DTensorSpec(dm, tuple(dst_placements), tensor_meta=meta), lm)
    assert not isinstance(pair, str), pair
    return pair.program


def test_an_uneven_gather_is_one_exact_exchange(fake_pg):
    """262140 f32 over 8 (the last rank one element short): shardc's own plan gathers the
    uneven blocks around a ring (7 rounds of point-to-point); the engine sends each rank's
    block to every peer in one all_to_all, never more than DTensor's one gather padded to
    the largest block."""
    from torch.distributed.tensor import Replicate, Shard

    fake_pg(8)
    own = lowering.compile(parse("f32[262140@x]"), parse("f32[262140]"), parse_mesh("x=8"))
    assert [s.kind for s in own.steps] == ["all_gather"]
    program = _engine_steps((8,), ("x",), [Shard(0)], [Replicate()], (262140,), torch.float32)
    assert [(s.kind, s.axes, s.launches) for s in program.steps] == [("all_to_allv", ("x",), 1)]
    padded = 7 * 32768 * 4  # DTensor: 7 chunks of the largest block out, 7 in
    assert own.cost.bytes_max <= program.cost.bytes_max <= padded
    # and it gives DTensor's values, forward and backward
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from torch_backend import dtensor_engine

    got = {}
    for on in (False, True):
        with LocalTensorMode(8):
            dm = init_device_mesh("cpu", (8,), mesh_dim_names=("x",))
            x = distribute_tensor(torch.arange(13.0).requires_grad_(), dm, [Shard(0)])
            with dtensor_engine(on):
                y = x.redistribute(dm, [Replicate()])
                (y.to_local() * torch.arange(13.0)).sum().backward()
            got[on] = (y.to_local().clone(), x.grad.to_local().clone())
    assert torch.equal(got[True][0], got[False][0]) and torch.equal(got[True][1], got[False][1])


def test_of_plans_of_about_the_same_bytes_the_fewest_calls(fake_pg):
    """``bf16[6@dp,8736,5@cp]{U:tp} -> bf16[6@dp,8736,5]`` on 2x2x2: shardc's own plan is
    reduce_scatter(tp), then one uneven gather over (tp, cp) (a ring of point-to-point
    rounds); per axis that is three calls (the cp gather uneven). Of the
    two-call plans of the same bytes, DTensor's (all_reduce(tp), then the cp gather as one
    exact exchange within each cp pair), not reduce_scatter(tp) and one exchange over
    (tp, cp): on gloo a reduce_scatter over 2 ranks costs an all_reduce, and an exchange
    over 4 ranks more than one over 2."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    fake_pg(8)
    program = _engine_steps((2, 2, 2), ("dp", "cp", "tp"), [Shard(0), Shard(2), Partial()],
                            [Shard(0), Replicate(), Replicate()], (6, 8736, 5), torch.bfloat16)
    own = lowering.compile(parse("bf16[6@dp,8736,5@cp]{U:tp}"), parse("bf16[6@dp,8736,5]"),
                           parse_mesh("dp=2,cp=2,tp=2"))
    assert [(s.kind, s.axes) for s in own.steps if s.is_collective] == [
        ("reduce_scatter", ("tp",)), ("all_gather", ("tp", "cp"))]
    assert [(s.kind, s.axes) for s in program.steps] == [("all_reduce", ("tp",)), ("all_to_allv", ("cp",))]
    assert program.cost.collectives == 2
    assert own.cost.bytes_max <= program.cost.bytes_max <= own.cost.bytes_max * 9 // 8


def test_dtensors_own_plan_where_it_is_faster_than_shardcs_at_the_bound(fake_pg):
    """``bf16[32768,8@tp] -> bf16[32768@(tp,dp,cp),8]`` on 2x2x2: shardc's own plan is a relay at
    the byte bound (two exchanges over all 8 ranks); DTensor's plan swaps the dim over tp's 2
    ranks (one call; on gloo a gather of the whole block) and slices over dp and cp. The engine
    runs DTensor's plan with shardc's steps: one exchange within each tp pair, half the block,
    fewer bytes than DTensor's own, and the values are DTensor's."""
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    from lowering.placements import to_placements
    from torch_backend import dtensor_engine
    from torch_backend.dtensor_specs import plan_pair

    fake_pg(8)
    mesh = parse_mesh("dp=2,cp=2,tp=2")
    s, d = parse("bf16[32768,8@tp]"), parse("bf16[32768@(tp,dp,cp),8]")
    own = lowering.compile(s, d, mesh)
    assert [(st.kind, st.axes, st.launches) for st in own.steps] == [("relay", ("dp", "cp", "tp"), 2)]
    sp, _ = to_placements(s, mesh, strided=True)
    dp, _ = to_placements(d, mesh, strided=True)
    meta = TensorMeta(torch.Size((32768, 8)), (8, 1), torch.bfloat16)
    with LocalTensorMode(8) as lm:
        dm = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
        pair = plan_pair(DTensorSpec(dm, tuple(sp), tensor_meta=meta), DTensorSpec(dm, tuple(dp), tensor_meta=meta), lm)
    assert not isinstance(pair, str), pair
    program = pair.program
    assert [(st.kind, st.axes) for st in program.steps if st.is_collective] == [("permute", ("tp",))]
    dtensor_bytes = 32768 * 4 * 2  # DTensor's gather of the other half of each row over tp
    assert own.cost.bytes_max < program.cost.bytes_max < dtensor_bytes

    got = {}
    for on in (False, True):
        with LocalTensorMode(8):
            dm = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
            x = distribute_tensor(torch.arange(40 * 8.0).view(40, 8).requires_grad_(), dm, list(sp))
            with dtensor_engine(on):
                y = x.redistribute(dm, list(dp))
                (y.to_local() * 3).sum().backward()
            got[on] = (y.full_tensor().clone(), x.grad.full_tensor().clone())
    assert torch.equal(got[True][0], got[False][0]) and torch.equal(got[True][1], got[False][1])
    assert torch.equal(got[True][0], torch.arange(40 * 8.0).view(40, 8))
