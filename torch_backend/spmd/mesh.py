"""``use_mesh``: the mesh that axis names refer to, for a scope."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NoReturn

import torch

from spec_lang.errors import SpecError, value_text
from spec_lang.ir import Mesh
from spec_lang.parser import parse_mesh
from torch_backend.groups import MeshContext, context, is_device_mesh

_MESH: ContextVar[Any] = ContextVar("spmd_mesh", default=None)
# the meshes of the ``use_mesh`` scopes entered inside torch.compile's trace: dynamo cannot
# trace a ContextVar, but it traces a list's appends and pops (and undoes nothing: a scope
# pops what it pushed); the traced spmd calls pass the innermost to their region
_TRACED: list[Any] = []


@contextmanager
def use_mesh(mesh: Any) -> Iterator[Any]:
    """Make ``mesh`` (a DeviceMesh, spec_lang Mesh or a string like ``"dp=2,tp=4"``) the mesh
    of every spmd call in the scope that does not pass ``mesh=``."""
    if mesh is None:
        _refuse("use_mesh needs a mesh", "pass a DeviceMesh or a string like 'dp=2,tp=4'")
    if isinstance(mesh, str):
        parse_mesh(mesh)  # a malformed string fails here, with its caret, not at the first collective
    elif not isinstance(mesh, Mesh) and not is_device_mesh(mesh):
        _refuse(f"use_mesh takes a mesh, got {type(mesh).__name__}",
                "pass a DeviceMesh with mesh_dim_names, a spec_lang Mesh or a string like 'dp=2,tp=4'")
    if torch.compiler.is_compiling():
        _TRACED.append(mesh)
        try:
            yield mesh
        finally:
            _TRACED.pop()
        return
    token = _MESH.set(mesh)
    try:
        yield mesh
    finally:
        _MESH.reset(token)


def traced_mesh(mesh: Any = None) -> Any:
    """Inside torch.compile's trace: ``mesh``, else the innermost ``use_mesh``'s entered in the
    trace, else None (the region reads a scope entered outside it, at trace time)."""
    return mesh if mesh is not None else _TRACED[-1] if _TRACED else None


def _refuse(message: str, hint: str) -> NoReturn:
    """A SpecError (in a trace, raised outside it: dynamo cannot build one)."""
    if torch.compiler.is_compiling():
        from torch_backend import traced

        traced.refuse(message, hint)
    raise SpecError(message, hint=hint)


def current_mesh(mesh: Any = None) -> Any:
    m = mesh if mesh is not None else _MESH.get()
    if m is None:
        raise SpecError("no mesh: axis names need one", hint="wrap the code in `with spmd.use_mesh(mesh):` "
                        "or pass mesh='dp=2,tp=4' (or a DeviceMesh)")
    return m


def mesh_context(mesh: Any = None) -> MeshContext:
    """The MeshContext of ``mesh`` or of the enclosing ``use_mesh``."""
    return context(current_mesh(mesh))


def as_axes(axis: Any, mesh_names: tuple[str, ...]) -> tuple[str, ...]:
    axes = (axis,) if isinstance(axis, str) else tuple(axis) if isinstance(axis, (tuple, list)) else None
    if not axes or not all(isinstance(a, str) for a in axes):
        raise SpecError(f"axis must be a mesh-axis name or a tuple of names, got {value_text(axis)}",
                        hint=f"use one of {', '.join(mesh_names)}, or a tuple of them")
    for a in axes:
        if a not in mesh_names:
            raise SpecError(f"mesh axis {a!r} is not on the mesh ({', '.join(mesh_names)})",
                            hint=f"use one of {', '.join(mesh_names)}")
    if len(set(axes)) != len(axes):
        raise SpecError(f"axis {value_text(axes)} names a mesh axis twice", hint="name each mesh axis once")
    return axes
