"""The JAX engine's fits: alpha and beta measured on the JAX devices, one file per mesh.

``shardc calibrate --engine jax --mesh M --out jax_backend/models/M.json`` wrote the fits in
``models/`` (8 CPU devices, one per mesh), local steps' copies included
(``CostModel.local_beta``); a mesh with no fit of its own gets the median alpha and betas
of them all. ``jax_backend.default_model`` makes them the engine's cost model; the box
exchange reads them here to choose its lowering (the two share one latency, ``call_alpha``).
"""

from __future__ import annotations

import dataclasses
import statistics
from functools import lru_cache
from pathlib import Path

from lowering.cost import CostModel
from spec_lang.ir import Mesh

MODELS = Path(__file__).resolve().parent / "models"


def model_path(mesh: Mesh) -> Path:
    """Where the fit for ``mesh`` lives (``dp=2,tp=4`` -> ``models/dp-2_tp-4.json``)."""
    return MODELS / (str(Mesh(mesh.names, mesh.sizes)).replace("=", "-").replace(",", "_") + ".json")


@lru_cache(maxsize=64)
def fitted_model(mesh: Mesh) -> CostModel:
    """The fit for ``mesh`` (one alpha for every collective), else the median of them all."""
    path = model_path(mesh)
    if path.exists():
        return one_alpha(CostModel.load(path))
    return _median_model()


def call_alpha(model: CostModel, axes: tuple[str, ...], call: str, members: int, world: int) -> float:
    """The latency of one ``lax`` collective: the model's alpha for a collective over the
    whole mesh, times (world/2 + members) / (world/2 + world) for a group collective (a fixed
    part and one growing with the group: two collectives over 2 and 4 members cost more than
    one over 8); a ``ppermute`` spans every device (its rendezvous), whatever pairs it names.
    Measured on 8 CPU devices (shard_map of one call on 64 B blocks, the time above an empty
    shard_map, two runs): all_to_all over 2 / 4 / 8 devices +0.06-0.12 / +0.11-0.14 /
    +0.16-0.26 ms, ppermute of 6 or 8 pairs, or within pairs of one axis, +0.15-0.18 ms."""
    alpha = model.alpha_of(axes)
    return alpha if call == "ppermute" else alpha * (world / 2 + members) / (world / 2 + world)


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
