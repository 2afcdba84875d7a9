"""bench/dtensor_engine.py's *model* part: a Llama-style block under tensor, sequence and
data parallelism (``parallelize_module`` with ColwiseParallel / RowwiseParallel /
SequenceParallel on tp=4, ``fully_shard`` on dp=2) on a 2x4 gloo mesh, forward and
backward, eager and compiled, with DTensor's own redistributions and with shardc's
engine; step times, loss and gradient differences, the engine's share of the calls."""

from __future__ import annotations

import statistics
import time
from typing import Any

DIM, HEADS, HIDDEN, BATCH, SEQ = 256, 8, 512, 2, 64


def _block() -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x: Any) -> Any:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            hd = DIM // HEADS
            q, k, v = (w(x).view(b, s, -1, hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(o.transpose(1, 2).reshape(b, s, -1))

    class FeedForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
            self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
            self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

        def forward(self, x: Any) -> Any:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention_norm, self.attention = RMSNorm(DIM), Attention()
            self.ffn_norm, self.feed_forward = RMSNorm(DIM), FeedForward()

        def forward(self, x: Any) -> Any:
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    return Block()


def _parallel_block(dm: Any) -> Any:
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    block = _block()
    plan = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    parallelize_module(block, dm["tp"], plan)
    fully_shard(block, mesh=dm["dp"])
    return block


def model_rows(rank: int, iters: int, backend: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from torch_backend.dtensor_switch import dtensor_engine, dtensor_engine_stats

    dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(BATCH, SEQ // 4, DIM, generator=gen)  # this rank's sequence chunk
    out: dict[str, Any] = {}
    # compiled first: after eager steps, fresh blocks on the same mesh get an earlier
    # block's equal ("tp",) submesh from DTensor's sharding-propagation cache, and an
    # inductor compile fails in make_fx (device_mesh._get_submesh is not an OpOverload),
    # with or without shardc (docs/running.md)
    for compiled in (True, False):
        torch._dynamo.reset()
        blocks = {mode: _parallel_block(dm) for mode in ("off", "on")}
        steps = {mode: torch.compile(b, backend=backend) if compiled else b for mode, b in blocks.items()}
        times: dict[str, list[float]] = {"off": [], "on": []}
        losses: dict[str, float] = {}
        counts = {"taken": 0, "fallback": 0}
        for i in range(iters + 2):  # the two timed in turn, which goes first alternating
            for mode in (("off", "on") if i % 2 else ("on", "off")):
                before = dtensor_engine_stats()
                with dtensor_engine(mode == "on"):
                    blocks[mode].zero_grad(set_to_none=True)
                    dist.barrier()
                    t0 = time.perf_counter()
                    try:
                        loss = steps[mode](x).pow(2).mean()
                        loss.backward()
                    except Exception as e:
                        raise RuntimeError(f"{'compiled' if compiled else 'eager'} step {i}, engine {mode}") from e
                    if i >= 2:
                        times[mode].append(time.perf_counter() - t0)
                after = dtensor_engine_stats()
                losses[mode] = float(loss.detach())
                if mode == "on" and i == 0:
                    counts = {k: after[k] - before[k] for k in counts}
        grads = {mode: {n: p.grad.full_tensor() for n, p in b.named_parameters()} for mode, b in blocks.items()}
        out["compiled" if compiled else "eager"] = {
            "off_s": statistics.median(times["off"]), "on_s": statistics.median(times["on"]),
            "loss_diff": abs(losses["off"] - losses["on"]),
            "grad_diff": max(float((grads["off"][n] - grads["on"][n]).abs().max()) for n in grads["off"]),
            "taken": counts["taken"], "fallback": counts["fallback"],
        }
    return out


def merge_model(gathered: list[dict[str, Any]]) -> dict[str, Any]:
    merged = {}
    for kind in gathered[0]:
        rows = [g[kind] for g in gathered]
        merged[kind] = {
            "off_s": max(r["off_s"] for r in rows), "on_s": max(r["on_s"] for r in rows),
            "loss_diff": max(r["loss_diff"] for r in rows), "grad_diff": max(r["grad_diff"] for r in rows),
            "taken": rows[0]["taken"], "fallback": rows[0]["fallback"],
        }
    return merged


def print_model(res: dict[str, Any]) -> dict[str, Any]:
    print("\nLlama-style block, tp=4 (Colwise/Rowwise/SequenceParallel) x dp=2 (fully_shard), forward+backward:")
    print(f"  {'':<9} {'off':>10} {'on':>10} {'on/off':>7}  loss diff  grad diff  engine took/fell back (first step)")
    for kind, r in res.items():
        print(f"  {kind:<9} {r['off_s'] * 1e3:8.1f}ms {r['on_s'] * 1e3:8.1f}ms {r['on_s'] / r['off_s']:7.2f}  "
              f"{r['loss_diff']:9.2e}  {r['grad_diff']:9.2e}  {r['taken']}/{r['fallback']}")
    return res
