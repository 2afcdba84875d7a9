"""The JAX engine: shardc's programs run inside JAX, as one ``jax.shard_map`` of ``lax``
collectives per redistribution (docs/jax.md).

Imports spec_lang, lowering and jax; torch only inside ``to_torch`` / ``from_torch``.
"""

from __future__ import annotations

from jax_backend.arrays import blocks_of, from_blocks, to_blocks
from jax_backend.default_model import default_cost_model
from jax_backend.engine import describe, lower_program
from jax_backend.lowerings import LOWERINGS, Lowered, lowers
from jax_backend.redistribution import redistribute, redistributor
from jax_backend.torch_blocks import from_torch, to_torch

__all__ = ["LOWERINGS", "Lowered", "blocks_of", "default_cost_model", "describe", "from_blocks", "from_torch",
           "lower_program", "lowers", "redistribute", "redistributor", "to_blocks", "to_torch"]
