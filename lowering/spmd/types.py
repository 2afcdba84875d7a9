"""The local SPMD types of one mesh axis: R, I, V, P(op) and S(i) (torch-free).

``R`` replicate (gradient P), ``I`` invariant (gradient I), ``V`` varying (gradient V),
``P`` a pending sum (gradient R; ``P("avg"|"max"|"min")`` other reductions) and ``S(i)``,
V whose blocks concatenate on tensor dim i (the partition-spec view of V)::

    R: A        I: A        V: A        P: +A        S(0): [A0]
       A           A           B           +B              [A1]   == [A0, A1, A2]
       A           A           C           +C              [A2]
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from spec_lang.errors import SpecError
from spec_lang.ir import TensorType

REDUCE_OPS = ("sum", "avg", "max", "min")


@dataclass(frozen=True)
class LocalType:
    """One mesh axis' local SPMD type; compare with ``==`` (``P == P("sum")``)."""

    kind: str  # "R" | "I" | "V" | "P" | "S"
    op: str = "sum"  # the reduction of P
    dim: int | None = None  # the concat dim of S

    def __call__(self, op: str) -> LocalType:
        """``P("avg")``: a pending reduction other than the sum."""
        if self.kind != "P":
            raise SpecError(f"{self!r} takes no argument", hint="only P takes a reduce op: P('avg')")
        if op not in REDUCE_OPS:
            raise SpecError(f"unknown reduce op {op!r}", hint=f"use one of {', '.join(REDUCE_OPS)}")
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

    def __repr__(self) -> str:
        if self.kind == "S":
            return f"S({self.dim})"
        if self.kind == "P" and self.op != "sum":
            return f"P({self.op!r})"
        return self.kind

    __str__ = __repr__


R = LocalType("R")
I = LocalType("I")  # noqa: E741 - the type system's name
V = LocalType("V")
P = LocalType("P")


def S(dim: int) -> LocalType:
    """V with concat semantics on tensor dim ``dim`` (``Shard(dim)``)."""
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
        raise SpecError(f"S({dim!r}) needs a tensor dim >= 0", hint="write S(0) for a split of dim 0")
    return LocalType("S", dim=dim)


_TEXT = re.compile(r"^\s*(?:(R|I|V|U|P)(?:\(\s*'?(\w+)'?\s*\))?|S\(\s*(\d+)\s*\))\s*$")


def as_local_type(t: object, what: str = "type") -> LocalType:
    """A LocalType from itself or from text: ``R``, ``I``, ``V``, ``P``/``U``, ``P(avg)``, ``S(1)``."""
    if isinstance(t, LocalType):
        return t
    if isinstance(t, str):
        m = _TEXT.match(t)
        if m:
            kind, op, dim = m.groups()
            if dim is not None:
                return S(int(dim))
            if kind in ("P", "U"):
                return P(op or "sum")
            if op is None:
                return LocalType(kind)
    raise SpecError(f"the {what} {t!r} is not a local SPMD type",
                    hint="use spmd.R, spmd.I, spmd.V, spmd.P, spmd.P('avg') or spmd.S(dim)")


def types_of(t: TensorType, unstated: Iterable[str] = ()) -> tuple[dict[str, LocalType], dict[tuple[str, ...], int]]:
    """The per-axis local types a global type states, and the global size of each split dim
    (keyed by its axes): a dim split by axes is S(dim) on each of them, an annotation gives
    R, V or P(op); each axis of ``unstated`` that ``t`` neither splits nor annotates is I
    (an unannotated mesh axis of a type means I: pass the mesh's axes for a type's meaning
    on its mesh, or the axes a string annotates ``{I:..}`` explicitly)."""
    types: dict[str, LocalType] = {}
    sizes: dict[tuple[str, ...], int] = {}
    for d, dim in enumerate(t.dims):
        for a in dim.axes:
            types[a] = S(d)
        if dim.axes:
            sizes[dim.axes] = dim.size
    for a, at in t.axis_types:
        types[a] = LocalType("P", at.op) if at.kind == "P" else LocalType(at.kind)
    for a in unstated:
        types.setdefault(a, I)
    return types, sizes
