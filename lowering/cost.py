"""The cost model: alpha-beta time of a step from the bytes it sends.

What each rank sends in a step is the step kind's price (``lowering.kinds``): a ring
all_gather sends (n-1) blocks (on uneven blocks total - b(successor)); a ring
reduce_scatter (n-1)/n of its input (padded to n equal chunks when uneven); a ring
all_reduce 2(n-1)/n of its block; an exchange exactly the bytes leaving the rank; a
local step nothing. A program's ``bytes_sent_max`` is the max over ranks of the sum
over its steps.

Time is ``sum(alpha(step axes) + beta(step axes) * max bytes of the step)``, with
per-axis alpha (latency, s) and beta (s/byte); a flattened group pays the slowest of its
axes, unless the model has its own (alpha, beta) for that group of axes (a calibrated
model measures flattened groups too: a group of 8 ranks is not priced like its slowest
axis of 2). The default model prices bytes only, so plans are chosen by bytes, then by
collective count, then by peak memory.

A model is saved and loaded as JSON (``to_json`` / ``from_json`` / ``load``), which is
what ``shardc calibrate`` writes from timings on a real backend
(``lowering.calibration``); ``compile(..., cost_model=)`` takes a CostModel, such a dict
or the path of such a file (``as_cost_model``).

One exception keeps the bytes-first model honest about latency: a *spare* axis is
one that both the source and the destination replicate, so no data has to cross it.
A plan can still use it, to split a pending reduction (slice over the spare axis,
reduce on half the data, all_gather back), which saves bytes for one more collective.
The bytes-first model charges each collective over a spare axis ``spare_axis_bytes``
(64 KiB: about what a 5 us collective latency costs at 12.5 GB/s), so a reduction is
split only where the saving pays for that latency, as an alpha-beta model would.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from spec_lang.errors import SpecError, value_text

SPARE_AXIS_BYTES = 65536  # the bytes-first model's charge per collective over a spare axis


_COST_HINT = "alpha is seconds per collective (e.g. 5e-6), beta seconds per byte (e.g. 1e-10): finite, >= 0"


def _is_number(v: object) -> TypeGuard[numbers.Real]:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _seconds(v: object, what: str, subject: str | None = None) -> float:
    """A finite, non-negative number of seconds, as a float."""
    if not _is_number(v):
        raise SpecError(f"{what} must be a number, got {type(v).__name__} {v!r}", subject=subject, hint=_COST_HINT)
    try:
        f, shown = float(v), None
    except OverflowError:  # an int past a float's range
        f, shown = math.inf, value_text(v)
    if not math.isfinite(f) or f < 0:
        raise SpecError(f"{what} must be finite and >= 0, got {shown or f}", subject=subject, hint=_COST_HINT)
    return f


@dataclass(frozen=True)
class CostModel:
    """Per-axis alpha (seconds per collective) and beta (seconds per byte).

    The constructor checks every field (finite, non-negative numbers; a non-negative
    int byte charge) and raises SpecError, so a bad model never reaches the planner.
    """

    alpha: tuple[tuple[str, float], ...] = field(default=())
    beta: tuple[tuple[str, float], ...] = field(default=())
    default_alpha: float = 0.0
    default_beta: float = 1e-10
    spare_axis_bytes: int = SPARE_AXIS_BYTES  # bytes-first only; see the module docstring
    # (sorted axes of a flattened group, alpha, beta): overrides the slowest-axis price
    groups: tuple[tuple[tuple[str, ...], float, float], ...] = field(default=())
    # the mesh a calibrated model was measured on (canonical text), None for a model made
    # by hand: other axis sizes are other group sizes, so compile refuses it on another mesh
    mesh: str | None = None
    # seconds per byte of its output block that a local step (a slice, a zero_pad) writes:
    # 0 where copies are free beside the wire (torch's executor: views); an engine whose
    # local steps are real copies as slow as its collectives' bytes (XLA:CPU) measures it
    local_beta: float = 0.0
    # an engine's own price (seconds) of a collective step as it runs it, given this model,
    # the step, the mesh and the step's priced bytes (busiest rank), where one latency per
    # launch of the kind does not describe its lowering: the JAX engine runs a merged
    # exchange as several ppermute rounds or one padded all_to_all, and a collective over
    # 2 devices costs XLA:CPU less than one over 8. None (the default, and where the engine
    # returns None): ``step_time``. Not saved in JSON: the engine sets it on its own model.
    # a timed model's limit on trading bytes for latency, as a multiple of the pair's lower
    # bound; 0: no limit. With a limit, a plan whose busiest rank moves more than the cap
    # ranks after every plan within it (by its excess, then time), where the cap is this
    # multiple for a source with a pending sum (one psum_scatter where a reduction split over
    # a spare axis reaches the bound: the trade the bytes-first model's spare-axis charge
    # makes) and the bound itself otherwise: an exchange moves no more than it must, and its
    # time chooses among the plans that reach the bound. Bytes-first models ignore it.
    bytes_cap: float = 0.0
    # (model, Step, Mesh, bytes_max) -> seconds or None (Any: lowering.program imports this module)
    engine_time: Callable[[CostModel, Any, Any, int], float | None] | None = field(default=None, repr=False)
    # ``engine_time`` never charges a step less than its bytes at ``beta_of``, plus this
    # floor (seconds) where it moves any: a timed search prunes with both before the engine
    # prices a step (``lowering.labels``); 0: no floor known. Set by the engine with ``engine_time``.
    engine_floor: float = 0.0

    def __post_init__(self) -> None:
        for what in ("alpha", "beta"):
            table = getattr(self, what)
            if not isinstance(table, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in table):
                raise SpecError(
                    f"CostModel.{what} must be a tuple of (mesh axis, seconds) pairs, got {value_text(table)}",
                    hint=f"build it with CostModel.make({what}={{'dp': ...}})",
                )
            names = [a for a, _ in table]
            for i, a in enumerate(names):
                if not isinstance(a, str):
                    raise SpecError(f"{what}: mesh axis names are str, got {type(a).__name__} {a!r}",
                                    hint=_COST_HINT)
                if a in names[:i]:
                    raise SpecError(f"{what} gives mesh axis {a!r} twice", subject=a,
                                    hint=f"give each mesh axis one {what}")
            object.__setattr__(self, what, tuple((a, _seconds(v, f"{what} of mesh axis {a!r}", a)) for a, v in table))
        object.__setattr__(self, "default_alpha", _seconds(self.default_alpha, "default_alpha"))
        object.__setattr__(self, "default_beta", _seconds(self.default_beta, "default_beta"))
        b = self.spare_axis_bytes
        try:
            if isinstance(b, bool):
                raise TypeError
            n = operator.index(b)  # int and numpy ints; not float, not bool
        except TypeError:
            raise SpecError(f"spare_axis_bytes must be an int (bytes), got {type(b).__name__} {b!r}",
                            hint="give a byte count, e.g. 65536, or 0 for a pure bytes-first plan") from None
        if n < 0:
            raise SpecError(f"spare_axis_bytes must be >= 0, got {b}",
                            hint="give a byte count, e.g. 65536, or 0 for a pure bytes-first plan")
        object.__setattr__(self, "spare_axis_bytes", n)
        object.__setattr__(self, "groups", _check_groups(self.groups))
        object.__setattr__(self, "mesh", _check_mesh(self.mesh))
        object.__setattr__(self, "local_beta", _seconds(self.local_beta, "local_beta"))
        object.__setattr__(self, "bytes_cap", _seconds(self.bytes_cap, "bytes_cap"))
        object.__setattr__(self, "engine_floor", _seconds(self.engine_floor, "engine_floor"))
        if self.engine_time is not None and not callable(self.engine_time):
            raise SpecError(f"CostModel.engine_time must be a function or None, got {type(self.engine_time).__name__}",
                            hint="give fn(model, step, mesh, bytes_max) -> seconds or None")

    @staticmethod
    def make(alpha: Mapping[str, float] | float | None = None, beta: Mapping[str, float] | float | None = None,
             default_alpha: float = 0.0, default_beta: float = 1e-10,
             spare_axis_bytes: int = SPARE_AXIS_BYTES) -> CostModel:
        """A model from per-axis dicts; a plain number for ``alpha``/``beta`` is every axis's value."""

        def table(value: object, what: str) -> tuple[tuple[str, float], ...]:
            if value is None:
                return ()
            if not isinstance(value, Mapping):
                raise SpecError(f"{what} must be a number or a dict of mesh axis -> number, got "
                                f"{type(value).__name__} {value_text(value)}", hint=_COST_HINT)
            if not all(isinstance(k, str) for k in value):
                raise SpecError(f"{what}: mesh axis names are str, got {list(value)!r}", hint=_COST_HINT)
            return tuple(sorted(value.items()))

        if _is_number(alpha):
            default_alpha, alpha = _seconds(alpha, "alpha"), None
        if _is_number(beta):
            default_beta, beta = _seconds(beta, "beta"), None
        return CostModel(table(alpha, "alpha"), table(beta, "beta"), default_alpha, default_beta, spare_axis_bytes)

    def _group(self, axes: tuple[str, ...]) -> tuple[tuple[str, ...], float, float] | None:
        if len(axes) < 2 or not self.groups:
            return None
        key = tuple(sorted(axes))
        return next((g for g in self.groups if g[0] == key), None)

    def alpha_of(self, axes: tuple[str, ...]) -> float:
        g = self._group(axes)
        if g is not None:
            return g[1]
        table = dict(self.alpha)
        return max((table.get(a, self.default_alpha) for a in axes), default=0.0)

    def beta_of(self, axes: tuple[str, ...]) -> float:
        g = self._group(axes)
        if g is not None:
            return g[2]
        table = dict(self.beta)
        return max((table.get(a, self.default_beta) for a in axes), default=0.0)

    def axis_names(self) -> set[str]:
        """Every mesh axis the model names (compile checks them against the mesh)."""
        return {a for a, _ in self.alpha + self.beta} | {a for g in self.groups for a in g[0]}

    def step_time(self, axes: tuple[str, ...], bytes_max: int, collective: bool, launches: int = 1,
                  local_bytes: int = 0) -> float:
        """A step's time: one latency per collective it runs (a relay runs two), and its bytes;
        a local step's, the ``local_bytes`` of its output block it writes (``local_beta``)."""
        if not collective:
            return self.local_beta * local_bytes
        return launches * self.alpha_of(axes) + self.beta_of(axes) * bytes_max

    def collective_time(self, step: Any, mesh: Any, bytes_max: int) -> float:
        """A collective ``lowering.Step``'s time on ``mesh``: the engine's price
        (``engine_time``) where it gives one, else ``step_time``'s alpha per launch and beta
        per byte."""
        if self.engine_time is not None:
            t = self.engine_time(self, step, mesh, bytes_max)
            if t is not None:
                return t
        return self.step_time(step.axes, bytes_max, True, step.launches)

    @property
    def bytes_first(self) -> bool:
        """True when time is a fixed multiple of bytes (no latency, one bandwidth)."""
        return (
            self.default_alpha == 0.0
            and self.local_beta == 0.0
            and self.engine_time is None
            and all(v == 0.0 for _, v in self.alpha)
            and all(v == self.default_beta for _, v in self.beta)
            and all(a == 0.0 and b == self.default_beta for _, a, b in self.groups)
        )

    def to_json(self) -> dict[str, Any]:
        """The model as a JSON-able dict; ``CostModel.from_json`` reads it back."""
        return {
            "format": FORMAT,
            "alpha": dict(self.alpha),
            "beta": dict(self.beta),
            "default_alpha": self.default_alpha,
            "default_beta": self.default_beta,
            "spare_axis_bytes": self.spare_axis_bytes,
            "groups": [{"axes": list(axes), "alpha": a, "beta": b} for axes, a, b in self.groups],
            **({"mesh": self.mesh} if self.mesh is not None else {}),
            **({"local_beta": self.local_beta} if self.local_beta else {}),
            **({"bytes_cap": self.bytes_cap} if self.bytes_cap else {}),
        }

    @staticmethod
    def from_json(data: object) -> CostModel:
        """A model from ``to_json``'s dict (or the JSON text of one); SpecError on anything else.

        ``mesh`` (the mesh a calibration measured) is kept; the other keys a calibration
        adds about itself (``backend``, ``fit``) are allowed and ignored; any other unknown
        key is refused, so a misspelt ``alpah`` is not silently the default.
        """
        if isinstance(data, str):
            data = _parse_json(data, "the cost model")
        if not isinstance(data, Mapping):
            raise SpecError(f"a cost model is a JSON object, got {type(data).__name__}", hint=_JSON_HINT)
        unknown = sorted(set(data) - _JSON_KEYS)
        if unknown:
            raise SpecError(f"the cost model has unknown key(s) {unknown}",
                            hint=f"the keys are {', '.join(sorted(_JSON_KEYS))}")
        if data.get("format", FORMAT) != FORMAT:
            raise SpecError(f"the cost model's format is {data['format']!r}, not {FORMAT!r}", hint=_JSON_HINT)
        groups = data.get("groups", [])
        if not isinstance(groups, list) or not all(isinstance(g, Mapping) and set(g) == {"axes", "alpha", "beta"}
                                                   for g in groups):
            raise SpecError(f"groups must be a list of {{axes, alpha, beta}} objects, got {groups!r}",
                            hint=_JSON_HINT)
        for g in groups:
            if not isinstance(g["axes"], list):
                raise SpecError(f"a group's axes are a list of mesh axis names, got {g['axes']!r}", hint=_JSON_HINT)
        for what in ("alpha", "beta"):
            if not isinstance(data.get(what, {}), Mapping):
                raise SpecError(f"{what} must be an object of mesh axis -> seconds, got {data[what]!r}",
                                hint=_JSON_HINT)
        return CostModel(
            tuple(sorted(data.get("alpha", {}).items())),
            tuple(sorted(data.get("beta", {}).items())),
            data.get("default_alpha", 0.0),
            data.get("default_beta", 1e-10),
            data.get("spare_axis_bytes", SPARE_AXIS_BYTES),
            tuple((tuple(g["axes"]), g["alpha"], g["beta"]) for g in groups),
            data.get("mesh"),
            data.get("local_beta", 0.0),
            data.get("bytes_cap", 0.0),
        )

    @staticmethod
    def load(path: str | os.PathLike[str]) -> CostModel:
        """Read a model from a JSON file (what ``shardc calibrate --out`` writes); a model
        calibrated on one mesh keeps it, and ``compile`` refuses it on another."""
        return CostModel.from_json(_parse_json(_read(path), f"the cost model file {os.fspath(path)!r}"))


