"""The SPMD type system's local type of one mesh axis, one class for the IR (``AxisType``,
a type's annotations), the SPMD rules and the torch API: ``R`` replicate (gradient P), ``I``
invariant (gradient I), ``V`` varying (gradient V), ``P`` a pending sum (gradient R; a type
writes it ``U``; ``P("avg"|"max"|"min")`` other reductions) and ``S(i)``, V whose blocks
concatenate on tensor dim i (for the SPMD API only: a type writes it as a sharded dim)::

    R: A        I: A        V: A        P: +A        S(0): [A0]
       A           A           B           +B              [A1]   == [A0, A1, A2]
       A           A           C           +C              [A2]
"""

from __future__ import annotations

from dataclasses import dataclass

from spec_lang.errors import SpecError, value_text
from spec_lang.split import INT64_LIMIT

REDUCE_OPS = ("sum", "avg", "max", "min")
KINDS = ("R", "I", "V", "P", "S")


@dataclass(frozen=True)
class LocalType:
    """One mesh axis' local SPMD type; compare with ``==`` (``P == P("sum")``).

    ``LocalType("U")`` is accepted as the spelling of ``LocalType("P", "sum")``.
    """

    kind: str  # "R" | "I" | "V" | "P" | "S"
    op: str = "sum"  # the reduce op, meaningful for P only
    dim: int | None = None  # the concat dim of S only

    def __post_init__(self) -> None:
        for what, value in (("local type", self.kind), ("reduce op", self.op)):
            if not isinstance(value, str):
                raise SpecError(f"the {what} must be a str, got {type(value).__name__} {value_text(value)}",
                                hint="write AxisType('R'), AxisType('P', 'max'), ...")
            if type(value) is not str:  # a str subclass (numpy's str_): the canonical form is a str
                object.__setattr__(self, "kind" if what == "local type" else "op", str(value))
        if self.kind == "U":
            object.__setattr__(self, "kind", "P")
            if self.op != "sum":
                raise SpecError(f"U is P(sum); it has no op {self.op!r}", hint=f"write AxisType('P', {self.op!r})")
        if self.kind not in KINDS:
            raise SpecError(f"unknown local type {self.kind!r}", hint="use one of U, R, I, V, P(op), S(dim)")
        if self.op not in REDUCE_OPS:
            raise SpecError(
                f"unknown reduce op {self.op!r}", subject=self.op,
                hint="use P(sum), P(avg), P(max) or P(min); U is P(sum)",
            )
        if self.kind != "P" and self.op != "sum":
            raise SpecError(
                f"local type {self.kind} has no reduce op (got {self.op!r})",
                hint=f"only P carries an op: write AxisType({self.kind!r}) or AxisType('P', {self.op!r})",
            )
        if (self.dim is None) != (self.kind != "S"):
            raise SpecError(f"local type {self.kind} {'needs' if self.kind == 'S' else 'has no'} tensor dim",
                            hint="only S carries a dim: S(0) is V split on tensor dim 0")
        dim = self.dim
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or not 0 <= dim < INT64_LIMIT):
            raise SpecError(f"S({value_text(dim)}) needs a tensor dim >= 0", hint="write S(0) for a split of dim 0")

    def __call__(self, op: str) -> LocalType:
        """``P("avg")``: a pending reduction other than the sum."""
        if self.kind != "P":
            raise SpecError(f"{self!r} takes no argument", hint="only P takes a reduce op: P('avg')")
        return LocalType("P", op)

    @property
    def base(self) -> str:
        """The local type proper: S(i) is V (the dim only says how blocks reassemble)."""
        return "V" if self.kind == "S" else self.kind

    @property
    def grad(self) -> LocalType:
        """The gradient's type: R <-> P (any P's gradient is R), I, V and S(i) their own."""
        return {"R": P, "P": R}.get(self.kind, self)

    def agrees(self, other: LocalType) -> bool:
        """Whether a tensor of this type may stand where ``other`` is stated: the same local
        type, S(i) where V is stated (or V where S(i) is: the partition spec is added), never
        S(i) for S(j) nor one pending reduction for another."""
        if self.base != other.base:
            return False
        if self.kind == "P":
            return self.op == other.op
        return not (self.kind == other.kind == "S" and self.dim != other.dim)

    @property
    def code(self) -> str:
        """How a type string writes it: ``U`` for P(sum), as JAX prints unreduced."""
        if self.kind == "P":
            return "U" if self.op == "sum" else f"P({self.op})"
        return repr(self)

    def __repr__(self) -> str:
        if self.kind == "S":
            return f"S({self.dim})"
        if self.kind == "P" and self.op != "sum":
            return f"P({self.op!r})"
        return self.kind

    __str__ = __repr__


R = LocalType("R")
I = LocalType("I")  # noqa: E741 - the SPMD type system's name for Invariant
V = LocalType("V")
P = U = LocalType("P")


def S(dim: int) -> LocalType:
    """V with concat semantics on tensor dim ``dim`` (``Shard(dim)``)."""
    return LocalType("S", dim=dim)
