"""The local SPMD types under the names the SPMD API uses (one class: ``spec_lang.local_type``),
and the per-axis local types a global type states."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from spec_lang.errors import SpecError
from spec_lang.ir import TensorType
from spec_lang.local_type import REDUCE_OPS, I, LocalType, P, R, V
from spec_lang.local_type import S as S_from_start
from spec_lang.parser import parse_local_type as as_local_type

__all__ = ["REDUCE_OPS", "FromEnd", "I", "LocalType", "P", "R", "S", "V", "as_local_type", "resolve", "types_of"]


@dataclass(frozen=True)
class FromEnd:
    """``S(-k)``: V split on the k-th dim from the end, as torch counts dims. It means a
    ``LocalType`` S(i) once the tensor is known (``resolve``); a tensor's types are always
    stored resolved, so ``typeof`` shows S(i)."""

    dim: int  # < 0

    def __repr__(self) -> str:
        return f"S({self.dim})"

    __str__ = __repr__


def S(dim: int) -> LocalType | FromEnd:
    """V with concat semantics on tensor dim ``dim`` (``Shard(dim)``); a negative dim counts
    from the end (``S(-1)``: the last dim), resolved against the tensor it types."""
    if isinstance(dim, int) and not isinstance(dim, bool) and dim < 0:
        return FromEnd(dim)
    return S_from_start(dim)


_FROM_END = re.compile(r"\s*S\s*\(\s*(-\d+)\s*\)\s*")


def resolve(t: Any, ndim: int, what: str = "type") -> LocalType:
    """A local type (or its text) for a tensor of ``ndim`` dims: ``S(-1)`` becomes S(ndim - 1)."""
    if isinstance(t, str) and (m := _FROM_END.fullmatch(t)):
        t = FromEnd(int(m.group(1)))
    if isinstance(t, FromEnd):
        if t.dim < -ndim:
            raise SpecError(f"the {what} {t!r} counts {-t.dim} dims from the end, but the tensor has {ndim} dims",
                            hint=f"use S(i) with {-ndim} <= i < {ndim}" if ndim else "a 0-d tensor has no dim to split")
        return S_from_start(t.dim + ndim)
    return as_local_type(t, what)


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
            types[a] = S_from_start(d)
        if dim.axes:
            sizes[dim.axes] = dim.size
    for a, at in t.axis_types:
        types[a] = LocalType("P", at.op) if at.kind == "P" else LocalType(at.kind)
    for a in unstated:
        types.setdefault(a, I)
    return types, sizes
