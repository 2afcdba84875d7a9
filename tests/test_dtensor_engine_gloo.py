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


def async_scenarios(rank: int, world: int) -> dict:
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from torch_backend.dtensor_switch import dtensor_engine

    torch.manual_seed(7)
    dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    out: dict = {"diffs": [], "dtensor_async": 0, "engine_async": 0, "engine_pending": 0}
    pairs = [([Shard(0), Shard(1)], [Replicate(), Replicate()]), ([Shard(0), Shard(1)], [Shard(1), Shard(0)]),
             ([Shard(1), Replicate()], [Replicate(), Shard(0)]), ([Replicate(), Shard(0)], [Replicate(), Replicate()]),
             ([Shard(0), Shard(0)], [Replicate(), Replicate()])]
    for n in (13, 16):
        full = torch.randn(n, 6, dtype=torch.float64)
        w = torch.randn(n, 6, dtype=torch.float64)
        for src, dst in pairs:
            x = distribute_tensor(full, dm, src).requires_grad_(True)
            ref = x.redistribute(dm, dst, async_op=True)
            with dtensor_engine():
                got = x.redistribute(dm, dst, async_op=True)
                out["dtensor_async"] += isinstance(ref._local_tensor, AsyncCollectiveTensor)
                if isinstance(got._local_tensor, AsyncCollectiveTensor):
                    out["engine_async"] += 1
                    out["engine_pending"] += not got._local_tensor.completed
                # first use through a view (waits on the storage's work), then the values
                same = (torch.equal(got.to_local().view(-1), ref.to_local().reshape(-1))
                        and torch.equal(got.full_tensor(), full))
                wd = distribute_tensor(w, dm, dst)
                (g_got,) = torch.autograd.grad((got * wd).to_local().sum(), x)
            (g_ref,) = torch.autograd.grad((ref * wd).to_local().sum(), x)
            if not (same and torch.allclose(g_got.full_tensor(), g_ref.full_tensor(), rtol=1e-12, atol=1e-12)):
                out["diffs"].append(f"{n} {src} -> {dst}")
    return out


@pytest.mark.timeout(300)
def test_gloo_async_op_gives_a_tensor_waited_on_first_use(gloo_pool):
    """``async_op=True``: DTensor hands out an AsyncCollectiveTensor (funcol) whose first use
    waits; the engine does too (its last collective in flight), with DTensor's values and
    gradients."""
    res = gloo_pool.run(async_scenarios, timeout_s=240)
    for rank, r in res.items():
        assert r["diffs"] == [], (rank, r["diffs"])
        assert r["engine_async"] >= r["dtensor_async"] > 0, (rank, r)
        assert r["engine_pending"] == r["engine_async"], (rank, r)


def shares_and_unit_dims(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    from torch_backend.dtensor_switch import dtensor_engine, dtensor_engine_stats

    torch.manual_seed(3)
    out: dict = {"diffs": []}
    before = dtensor_engine_stats()
    dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    p = DTensor.from_local(torch.randn(2, 5, dtype=torch.float64) + rank, dm, [Partial(), Shard(0)])  # 8 x 5
    r = distribute_tensor(torch.randn(8, 5, dtype=torch.float64), dm, [Replicate(), Shard(0)])
    ref = (p + r).to_local()  # r: [R, S(0)] -> [P, S(0)], each rank its share v/2
    with dtensor_engine():
        got = (p + r).to_local()
    if not torch.equal(got, ref):
        out["diffs"].append("partial + replicate")
    unit = init_device_mesh("cpu", (2, 1, 4), mesh_dim_names=("e", "f", "g"))
    full = torch.randn(7, 6, dtype=torch.float64)
    for mesh in (unit, unit["e", "f"]):
        for src, dst in [([Shard(0)] * mesh.ndim, [Replicate()] * (mesh.ndim - 1) + [Shard(1)]),
                         ([Shard(1)] * mesh.ndim, [Shard(0)] + [Replicate()] * (mesh.ndim - 1))]:
            x = distribute_tensor(full, mesh, src)
            ref = x.redistribute(mesh, dst).to_local()
            with dtensor_engine():
                got = x.redistribute(mesh, dst).to_local()
            if not torch.equal(got, ref):
                out["diffs"].append(f"{mesh} {src} -> {dst}")
    after = dtensor_engine_stats()
    out["taken"] = after["taken"] - before["taken"]
    out["fallback"] = after["fallback"] - before["fallback"]
    return out


@pytest.mark.timeout(300)
def test_gloo_partial_shares_and_size_one_mesh_dims(gloo_pool):
    """On real ranks: ``partial + replicate`` (DTensor gives the Replicate operand's ranks
    each their share) and a mesh with a size-1 dim, and its submesh, equal DTensor's own
    path, all taken."""
    res = gloo_pool.run(shares_and_unit_dims, timeout_s=240)
    for rank, r in res.items():
        assert r["diffs"] == [], (rank, r["diffs"])
        assert r["taken"] >= 5 and r["fallback"] == 0, (rank, r)
