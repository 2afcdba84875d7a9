"""``redistribute`` / ``distribute`` entry points: every bad call is a SpecError (a
ValueError with a hint) raised before any collective, with the input left unchanged;
the DTensor form; ``distribute``'s blocks."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch_utils import from_local, local_mode, to_local  # noqa: E402

import lowering  # noqa: E402
import torch_backend  # noqa: E402
from spec_lang import SpecError, parse, parse_mesh  # noqa: E402
from torch_backend.data import all_blocks, global_tensor  # noqa: E402

MESH = "dp=2,tp=2"
SRC, DST = "f32[10@(dp,tp),3]", "f32[10@tp,3]"


def _blocks(src: str = SRC, mesh: str = MESH) -> list[torch.Tensor]:
    t = parse(src)
    return all_blocks(t, parse_mesh(mesh), global_tensor(t))


def _expect_error(fake_pg, make_x, *args, match: str, world: int = 4, **kwargs):
    with local_mode(fake_pg, world) as lm:
        with lm.disable():  # plain per-rank tensors, not LocalTensors
            x = make_x(lm)
        before = [t.clone() for t in from_local(x)] if hasattr(x, "_local_tensors") else None
        with pytest.raises(SpecError, match=match) as info:
            torch_backend.redistribute(x, *args, **kwargs)
        if before is not None:
            assert all(torch.equal(a, b) for a, b in zip(from_local(x), before)), "input changed"
    assert isinstance(info.value, ValueError)
    assert info.value.hint, "every SpecError says how to fix it"
    return info.value


def test_wrong_local_shape_names_the_rank(fake_pg):
    def make(lm):
        bl = _blocks()
        bl[3] = torch.zeros(4, 3)  # rank 3 must hold 2 rows of 10@(dp,tp) (3,2,3,2)
        return to_local(lm, bl)

    e = _expect_error(fake_pg, make, SRC, DST, MESH, match="rank 3's tensor has shape")
    assert "[2, 3]" in str(e)


def test_global_tensor_instead_of_block_gets_a_hint(fake_pg):
    e = _expect_error(fake_pg, lambda lm: to_local(lm, [torch.zeros(10, 3)] * 4), SRC, DST, MESH,
                      match="tensor has shape")
    assert "distribute" in e.hint


def test_dtype_mismatch(fake_pg):
    e = _expect_error(fake_pg, lambda lm: to_local(lm, [b.double() for b in _blocks()]), SRC, DST, MESH,
                      match="f64")
    assert "float32" in e.hint


def test_world_size_differs_from_mesh(fake_pg):
    _expect_error(fake_pg, lambda lm: to_local(lm, _blocks()[:1] * 4), "f32[4]", "f32[4]", "dp=8",
                  match="simulates 4 ranks but the mesh")


@pytest.mark.parametrize("src,dst,mesh,match", [
    ("f32[10@(dp,tp),3]", "f32[10@xx,3]", MESH, "not on the mesh"),
    ("f32[10@(dp,tp),3", DST, MESH, "expected"),
    (SRC, "f32[12@tp,3]", MESH, "global shapes differ"),
    (SRC, "f64[10@tp,3]", MESH, "dtypes differ"),
    ("f32[4]{U:dp}", "f32[4]{P(max):dp}", MESH, "cannot turn a pending sum"),
])
def test_bad_types(fake_pg, src, dst, mesh, match):
    _expect_error(fake_pg, lambda lm: to_local(lm, _blocks()), src, dst, mesh, match=match)


def test_not_a_tensor_and_missing_arguments(fake_pg):
    with pytest.raises(SpecError, match="expected a torch.Tensor"):
        torch_backend.redistribute([1, 2, 3], "f32[3]", "f32[3]", "dp=1")
    with pytest.raises(SpecError, match="needs a destination"):
        torch_backend.redistribute(torch.zeros(3), "f32[3]")
    with pytest.raises(SpecError, match="needs the mesh"):
        torch_backend.redistribute(torch.zeros(3), "f32[3]", "f32[3]")
    with pytest.raises(SpecError, match="expected a mesh"):
        torch_backend.redistribute(torch.zeros(3), "f32[3]", "f32[3]", 42)


def test_no_process_group(fake_pg):
    if dist.is_initialized():
        dist.destroy_process_group()  # fake_pg re-creates it on next use
    x = torch.zeros(4)
    with pytest.raises(SpecError, match="no torch.distributed process group") as info:
        torch_backend.redistribute(x, "f32[4@dp]", "f32[4]", "dp=2")
    assert "torchrun" in info.value.hint


def test_plain_tensor_under_local_mode_is_replicated(fake_pg):
    with local_mode(fake_pg, 4):
        y = torch_backend.redistribute(torch.arange(8.0), "f32[8]", "f32[8@(tp,dp)]", MESH)
        outs = from_local(y)
    slices = lowering.local_slices("f32[8@(tp,dp)]", MESH)
    for r, o in enumerate(outs):
        assert torch.equal(o, torch.arange(8.0)[slices[r]])


def test_distribute_blocks(fake_pg):
    g = torch.arange(24.0).reshape(6, 4)
    with local_mode(fake_pg, 4):
        sharded = from_local(torch_backend.distribute(g, MESH, "f32[6@tp,4@dp]"))
        partial = from_local(torch_backend.distribute(g, MESH, "f32[6,4]{U:dp}"))
        avg = from_local(torch_backend.distribute(g, MESH, "f32[6,4]{P(avg):tp}"))
        with pytest.raises(SpecError, match="global shape"):
            torch_backend.distribute(g[:3], MESH, "f32[6@tp,4@dp]")
    slices = lowering.local_slices("f32[6@tp,4@dp]", MESH)
    for r in range(4):
        assert torch.equal(sharded[r], g[slices[r]])
        assert torch.equal(avg[r], g)
    mesh = parse_mesh(MESH)
    for r in range(4):  # P(sum): coordinate 0 of dp holds the values, the other dp rank zeros
        want = g if mesh.coords(r)[0] == 0 else torch.zeros_like(g)
        assert torch.equal(partial[r], want)


def test_distribute_then_redistribute_roundtrip(fake_pg):
    g = torch.arange(30.0).reshape(10, 3)
    with local_mode(fake_pg, 4):
        x = torch_backend.distribute(g, MESH, "f32[10,3]{U:(dp,tp)}")
        y = torch_backend.redistribute(x, "f32[10,3]{U:(dp,tp)}", "f32[10@(tp,dp),3]", MESH)
        outs = from_local(y)
    slices = lowering.local_slices("f32[10@(tp,dp),3]", MESH)
    for r in range(4):
        assert torch.equal(outs[r], g[slices[r]])


def _dtensor_setup(fake_pg):
    from torch.distributed.device_mesh import init_device_mesh

    fake_pg(8)
    return init_device_mesh


@pytest.mark.parametrize("dst,placements", [
    ("f32[12@tp,10]", "(Replicate(), Shard(dim=0))"),
    ("f32[12,10@(tp,dp)]", None),  # non-mesh order: a _StridedShard form
    ("f32[12,10]", "(Replicate(), Replicate())"),
])
def test_dtensor_forward(fake_pg, dst, placements):
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    fake_pg(8)
    g = torch.arange(120.0).reshape(12, 10)
    with LocalTensorMode(8):
        dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        dt = distribute_tensor(g, dm, [Shard(0), Shard(0)])  # f32[12@(dp,tp),10], uneven
        out = torch_backend.redistribute(dt, dst)
        if placements is not None:
            assert str(tuple(out.placements)) == placements
        outs = from_local(out.to_local())
    slices = lowering.local_slices(dst, "dp=2,tp=4")
    for r in range(8):
        assert torch.equal(outs[r], g[slices[r]])


def test_dtensor_backward(fake_pg):
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    fake_pg(8)
    g = torch.arange(128.0).reshape(16, 8)
    w_full = torch.tensor(np.arange(128.0).reshape(16, 8) % 5)
    with LocalTensorMode(8):
        dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        dt = distribute_tensor(g, dm, [Replicate(), Shard(1)]).requires_grad_(True)
        y = torch_backend.redistribute(dt, "f32[16@(dp,tp),8]")
        w = distribute_tensor(w_full.float(), dm, y.placements)
        (y * w).sum().backward()
        assert tuple(dt.grad.placements) == (Replicate(), Shard(1))
        full = from_local(dt.grad.full_tensor())
    for f in full:
        assert torch.equal(f, w_full.float())
