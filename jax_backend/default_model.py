"""The JAX engine's cost model: alpha and beta measured on the JAX devices.

XLA:CPU's collectives cost far more per call than the bytes-first default assumes (about
0.3 ms each on 8 CPU devices, against 1-2 ns per byte), so the fewest bytes is not the
fastest program there: ``{U:tp} -> f32[N@tp,N]`` is one ``psum_scatter`` under this model,
not a slice, a reduce_scatter and an all_gather. The fits in ``models/`` were measured by
``shardc calibrate --engine jax --mesh M --out jax_backend/models/M.json`` (8 CPU devices,
one per mesh), local steps' copies included (``CostModel.local_beta``); a mesh with no fit
of its own gets the median alpha and betas of them all.
"""

from __future__ import annotations

import dataclasses
import statistics
from functools import lru_cache
from pathlib import Path

from lowering.cost import CostModel
from spec_lang.ir import Mesh
from spec_lang.parser import parse_mesh

MODELS = Path(__file__).resolve().parent / "models"


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
        return one_alpha(CostModel.load(path))
    return _median_model()


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
                     local_beta=statistics.median(m.local_beta for m in fits))
