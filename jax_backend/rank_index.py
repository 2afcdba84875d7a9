"""This rank's entry of a per-rank table, and the slices and picks it drives, as few kernels
as XLA can compile.

A lowering that moves a different box on each rank reads its corner from a (world, ...)
table at ``lax.axis_index``. On XLA:CPU a small program's first call is mostly XLA compiling
those index computations (each kernel indexed by the rank adds ~10-30 ms), so:

* a table whose rows are all equal is no lookup at all: its row is a constant, and the
  slices it drives are static (``lax.slice``, a plain index);
* a lookup is one ``dynamic_slice`` of the table, and the slices and updates it drives skip
  JAX's negative-index fix-up (a compare, an add and a select per index: the corners are
  in bounds by construction);
* a pick of cells by a vector of indices promises they are in bounds (no NaN fill, no mask).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

Block = jax.Array
Index = np.ndarray | Block  # a constant (every rank alike) or this rank's traced entry


def own_row(table: np.ndarray, me: Block) -> Index:
    """Rank ``me``'s row of ``table`` (world, ...): the constant row where every rank's is equal."""
    t = np.asarray(table)
    if (t == t[:1]).all():
        return t[0]
    return jax.lax.dynamic_index_in_dim(jnp.asarray(t), me, 0, keepdims=False, allow_negative_indices=False)


def cut(x: Block, at: Index, shape: Sequence[int]) -> Block:
    """The box of ``shape`` at corner ``at`` (in bounds) of ``x``."""
    if isinstance(at, np.ndarray):
        return jax.lax.slice(x, tuple(int(a) for a in at), tuple(int(a) + s for a, s in zip(at, shape)))
    return jax.lax.dynamic_slice(x, tuple(at[i] for i in range(len(shape))), tuple(shape), allow_negative_indices=False)


def put(y: Block, piece: Block, at: Index) -> Block:
    """``y`` with ``piece`` written at corner ``at`` (in bounds)."""
    if isinstance(at, np.ndarray):
        return jax.lax.dynamic_update_slice(y, piece, tuple(int(a) for a in at))
    return jax.lax.dynamic_update_slice(y, piece, tuple(at[i] for i in range(piece.ndim)), allow_negative_indices=False)


def pick(cells: Block, idx: Index) -> Block:
    """``cells[idx]`` along the leading axis: one cell for a scalar index, a stack for a vector."""
    if isinstance(idx, np.ndarray):
        if idx.ndim == 0:
            return cells[int(idx)]
        if np.array_equal(idx, np.arange(cells.shape[0])):
            return cells
        return jnp.stack([cells[int(i)] for i in idx]) if len(idx) <= 8 else jnp.take(cells, idx, axis=0)
    if idx.ndim == 0:
        return jax.lax.dynamic_index_in_dim(cells, idx, 0, keepdims=False, allow_negative_indices=False)
    return cells.at[idx].get(mode="promise_in_bounds", wrap_negative_indices=False)
