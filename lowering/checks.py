"""Checks of a type against a mesh, run before anything is planned or sent."""

from __future__ import annotations

from spec_lang.errors import SpecError, locate
from spec_lang.ir import Mesh, TensorType
from spec_lang.parser import parse, parse_mesh


def resolve(t: TensorType | str, mesh: Mesh | str) -> tuple[TensorType, Mesh]:
    """Parse strings and check the type against the mesh (the common entry of lowering)."""
    m = parse_mesh(mesh)
    tt = parse(t)
    check_type(tt, m, text=t if isinstance(t, str) else None)
    return tt, m


def check_type(t: TensorType, mesh: Mesh, text: str | None = None) -> None:
    """Every axis the type names exists on the mesh; otherwise a SpecError at that axis."""
    for a in (*t.sharded_axes, *(a for a, _ in t.axis_types)):
        if a not in mesh:
            src = text if text is not None else str(t)  # formatted only for the error: calls are hot
            raise SpecError(
                f"mesh axis {a!r} is not on the mesh {mesh}",
                text=src, pos=locate(src, a, src.find("[")),
                hint=f"use one of the mesh axes {', '.join(mesh.names)}, or add {a!r} to the mesh",
            )


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
