"""Torch execution of the SPMD type system's retyping steps (rules in ``lowering.kinds.retype``)."""

from __future__ import annotations

import torch

from lowering.program import Step
from torch_backend.comm import rank_map
from torch_backend.groups import MeshContext
from torch_backend.runners import Pieces, runs


@runs("pcast")
def pcast(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    return x  # only the denotation changes


@runs("stack")
def stack(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    return rank_map(ctx, lambda r, t: t.reshape(pieces[r].out_shape), x)  # unsqueeze or squeeze of dim d
