"""A Megatron-style tensor-parallel MLP in the SPMD type system, and its single-process twin.

Column-parallel then row-parallel, over the ``tp`` axis::

    x (I -> R)  --linear(W1[rows of rank])-->  h (V)  --relu-->  --linear(W2[cols of rank])-->
    (V) --reinterpret(V,P)-->  +y_rank  --all_reduce(P,R)-->  y (R) + b2  --> loss (R -> I)

The global-SPMD version states the partition specs (S(0) for W1's rows, S(1) for W2's
columns) and makes the partial output explicit: ``spmd.linear(h, W2, out_partial_axes="tp")``.
"""

from __future__ import annotations

from typing import Any

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


# ---- tensor parallel + FSDP over dp, on dp=2,tp=4 ------------------------------------------
#
# The weights are stored FSDP-style, each rank holding 1/8 of the rows (W1) or columns (W2),
# and gathered over dp for the step; the batch is split over dp. A gathered weight meets
# dp-varying data, so its gradient must be summed over dp: the gather's destination must
# say R on dp (``{R:dp}``). Written without it, the type string leaves dp unannotated,
# which means I, whose gradient is not summed: the trap, refused under typecheck().

FSDP_MESH = "dp=2,tp=4"
FB, FD, FH, FO, FSTEPS, FLR = 8, 16, 32, 4, 3, 0.005
STORED = {"W1": "f64[32@(tp,dp),16]", "W2": "f64[4,32@(tp,dp)]"}
GATHERED = {"W1": "f64[32@tp,16]{R:dp}", "W2": "f64[4,32@tp]{R:dp}"}
TRAP = {"W1": "f64[32@tp,16]", "W2": "f64[4,32@tp]"}  # what jax.typeof prints: I on dp


def fsdp_init() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"x": torch.randn(FB, FD, generator=g, dtype=torch.float64),
            "W1": torch.randn(FH, FD, generator=g, dtype=torch.float64) / 4,
            "W2": torch.randn(FO, FH, generator=g, dtype=torch.float64) / 4}


def fsdp_single() -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The single-process reference: losses, the first step's gradients, the final weights."""
    p = {k: v.clone().requires_grad_(k != "x") for k, v in fsdp_init().items()}
    losses, first = [], {}
    for step in range(FSTEPS):
        y = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(p["x"], p["W1"])), p["W2"])
        loss = (y * y).sum()
        loss.backward()
        losses.append(float(loss.detach()))
        with torch.no_grad():
            for k in ("W1", "W2"):
                if step == 0:
                    first[k] = p[k].grad.clone()
                p[k] -= FLR * p[k].grad
                p[k].grad = None
    return losses, first, {k: p[k].detach() for k in ("W1", "W2")}


def fsdp_forward(p: dict[str, torch.Tensor], gathered: dict[str, str]) -> torch.Tensor:
    """One forward on this rank's blocks (under typecheck() in the tests): the loss, P on dp
    (each dp rank's batch adds its part) and I on tp."""
    import torch_backend as tb

    w1 = tb.redistribute(p["W1"], STORED["W1"], gathered["W1"], FSDP_MESH)  # tp: S(0), dp: R (or the trap's I)
    w2 = tb.redistribute(p["W2"], STORED["W2"], gathered["W2"], FSDP_MESH)  # tp: S(1)
    h = torch.relu(torch.nn.functional.linear(p["x"], w1))  # x dp: S(0), tp: R -> h dp: S(0), tp: S(1)
    y = spmd.linear(h, w2, out_partial_axes="tp")  # the contracted hidden dim is split on tp: P
    y = spmd.all_reduce(y, "tp", src=P, dst=R)
    loss = spmd.reinterpret((y * y).sum(), "dp", src=V, dst=P)  # the batch's parts add up
    return spmd.reinterpret(loss, "tp", src=R, dst=I)  # computed alike on every tp rank: counted once


def fsdp_parallel(rank: int, world: int, full: dict[str, torch.Tensor], gathered: dict[str, str] | None = None,
                  steps: int = FSTEPS) -> tuple[list[float], dict[str, list], dict[str, list], dict]:
    """``steps`` SGD steps on this rank's blocks of ``full`` (``fsdp_init()``, made outside
    LocalTensorMode, where random tensors differ per rank) under typecheck(), on the default
    world or LocalTensorMode's: losses, the first step's gradients of the stored shards and
    the final shards (as lists), and the loss' type."""
    import torch_backend as tb

    gathered = gathered or GATHERED
    p = {"x": spmd.assert_type(tb.distribute(full["x"], FSDP_MESH, "f64[8@dp,16]"), "f64[8@dp,16]{R:tp}")}
    for k in ("W1", "W2"):
        p[k] = spmd.assert_type(tb.distribute(full[k], FSDP_MESH, STORED[k]), STORED[k]).requires_grad_(True)
    losses, first, loss_type = [], {}, {}
    with spmd.use_mesh(FSDP_MESH):
        for step in range(steps):
            with spmd.typecheck():
                loss = fsdp_forward(p, gathered)
            loss_type = spmd.typeof(loss)
            loss.backward()
            with spmd.typecheck():
                losses.append(_values(spmd.all_reduce(loss.detach(), "dp", src=P, dst=I)))
            with torch.no_grad():
                for k in ("W1", "W2"):
                    if step == 0:
                        first[k] = _values(p[k].grad)
                    p[k] -= FLR * p[k].grad
                    p[k].grad = None
    return losses, first, {k: _values(p[k]) for k in ("W1", "W2")}, loss_type


def _values(t: torch.Tensor) -> Any:
    """A block as plain lists (every rank's, in rank order, under LocalTensorMode)."""
    inner = getattr(t, "_local_tensors", None)
    if inner is not None:
        return [inner[r].detach().tolist() for r in sorted(inner)]
    return t.detach().tolist()
