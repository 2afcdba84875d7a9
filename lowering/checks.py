"""Checks of a type against a mesh, run before anything is planned or sent."""

from __future__ import annotations

import math
import numbers
import operator

from lowering.caching import on_clear
from lowering.layout.ranges import dim_ranges
from spec_lang.errors import SpecError, locate, value_text
from spec_lang.ir import Dim, Mesh, TensorType
from spec_lang.parser import parse, parse_mesh
from spec_lang.split import INT64_LIMIT


def resolve(t: TensorType | str, mesh: Mesh | str) -> tuple[TensorType, Mesh]:
    """Parse strings and check the type against the mesh: what the public entry points do
    first, so every function below them takes IR."""
    m = parse_mesh(mesh)
    tt = parse(t)
    check_type_once(tt, m, text=t if isinstance(t, str) else None)
    return tt, m


def check_rank(rank: object, mesh: Mesh) -> int:
    """``rank`` as an int where it is a rank of ``mesh``; otherwise a SpecError."""
    try:
        r = -1 if isinstance(rank, bool) else operator.index(rank)  # type: ignore[arg-type]  # any object: operator.index decides
    except TypeError:
        r = -1
    if not 0 <= r < mesh.size:
        raise SpecError(
            f"rank {value_text(rank)} is not on the mesh {mesh} (ranks 0..{mesh.size - 1})",
            hint="ranks are row-major over the mesh axes, from 0 to the mesh size - 1",
        )
    return r


def check_type(t: TensorType, mesh: Mesh, text: str | None = None) -> None:
    """Every axis the type names exists on the mesh; otherwise a SpecError at that axis
    (its caret in ``text``, the type as written, where given). ``lowering.check_type`` is
    the public door, which takes strings too."""
    for a in (*t.sharded_axes, *(a for a, _ in t.axis_types)):
        if a not in mesh:
            src = text if text is not None else str(t)  # formatted only for the error: calls are hot
            raise SpecError(
                f"mesh axis {a!r} is not on the mesh {mesh}",
                text=src, pos=locate(src, a, src.find("[")),
                hint=f"use one of the mesh axes {', '.join(mesh.names)}, or add {a!r} to the mesh",
            )
    for d in t.dims:
        if d.split is not None:
            _check_split(t, d, mesh, text)


# (type, mesh) pairs check_type accepted: the check is a pure function of the two, and a
# first call meets the same pair at its door, in the planner's door, in the layout
# algebra and in each step's pieces; only the first of them needs to run it
_CHECKED: set[tuple[TensorType, Mesh]] = set()
_CHECKED_MAX = 1 << 16
on_clear(_CHECKED.clear)


def check_type_once(t: TensorType, mesh: Mesh, text: str | None = None) -> None:
    """``check_type``, skipped for a pair it accepted before (a refused pair is checked
    again, so its error is the one ``text`` gives)."""
    if (t, mesh) in _CHECKED:
        return
    check_type(t, mesh, text)
    if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
    _CHECKED.add((t, mesh))


def _check_split(t: TensorType, d: Dim, mesh: Mesh, text: str | None) -> None:
    """An uneven split against the mesh (``Split.check_axis``, ``check_chunks``), with a caret."""
    sp, axis, major = d.split, d.axes[d.split_at], d.axes[:d.split_at]
    assert sp is not None
    try:
        sp.check_axis(axis, mesh.axis_size(axis))
        if major:
            lengths = sorted({int(hi - lo) for lo, hi in dim_ranges(d.size, major, mesh)})
            sp.check_chunks(axis, major, d.size, lengths, mesh.group_size(major))
    except SpecError as e:
        src = text if text is not None else str(t)
        raise e.at(src, src.find("<") if "<" in src else None) from None


def check_same_global(src: TensorType, dst: TensorType, src_text: str | None = None,
                      dst_text: str | None = None) -> None:
    """A redistribution keeps the global shape and dtype."""
    if src.dtype != dst.dtype:
        raise SpecError(
            f"dtypes differ: source is {src.dtype}, destination is {dst.dtype}",
            text=dst_text or str(dst), pos=0,
            hint="redistribute does not cast; give both types the same dtype",
        )
    if src.shape != dst.shape:
        raise SpecError(
            f"global shapes differ: source is {list(src.shape)}, destination is {list(dst.shape)}",
            text=dst_text or str(dst), pos=(dst_text or str(dst)).find("["),
            hint="redistribute changes the layout, not the shape; give both types the same sizes",
        )