def _parse_json(text: str, what: str) -> object:
    """JSON text as data; a SpecError that shows the offending line (not the whole text)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        start = text.rfind("\n", 0, e.pos) + 1
        end = text.find("\n", e.pos)
        line = text[start:end if end >= 0 else len(text)]
        col = e.pos - start
        # a long line (minified JSON) is shown around the error only
        cut = max(0, col - 40)
        shown = ("..." if cut else "") + line[cut:cut + 80] + ("..." if len(line) > cut + 80 else "")
        raise SpecError(f"{what} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})",
                        text=shown, pos=col - cut + (3 if cut else 0), hint=_JSON_HINT) from None


def _read(path: str | os.PathLike[str]) -> str:
    hint = "give the path of a JSON file written by shardc calibrate --out"
    if not isinstance(path, (str, os.PathLike)):
        raise SpecError(f"a cost model file is named by a str or a path, got {type(path).__name__}", hint=hint)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise SpecError(f"cannot read the cost model file {os.fspath(path)!r}: {e.strerror}", hint=hint) from None
    except ValueError as e:  # a NUL in the name, or a file that is not UTF-8 text
        raise SpecError(f"cannot read the cost model file {os.fspath(path)!r}: {e}", hint=hint) from None


FORMAT = "shardc-cost-model/1"
_JSON_KEYS = {"format", "alpha", "beta", "default_alpha", "default_beta", "spare_axis_bytes", "groups",
              "backend", "mesh", "fit", "local_beta", "bytes_cap"}
_JSON_HINT = ("write it as {\"alpha\": {\"dp\": 5e-6}, \"beta\": {\"dp\": 1e-10}, \"groups\": "
              "[{\"axes\": [\"dp\", \"tp\"], \"alpha\": 8e-6, \"beta\": 2e-10}]}, as shardc calibrate does")


def _check_groups(groups: object) -> tuple[tuple[tuple[str, ...], float, float], ...]:
    """Each flattened group's entry: 2+ distinct str axes (kept sorted), checked alpha and beta."""
    if not isinstance(groups, tuple) or not all(isinstance(g, tuple) and len(g) == 3 for g in groups):
        raise SpecError(f"CostModel.groups must be a tuple of (axes, alpha, beta), got {groups!r}",
                        hint="e.g. groups=((('dp', 'tp'), 8e-6, 2e-10),)")
    out: list[tuple[tuple[str, ...], float, float]] = []
    for axes, a, b in groups:
        if (not isinstance(axes, tuple) or len(axes) < 2 or len(set(axes)) != len(axes)
                or not all(isinstance(x, str) for x in axes)):
            raise SpecError(f"a group of the cost model is 2 or more distinct mesh axis names, got {value_text(axes)}",
                            hint="give per-axis values in alpha/beta; groups are for flattened axes, e.g. ('dp', 'tp')")
        key = tuple(sorted(axes))
        if any(g[0] == key for g in out):
            raise SpecError(f"the cost model gives the group {key} twice", subject=key[0],
                            hint="give each flattened group one entry")
        label = ",".join(key)
        out.append((key, _seconds(a, f"alpha of group ({label})", key[0]),
                    _seconds(b, f"beta of group ({label})", key[0])))
    return tuple(out)


