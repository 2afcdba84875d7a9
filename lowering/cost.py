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

from dataclasses import dataclass, field

SPARE_AXIS_BYTES = 65536  # the bytes-first model's charge per collective over a spare axis


@dataclass(frozen=True)
class CostModel:
    """Per-axis alpha (seconds per collective) and beta (seconds per byte)."""

    alpha: tuple[tuple[str, float], ...] = field(default=())
    beta: tuple[tuple[str, float], ...] = field(default=())
    default_alpha: float = 0.0
    default_beta: float = 1e-10
    spare_axis_bytes: int = SPARE_AXIS_BYTES  # bytes-first only; see the module docstring

    @staticmethod
    def make(alpha: dict[str, float] | None = None, beta: dict[str, float] | None = None,
             default_alpha: float = 0.0, default_beta: float = 1e-10,
             spare_axis_bytes: int = SPARE_AXIS_BYTES) -> CostModel:
        return CostModel(
            tuple(sorted((alpha or {}).items())), tuple(sorted((beta or {}).items())),
            default_alpha, default_beta, int(spare_axis_bytes),
        )

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
