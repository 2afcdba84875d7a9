"""The JAX engine's cost model: alpha and beta measured on the JAX devices.

XLA:CPU's collectives cost far more per call than the bytes-first default assumes (about
0.3 ms each on 8 CPU devices, against 1-2 ns per byte), so the fewest bytes is not the
fastest program there: ``{U:tp} -> f32[N@tp,N]`` is one ``psum_scatter`` under this model,
not a slice, a reduce_scatter and an all_gather. The fits in ``models/`` were measured by
``shardc calibrate --engine jax --mesh M --out jax_backend/models/M.json`` (8 CPU devices,
one per mesh), local steps' copies included (``CostModel.local_beta``); a mesh with no fit
of its own gets the median alpha and betas of them all.

The model prices each step as the engine lowers it (``CostModel.engine_time``,
``lowered_time``): one latency per ``lax`` collective the step runs, so a merged exchange
of 4 ``ppermute`` rounds pays 4 where one ``all_to_all`` pays 1, and a padded all_to_all is
charged the bytes it sends. XLA:CPU's latency grows with the group (``call_alpha``).
"""

from __future__ import annotations

import dataclasses
import statistics
from functools import lru_cache
from pathlib import Path

from lowering.cost import CostModel
from lowering.program import Step
from spec_lang.ir import Mesh
from spec_lang.parser import parse_mesh

MODELS = Path(__file__).resolve().parent / "models"
# the JAX engine trades bytes for latency up to this many times the pair's lower bound
# (``CostModel.bytes_cap``): one psum_scatter instead of a split reduction sends 1.5x
BYTES_CAP = 1.5


def model_path(mesh: Mesh) -> Path:
    """Where the fit for ``mesh`` lives (``dp=2,tp=4`` -> ``models/dp-2_tp-4.json``)."""
    return MODELS / (str(Mesh(mesh.names, mesh.sizes)).replace("=", "-").replace(",", "_") + ".json")


def default_cost_model(mesh: Mesh | str) -> CostModel:
    """The cost model the JAX engine plans with on ``mesh`` (a Mesh or a mesh string): its
    own fit where one was measured, else the shipped fits' median alpha and beta for every
    axis."""
    return _model_for(parse_mesh(mesh))


@lru_cache(maxsize=64)
def _model_for(mesh: Mesh) -> CostModel:
    path = model_path(mesh)
    if path.exists():
        return dataclasses.replace(one_alpha(CostModel.load(path)), engine_time=lowered_time, bytes_cap=BYTES_CAP)
    return _median_model()


def call_alpha(model: CostModel, axes: tuple[str, ...], call: str, members: int, world: int) -> float:
    """The latency of one ``lax`` collective: the model's alpha for a collective over the
    whole mesh, times (1 + members) / (1 + world) for a group collective; a ``ppermute``
    spans every device (its rendezvous), whatever pairs it names. Measured on 8 CPU devices
    (shard_map of one call on 64 B blocks, the time above an empty shard_map, two runs):
    all_to_all over 2 / 4 / 8 devices +0.06-0.12 / +0.11-0.14 / +0.16-0.26 ms, ppermute of 6
    or 8 pairs, or within pairs of one axis, +0.15-0.18 ms."""
    alpha = model.alpha_of(axes)
    return alpha if call == "ppermute" else alpha * (1 + members) / (1 + world)


@lru_cache(maxsize=16384)
def lowered_time(model: CostModel, step: Step, mesh: Mesh, bytes_max: int) -> float | None:
    """A collective step's time as the JAX engine runs it (``CostModel.engine_time``): its
    ``lax`` calls' latencies (``call_alpha``) and its bytes, the padding a padded all_to_all
    sends included; None where the lowering is a table exchange (the kind's price then)."""
    from jax_backend.lowerings import lowered_collectives  # lowerings import this module

    got = lowered_collectives(step, mesh)
    if got is None:
        return None
    calls, sent = got
    return (sum(call_alpha(model, step.axes, c, n, mesh.size) for c, n in calls)
            + model.beta_of(step.axes) * (bytes_max if sent is None else max(sent, bytes_max)))


def one_alpha(model: CostModel) -> CostModel:
    """``model`` with one latency for every collective, the median of its fits: XLA:CPU's
    per-group alphas differ by the noise of the timing (0.25-0.37 ms on 8 devices, R^2 of
    the fits often under 0.5), and noise must not choose between two one-collective plans
    (an all_gather of 448 B over (dp,tp) and a slice, over an all_to_all of 48 B)."""
    alphas = [a for _, a in model.alpha] + [a for _, a, _ in model.groups]
    alpha = statistics.median(alphas) if alphas else model.default_alpha
    return dataclasses.replace(model, alpha=tuple((a, alpha) for a, _ in model.alpha), default_alpha=alpha,
                               groups=tuple((axes, alpha, b) for axes, _, b in model.groups))


@lru_cache(maxsize=1)
def _median_model() -> CostModel:
    fits = [CostModel.load(p) for p in sorted(MODELS.glob("*.json"))]
    alphas = [a for m in fits for _, a in m.alpha]
    betas = [b for m in fits for _, b in m.beta]
    return CostModel(default_alpha=statistics.median(alphas), default_beta=statistics.median(betas),
                     local_beta=statistics.median(m.local_beta for m in fits), engine_time=lowered_time,
                     bytes_cap=BYTES_CAP)
