"""``async_op=True``: the handle's ``wait()`` gives what the sync call gives, autograd included;
on real gloo the last collective is really launched before ``wait()``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_utils import from_local, local_mode, random_blocks, to_local  # noqa: E402

import torch_backend  # noqa: E402
from spec_lang import parse, parse_mesh  # noqa: E402
from spec_lang.dual import dual_type  # noqa: E402
from spec_lang.errors import SpecError  # noqa: E402

CASES = [  # launched: even all_gather into its output, reduce_scatter, all_reduce; then not launched
    ("dp=4,tp=2", "f64[8@dp,6]", "f64[8,6]"),
    ("dp=4,tp=2", "f64[8,6]{U:dp}", "f64[8@dp,6]"),
    ("dp=4,tp=2", "f64[5,3]{U:(dp,tp)}", "f64[5,3]"),
    ("dp=4,tp=2", "f64[10@(dp,tp),3]", "f64[10,3@tp]"),
    ("dp=4,tp=2", "f64[8@(dp,tp)]", "f64[8@(tp,dp)]"),
    ("dp=4,tp=2", "f64[8@dp,6]", "f64[8@dp,6@tp]"),
]


def test_async_equals_sync_with_autograd(fake_pg: Callable[[int], None]) -> None:
    for i, (m, s, d) in enumerate(CASES):
        mesh = parse_mesh(m)
        with local_mode(fake_pg, mesh.size) as lm:
            x = to_local(lm, random_blocks(parse(s), mesh, np.random.default_rng(i)), requires_grad=True)
            g = to_local(lm, random_blocks(dual_type(parse(d)), mesh, np.random.default_rng(i + 50)))
            h = torch_backend.redistribute(x, s, d, m, async_op=True)
            y = h.wait()
            assert h.wait() is y
            want = torch_backend.redistribute(x, s, d, m)
            (gx,) = torch.autograd.grad(y, x, grad_outputs=g)
            (gw,) = torch.autograd.grad(want, x, grad_outputs=g)
            f = torch_backend.redistributor(s, d, m)
            y2 = f(x, async_op=True).wait()
            assert all(torch.equal(a, b) for a, b in zip(from_local(y), from_local(want)))
            assert all(torch.equal(a, b) for a, b in zip(from_local(y2), from_local(want)))
            assert all(torch.equal(a, b) for a, b in zip(from_local(gx), from_local(gw)))


def test_async_refuses_a_dtensor(fake_pg: Callable[[int], None]) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    with local_mode(fake_pg, 4):
        dm = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
        dt = distribute_tensor(torch.arange(8.0), dm, [Shard(0)])
        with pytest.raises(SpecError, match="async_op"):
            torch_backend.redistribute(dt, "f32[8]", async_op=True)


def _gloo_async(rank: int, world: int) -> list[str]:
    import torch_backend.collectives as coll

    bad = []
    launched = []
    real = coll.launch

    def spy(*a: object) -> object:
        out = real(*a)  # type: ignore[arg-type]
        launched.append(out is not None)
        return out

    coll.launch = spy  # type: ignore[assignment]
    try:
        return _run_cases(rank, launched, bad)
    finally:
        coll.launch = real  # type: ignore[assignment]


def _run_cases(rank: int, launched: list[bool], bad: list[str]) -> list[str]:
    for i, (m, s, d) in enumerate(CASES):
        mesh = parse_mesh(m)
        blocks = random_blocks(parse(s), mesh, np.random.default_rng(i))
        x = blocks[rank].clone().requires_grad_(True)
        h = torch_backend.redistribute(x, s, d, m, async_op=True, timeout=30)
        y = h.wait()
        want = torch_backend.redistribute(x, s, d, m, timeout=30)
        if not torch.equal(y, want):
            bad.append(f"{s} -> {d}: wrong result")
        g = random_blocks(dual_type(parse(d)), mesh, np.random.default_rng(i + 50))[rank]
        (gx,) = torch.autograd.grad(y, x, grad_outputs=g)
        (gw,) = torch.autograd.grad(want, x, grad_outputs=g)
        if not torch.equal(gx, gw):
            bad.append(f"{s} -> {d}: wrong gradient")
    if launched[:3] != [True, True, True] or any(launched[3:]):
        bad.append(f"launched {launched}")
    return bad


@pytest.mark.timeout(240)
def test_async_on_gloo_launches_and_matches(gloo_pool: Any) -> None:
    results = gloo_pool.run(_gloo_async, timeout_s=200)
    bad = {r: v for r, v in results.items() if v}
    assert not bad, bad


MANY_SRCS = ["f64[8@dp,6]", "f64[16@dp,2]", "f64[8,6]{U:dp}", "f64[10@(dp,tp),3]"]
MANY_DSTS = ["f64[8,6]", "f64[16,2]", "f64[8@dp,6]", "f64[10,3@tp]"]


def test_many_async_equals_sync_with_autograd(fake_pg: Callable[[int], None]) -> None:
    mesh = parse_mesh("dp=4,tp=2")
    with local_mode(fake_pg, 8) as lm:
        xs = [to_local(lm, random_blocks(parse(s), mesh, np.random.default_rng(i)), requires_grad=True)
              for i, s in enumerate(MANY_SRCS)]
        gs = [to_local(lm, random_blocks(dual_type(parse(d)), mesh, np.random.default_rng(20 + i)))
              for i, d in enumerate(MANY_DSTS)]
        ys = torch_backend.redistribute_many(xs, MANY_SRCS, MANY_DSTS, mesh, async_op=True).wait()
        want = torch_backend.redistribute_many(xs, MANY_SRCS, MANY_DSTS, mesh)
        got_g = torch.autograd.grad(ys, xs, grad_outputs=gs)
        want_g = torch.autograd.grad(want, xs, grad_outputs=gs)
        for a, b in zip(ys + list(got_g), want + list(want_g)):
            assert all(torch.equal(p, q) for p, q in zip(from_local(a), from_local(b)))


def _gloo_many_async(rank: int, world: int) -> list[str]:
    mesh = parse_mesh("dp=4,tp=2")
    xs = [random_blocks(parse(s), mesh, np.random.default_rng(i))[rank].clone().requires_grad_(True)
          for i, s in enumerate(MANY_SRCS)]
    h = torch_backend.redistribute_many(xs, MANY_SRCS, MANY_DSTS, mesh, async_op=True, timeout=30)
    inflight = len(h._inflight)
    ys = h.wait()
    want = torch_backend.redistribute_many(xs, MANY_SRCS, MANY_DSTS, mesh, timeout=30)
    bad = [] if inflight >= 2 else [f"only {inflight} collectives in flight"]
    bad += [f"tensor {j} differs" for j, (a, b) in enumerate(zip(ys, want)) if not torch.equal(a, b)]
    gs = [random_blocks(dual_type(parse(d)), mesh, np.random.default_rng(20 + i))[rank] for i, d in enumerate(MANY_DSTS)]
    got = torch.autograd.grad(ys, xs, grad_outputs=gs)
    ref = torch.autograd.grad(want, xs, grad_outputs=gs)
    bad += [f"gradient {j} differs" for j, (a, b) in enumerate(zip(got, ref)) if not torch.equal(a, b)]
    return bad


@pytest.mark.timeout(240)
def test_many_async_on_gloo(gloo_pool: Any) -> None:
    results = gloo_pool.run(_gloo_many_async, timeout_s=200)
    bad = {r: v for r, v in results.items() if v}
    assert not bad, bad
