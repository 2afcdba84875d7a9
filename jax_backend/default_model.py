"""The JAX engine's cost model: alpha and beta measured on the JAX devices.

XLA:CPU's collectives cost far more per call than the bytes-first default assumes (about
0.3 ms each on 8 CPU devices, against 1-2 ns per byte), so the fewest bytes is not the
fastest program there: ``{U:tp} -> f32[N@tp,N]`` is one ``psum_scatter`` under this model,
not a slice, a reduce_scatter and an all_gather. The fits are ``jax_backend.fits``'
(``shardc calibrate --engine jax``, one per 8-device mesh, the median for another mesh).

The model prices each step as the engine lowers it (``CostModel.engine_time``,
``lowered_time``): one latency per ``lax`` collective the step runs, so a merged exchange
of 4 ``ppermute`` rounds pays 4 where one ``all_to_all`` pays 1, and a padded all_to_all is
charged the bytes it sends. XLA:CPU's latency grows with the group (``fits.call_alpha``).
How far it trades bytes for latency is capped (``BYTES_CAP``).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from jax_backend.fits import MODELS, call_alpha, fitted_model, model_path
from jax_backend.lowerings import lowered_collectives
from lowering.cost import CostModel
from lowering.program import Step
from spec_lang.ir import Mesh
from spec_lang.parser import parse_mesh

__all__ = ["BYTES_CAP", "MODELS", "default_cost_model", "lowered_time", "model_path"]

# the JAX engine trades bytes for latency up to this many times the pair's lower bound, for
# a pending sum (``CostModel.bytes_cap``): one psum_scatter instead of a split reduction
# sends 1.5x; an exchange keeps to the bound
BYTES_CAP = 1.5


def default_cost_model(mesh: Mesh | str) -> CostModel:
    """The cost model the JAX engine plans with on ``mesh`` (a Mesh or a mesh string): its
    own fit where one was measured, else the shipped fits' median alpha and beta for every
    axis; each step priced as it lowers (``lowered_time``), bytes capped (``BYTES_CAP``)."""
    return _model_for(parse_mesh(mesh))


@lru_cache(maxsize=64)
def _model_for(mesh: Mesh) -> CostModel:
    fit = fitted_model(mesh)
    # a collective step that moves bytes runs one lax call at least (the table exchanges:
    # the kind's alpha per launch), the cheapest a 2-member one at the lowest alpha
    floor = min(call_alpha(fit, axes, "all_to_all", 2, mesh.size)
                for axes in [(a,) for a in mesh.names] + [g[0] for g in fit.groups])
    return dataclasses.replace(fit, engine_time=lowered_time, bytes_cap=BYTES_CAP, engine_floor=floor)


@lru_cache(maxsize=16384)
def lowered_time(model: CostModel, step: Step, mesh: Mesh, bytes_max: int) -> float | None:
    """A collective step's time as the JAX engine runs it (``CostModel.engine_time``): its
    ``lax`` calls' latencies (``call_alpha``) and its bytes, the padding a padded all_to_all
    sends included; None where the lowering is a table exchange (the kind's price then)."""
    got = lowered_collectives(step, mesh)
    if got is None:
        return None
    calls, sent = got
    return (sum(call_alpha(model, step.axes, c, n, mesh.size) for c, n in calls)
            + model.beta_of(step.axes) * (bytes_max if sent is None else max(sent, bytes_max)))
