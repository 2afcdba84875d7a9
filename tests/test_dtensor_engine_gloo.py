"""shardc as DTensor's redistribution engine on 8 real gloo ranks: a seeded corpus (named,
unnamed, sub- and flattened meshes, a mesh whose ranks are out of world order, uneven
dims, Partial of every op, _StridedShard) gives DTensor's values and gradients with the
engine on, and the flattened-mesh gather that DTensor gets wrong gives the global tensor."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")


def scenarios(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._redistribute import redistribute_local_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    from torch_backend.dtensor_switch import dtensor_engine, dtensor_engine_stats

    rng = random.Random(36)
    torch.manual_seed(36)
    named = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    from torch.distributed.device_mesh import DeviceMesh

    # a mesh whose ranks are not in world order (rank r at row r % 4, column r // 4)
    permuted = DeviceMesh("cpu", torch.arange(8).reshape(2, 4).T.contiguous(), mesh_dim_names=("p", "q"))
    meshes = [named, named["tp"], named["dp"], init_device_mesh("cpu", (2, 2, 2)),
              init_device_mesh("cpu", (2, 4), mesh_dim_names=("x", "y"))["x", "y"]._flatten(), permuted]
    out: dict = {"diffs": [], "cases": 0}
    before = dtensor_engine_stats()
    for dm in meshes:
        for _ in range(10):
            shape = (rng.choice([3, 5, 8, 13]), rng.choice([2, 7]))
            op = rng.choice(["sum", "avg", "max", "min"])

            def pick(partial: bool, ndim: int = dm.ndim, op: str = op) -> list:
                ps = []
                for _ in range(ndim):
                    k = rng.random()
                    ps.append(Shard(rng.randrange(2)) if k < 0.6 else Partial(op) if partial and k > 0.85
                              else Replicate())
                return ps

            src, dst = pick(True), pick(False)
            if dm.ndim >= 2 and rng.random() < 0.3:
                shape = (dm.size(0) * dm.size(1) * 2, shape[1])
                src = [_StridedShard(0, split_factor=dm.size(1)), Shard(0)] + [Replicate()] * (dm.ndim - 2)
            full = torch.randn(shape, dtype=torch.float64)
            r = distribute_tensor(full, dm, [Replicate()] * dm.ndim)
            spec = DTensorSpec(dm, tuple(src), tensor_meta=TensorMeta(full.shape, full.stride(), full.dtype))
            x = DTensor(redistribute_local_tensor(r.to_local(), r._spec, spec), spec, requires_grad=True)
            w = distribute_tensor(torch.randn(shape, dtype=torch.float64), dm, dst)
            ref = x.redistribute(dm, dst)
            (g_ref,) = torch.autograd.grad((ref * w).to_local().sum(), x)
            with dtensor_engine():
                got = x.redistribute(dm, dst)
                (g_got,) = torch.autograd.grad((got * w).to_local().sum(), x)
            out["cases"] += 1
            same = (tuple(got.placements) == tuple(ref.placements)
                    and torch.allclose(got.to_local(), ref.to_local(), rtol=1e-12, atol=1e-12)
                    and tuple(g_got.placements) == tuple(g_ref.placements)
                    and torch.allclose(g_got.full_tensor(), g_ref.full_tensor(), rtol=1e-12, atol=1e-12))
            if not same:
                out["diffs"].append(f"{dm} {shape} {src} -> {dst}")
    # DTensor's defect: with the flattened dp_tp mesh in existence it merges the two gathers
    named["dp", "tp"]._flatten()
    full = torch.arange(13.0)
    x = distribute_tensor(full, named, [Shard(0), Shard(0)])
    out["dtensor_flattened_right"] = torch.equal(x.redistribute(named, [Replicate(), Replicate()]).to_local(), full)
    with dtensor_engine():
        out["engine_flattened_right"] = (
            torch.equal(x.redistribute(named, [Replicate(), Replicate()]).to_local(), full)
            and torch.equal(x.full_tensor(), full))
    after = dtensor_engine_stats()
    out["taken"] = after["taken"] - before["taken"]
    out["fallback"] = after["fallback"] - before["fallback"]
    return out


@pytest.mark.timeout(300)
def test_gloo_engine_equals_dtensor(gloo_pool):
    res = gloo_pool.run(scenarios, timeout_s=240)
    for rank, r in res.items():
        assert r["diffs"] == [], (rank, r["diffs"])
        assert r["cases"] == 60
        assert r["taken"] / (r["taken"] + r["fallback"]) >= 0.95, (rank, r)
        assert r["engine_flattened_right"], rank
    assert not all(r["dtensor_flattened_right"] for r in res.values())  # DTensor's defect, still there
