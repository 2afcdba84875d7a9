"""The one canonical printer: JAX's format (``float32[8@(dp,tp),16]{U:tp}``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spec_lang.ir import Dim, TensorType

# Annotation groups print in this order, as JAX prints unreduced before reduced.
_KIND_ORDER = ("U", "P(avg)", "P(max)", "P(min)", "R", "I", "V")


def _axes(axes: tuple[str, ...]) -> str:
    return axes[0] if len(axes) == 1 else "(" + ",".join(axes) + ")"


def _dim(d: Dim) -> str:
    if not d.axes:
        return str(d.size)
    if d.split is None:
        return f"{d.size}@{_axes(d.axes)}"
    if len(d.axes) == 1:
        return f"{d.size}@{d.axes[0]}{d.split}"
    names = [a + (str(d.split) if i == d.split_at else "") for i, a in enumerate(d.axes)]
    return f"{d.size}@(" + ",".join(names) + ")"


def format_type(t: TensorType, short_dtype: bool = False) -> str:
    from spec_lang.ir import DTYPES, TensorType

    if type(t) is not TensorType:  # a string is parsed: its canonical form comes back
        from spec_lang.parser import parse

        t = parse(t)
    dtype = DTYPES[t.dtype][0] if short_dtype else t.dtype
    dims = ",".join(_dim(d) for d in t.dims)
    groups: dict[str, list[str]] = {}
    for name, at in t.axis_types:
        groups.setdefault(at.code, []).append(name)
    ann = ", ".join(f"{code}:{_axes(tuple(groups[code]))}" for code in _KIND_ORDER if code in groups)
    return f"{dtype}[{dims}]" + (f"{{{ann}}}" if ann else "")
