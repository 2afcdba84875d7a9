"""Calibration: a cost model fitted to measured collective times on a real backend.

``shardc calibrate`` times a few *probes* on every group of mesh axes (each axis, and the
flattened groups of several axes) at a few message sizes: an all_gather, a reduce_scatter,
an all_reduce and an all_to_all, each compiled by the planner, so the bytes a sample is
priced at are exactly what the planner charges for that step::

    all_gather over tp (n=4), 1 KiB out:   rank r sends its 256 B block to 3 peers
    r0 [A] r1 [B] r2 [C] r3 [D]  ->  every rank [A B C D]      bytes_max = 768

A sample is (group axes, step kind, bytes_max, seconds: the median over runs of the
slowest rank). Per group, alpha (s) and beta (s/byte) are the least-squares fit of
``seconds = alpha + beta * bytes_max`` over every kind and size, weighted by 1/seconds so
that a 1 KiB probe's latency counts as much as a 4 MiB probe's bandwidth (unweighted, the
largest messages would decide alpha alone). Both are clamped at 0 (a CostModel's values are
non-negative): with alpha < 0 the fit is redone through the origin, with beta < 0 as a
constant.

Single axes give the model's per-axis alpha/beta; a flattened group gets its own entry
(``CostModel.groups``), since a group of 8 ranks over (dp, tp) is slower than its slowest
axis alone. This module imports neither torch nor jax: the timing is
``torch_backend.calibrate``'s.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering.cost import FORMAT, SPARE_AXIS_BYTES, CostModel
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh

DEFAULT_SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 22)  # 1 KiB .. 4 MiB
MAX_SIZE = 1 << 28  # 256 MiB: every rank holds a tensor of this size during a probe
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
# probes are compiled with this model: no spare axis ever pays for splitting a reduction, so
# each probe is the one collective it is named for (on 2 ranks an all_to_all is a permute)
PROBE_MODEL = CostModel(spare_axis_bytes=1 << 62)
_SIZES_HINT = ("give sizes in bytes with an optional K/M suffix, up to 256M, e.g. --sizes 1K,16K,256K,4M "
               "(2 or more distinct)")


@dataclass(frozen=True)
class Probe:
    """One timed redistribution: ``src -> dst`` compiles to one ``kind`` step over ``axes``."""

    kind: str
    axes: tuple[str, ...]
    size: int  # bytes of the full tensor
    src: str
    dst: str


@dataclass(frozen=True)
class Sample:
    """One collective step's measured time: the slowest rank's median over runs."""

    axes: tuple[str, ...]
    kind: str
    bytes_max: int
    seconds: float


@dataclass(frozen=True)
class GroupFit:
    """The fitted alpha/beta of one group of mesh axes, and how well the line fits (R^2)."""

    axes: tuple[str, ...]
    group_size: int
    alpha: float
    beta: float
    r2: float
    samples: int

    def to_json(self) -> dict[str, Any]:
        return {"axes": list(self.axes), "group_size": self.group_size, "alpha": self.alpha,
                "beta": self.beta, "r2": self.r2, "samples": self.samples}


def parse_sizes(text: str) -> tuple[int, ...]:
    """``1K,16K,256K,4M`` -> byte counts (K = 1024); SpecError with a caret on a bad one."""
    out: list[int] = []
    pos = 0
    for part in text.split(","):
        word = part.strip()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(word[-1:].upper(), 1)
        digits = word[:-1] if scale > 1 else word
        if not digits.isdigit() or not 0 < int(digits) * scale <= MAX_SIZE:
            raise SpecError(f"bad message size {word!r}", text=text, pos=pos + part.index(word) if word else pos,
                            hint=_SIZES_HINT)
        out.append(int(digits) * scale)
        pos += len(part) + 1
    if len(set(out)) < 2:
        raise SpecError("calibration needs 2 or more distinct message sizes to fit a line", text=text, pos=0,
                        hint=_SIZES_HINT)
    return tuple(sorted(set(out)))


def groups_of(mesh: Mesh) -> list[tuple[str, ...]]:
    """The axis groups to calibrate: each axis of size > 1, then every flattened group of
    2 or more of them (in mesh order); past 3 such axes only the adjacent pairs and all of them."""
    axes = [a for a in mesh.names if mesh.axis_size(a) > 1]
    multi: Iterable[tuple[str, ...]]
    if len(axes) <= 3:
        multi = (c for k in range(2, len(axes) + 1) for c in itertools.combinations(axes, k))
    else:
        multi = [*zip(axes, axes[1:]), tuple(axes)]
    return [(a,) for a in axes] + list(multi)


def probes(mesh: Mesh, sizes: Sequence[int] = DEFAULT_SIZES) -> list[Probe]:
    """Every (group, kind, size) probe, as f32 types; element counts rounded up so every rank
    holds an even block."""
    out = []
    for axes in groups_of(mesh):
        n = mesh.group_size(axes)
        on = axes[0] if len(axes) == 1 else f"({','.join(axes)})"
        partial = ",".join(f"P:{a}" for a in axes)
        for size in sizes:
            e = max(n, math.ceil(size / 4 / n) * n)
            rows = max(n, math.ceil(size / 4 / n / n) * n)  # all_to_all: rows x n columns
            pairs = {
                "all_gather": (f"f32[{e}@{on}]", f"f32[{e}]"),
                "reduce_scatter": (f"f32[{e}]{{{partial}}}", f"f32[{e}@{on}]"),
                "all_reduce": (f"f32[{e}]{{{partial}}}", f"f32[{e}]"),
                "all_to_all": (f"f32[{rows}@{on},{n}]", f"f32[{rows},{n}@{on}]"),
            }
            out += [Probe(kind, axes, size, *pairs[kind]) for kind in KINDS]
    return out


def fit_line(bytes_max: Sequence[float], seconds: Sequence[float]) -> tuple[float, float, float]:
    """(alpha, beta, R^2) of ``seconds ~ alpha + beta * bytes``, least squares on relative
    error, both clamped at >= 0 (see the module docstring)."""
    x = np.asarray(bytes_max, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if x.size != y.size or x.size < 2 or np.unique(x).size < 2:
        raise SpecError(f"a line needs samples at 2 or more distinct byte counts, got {sorted(set(x.tolist()))}",
                        hint=_SIZES_HINT)
    if not (np.all(np.isfinite(y)) and np.all(y >= 0) and np.all(np.isfinite(x))):
        raise SpecError("measured times must be finite and >= 0", hint="re-run the calibration")
    w = 1.0 / np.maximum(y, max(float(y.max()) * 1e-9, 1e-300))  # a zero time must not divide by 0
    (alpha, beta), *_ = np.linalg.lstsq(np.stack([w, x * w], axis=1), np.ones_like(y), rcond=None)
    if alpha < 0:
        alpha, beta = 0.0, float(np.sum(x * w) / np.sum((x * w) ** 2))
    if beta < 0:
        alpha, beta = float(np.sum(w) / np.sum(w * w)), 0.0
    pred = alpha + beta * x
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - pred) ** 2)) / ss_tot if ss_tot > 0 else 1.0
    return float(alpha), float(beta), r2


def fit_model(samples: Sequence[Sample], mesh: Mesh, *,
              spare_axis_bytes: int = SPARE_AXIS_BYTES) -> tuple[CostModel, list[GroupFit]]:
    """A CostModel from samples: per-axis alpha/beta from single-axis groups, a ``groups``
    entry for each flattened one. Axes without samples get the slowest fitted values."""
    by_group: dict[tuple[str, ...], list[Sample]] = {}
    for s in samples:
        bad = [a for a in s.axes if a not in mesh]
        if bad:
            raise SpecError(f"a sample names axis {bad[0]!r}, which is not on the mesh {mesh}",
                            hint=f"use the mesh axes {', '.join(mesh.names)}")
        by_group.setdefault(tuple(sorted(s.axes)), []).append(s)
    if not by_group:
        raise SpecError("no samples to fit", hint="time at least one group at 2 or more message sizes")
    fits = []
    for key in sorted(by_group, key=lambda k: (len(k), [mesh.names.index(a) for a in k])):
        ss = by_group[key]
        axes = tuple(a for a in mesh.names if a in key)
        alpha, beta, r2 = fit_line([s.bytes_max for s in ss], [s.seconds for s in ss])
        fits.append(GroupFit(axes, mesh.group_size(axes), alpha, beta, r2, len(ss)))
    single = [f for f in fits if len(f.axes) == 1]
    model = CostModel(
        alpha=tuple(sorted((f.axes[0], f.alpha) for f in single)),
        beta=tuple(sorted((f.axes[0], f.beta) for f in single)),
        default_alpha=max(f.alpha for f in fits),
        default_beta=max(f.beta for f in fits),
        spare_axis_bytes=spare_axis_bytes,
        groups=tuple((tuple(sorted(f.axes)), f.alpha, f.beta) for f in fits if len(f.axes) > 1),
        mesh=str(mesh),
    )
    return model, fits


def calibration_json(model: CostModel, fits: Sequence[GroupFit], *, backend: str, mesh: Mesh,
                     sizes: Sequence[int], iters: int) -> dict[str, Any]:
    """What ``shardc calibrate --out`` writes: the model (``CostModel.from_json`` reads it)
    plus how it was measured."""
    data = model.to_json()
    data.update(format=FORMAT, backend=backend, mesh=str(mesh),
                fit={"sizes": list(sizes), "iters": iters, "groups": [f.to_json() for f in fits]})
    return data
