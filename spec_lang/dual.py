"""The type of a gradient: the dual of a tensor type under the SPMD type system.

The gradient of a Replicate value is Partial (each replica's use contributes a piece),
the gradient of a Partial value is Replicate, Invariant and Varying are their own
duals, and a dim sharded by a mesh axis stays sharded by it::

    R <-> P(sum)     P(avg|max|min) -> R     I -> I     V -> V     8@dp -> 8@dp
"""

from __future__ import annotations

from spec_lang.errors import SpecError
from spec_lang.ir import AxisType, TensorType

_SUM = AxisType("P", "sum")
_REPLICATE = AxisType("R")


def dual_type(t: TensorType) -> TensorType:
    """The gradient's type: R <-> P (P(avg) -> R too), I and V and sharded dims unchanged
    (``torch_backend.dual_type`` is the public door that takes a string too)."""
    out = []
    for a, at in t.axis_types:
        if at.kind == "R":
            out.append((a, _SUM))
        elif at.kind == "P":
            out.append((a, _REPLICATE))
        else:
            out.append((a, at))
    return t.replace(axis_types=tuple(out))


def check_differentiable(src: TensorType, dst: TensorType) -> None:
    for t, side in ((src, "source"), (dst, "destination")):
        op = t.partial_op
        if op in ("max", "min"):
            raise SpecError(
                f"no gradient through a pending {op}: the {side} type {t} is P({op})",
                hint=f"P({op}) has no typed gradient (it needs the arg-{op}); reduce it without autograd "
                "(torch.no_grad() or .detach()), or use P(sum)/P(avg)",
            )
