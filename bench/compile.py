"""A compiled training step: a TP + FSDP MLP on 8 gloo ranks (CPU, ``dp=2,tp=4``), in one run:

    python bench/compile.py [--iters 10]

The model, ``y = relu(x @ W1.T) @ W2.T``, loss ``sum(y * y)``, with shardc's calls only:

* the weights are stored FSDP + TP (``W1: f32[H@(tp,dp),D]``, ``W2: f32[D,H@(tp,dp)]``) and
  gathered over dp with ``redistribute`` to ``{R:dp}`` (an all_gather; its backward a
  reduce_scatter that sums the dp ranks' gradients into the shards);
* the activations are sequence parallel (``x: f32[T@(dp,tp),D]``): gathered over tp
  before the column-parallel matmul (``{R:tp}``: the backward reduce_scatters the
  partial gradient), and the row-parallel matmul's pending sum reduce-scattered back to
  the sequence split (``{U:tp}`` -> ``f32[T@(dp,tp),D]``; its backward an all_gather).

Four ways, each 2 warm-up steps then ``--iters`` timed forward + backward steps after a
barrier (a time is the median over steps of the slowest rank): the step compiled with
``torch.compile(fullgraph=True, backend="aot_eager")``, the same with the weights held as
DTensors (shardc reads their layout), the same step eager, and the same
model written with DTensor (its ``redistribute`` and sharding propagation) compiled the
same way. Also checks the losses and gradients against each other and against the
single-process model. ``tests/test_compile_step.py`` runs the check on the same ranks.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.gloo_world import report, run_world

WORLD, MESH = 8, "dp=2,tp=4"
T, D, H = 32, 16, 32  # tokens, model width, hidden width
X, W1, W2 = f"f64[{T}@(dp,tp),{D}]", f"f64[{H}@(tp,dp),{D}]", f"f64[{D},{H}@(tp,dp)]"


def full_params(dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """The single-process model's input and weights (small integers over 8: exact sums)."""
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randint(-4, 5, (T, D), generator=g).to(dtype) / 8,
            "W1": torch.randint(-4, 5, (H, D), generator=g).to(dtype) / 8,
            "W2": torch.randint(-4, 5, (D, H), generator=g).to(dtype) / 8}


def reference() -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of the single-process model, from its definition."""
    p = {k: v.clone().requires_grad_() for k, v in full_params().items()}
    y = torch.relu(p["x"] @ p["W1"].T) @ p["W2"].T
    loss = (y * y).sum()
    loss.backward()
    return float(loss.detach()), {k: v.grad for k, v in p.items()}


def blocks(full: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s blocks, written from the types: mesh rank = dp * 4 + tp; ``@(dp,tp)``
    splits a dim into 8 blocks in (dp, tp) order, ``@(tp,dp)`` in (tp, dp) order."""
    dp, tp = divmod(rank, 4)
    seq, feat = T // WORLD, H // WORLD
    w = tp * 2 + dp
    return {"x": full["x"][rank * seq:(rank + 1) * seq].clone(),
            "W1": full["W1"][w * feat:(w + 1) * feat].clone(),
            "W2": full["W2"][:, w * feat:(w + 1) * feat].clone()}


