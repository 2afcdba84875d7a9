"""``redistribute`` with a DTensor input: a stated source type or mesh must agree with the
DTensor (SpecError before any communication otherwise), ``agree=`` is honoured, and the
gradient of the input has the dual type's placements. DTensor under LocalTensorMode is the
oracle."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch_utils import from_local  # noqa: E402

import lowering  # noqa: E402
import torch_backend  # noqa: E402
from spec_lang import SpecError  # noqa: E402

MESH = "dp=2,tp=4"


def _dtensor(fake_pg, placements, full=None):
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    fake_pg(8)
    full = torch.arange(120.0).reshape(12, 10) if full is None else full
    lm = LocalTensorMode(8)
    lm.__enter__()
    dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    return lm, dm, full, distribute_tensor(full, dm, placements)


@pytest.fixture
def sharded(fake_pg):
    from torch.distributed.tensor import Shard

    lm, dm, full, d = _dtensor(fake_pg, [Shard(0), Shard(0)])  # f32[12@(dp,tp),10]
    yield dm, full, d
    lm.__exit__(None, None, None)


@pytest.mark.parametrize("src,match", [
    ("f32[12@(tp,dp),10]", r"does not match the DTensor, which is float32\[12@\(dp,tp\),10\]"),
    ("f32[12@dp,10]", "does not match the DTensor"),
    ("f64[12@(dp,tp),10]", "does not match the DTensor"),
    ("f32[12@(dp,tp),10]{U:zz}", "not on the mesh"),
    ("f32[12@(dp,tp),10", "malformed"),
])
def test_stated_source_must_match(sharded, src, match):
    _, _, d = sharded
    before = [t.clone() for t in from_local(d.to_local())]
    with pytest.raises(SpecError, match=match) as info:
        torch_backend.redistribute(d, src, "f32[12@tp,10]")
    assert info.value.hint
    assert all(torch.equal(a, b) for a, b in zip(from_local(d.to_local()), before))


@pytest.mark.parametrize("mesh", ["a=2,b=4", "dp=4,tp=2", "dp=8", "tp=4,dp=2"])
def test_stated_mesh_must_match(sharded, mesh):
    _, _, d = sharded
    with pytest.raises(SpecError, match="does not match the DTensor's DeviceMesh dp=2,tp=4") as info:
        torch_backend.redistribute(d, "f32[12@tp,10]", mesh=mesh)
    assert "drop mesh=" in info.value.hint


def test_other_device_mesh_is_refused(sharded):
    from torch.distributed.device_mesh import init_device_mesh

    _, _, d = sharded
    other = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))
    with pytest.raises(SpecError, match="does not match the DTensor's DeviceMesh"):
        torch_backend.redistribute(d, "f32[12@tp,10]", mesh=other)


@pytest.mark.parametrize("how", ["dst only", "src and dst", "src, dst, mesh string", "own DeviceMesh", "agree"])
def test_agreeing_forms_give_dtensor_result(sharded, how):
    dm, full, d = sharded
    src, dst = "f32[12@(dp,tp),10]", "f32[12@tp,10]"
    call = {
        "dst only": lambda: torch_backend.redistribute(d, dst),
        "src and dst": lambda: torch_backend.redistribute(d, src, dst),
        "src, dst, mesh string": lambda: torch_backend.redistribute(d, src, dst, MESH),
        "own DeviceMesh": lambda: torch_backend.redistribute(d, src, dst, dm),
        "agree": lambda: torch_backend.redistribute(d, src, dst, agree=True),
    }[how]
    out = call()
    slices = lowering.local_slices(dst, MESH)
    outs = from_local(out.to_local())
    for r in range(8):
        assert torch.equal(outs[r], full[slices[r]])


@pytest.mark.parametrize("agree", [True, False])
def test_agree_is_passed_through(sharded, monkeypatch, agree):
    seen = []
    real = torch_backend.api.agreed

    def spy(mesh, run):
        seen.append(mesh)
        return real(mesh, run)

    monkeypatch.setattr(torch_backend.api, "agreed", spy)
    dm, _, d = sharded
    torch_backend.redistribute(d, "f32[12@(dp,tp),10]", "f32[12@tp,10]", agree=agree)
    assert seen == ([dm] if agree else [])


def test_partial_input_gradient_is_replicated(fake_pg):
    """A Partial(sum) DTensor's gradient is replicated (the dual of P is R), as DTensor's own
    redistribute gives it, not Partial."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    full = torch.arange(96.0).reshape(12, 8)
    lm, dm, _, d = _dtensor(fake_pg, [Partial(), Shard(0)], full)
    try:
        d.requires_grad_(True)
        y = torch_backend.redistribute(d, "f32[12@tp,8]{U:dp}", "f32[12@(tp,dp),8]")
        y.sum().backward()
        assert tuple(d.grad.placements) == (Replicate(), Shard(0))
        grads = from_local(d.grad.full_tensor())
    finally:
        lm.__exit__(None, None, None)
    for g in grads:
        assert torch.equal(g, torch.ones(12, 8))


def test_stated_r_asks_for_a_partial_gradient(fake_pg):
    """``{R:dp}`` may stand for DTensor's Replicate: same forward, and the input's gradient
    is then Partial over dp (its dual), summing to the same full gradient."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    full = torch.arange(96.0).reshape(12, 8)
    lm, dm, _, d = _dtensor(fake_pg, [Replicate(), Shard(0)], full)
    try:
        d.requires_grad_(True)
        y = torch_backend.redistribute(d, "f32[12@tp,8]{R:dp}", "f32[12@(tp,dp),8]")
        y.sum().backward()
        assert tuple(d.grad.placements) == (Partial(), Shard(0))
        grads = from_local(d.grad.full_tensor())
        d2 = d.detach().requires_grad_(True)
        torch_backend.redistribute(d2, "f32[12@(tp,dp),8]").sum().backward()
        assert tuple(d2.grad.placements) == (Replicate(), Shard(0))
    finally:
        lm.__exit__(None, None, None)
    for g in grads:
        assert torch.equal(g, torch.ones(12, 8))
