"""Random per-rank data of a given type, and the inner product of denotations (torch-free)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from planner_oracle import local_array

from spec_lang.ir import Mesh, TensorType


def _coord_index(mesh: Mesh, rank: int, axes: Sequence[str]) -> int:
    c = mesh.coords(rank)
    j = 0
    for a in mesh.names:
        if a in axes:
            j = j * mesh.axis_size(a) + c[mesh.index(a)]
    return j


def random_arrays(t: TensorType, mesh: Mesh, rng: np.random.Generator, lo: int = -9, hi: int = 10) -> list[np.ndarray]:
    """Valid blocks of type ``t`` with random integer values (float64): equal across R/I
    axes, arbitrary across P and V axes and along sharded dims."""
    full = rng.integers(lo, hi, size=t.shape)
    per_axis = [a for a in mesh.names if t.dim_of(a) is None and t.axis_type(a).kind in ("P", "V")]
    variants: dict[int, np.ndarray] = {}
    out = []
    for r in range(mesh.size):
        j = _coord_index(mesh, r, per_axis) if per_axis else 0
        if per_axis and j not in variants:
            variants[j] = rng.integers(lo, hi, size=t.shape)
        src = variants[j] if per_axis else full
        out.append(np.asarray(local_array(src, t, mesh, r), dtype=np.float64))
    return out


def pairing(t: TensorType, mesh: Mesh, values: Sequence[Any], grads: Sequence[Any]) -> float:
    """<value, gradient> of the denotations of a type-``t`` value and a dual(t) gradient.

    The sum over ranks of local inner products, with each I axis (value and gradient
    both replicated there) and each P(avg) axis (the denotation is the mean) counted once.
    """
    total = sum(float((np.asarray(v, dtype=np.float64) * np.asarray(g, dtype=np.float64)).sum())
                for v, g in zip(values, grads))
    w = 1
    for a in mesh.names:
        if t.dim_of(a) is not None:
            continue
        at = t.axis_type(a)
        if at.kind == "I" or (at.kind == "P" and at.op == "avg"):
            w *= mesh.axis_size(a)
    return total / w
