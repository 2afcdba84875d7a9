"""Prepared programs and coalesced redistribution, under LocalTensorMode: bit-identical to
``redistribute``, one collective per packed group, differentiable, checked before sending."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from planner_oracle import shards_of  # noqa: E402
from soak_cases import random_redistributions  # noqa: E402
from torch_utils import from_local, local_mode, random_blocks, to_local  # noqa: E402

import torch_backend  # noqa: E402
from lowering import compile_many  # noqa: E402
from spec_lang import parse, parse_mesh  # noqa: E402
from spec_lang.dual import dual_type  # noqa: E402
from spec_lang.errors import SpecError  # noqa: E402
from torch_backend import comm  # noqa: E402

FakePG = Callable[[int], None]


def _inputs(src: str, mesh: str, seed: int) -> list[torch.Tensor]:
    t, m = parse(src), parse_mesh(mesh)
    rng = np.random.default_rng(seed)
    full = rng.integers(-20, 20, size=t.shape).astype(np.float64)
    return [torch.from_numpy(a.copy()) for a in shards_of(full, t, m, rng)]


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture()
def count_collectives(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls: dict[str, int] = {}
    for name in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "p2p"):
        real = getattr(comm, name)

        def counted(*a: object, _real: Callable = real, _name: str = name, **k: object) -> object:
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*a, **k)

        monkeypatch.setattr(comm, name, counted)
    return calls


def test_redistributor_is_bit_identical_to_redistribute(fake_pg: FakePG) -> None:
    for i, (m, s, d) in enumerate(random_redistributions(40, seed=3)):
        mesh = parse_mesh(m)
        blocks = _inputs(s, m, i)
        with local_mode(fake_pg, mesh.size) as lm:
            f = torch_backend.redistributor(s, d, m)
            x = to_local(lm, blocks)
            want = from_local(torch_backend.redistribute(x, s, d, m))
            got1, got2 = from_local(f(x)), from_local(f(x))
            assert _equal(from_local(x), blocks), "input modified"
        assert _equal(got1, want) and _equal(got2, want), (m, s, d)


def test_redistribute_many_is_bit_identical(fake_pg: FakePG) -> None:
    cases = [c for c in random_redistributions(60, seed=5) if c[0] == "dp=2,tp=4"][:12]
    srcs, dsts = [s for _, s, _ in cases], [d for _, _, d in cases]
    blocks = [_inputs(s, "dp=2,tp=4", i) for i, s in enumerate(srcs)]
    with local_mode(fake_pg, 8) as lm:
        xs = [to_local(lm, b) for b in blocks]
        want = [from_local(torch_backend.redistribute(x, s, d, "dp=2,tp=4")) for x, s, d in zip(xs, srcs, dsts)]
        got = [from_local(y) for y in torch_backend.redistribute_many(xs, srcs, dsts, "dp=2,tp=4")]
    for w, g, s, d in zip(want, got, srcs, dsts):
        assert _equal(g, w), (s, d)


FSDP = [(f"f32[{n}@dp,{k}]", f"f32[{n},{k}]") for n, k in [(16, 8), (8, 4), (32, 2), (4, 4), (24, 3)]]
FSDP += [(f"f64[{n}@dp]", f"f64[{n}]") for n in (8, 12)]


def test_fsdp_layer_is_one_collective_per_dtype(fake_pg: FakePG, count_collectives: dict[str, int]) -> None:
    srcs, dsts = [s for s, _ in FSDP], [d for _, d in FSDP]
    joint = compile_many(srcs, dsts, "dp=4")
    assert joint.cost.collectives == 2  # float32 and float64
    assert joint.cost.bytes_sent_max == sum(p.cost.bytes_sent_max for p in joint.programs)
    with local_mode(fake_pg, 4) as lm:
        xs = [to_local(lm, random_blocks(parse(s), parse_mesh("dp=4"), np.random.default_rng(i), dtype=dt))
              for i, (s, dt) in enumerate(zip(srcs, [torch.float32] * 5 + [torch.float64] * 2))]
        count_collectives.clear()
        ys = torch_backend.redistribute_many(xs, srcs, dsts, "dp=4")
        assert count_collectives == {"all_gather": 2}
        want = [torch_backend.redistribute(x, s, d, "dp=4") for x, s, d in zip(xs, srcs, dsts)]
        assert all(_equal(from_local(a), from_local(b)) for a, b in zip(ys, want))


def test_packed_kinds(fake_pg: FakePG, count_collectives: dict[str, int]) -> None:
    # reduce_scatter (even and padded), all_reduce and exchange, each packed across tensors
    sets = {
        "reduce_scatter": (["f32[8,4]{U:tp}", "f32[10]{U:tp}", "f32[4,8]{U:tp}"],
                           ["f32[8@tp,4]", "f32[10@tp]", "f32[4@tp,8]"]),
        "all_reduce": (["f32[3]{U:tp}", "f32[2,5]{U:tp}"], ["f32[3]", "f32[2,5]"]),
        "all_to_all": (["f32[8@tp,4]", "f32[7@tp,10]", "f32[4@tp,8]"], ["f32[8,4@tp]", "f32[7,10@tp]", "f32[4,8@tp]"]),
    }
    for kind, (srcs, dsts) in sets.items():
        with local_mode(fake_pg, 8) as lm:
            mesh = parse_mesh("dp=2,tp=4")
            xs = [to_local(lm, random_blocks(parse(s), mesh, np.random.default_rng(i), dtype=torch.float32))
                  for i, s in enumerate(srcs)]
            count_collectives.clear()
            ys = torch_backend.redistribute_many(xs, srcs, dsts, mesh)
            assert count_collectives == {kind: 1}, (kind, count_collectives)
            want = [torch_backend.redistribute(x, s, d, mesh) for x, s, d in zip(xs, srcs, dsts)]
            assert all(_equal(from_local(a), from_local(b)) for a, b in zip(ys, want)), kind


def test_autograd_through_prepared_and_many(fake_pg: FakePG) -> None:
    srcs = ["f64[8@dp,4]", "f64[6,4]{U:tp}", "f64[8@(dp,tp)]"]
    dsts = ["f64[8,4]{R:dp}", "f64[6@tp,4]", "f64[8@(tp,dp)]"]
    mesh = parse_mesh("dp=2,tp=4")
    with local_mode(fake_pg, 8) as lm:
        xs = [to_local(lm, random_blocks(parse(s), mesh, np.random.default_rng(i), dtype=torch.float64),
                       requires_grad=True) for i, s in enumerate(srcs)]
        ys = torch_backend.redistribute_many(xs, srcs, dsts, mesh)
        gs = [to_local(lm, random_blocks(dual_type(parse(d)), mesh, np.random.default_rng(9 + i),
                                         dtype=torch.float64)) for i, d in enumerate(dsts)]
        got = torch.autograd.grad(ys, xs, grad_outputs=gs)
        for x, s, d, g, want_g in zip(xs, srcs, dsts, gs, got):
            y = torch_backend.redistributor(s, d, mesh)(x)
            (one,) = torch.autograd.grad(y, x, grad_outputs=g)
            (ref,) = torch.autograd.grad(torch_backend.redistribute(x, s, d, mesh), x, grad_outputs=g)
            assert _equal(from_local(one), from_local(ref))
            assert _equal(from_local(want_g), from_local(ref))


def test_refusals_come_before_any_collective(fake_pg: FakePG, count_collectives: dict[str, int]) -> None:
    with local_mode(fake_pg, 4) as lm:
        good = to_local(lm, random_blocks(parse("f32[8@dp]"), parse_mesh("dp=4"), np.random.default_rng(0),
                                          dtype=torch.float32))
        bad = to_local(lm, random_blocks(parse("f32[12@dp]"), parse_mesh("dp=4"), np.random.default_rng(0),
                                         dtype=torch.float32))
        count_collectives.clear()
        with pytest.raises(SpecError, match="tensor 1"):
            torch_backend.redistribute_many([good, bad], ["f32[8@dp]"] * 2, ["f32[8]"] * 2, "dp=4")
        with pytest.raises(SpecError, match="one destination type per source type|2 tensors, 2 source types and 1"):
            torch_backend.redistribute_many([good, good], ["f32[8@dp]"] * 2, ["f32[8]"], "dp=4")
        with pytest.raises(SpecError, match="sequence of tensors"):
            torch_backend.redistribute_many(good, ["f32[8@dp]"], ["f32[8]"], "dp=4")
        with pytest.raises(SpecError, match="not on the mesh"):
            torch_backend.redistributor("f32[8@tp]", "f32[8]", "dp=4")
        f = torch_backend.redistributor("f32[8@dp]", "f32[8]", "dp=4")
        with pytest.raises(SpecError, match="shape"):
            f(bad)
        assert count_collectives == {}
