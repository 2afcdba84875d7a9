"""The engine's latency tie-break: where shardc's bytes-first plan merges a collective over
several mesh axes into one ring over their flattened group, and one ring per axis moves the
same bytes in fewer ring steps, the engine runs the per-axis rings (DTensor's own choice
for a gather of two dims). shardc's own plans (``lowering.compile``) are unchanged."""

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