def shardc_step(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """This rank's part of the loss (the ranks' parts sum to the model's loss)."""
    import torch_backend as tb

    w1g = tb.redistribute(w1, W1, f"f64[{H}@tp,{D}]{{R:dp}}", MESH)                # FSDP gather
    w2g = tb.redistribute(w2, W2, f"f64[{D},{H}@tp]{{R:dp}}", MESH)
    xg = tb.redistribute(x, X, f"f64[{T}@dp,{D}]{{R:tp}}", MESH)                  # sequence -> tensor parallel
    y = torch.relu(xg @ w1g.T) @ w2g.T                                           # pending sum over tp
    y = tb.redistribute(y, f"f64[{T}@dp,{D}]{{U:tp}}", X, MESH)                   # reduce_scatter to the sequence
    return (y * y).sum()


def shardc_dtensor_step(x: torch.Tensor, w1: Any, w2: Any) -> torch.Tensor:
    """``shardc_step`` with the weights held as DTensors: shardc reads their layout."""
    from torch.distributed.tensor import Partial, Shard

    import torch_backend as tb

    # each dp rank's gradient of the gathered weight is its batch's part: a pending sum
    w1g = tb.redistribute(w1, f"f64[{H}@tp,{D}]{{R:dp}}").to_local(grad_placements=[Partial(), Shard(0)])
    w2g = tb.redistribute(w2, f"f64[{D},{H}@tp]{{R:dp}}").to_local(grad_placements=[Partial(), Shard(1)])
    xg = tb.redistribute(x, X, f"f64[{T}@dp,{D}]{{R:tp}}", MESH)
    y = torch.relu(xg @ w1g.T) @ w2g.T
    y = tb.redistribute(y, f"f64[{T}@dp,{D}]{{U:tp}}", X, MESH)
    return (y * y).sum()


def dtensor_params(local: dict[str, torch.Tensor], dm: Any) -> dict[str, Any]:
    """The same blocks as DTensors; (tp, dp) order is DTensor's _StridedShard on dp."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    def dt(t: torch.Tensor, placements: list[Any], shape: tuple[int, int]) -> Any:
        return DTensor.from_local(t, dm, placements, run_check=False, shape=torch.Size(shape),
                                  stride=(shape[1], 1)).requires_grad_()

    return {"x": DTensor.from_local(local["x"], dm, [Shard(0), Shard(0)], run_check=False),
            "W1": dt(local["W1"], [_StridedShard(0, split_factor=4), Shard(0)], (H, D)),
            "W2": dt(local["W2"], [_StridedShard(1, split_factor=4), Shard(1)], (D, H))}


def dtensor_step(x: Any, w1: Any, w2: Any) -> torch.Tensor:
    from torch.distributed.tensor import Replicate, Shard

    dm = x.device_mesh
    w1g = w1.redistribute(dm, [Replicate(), Shard(0)])
    w2g = w2.redistribute(dm, [Replicate(), Shard(1)])
    xg = x.redistribute(dm, [Shard(0), Replicate()])
    y = torch.relu(xg @ w1g.T) @ w2g.T                                           # Shard(0), Partial()
    y = y.redistribute(dm, [Shard(0), Shard(0)])
    return (y * y).sum().to_local()


def _run(step: Any, args: dict[str, Any], grad_of: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = step(args["x"], args["W1"], args["W2"])
    loss.backward()
    return loss.detach(), {k: grad_of(args[k]) for k in ("W1", "W2")}


def steps(rank: int) -> dict[str, Any]:
    """The three steps on this rank, each with its fresh arguments and how to read a gradient."""
    from torch.distributed.device_mesh import init_device_mesh

    dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))

    def local_args() -> dict[str, torch.Tensor]:
        return {k: v.requires_grad_(k != "x") for k, v in blocks(full_params(), rank).items()}

    compiled = torch.compile(shardc_step, fullgraph=True, backend="aot_eager")
    compiled_dt = torch.compile(dtensor_step, fullgraph=True, backend="aot_eager")
    def dtensor_weights() -> dict[str, Any]:
        p = dtensor_params(blocks(full_params(), rank), dm)
        return {**p, "x": p["x"].to_local()}

    compiled_w = torch.compile(shardc_dtensor_step, fullgraph=True, backend="aot_eager")
    return {"compiled": (compiled, local_args, lambda t: t.grad),
            "compiled, DTensor weights": (compiled_w, dtensor_weights, lambda t: t.grad.to_local()),
            "eager": (shardc_step, local_args, lambda t: t.grad),
            "dtensor compiled": (compiled_dt, lambda: dtensor_params(blocks(full_params(), rank), dm),
                                 lambda t: t.grad.to_local())}


def check(rank: int, world: int) -> dict[str, Any]:
    """Each step's loss (summed over the ranks) and this rank's gradient blocks."""
    import torch.distributed as dist

    out: dict[str, Any] = {}
    for name, (step, make, grad_of) in steps(rank).items():
        dist.barrier()
        loss, grads = _run(step, make(), grad_of)
        dist.all_reduce(loss)
        out[name] = (float(loss), grads)
    return out


def rank_main(rank: int, store_path: str, iters: int, out_path: str) -> None:
    import torch.distributed as dist

    from bench.exec_vs_dtensor import _time

    store = dist.FileStore(store_path, WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    row: dict[str, Any] = {}
    for name, (step, make, grad_of) in steps(rank).items():
        args = make()
        _run(step, args, grad_of)  # traced and compiled here (not timed)
        row[name] = _time(lambda s=step, a=args, g=grad_of: _run(s, a, g), iters)
    ref_loss, ref = reference()
    got = check(rank, WORLD)
    want = blocks(ref, rank)
    row["ok"] = all(abs(got[n][0] - ref_loss) <= 1e-9 * abs(ref_loss)
                    and all(torch.allclose(got[n][1][k], want[k], rtol=1e-12, atol=1e-12) for k in ("W1", "W2"))
                    for n in got)
    row["compiled equals eager"] = got["compiled"][0] == got["eager"][0] and all(
        torch.equal(got["compiled"][1][k], got["eager"][1][k]) for k in ("W1", "W2"))
    report(row, out_path, lambda gathered: {
        k: (max(g[k] for g in gathered) if isinstance(row[k], float) else all(g[k] for g in gathered)) for k in row})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    r = run_world(rank_main, WORLD, args.iters)
    print(f"TP + FSDP MLP step (forward + backward), x f64[{T},{D}], W1 f64[{H},{D}], W2 f64[{D},{H}] on {MESH} "
          f"(8 gloo ranks, {os.cpu_count()} cores), median of {args.iters} steps, slowest rank")
    labels = {"compiled": "shardc compiled", "compiled, DTensor weights": "shardc compiled, DTensor weights",
              "eager": "shardc eager", "dtensor compiled": "DTensor compiled"}
    for name, label in labels.items():
        print(f"  {label:33} {r[name] * 1e3:8.2f} ms")
    print(f"  compiled / eager shardc {r['compiled'] / r['eager']:.2f}, "
          f"compiled shardc / compiled DTensor {r['compiled'] / r['dtensor compiled']:.2f}")
    print(f"  losses and gradients equal the single-process model's: {r['ok']}; "
          f"compiled equal to eager bit for bit: {r['compiled equals eager']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
