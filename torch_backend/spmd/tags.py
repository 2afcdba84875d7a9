"""Types attached to tensors and Python numbers: ``assert_type``, ``typeof`` (erasable:
nothing reads them unless a typed call or ``typecheck()`` does)."""

from __future__ import annotations

from typing import Any

import torch

from lowering.spmd.types import resolve, types_of
from spec_lang.errors import SpecError
from spec_lang.local_type import LocalType
from torch_backend.type_tags import SIZES, TYPES, attach


class TypedFloat(float):
    """A Python float with SPMD types (``spmd.assert_type(0.5, {"dp": V})``, or ``.item()``
    of a typed tensor under ``typecheck()``): a torch op taking it types it as an operand.
    Python arithmetic on it gives a plain number (the types stay with torch ops)."""


class TypedInt(int):
    """A Python int with SPMD types (see ``TypedFloat``)."""


def local_form(types: dict[str, LocalType]) -> dict[str, LocalType]:
    return {a: LocalType("V") if t.kind == "S" else t for a, t in types.items()}


def typed_number(value: Any, types: dict[str, LocalType]) -> Any:
    n = (TypedFloat if isinstance(value, float) else TypedInt)(value)
    setattr(n, TYPES, local_form(types))
    return n


def typeof(x: Any) -> dict[str, LocalType]:
    """The local SPMD type of ``x`` per mesh axis (``{}`` for an untyped tensor, and for a
    Python number, which holds one value on every rank, unless ``assert_type`` typed it)."""
    if not isinstance(x, (torch.Tensor, bool, int, float, complex)):
        raise SpecError(f"spmd.typeof takes a tensor, got {type(x).__name__}",
                        hint="pass the tensor whose per-axis types you want (spmd.assert_type attaches them)")
    return dict(getattr(x, TYPES, None) or {})


def is_jax_spec(spec: Any) -> bool:
    """A jax PartitionSpec or NamedSharding (told by its module: jax is not imported here)."""
    module = getattr(type(spec), "__module__", "") or ""
    return module.startswith(("jax.", "jaxlib.")) or module in ("jax", "jaxlib")


def spec_types(spec: Any, x: Any, what: str) -> tuple[dict[str, LocalType], dict[tuple[str, ...], int]]:
    """The per-axis types (and split dims' global sizes) that ``spec`` states for ``x``: a dict,
    a type string or a jax ``PartitionSpec``/``NamedSharding`` (no global sizes: x's shape is local)."""
    ndim = x.ndim if isinstance(x, torch.Tensor) else 0
    if isinstance(spec, str):
        from spec_lang.parser import invariant_axes, parse

        return types_of(parse(spec), invariant_axes(spec))
    if isinstance(spec, dict):
        types = {}
        for a, t in spec.items():
            if not isinstance(a, str):
                raise SpecError(f"{what} keys are mesh-axis names, got {a!r}", hint="e.g. {'tp': spmd.V}")
            types[a] = resolve(t, ndim, f"type of axis {a!r}")
        return types, {}
    if is_jax_spec(spec):
        from spec_lang import from_jax

        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else ()
        return types_of(from_jax(spec, shape=shape))[0], {}
    raise SpecError(f"{what} takes a dict {{axis: type}}, a type string or a jax PartitionSpec, got "
                    f"{type(spec).__name__}", hint="e.g. {'tp': spmd.V}, 'f32[4,6]{V:tp}' or PartitionSpec('tp', None)")


def assert_type(x: Any, types: Any) -> Any:
    """Attach the local SPMD types ``{axis: type}`` (or a DSL string such as
    ``"f32[4,6]{V:tp}"``, or a jax ``PartitionSpec``) to ``x`` and return ``x``.

    A type string states the axes it splits (S(dim)) or annotates, ``{I:..}`` included;
    the axes it leaves out are left alone. ``S(-1)`` counts from x's last dim. When ``x``
    already carries a type on an axis, the new one must agree (else SpecError): S(i) and V
    agree (S(i) only adds how the blocks reassemble), S(i) and S(j) do not, nor P(op) and
    another reduction. A Python number (a scale that differs per rank, say) comes back
    as a typed number (``TypedFloat``/``TypedInt``), which a torch op types as an operand.
    """
    number = isinstance(x, (int, float)) and not isinstance(x, bool)
    if number and not isinstance(types, dict):
        raise SpecError("assert_type of a Python number takes a dict {axis: type}",
                        hint="e.g. spmd.assert_type(0.5, {'dp': spmd.V})")
    if not number and not isinstance(x, torch.Tensor):
        raise SpecError(f"assert_type needs a tensor or a Python number, got {type(x).__name__}")
    new, sizes = spec_types(types, x, "assert_type")
    if number and any(t.kind == "S" for t in new.values()):
        raise SpecError(f"assert_type: a Python number has no dims to split ({new})",
                        hint="write V for a number that differs per rank")
    old = typeof(x)
    for a, t in new.items():
        if a in old and not old[a].agrees(t):
            raise SpecError(f"assert_type: axis {a!r} of the {'number' if number else 'tensor'} is {old[a]!r}, "
                            f"not {t!r}", hint=None if number else f"convert it first, e.g. spmd.convert(x, {a!r}, "
                            f"src={old[a]!r}, dst={t!r})")
    if number:
        return typed_number(x, {**old, **new})
    merged = {**old, **{a: t for a, t in new.items() if not (t.kind == "V" and old.get(a, t).kind == "S")}}
    attach(x, merged, {**(getattr(x, SIZES, None) or {}), **sizes})
    if x.requires_grad and x.is_leaf and not torch.compiler.is_compiling():
        types_gradients(x)
    return x


_GRAD_HOOKED = "_spmd_grad_typed"  # a leaf whose gradient is typed as backward accumulates it


def type_grad(x: Any, g: Any) -> None:
    """``g``, the gradient of ``x``, typed by the gradient table (an untyped ``x``: left alone)."""
    types = getattr(x, TYPES, None) if isinstance(x, torch.Tensor) else None
    if types and isinstance(g, torch.Tensor):
        setattr(g, TYPES, {a: t.grad for a, t in types.items()})


def types_gradients(x: torch.Tensor) -> None:
    """Type ``x.grad`` (a typed leaf's) whenever backward accumulates it, and now if it exists,
    so ``typeof(w.grad)`` is right however and whenever it is read."""
    if not getattr(x, _GRAD_HOOKED, False):
        x.register_post_accumulate_grad_hook(lambda w: type_grad(w, w.grad))
        setattr(x, _GRAD_HOOKED, True)
    type_grad(x, x.grad)