def _check_mesh(mesh: object) -> str | None:
    """A calibrated model's mesh as canonical text (``dp=4, tp=2`` -> ``dp=4,tp=2``)."""
    if mesh is None:
        return None
    if not isinstance(mesh, str):
        raise SpecError(f"the cost model's mesh is a mesh string like dp=2,tp=4, got {mesh!r}", hint=_JSON_HINT)
    from spec_lang.parser import parse_mesh

    try:
        return str(parse_mesh(mesh))
    except SpecError as e:
        raise SpecError(f"the cost model's mesh is not a mesh: {e.message}", text=e.text, pos=e.pos,
                        hint="it names the mesh the model was calibrated on, e.g. dp=2,tp=4") from None


def as_cost_model(value: object, mesh: object = None) -> CostModel | None:
    """``compile``'s ``cost_model=``: None, a CostModel, its JSON dict, or a JSON file's path.

    A calibrated model names the mesh it was measured on (``CostModel.mesh``, from its
    JSON); with ``mesh`` given, a different one (other axis sizes are other group sizes,
    so other alphas) is refused, whichever form the model came in.
    """
    if value is None:
        return None
    if isinstance(value, CostModel):
        model = value
    elif isinstance(value, (str, os.PathLike)):
        model = CostModel.load(value)
    elif isinstance(value, Mapping):
        model = CostModel.from_json(value)
    else:
        raise SpecError(
            f"cost_model must be a lowering.CostModel, a dict or a path to its JSON, got {type(value).__name__}",
            hint="build one with CostModel.make(alpha={'dp': 5e-6}, beta={'dp': 1e-10}), "
            "or pass the file shardc calibrate --out wrote",
        )
    if mesh is not None and model.mesh is not None:
        from spec_lang.parser import parse_mesh

        mesh = str(parse_mesh(mesh)) if isinstance(mesh, str) else str(mesh)
        if model.mesh != mesh:
            raise SpecError(f"the cost model was calibrated on the mesh {model.mesh}, not {mesh}",
                            hint=f"calibrate this mesh (shardc calibrate --mesh {mesh}), or drop the model's "
                            "\"mesh\" key (CostModel.mesh) to use it anyway")
    return model


DEFAULT_COST_MODEL = CostModel()