def check_partial_conversion(src: TensorType, dst: TensorType) -> str:
    """The reduce op in play; SpecError where the SPMD type system defines no conversion."""
    sv, dv = set(src.axes_of_kind("V")), set(dst.axes_of_kind("V"))
    if sv != dv:
        raise SpecError(
            f"varying axes differ: source {sorted(sv)}, destination {sorted(dv)}",
            text=str(dst), pos=str(dst).find("{"),
            hint="a V axis has no global value to preserve; keep V axes the same on both sides "
            "(reinterpret them in local code instead)",
        )
    sop, dop = src.partial_op, dst.partial_op
    if sop and dop and sop != dop:
        raise SpecError(
            f"cannot turn a pending {sop} into a pending {dop}",
            text=str(dst), pos=str(dst).find("{"),
            hint=f"reduce the source first (redistribute to a type without P({sop})), then convert",
        )
    for a in dst.partial_axes:
        if a in src.partial_axes:
            continue
        if src.dim_of(a) is not None and dop != "sum":
            raise SpecError(
                f"no conversion from a dim sharded on {a!r} to P({dop}) on {a!r}",
                text=str(dst), pos=str(dst).find(a, str(dst).find("{")),
                hint="the SPMD type system defines convert(S, P) only for sum (zero padding); "
                "gather the dim first, then convert R to P(" + str(dop) + ")",
            )
    return sop or dop or "sum"


def check_flag(value: object, what: str, hint: str) -> bool | None:
    """``value`` where it is None, True or False; any other value (``"no"``, 0, a numpy
    bool) is a SpecError naming ``what``, since its truthiness would silently decide."""
    if value is not None and value is not True and value is not False:
        cls = type(value)
        name = cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__name__}"  # numpy.bool
        raise SpecError(f"{what} must be True, False or None, got {name} {value_text(value)}", hint=hint)
    return value


def check_seconds(value: object, what: str, hint: str) -> float:
    """``value`` as a float; SpecError naming ``what`` unless it is a positive finite number."""
    try:
        seconds = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an int past a float's range
        seconds = math.inf
    if not math.isfinite(seconds) or seconds <= 0:
        raise SpecError(f"{what} must be a positive finite number of seconds, got {value_text(value)}", hint=hint)
    return seconds


# A collective timeout longer than this is a typo (it is about 31 years); it also keeps the
# value inside what a timedelta and c10d's milliseconds can hold.
TIMEOUT_MAX_S = 1e9


def check_timeout_s(value: object, what: str, hint: str) -> float:
    """A collective timeout in seconds as a float; a SpecError naming ``what``, with the
    caller's ``hint``, unless it is positive, finite and at most ``TIMEOUT_MAX_S`` (one rule
    for the API's ``timeout=`` and the CLI's ``--timeout``)."""
    seconds = check_seconds(value, what, hint)
    if seconds > TIMEOUT_MAX_S:
        raise SpecError(f"{what} {seconds:g} s is longer than the longest allowed, {TIMEOUT_MAX_S:g} s", hint=hint)
    return seconds


def check_gap_bytes(gap_bytes: object, default: int) -> int:
    """``gap_bytes`` as an int; SpecError unless it is a whole number of bytes >= 0."""
    hint = f"give a whole number of bytes: the default {default}, or 0 for a plan proven cheapest outright"
    if isinstance(gap_bytes, bool) or not isinstance(gap_bytes, numbers.Integral):
        raise SpecError(f"gap_bytes must be an int (bytes), got {type(gap_bytes).__name__} {gap_bytes!r}", hint=hint)
    n = int(gap_bytes)
    if not 0 <= n < INT64_LIMIT:
        raise SpecError(f"gap_bytes must be >= 0 and below 2**63, got {value_text(gap_bytes)}", hint=hint)
    return n


def check_budget(budget_s: object, default: float) -> float:
    """``budget_s`` as a float; SpecError unless it is a positive finite number."""
    return check_seconds(budget_s, "budget_s",
                         f"use the default {default} s, or more for a plan proven optimal on a large mesh")
