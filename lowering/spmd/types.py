"""The local SPMD types under the names the SPMD API uses (one class: ``spec_lang.local_type``),
and the per-axis local types a global type states."""

from __future__ import annotations

from collections.abc import Iterable

from spec_lang.ir import TensorType
from spec_lang.local_type import REDUCE_OPS, I, LocalType, P, R, S, V
from spec_lang.parser import parse_local_type as as_local_type

__all__ = ["REDUCE_OPS", "I", "LocalType", "P", "R", "S", "V", "as_local_type", "types_of"]


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
