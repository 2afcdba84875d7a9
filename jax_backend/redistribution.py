"""``redistribute`` and ``redistributor``: a jax.Array moved to a new layout by shardc's program.

Strings at the door: the destination (a type string in the mesh's axis names, a
PartitionSpec or a NamedSharding) and the source (read from the array's NamedSharding,
unreduced axes included, or ``src=``) become IR, then ``lowering.compile`` plans the
program and ``jax_backend.engine`` runs it as one ``shard_map``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import jax

import lowering
from jax_backend.default_model import default_cost_model
from jax_backend.engine import jitted, shard_mapped
from lowering.program import Program
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType, canonical_dtype
from spec_lang.jax_interop import from_jax, mesh_from_jax, to_jax
from spec_lang.parser import parse


def _plain_mesh(jax_mesh: Any) -> Mesh:
    """The mesh a program is planned on: the jax mesh's axes (its devices are shard_map's)."""
    m = mesh_from_jax(jax_mesh)
    return Mesh(m.names, m.sizes)


def _jax_mesh(x: Any, mesh: Any) -> Any:
    if mesh is not None:
        mesh_from_jax(mesh)  # a SpecError for anything else
        return mesh
    sharding = getattr(jax.typeof(x), "sharding", None) if isinstance(x, jax.core.Tracer) else getattr(x, "sharding", None)
    found = getattr(sharding, "mesh", None)
    if found is None or not found.axis_names:
        raise SpecError(f"the array's sharding {sharding} names no mesh",
                        hint="pass mesh=, or give the array a NamedSharding (jax.device_put(x, NamedSharding(...)))")
    return found


def as_type(t: Any, shape: tuple[int, ...], dtype: Any, jax_mesh: Any, what: str) -> TensorType:
    """A type string, PartitionSpec or NamedSharding -> TensorType on ``jax_mesh``."""
    m = _plain_mesh(jax_mesh)
    if isinstance(t, (str, TensorType)):
        tt = parse(t)
        lowering.check_type(tt, m)
    else:
        tt = from_jax(t, shape, dtype, mesh=jax_mesh)
    if tt.shape != tuple(shape):
        raise SpecError(f"the {what} type {tt} has shape {list(tt.shape)}, the array {list(shape)}",
                        hint="a redistribution keeps the global shape")
    return tt


def source_type(x: Any, jax_mesh: Any) -> TensorType:
    """The array's own type: its NamedSharding (unreduced axes included), or under jit
    ``jax.typeof(x)``, whose sharding JAX knows on Explicit mesh axes."""
    aval = jax.typeof(x)
    sharding = aval.sharding if isinstance(x, jax.core.Tracer) else getattr(x, "sharding", None)
    if sharding is None or not hasattr(sharding, "spec"):
        raise SpecError(f"cannot read the layout of {type(x).__name__} {aval}",
                        hint="pass src= (a type string), or give the array a NamedSharding")
    if isinstance(x, jax.core.Tracer):
        from jax.sharding import AxisType

        hidden = [n for n, k in zip(sharding.mesh.axis_names, sharding.mesh.axis_types) if k != AxisType.Explicit]
        if hidden:  # JAX types a traced value only on Explicit axes: it would read as replicated
            raise SpecError(f"under jit JAX does not know how the array is laid out over the mesh axes "
                            f"{hidden} ({sharding.mesh.axis_types[0]} axes)",
                            hint="pass src= (its type string), or use a mesh with Explicit axes")
    return from_jax(sharding, tuple(aval.shape), aval.dtype, mesh=jax_mesh)


@lru_cache(maxsize=4096)
def plan(src: TensorType, dst: TensorType, mesh: Mesh) -> Program:
    """The program the JAX engine runs for ``src -> dst`` (its cost model: ``jax_backend.default_model``)."""
    return lowering.compile(src, dst, mesh, cost_model=default_cost_model(mesh))


def redistribute(x: Any, dst: Any, mesh: Any = None, *, src: Any = None) -> jax.Array:
    """``x`` laid out as ``dst``, by shardc's program (one ``shard_map`` of ``lax`` collectives).

    ``dst``: a type string in the mesh's axis names, a PartitionSpec or a NamedSharding;
    ``mesh``: a ``jax.sharding.Mesh`` (default: ``x``'s); ``src``: ``x``'s type where its
    sharding does not say (under jit on Auto axes). Eager or inside ``jax.jit``; ``jax.grad``
    runs the dual program (on an Explicit mesh under ``jax.set_mesh(mesh)``).
    """
    if not isinstance(x, (jax.Array, jax.core.Tracer)):
        raise SpecError(f"redistribute takes a jax.Array, got {type(x).__name__}",
                        hint="jax.device_put the array onto a NamedSharding first")
    jax_mesh = _jax_mesh(x, mesh)
    aval = jax.typeof(x)
    shape = tuple(aval.shape)
    s = source_type(x, jax_mesh) if src is None else as_type(src, shape, aval.dtype, jax_mesh, "source")
    d = as_type(dst, shape, aval.dtype, jax_mesh, "destination")
    if s.dtype != d.dtype:
        raise SpecError(f"the array is {s.dtype}, the destination {d}", hint="a redistribution keeps the dtype")
    return _jitted(s, d, jax_mesh, isinstance(x, jax.core.Tracer))(x)  # under an outer jit (or grad) it is inlined


@lru_cache(maxsize=1024)
def _jitted(src: TensorType, dst: TensorType, jax_mesh: Any, nested: bool = False) -> Callable[[jax.Array], jax.Array]:
    """The jitted program; ``nested``: for a traced value (inside the caller's jit or grad),
    where JAX takes no compiler options."""
    for t in (src, dst):  # a type JAX cannot hold (uneven, V, P(avg)) is refused before planning
        to_jax(t, jax_mesh)
    program = plan(src, dst, _plain_mesh(jax_mesh))
    return jax.jit(shard_mapped(program, jax_mesh)) if nested else jitted(program, jax_mesh)


def redistributor(src: Any, dst: Any, mesh: Any) -> Prepared:
    """The prepared form: a jittable function of one array laid out as ``src`` (a type
    string, PartitionSpec or NamedSharding) that returns it laid out as ``dst``; planned
    once, here. Call it eagerly (jitted once) or inside your own ``jax.jit``."""
    mesh_from_jax(mesh)
    shape = _shape_of(src, dst)
    dtype = parse(src).dtype if isinstance(src, str) else parse(dst).dtype if isinstance(dst, str) else "float32"
    s = as_type(src, shape, dtype, mesh, "source")
    d = as_type(dst, shape, s.dtype, mesh, "destination")
    if d.dtype != s.dtype:
        raise SpecError(f"the source is {s.dtype}, the destination {d.dtype}", hint="a redistribution keeps the dtype")
    return Prepared(s, _jitted(s, d, mesh), _jitted(s, d, mesh, True))


def _shape_of(src: Any, dst: Any) -> tuple[int, ...]:
    for t in (src, dst):
        if isinstance(t, (str, TensorType)):
            return parse(t).shape
    raise SpecError("redistributor needs the global shape: give src or dst as a type string",
                    hint="e.g. redistributor('f32[8@dp,4]', PartitionSpec(None, 'dp'), mesh)")


class Prepared:
    """A prepared redistribution: called on an array laid out as ``src`` (eagerly or under an
    outer ``jax.jit``), it checks the array, then runs the jitted program. The jitted
    function's own methods (``lower``, ``trace``, ``eval_shape``) are reached through it."""

    def __init__(self, src: TensorType, run: Callable[[jax.Array], jax.Array],
                 nested: Callable[[jax.Array], jax.Array]) -> None:
        self.src, self.run, self.nested = src, run, nested

    def __call__(self, x: jax.Array) -> jax.Array:
        # checked here, where JAX would answer a wrong array with shard_map's own error
        if not isinstance(x, (jax.Array, jax.core.Tracer)):
            raise SpecError(f"the redistributor takes a jax.Array, got {type(x).__name__}",
                            hint=f"pass the array laid out as {self.src}")
        aval = jax.typeof(x)
        if tuple(aval.shape) != self.src.shape or canonical_dtype(str(aval.dtype)) != self.src.dtype:
            raise SpecError(f"the redistributor was prepared for {self.src}, got an array of shape "
                            f"{list(aval.shape)} and dtype {aval.dtype}", hint="prepare one redistributor per source type")
        return (self.nested if isinstance(x, jax.core.Tracer) else self.run)(x)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.run, name)
