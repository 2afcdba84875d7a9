"""The JAX engine's cost model: alpha and beta measured on the JAX devices."""

from __future__ import annotations

from lowering.cost import CostModel
from spec_lang.ir import Mesh


def default_cost_model(mesh: Mesh) -> CostModel | None:
    """The cost model the JAX engine plans with on ``mesh`` (None: the bytes-first default)."""
    return None
