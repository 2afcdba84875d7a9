"""The two-phase relay on real gloo ranks (4 processes): the planner's relay forward, the
bytes handed to all_to_all_single and taken back (two calls, each with exact splits: the
step's sent figure, and per call the busier direction, summed: its price), and its
gradient as the exact adjoint; compiled by inductor, the same bits as eager. Small tensors, hard timeouts."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch_utils import pairing, random_blocks, run_once  # noqa: E402
from uneven_cases import block, case_types  # noqa: E402

from lowering import compile  # noqa: E402
from spec_lang.dual import dual_type  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")
# rows 0 and 1 on (y=0, x=0) and (y=1, x=0); each rank needs its x's two columns of both
RELAY = ("y=2,x=2", "f64[2@(x,y),4]", "f64[2,4@x]")


def relayed(rank: int, world: int) -> dict:
    from torch_backend import redistribute

    real = dist.all_to_all_single
    seen: list[tuple[int, int]] = []

    def counting(output, input, output_split_sizes=None, input_split_sizes=None, **kw):
        assert input.numel() == sum(input_split_sizes) and output.numel() == sum(output_split_sizes)
        sent, got = sum(input_split_sizes) * input.element_size(), sum(output_split_sizes) * output.element_size()
        seen.append((sent, max(sent, got)))
        return real(output, input, output_split_sizes, input_split_sizes, **kw)

    m, s, d = case_types(*RELAY)
    dist.all_to_all_single = counting
    try:
        x = torch.from_numpy(block(s, m, rank))
        x0 = x.clone()
        y = redistribute(x, s, d, m, timeout=20)
        out = {"calls": len(seen), "sent": sum(c[0] for c in seen), "moved": sum(c[1] for c in seen),
               "ok": bool(np.array_equal(y.numpy(), block(d, m, rank)) and torch.equal(x, x0))}
    finally:
        dist.all_to_all_single = real
    rng = np.random.default_rng(7)  # the same on every rank: every rank builds the same blocks
    xb, yb = random_blocks(s, m, rng), random_blocks(dual_type(d), m, rng)
    xg = xb[rank].clone().requires_grad_(True)
    yg = redistribute(xg, s, d, m, timeout=20)
    (grad,) = torch.autograd.grad(yg, xg, grad_outputs=yb[rank])
    out["backward"] = (yg.detach().numpy(), grad.numpy())
    # compiled by inductor, forward and backward: the same bits as eager (the relay's empty
    # sends and receives still follow its input, so every rank's collectives pair up)
    fn = torch.compile(lambda t: redistribute(t, RELAY[1], RELAY[2], RELAY[0]), backend="inductor", fullgraph=True)
    xc = xb[rank].clone().requires_grad_(True)
    yc = fn(xc)
    (gc,) = torch.autograd.grad(yc, xc, grad_outputs=yb[rank])
    out["compiled"] = bool(torch.equal(yc.detach(), yg.detach()) and torch.equal(gc, grad))
    return out


@pytest.mark.timeout(300)
def test_relay_on_4_gloo_ranks() -> None:
    m, s, d = case_types(*RELAY)
    prog = compile(s, d, m)
    assert [st.kind for st in prog.steps] == ["relay"]
    results = run_once(4, relayed, collective_timeout_s=30, timeout_s=120)
    step = prog.steps[0]
    for r in range(4):
        assert results[r]["ok"], r
        assert results[r]["compiled"], r
        assert results[r]["calls"] == 2  # the two phases
        assert (results[r]["sent"], results[r]["moved"]) == (step.bytes_sent[r], step.bytes_moved[r]), r
    assert max(results[r]["moved"] for r in range(4)) == prog.cost.bytes_max
    rng = np.random.default_rng(7)
    xb, yb = random_blocks(s, m, rng), random_blocks(dual_type(d), m, rng)
    outs = [torch.from_numpy(results[r]["backward"][0]) for r in range(4)]
    grads = [torch.from_numpy(results[r]["backward"][1]) for r in range(4)]
    assert pairing(d, m, outs, yb) == pairing(s, m, xb, grads)
