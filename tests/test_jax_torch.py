"""``jax_backend.to_torch`` / ``from_torch``: a sharded jax.Array's per-device blocks as torch
tensors and back through DLPack, exact and without a copy on CPU; and where they meet
torch's LocalTensorMode: the same blocks redistributed by the torch engine (one process
playing every rank) and by the JAX engine agree block for block."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
from torch_utils import from_local, local_mode, to_local  # noqa: E402

import jax_backend  # noqa: E402
import lowering  # noqa: E402
import torch_backend  # noqa: E402
from spec_lang import SpecError, parse, to_jax  # noqa: E402

if len(jax.devices()) < 8:
    pytest.skip("jax sees fewer than 8 devices (XLA_FLAGS was set too late)", allow_module_level=True)


def _array(text: str, mesh: str) -> jax.Array:
    t, m = lowering.resolve(text, mesh)
    rng = np.random.default_rng(0)
    blocks = [rng.standard_normal(s).astype(np.float32) for s in lowering.local_shapes(t, m)]
    if not t.partial_axes:
        full = rng.standard_normal(t.shape).astype(np.float32)
        blocks = [full[sl] for sl in lowering.local_slices(t, m)]
    return jax_backend.from_blocks(blocks, t, to_jax(t, m).mesh)


@pytest.mark.parametrize("text,mesh", [("f32[8@(dp,tp),6]", "dp=2,tp=4"), ("f32[8@tp,6]{U:dp}", "dp=2,tp=4")])
def test_round_trip_is_exact_and_shares_memory_on_cpu(text: str, mesh: str) -> None:
    x = _array(text, mesh)
    blocks, t = jax_backend.to_torch(x)
    assert parse(t) == parse(text) and len(blocks) == 8 and all(isinstance(b, torch.Tensor) for b in blocks)
    mine = jax_backend.blocks_of(x)
    assert all(np.array_equal(b.numpy(), m) for b, m in zip(blocks, mine, strict=True))
    shards = jax_backend.to_blocks(x)[0]
    assert all(b.data_ptr() == s.unsafe_buffer_pointer() for b, s in zip(blocks, shards))  # no copy
    back = jax_backend.from_torch(blocks, t, x.sharding.mesh)
    assert back.sharding == x.sharding and jax.typeof(back) == jax.typeof(x)
    assert all(np.array_equal(a, b) for a, b in zip(jax_backend.blocks_of(back), mine, strict=True))
    again = jax_backend.to_blocks(back)[0]
    assert all(a.unsafe_buffer_pointer() == b.data_ptr() for a, b in zip(again, blocks))  # no copy back


def test_from_torch_refuses_a_wrong_block() -> None:
    x = _array("f32[8@(dp,tp),6]", "dp=2,tp=4")
    blocks, t = jax_backend.to_torch(x)
    with pytest.raises(SpecError, match="rank 3's block has shape"):
        jax_backend.from_torch(blocks[:3] + [torch.zeros(2, 6)] + blocks[4:], t, x.sharding.mesh)
    with pytest.raises(SpecError, match="7 blocks"):
        jax_backend.from_torch(blocks[:7], t, x.sharding.mesh)


@pytest.mark.parametrize("src,dst", [("f32[8@(tp,dp),8]", "f32[8,8@dp]"), ("f32[8,8]{U:tp}", "f32[8@tp,8]")])
def test_local_tensor_mode_and_jax_agree(fake_pg, src: str, dst: str) -> None:  # type: ignore[no-untyped-def]
    mesh = "dp=4,tp=2"
    x = _array(src, mesh)
    blocks, t = jax_backend.to_torch(x)
    with local_mode(fake_pg, 8) as lm:
        y = torch_backend.redistribute(to_local(lm, blocks), t, dst, mesh)
    torch_out = from_local(y)
    jax_out, t_out = jax_backend.to_torch(jax_backend.redistribute(x, dst))
    assert t_out == str(lowering.resolve(dst, mesh)[0])
    assert all(torch.equal(a, b) for a, b in zip(torch_out, jax_out, strict=True))
