"""Types attached to tensors: ``assert_type``, ``typeof`` (erasable: nothing reads them
unless a typed call or ``typecheck()`` does)."""

from __future__ import annotations

from typing import Any

import torch

from spec_lang.errors import SpecError
from spec_lang.ir import TensorType
from spec_lang.local_type import LocalType, S
from spec_lang.parser import parse_local_type as as_local_type

TYPES = "_spmd_types"  # {mesh axis: LocalType}
SIZES = "_spmd_sizes"  # {group axes: global size of the dim the group splits}


def typeof(x: Any) -> dict[str, LocalType]:
    """The local SPMD type of ``x`` per mesh axis (``{}`` for an untyped tensor, and for a
    Python number, which holds one value on every rank)."""
    if not isinstance(x, torch.Tensor):
        if isinstance(x, (bool, int, float, complex)):
            return {}
        raise SpecError(f"spmd.typeof takes a tensor, got {type(x).__name__}",
                        hint="pass the tensor whose per-axis types you want (spmd.assert_type attaches them)")
    return dict(getattr(x, TYPES, None) or {})


def attach(x: torch.Tensor, types: dict[str, LocalType], sizes: dict[tuple[str, ...], int] | None = None) -> torch.Tensor:
    setattr(x, TYPES, types)
    if sizes:
        setattr(x, SIZES, sizes)
    return x


def recorded_size(x: Any, group: tuple[str, ...]) -> int | None:
    return (getattr(x, SIZES, None) or {}).get(group)


def types_of_text(text: str) -> tuple[dict[str, LocalType], dict[tuple[str, ...], int]]:
    """The per-axis types a DSL string states: a dim split by axes is S(dim) on each of them,
    annotations give R, I, V and P(op)."""
    from spec_lang.parser import parse

    t: TensorType = parse(text)
    types: dict[str, LocalType] = {}
    sizes: dict[tuple[str, ...], int] = {}
    for d, dim in enumerate(t.dims):
        for a in dim.axes:
            types[a] = S(d)
        if dim.axes:
            sizes[dim.axes] = dim.size
    for a, at in t.axis_types:
        types[a] = at
    return types, sizes


def assert_type(x: torch.Tensor, types: dict[str, Any] | str) -> torch.Tensor:
    """Attach the local SPMD types ``{axis: type}`` (or a DSL string such as
    ``"f32[4,6]{V:tp}"``) to ``x`` and return ``x``.

    When ``x`` already carries a type on an axis, the new one must agree (else SpecError);
    S(i) and V agree (S(i) only adds how the blocks reassemble).
    """
    if not isinstance(x, torch.Tensor):
        raise SpecError(f"assert_type needs a tensor, got {type(x).__name__}")
    sizes: dict[tuple[str, ...], int] = {}
    if isinstance(types, str):
        new, sizes = types_of_text(types)
    elif isinstance(types, dict):
        new = {}
        for a, t in types.items():
            if not isinstance(a, str):
                raise SpecError(f"assert_type keys are mesh-axis names, got {a!r}", hint="e.g. {'tp': spmd.V}")
            new[a] = as_local_type(t, f"type of axis {a!r}")
    else:
        raise SpecError(f"assert_type takes a dict {{axis: type}} or a type string, got {type(types).__name__}",
                        hint="e.g. spmd.assert_type(x, {'tp': spmd.V}) or spmd.assert_type(x, 'f32[4,6]{V:tp}')")
    old = typeof(x)
    for a, t in new.items():
        if a in old and old[a].base != t.base and old[a] != t:
            raise SpecError(f"assert_type: axis {a!r} of the tensor is {old[a]!r}, not {t!r}",
                            hint=f"convert it first, e.g. spmd.convert(x, {a!r}, src={old[a]!r}, dst={t!r})")
    merged = {**old, **new}
    return attach(x, merged, {**(getattr(x, SIZES, None) or {}), **sizes})
