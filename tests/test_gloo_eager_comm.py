"""Eager calls on the functional collectives (``comm.eager_comm("functional")``, what
``SHARDC_EAGER_COMM=functional`` selects) give, bit for bit, what the default c10d
implementation gives, on real gloo ranks: the lean one-step forms, multi-step and uneven
programs (a ring and point-to-point permute on c10d, an exact all_to_all on the functional
form), dtypes gloo carries in another form (complex, bool, bf16), a prepared call,
``redistribute_many``, ``async_op=True``, and the gradients. Both ways run in the same rank
processes, and each way is checked to have issued its own collectives."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch_utils import random_blocks  # noqa: E402

from spec_lang import parse, parse_mesh  # noqa: E402
from spec_lang.dual import dual_type  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

MESH = "dp=2,tp=4"
CASES = [
    ("f64[8@dp,6]", "f64[8,6]"),  # lean all_gather
    ("f64[8,6]{P(avg):(dp,tp)}", "f64[8@tp,6@dp]"),  # lean reduce_scatter, avg
    ("f64[5,3]{U:(dp,tp)}", "f64[5,3]"),  # all_reduce
    ("f64[10@(dp,tp)]", "f64[10]"),  # uneven all_gather: a ring on c10d, one all_to_all here
    ("f64[8@(dp,tp),2]", "f64[8@(tp,dp),2]"),  # permute: point-to-point on c10d
    ("f64[12@(dp,tp),10]", "f64[12@tp,10]"),  # uneven exchange
    ("c64[12@(dp,tp),10]", "c64[12@tp,10]"),  # complex travels as real pairs
    ("c128[8,6]{P(avg):(dp,tp)}", "c128[8@tp,6]"),
    ("bool[10@(dp,tp)]", "bool[10]"),
    ("bf16[8,4]{U:tp}", "bf16[8,4@tp]"),
]
MANY = (["f64[8@dp,6]", "f64[16@dp,2]", "f64[8,6]{U:dp}"], ["f64[8,6]", "f64[16,2]", "f64[8@dp,6]"])


def _calls(rank: int) -> list[torch.Tensor]:
    """Every call form's results and gradients on this rank, in one order."""
    import torch_backend
    from torch_backend.data import block, global_tensor

    mesh = parse_mesh(MESH)
    out: list[torch.Tensor] = []
    for i, (s, d) in enumerate(CASES):
        x = block(parse(s), mesh, global_tensor(parse(s)), rank).clone()
        out.append(torch_backend.redistribute(x, s, d, MESH, timeout=30))
        out.append(torch_backend.redistributor(s, d, MESH)(x))
        if x.dtype == torch.float64:
            x.requires_grad_(True)
            g = random_blocks(dual_type(parse(d)), mesh, np.random.default_rng(40 + i))[rank]
            y = torch_backend.redistribute(x, s, d, MESH, async_op=True, timeout=30).wait()
            out += [y.detach(), *torch.autograd.grad(y, x, grad_outputs=g)]
    xs = [random_blocks(parse(s), mesh, np.random.default_rng(60 + i))[rank].clone().requires_grad_(True)
          for i, s in enumerate(MANY[0])]
    gs = [random_blocks(dual_type(parse(d)), mesh, np.random.default_rng(70 + i))[rank] for i, d in enumerate(MANY[1])]
    for async_op in (False, True):
        ys = torch_backend.redistribute_many(xs, *MANY, MESH, async_op=async_op, timeout=30)
        ys = ys.wait() if async_op else ys
        out += [y.detach() for y in ys] + list(torch.autograd.grad(ys, xs, grad_outputs=gs))
    return out


def _both_ways(rank: int, world: int) -> dict[str, Any]:
    from torch_backend import comm

    counts = {"c10d": 0, "functional": 0}
    spied = {"c10d": comm.C10D, "functional": comm.EAGER_FUNCTIONAL}

    def spy(impl: Any, name: str, method: str) -> None:
        real = getattr(impl, method)

        def counted(*a: Any, **k: Any) -> Any:
            counts[name] += 1
            return real(*a, **k)

        setattr(impl, method, counted)

    methods = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "p2p_batch")
    for name, impl in spied.items():
        for method in methods:
            if hasattr(impl, method):
                spy(impl, name, method)
    got = {}
    try:
        for name in ("c10d", "functional"):
            comm.eager_comm(name)
            got[name] = _calls(rank)
    finally:
        comm.eager_comm("c10d")
        for impl in spied.values():
            for method in methods:
                impl.__dict__.pop(method, None)
    a, b = got["c10d"], got["functional"]
    same = len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))
    return {"same": same, "n": len(a), "counts": counts}


@pytest.mark.timeout(240)
def test_eager_functional_equals_c10d_bit_for_bit(gloo_pool: Any) -> None:
    results = gloo_pool.run(_both_ways, timeout_s=200)
    for r, res in results.items():
        assert res["same"], f"rank {r}: the functional collectives differ from c10d's"
        assert res["n"] == 44  # 10 calls and 10 prepared, 6 async with gradients, 2x redistribute_many of 3
        # each way issued collectives of its own implementation (the spies saw both)
        assert res["counts"]["c10d"] > 0 and res["counts"]["functional"] > 0, res["counts"]


def test_eager_comm_refuses_an_unknown_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from spec_lang.errors import SpecError
    from torch_backend import comm

    with pytest.raises(SpecError, match=r"eager_comm\('nccl'\).*\n.*hint: use one of \['c10d', 'functional'\]"):
        comm.eager_comm("nccl")
    monkeypatch.setenv("SHARDC_EAGER_COMM", "fast")
    with pytest.raises(SpecError, match="SHARDC_EAGER_COMM='fast'"):
        comm.eager_comm()
    monkeypatch.delenv("SHARDC_EAGER_COMM")
    assert comm.eager_comm() == "c10d"
    monkeypatch.undo()
    comm.eager_comm()  # this process's own setting again
