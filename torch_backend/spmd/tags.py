"""Types attached to tensors: ``assert_type``, ``typeof`` (erasable: nothing reads them
unless a typed call or ``typecheck()`` does)."""

from __future__ import annotations

from typing import Any

import torch

from lowering.spmd.types import types_of
from spec_lang.errors import SpecError
from spec_lang.local_type import LocalType
from spec_lang.parser import parse_local_type as as_local_type
from torch_backend.type_tags import SIZES, TYPES, attach


def typeof(x: Any) -> dict[str, LocalType]:
    """The local SPMD type of ``x`` per mesh axis (``{}`` for an untyped tensor, and for a
    Python number, which holds one value on every rank)."""
    if not isinstance(x, torch.Tensor):
        if isinstance(x, (bool, int, float, complex)):
            return {}
        raise SpecError(f"spmd.typeof takes a tensor, got {type(x).__name__}",
                        hint="pass the tensor whose per-axis types you want (spmd.assert_type attaches them)")
    return dict(getattr(x, TYPES, None) or {})


def recorded_size(x: Any, group: tuple[str, ...]) -> int | None:
    return (getattr(x, SIZES, None) or {}).get(group)


def assert_type(x: torch.Tensor, types: dict[str, Any] | str) -> torch.Tensor:
    """Attach the local SPMD types ``{axis: type}`` (or a DSL string such as
    ``"f32[4,6]{V:tp}"``) to ``x`` and return ``x``.

    A type string states the axes it splits (S(dim)) or annotates, ``{I:..}`` included;
    the axes it leaves out are left alone. When ``x`` already carries a type on an axis,
    the new one must agree (else SpecError): S(i) and V agree (S(i) only adds how the
    blocks reassemble), S(i) and S(j) do not, nor P(op) and another reduction.
    """
    if not isinstance(x, torch.Tensor):
        raise SpecError(f"assert_type needs a tensor, got {type(x).__name__}")
    sizes: dict[tuple[str, ...], int] = {}
    if isinstance(types, str):
        from spec_lang.parser import invariant_axes, parse

        new, sizes = types_of(parse(types), invariant_axes(types))
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
        if a in old and not old[a].agrees(t):
            raise SpecError(f"assert_type: axis {a!r} of the tensor is {old[a]!r}, not {t!r}",
                            hint=f"convert it first, e.g. spmd.convert(x, {a!r}, src={old[a]!r}, dst={t!r})")
    merged = {**old, **{a: t for a, t in new.items() if not (t.kind == "V" and old.get(a, t).kind == "S")}}
    return attach(x, merged, {**(getattr(x, SIZES, None) or {}), **sizes})
