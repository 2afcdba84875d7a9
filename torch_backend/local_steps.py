"""Torch execution of the local step kinds (see ``lowering.kinds.local`` for their rules)."""

from __future__ import annotations

import torch

from lowering.kinds import RankPieces
from lowering.kinds.local import FillPieces, RegionPieces, SharePieces
from lowering.program import Step
from torch_backend.comm import rank_map, tied
from torch_backend.groups import MeshContext
from torch_backend.runners import Failed, FastRunner, Pieces, fast, pieces_as, runs


@runs("slice")
def slice_(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    regions = pieces_as(RegionPieces, pieces)
    return rank_map(ctx, lambda r, t: t[regions[r].region], x)  # a view; never written to


@fast("slice")
def slice_fast(ctx: MeshContext, step: Step, p: RankPieces, failed: Failed) -> FastRunner | None:
    if not isinstance(p, RegionPieces):
        return None
    region = p.region

    def slice_(x: torch.Tensor) -> torch.Tensor:
        # a view of the input: copied, as the interpreter copies a result that aliases it
        y = x[region]
        return y.clone(memory_format=torch.contiguous_format) if y.numel() else y

    return slice_


@runs("zero_fill")
def zero_fill(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    fills = pieces_as(FillPieces, pieces)
    return rank_map(ctx, lambda r, t: t if fills[r].keep else tied(ctx, torch.zeros_like(t), t), x)


@runs("divide")
def divide(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    shares = pieces_as(SharePieces, pieces)
    return rank_map(ctx, lambda r, t: t / shares[r].divisor, x)  # DTensor's Partial._partition_value


@runs("zero_pad")
def zero_pad(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    regions = pieces_as(RegionPieces, pieces)

    def pad(r: int, t: torch.Tensor) -> torch.Tensor:
        y = t.new_zeros(regions[r].out_shape)
        y[regions[r].region] = t
        return y

    return rank_map(ctx, pad, x)


@runs("reinterpret")
def reinterpret(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    return x
