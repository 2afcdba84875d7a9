"""A rank's local tensor cut out of a global tensor: the torch side of ``lowering.layout.rank_layout``."""

from __future__ import annotations

import torch

from lowering.layout import rank_layout
from spec_lang.ir import Mesh, TensorType


def local_part(g: torch.Tensor, t: TensorType, mesh: Mesh, rank: int) -> torch.Tensor:
    """``rank``'s local tensor of global ``g`` under ``t`` (a fresh tensor, in local order:
    the rank's blocks concatenated along the split dim, or flattened for a ragged split
    over several dims)."""
    lay = rank_layout(t, mesh, rank)
    parts = [g[s] for s in lay.slices()]
    if not parts:
        return g.new_empty(lay.shape)
    if lay.cat is None:
        return torch.cat([p.reshape(-1) for p in parts])
    if len(parts) == 1:
        return parts[0].clone()
    return torch.cat(parts, dim=lay.cat)
