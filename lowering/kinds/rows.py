"""Group rows: the (groups, members) rank arrays that the collective kinds' vectorised prices run over."""

from __future__ import annotations

import numpy as np

from lowering.layout import group_arrays
from spec_lang.ir import Mesh


def group_rows(mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """(num_groups, n) rank array, each row one group in the step's group order (read-only,
    the layout algebra's cached groups)."""
    return group_arrays(mesh, axes)[1]


def per_rank(mesh: Mesh, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Scatter (num_groups, n) per-member values back to a (world,) array in rank order."""
    out = np.zeros(mesh.size, dtype=np.int64)
    out[rows] = values  # (num_groups, 1) values broadcast: every member gets its group's
    return out
