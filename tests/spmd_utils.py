"""Helpers for the typed-collective tests: letters as distinct numbers, one call on 3 ranks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch_utils import from_local, local_mode, to_local


def num(name: str) -> int:
    """A distinct integer per letter name (``0`` is zero); ``"A+B"`` is their sum."""
    if "+" in name:
        return sum(num(p.strip()) for p in name.split("+"))
    if name == "0":
        return 0
    n = 0
    for c in name:  # the name's characters as base-128 digits: the same number in every process
        n = n * 128 + ord(c)
    return n


def T(*names: str) -> torch.Tensor:
    """``T("A")`` a 0-d tensor; ``T("A0", "A1")`` a 1-d tensor of those letters."""
    vals = [float(num(n)) for n in names]
    return torch.tensor(vals[0] if len(names) == 1 and not names[0].startswith("[") else vals,
                        dtype=torch.float64)


def Tv(*names: str) -> torch.Tensor:
    """Always 1-d, even for one letter: ``[A]``."""
    return torch.tensor([float(num(n)) for n in names], dtype=torch.float64)


def run_typed(fake_pg: Callable[[int], None], fn: Callable[..., torch.Tensor], xs: list[torch.Tensor],
              grads: list[torch.Tensor] | None, mesh: str = "x=3", **kw: Any
              ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None, dict]:
    """``fn(x, **kw)`` under LocalTensorMode on per-rank blocks ``xs``; with ``grads``, also the
    gradient of x for the incoming gradient ``grads``. Returns (outs, grad_ins, typeof(out))."""
    from torch_backend import spmd

    with local_mode(fake_pg, len(xs)) as lm, spmd.use_mesh(mesh):
        x = to_local(lm, xs, requires_grad=grads is not None)
        out = fn(x, **kw)
        types = spmd.typeof(out)
        gin = None
        if grads is not None:
            (g,) = torch.autograd.grad(out, x, grad_outputs=to_local(lm, grads))
            gin = from_local(g)
        return from_local(out), gin, types


def same(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for r, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, f"rank {r}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert torch.equal(a, b), f"rank {r}: {a.tolist()} != {b.tolist()}"
