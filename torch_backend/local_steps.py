"""Torch execution of the local step kinds (see ``lowering.kinds.local`` for their rules)."""

from __future__ import annotations

import torch

from lowering.program import Step
from torch_backend.comm import rank_map, tied
from torch_backend.groups import MeshContext
from torch_backend.runners import Pieces, runs


@runs("slice")
def slice_(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    return rank_map(ctx, lambda r, t: t[pieces[r].region], x)  # a view; never written to


@runs("zero_fill")
def zero_fill(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    return rank_map(ctx, lambda r, t: t if pieces[r].keep else tied(ctx, torch.zeros_like(t), t), x)


@runs("zero_pad")
def zero_pad(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    def pad(r: int, t: torch.Tensor) -> torch.Tensor:
        y = t.new_zeros(pieces[r].out_shape)
        y[pieces[r].region] = t
        return y

    return rank_map(ctx, pad, x)


@runs("reinterpret")
def reinterpret(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    return x
