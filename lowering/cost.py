"""The cost model: alpha-beta time of a step from the bytes it sends.

What each rank sends in a step is the step kind's price (``lowering.kinds``): a ring
all_gather sends (n-1) blocks (on uneven blocks total - b(successor)); a ring
reduce_scatter (n-1)/n of its input (padded to n equal chunks when uneven); a ring
all_reduce 2(n-1)/n of its block; an exchange exactly the bytes leaving the rank; a
local step nothing. A program's ``bytes_sent_max`` is the max over ranks of the sum
over its steps.

Time is ``sum(alpha(step axes) + beta(step axes) * max bytes of the step)``, with
per-axis alpha (latency, s) and beta (s/byte); a flattened group pays the slowest of its
axes. The default model prices bytes only, so plans are chosen by bytes, then by
collective count, then by peak memory.

One exception keeps the bytes-first model honest about latency: a *spare* axis is
one that both the source and the destination replicate, so no data has to cross it.
A plan can still use it, to split a pending reduction (slice over the spare axis,
reduce on half the data, all_gather back), which saves bytes for one more collective.
The bytes-first model charges each collective over a spare axis ``spare_axis_bytes``
(64 KiB: about what a 5 us collective latency costs at 12.5 GB/s), so a reduction is
split only where the saving pays for that latency, as an alpha-beta model would.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field

from spec_lang.errors import SpecError

SPARE_AXIS_BYTES = 65536  # the bytes-first model's charge per collective over a spare axis


_COST_HINT = "alpha is seconds per collective (e.g. 5e-6), beta seconds per byte (e.g. 1e-10): finite, >= 0"


def _is_number(v: object) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _seconds(v: object, what: str, subject: str | None = None) -> float:
    """A finite, non-negative number of seconds, as a float."""
    if not _is_number(v):
        raise SpecError(f"{what} must be a number, got {type(v).__name__} {v!r}", subject=subject, hint=_COST_HINT)
    f = float(v)  # type: ignore[arg-type]
    if not math.isfinite(f) or f < 0:
        raise SpecError(f"{what} must be finite and >= 0, got {f}", subject=subject, hint=_COST_HINT)
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

    def __post_init__(self) -> None:
        for what in ("alpha", "beta"):
            table = getattr(self, what)
            if not isinstance(table, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in table):
                raise SpecError(
                    f"CostModel.{what} must be a tuple of (mesh axis, seconds) pairs, got {table!r}",
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
                                f"{type(value).__name__} {value!r}", hint=_COST_HINT)
            if not all(isinstance(k, str) for k in value):
                raise SpecError(f"{what}: mesh axis names are str, got {list(value)!r}", hint=_COST_HINT)
            return tuple(sorted(value.items()))

        if _is_number(alpha):
            default_alpha, alpha = _seconds(alpha, "alpha"), None
        if _is_number(beta):
            default_beta, beta = _seconds(beta, "beta"), None
        return CostModel(table(alpha, "alpha"), table(beta, "beta"), default_alpha, default_beta, spare_axis_bytes)

    def alpha_of(self, axes: tuple[str, ...]) -> float:
        table = dict(self.alpha)
        return max((table.get(a, self.default_alpha) for a in axes), default=0.0)

    def beta_of(self, axes: tuple[str, ...]) -> float:
        table = dict(self.beta)
        return max((table.get(a, self.default_beta) for a in axes), default=0.0)

    def step_time(self, axes: tuple[str, ...], bytes_max: int, collective: bool) -> float:
        if not collective:
            return 0.0
        return self.alpha_of(axes) + self.beta_of(axes) * bytes_max

    @property
    def bytes_first(self) -> bool:
        """True when time is a fixed multiple of bytes (no latency, one bandwidth)."""
        return (
            self.default_alpha == 0.0
            and all(v == 0.0 for _, v in self.alpha)
            and all(v == self.default_beta for _, v in self.beta)
        )


DEFAULT_COST_MODEL = CostModel()
