"""A Megatron-style tensor-parallel MLP in the SPMD type system, and its single-process twin.

Column-parallel then row-parallel, over the ``tp`` axis::

    x (I -> R)  --linear(W1[rows of rank])-->  h (V)  --relu-->  --linear(W2[cols of rank])-->
    (V) --reinterpret(V,P)-->  +y_rank  --all_reduce(P,R)-->  y (R) + b2  --> loss (R -> I)

The global-SPMD version states the partition specs (S(0) for W1's rows, S(1) for W2's
columns) and makes the partial output explicit: ``spmd.linear(h, W2, out_partial_axes="tp")``.
"""

from __future__ import annotations

import torch

from torch_backend import spmd
from torch_backend.spmd import I, P, R, S, V

D, H, OUT, B, STEPS, LR = 4, 6, 3, 5, 5, 0.05


def init() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(B, D, generator=g, dtype=torch.float64),
            "W1": torch.randn(H, D, generator=g, dtype=torch.float64) / 2,
            "b1": torch.randn(H, generator=g, dtype=torch.float64) / 2,
            "W2": torch.randn(OUT, H, generator=g, dtype=torch.float64) / 2,
            "b2": torch.randn(OUT, generator=g, dtype=torch.float64) / 2}


def single() -> tuple[list[float], dict[str, torch.Tensor]]:
    p = {k: v.clone().requires_grad_(k != "x") for k, v in init().items()}
    losses = []
    for _ in range(STEPS):
        y = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(p["x"], p["W1"], p["b1"])),
                                       p["W2"], p["b2"])
        loss = (y * y).sum()
        loss.backward()
        losses.append(float(loss.detach()))
        with torch.no_grad():
            for k in ("W1", "b1", "W2", "b2"):
                p[k] -= LR * p[k].grad
                p[k].grad = None
    return losses, {k: v.detach() for k, v in p.items()}


def _shards(rank: int, world: int) -> dict[str, torch.Tensor]:
    full = init()
    h = H // world
    rows = slice(rank * h, (rank + 1) * h)
    return {"x": full["x"], "W1": full["W1"][rows].clone(), "b1": full["b1"][rows].clone(),
            "W2": full["W2"][:, rows].clone(), "b2": full["b2"].clone()}


def _forward_local(p: dict[str, torch.Tensor]) -> torch.Tensor:
    x = spmd.reinterpret(p["x"], "tp", src=I, dst=R)  # Megatron's copy-to-tensor-parallel region
    h = torch.relu(torch.nn.functional.linear(x, p["W1"], p["b1"]))  # R, V -> V
    y = spmd.reinterpret(torch.nn.functional.linear(h, p["W2"]), "tp", src=V, dst=P)  # a global matmul
    y = spmd.all_reduce(y, "tp", src=P, dst=R) + spmd.reinterpret(p["b2"], "tp", src=I, dst=R)
    return spmd.reinterpret((y * y).sum(), "tp", src=R, dst=I)  # one loss, counted once


def _forward_global(p: dict[str, torch.Tensor]) -> torch.Tensor:
    x = spmd.reinterpret(p["x"], "tp", src=I, dst=R)
    h = torch.relu(spmd.linear(x, p["W1"], p["b1"]))  # S(0) rows of W1 -> h is S(1)
    y = spmd.linear(h, p["W2"], out_partial_axes="tp")  # the contracted dim is split: explicitly P
    y = spmd.all_reduce(y, "tp", src=P, dst=R) + spmd.reinterpret(p["b2"], "tp", src=I, dst=R)
    return spmd.reinterpret((y * y).sum(), "tp", src=R, dst=I)


def parallel(rank: int, world: int, mode: str = "local") -> tuple[list[float], dict[str, list]]:
    """Train STEPS steps on ``world`` ranks of the default process group (typecheck on); the
    weights come back as lists (plain data crosses process boundaries)."""
    p = _shards(rank, world)
    sharded = {"W1": S(0), "b1": S(0), "W2": S(1)} if mode == "global" else {"W1": V, "b1": V, "W2": V}
    for k, v in p.items():
        spmd.assert_type(v, {"tp": sharded.get(k, I)})
        v.requires_grad_(k != "x")
    forward = _forward_global if mode == "global" else _forward_local
    losses = []
    with spmd.use_mesh(f"tp={world}"):
        for _ in range(STEPS):
            with spmd.typecheck():
                loss = forward(p)
            assert spmd.typeof(loss) == {"tp": I}
            loss.backward()
            losses.append(float(loss.detach()))
            with torch.no_grad():
                for k in ("W1", "b1", "W2", "b2"):
                    p[k] -= LR * p[k].grad
                    p[k].grad = None
    return losses, {k: v.detach().tolist() for k, v in p.items()}
