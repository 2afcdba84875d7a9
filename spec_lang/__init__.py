"""shardc's front end: the type DSL, its IR, its printer, and JAX interop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spec_lang.errors import SpecError
from spec_lang.ir import DTYPES, AxisType, Dim, Mesh, TensorType
from spec_lang.lazy import needs_extra
from spec_lang.local_type import LocalType
from spec_lang.parser import parse, parse_local_type, parse_mesh, parse_shard_order

if TYPE_CHECKING:  # jax is optional: only a type checker imports it here
    from jax.sharding import NamedSharding


def format_type(t: TensorType | str, short_dtype: bool = False) -> str:
    """The canonical text of a type, JAX's format; a string is parsed first (its canonical form comes back)."""
    if short_dtype is not True and short_dtype is not False:  # its truthiness would decide silently
        raise SpecError(f"short_dtype must be True or False, got {type(short_dtype).__name__}",
                        hint="short_dtype=True prints f32, False float32")
    return parse(t).format(short_dtype)


def from_jax(spec_or_sharding: Any, shape: Sequence[int] | None = None, dtype: Any = None,
             mesh: Mesh | str | Any = None) -> TensorType:
    """PartitionSpec / NamedSharding (or a jax.Array) -> TensorType. jax is imported lazily."""
    from spec_lang.jax_interop import from_jax as _from_jax

    with needs_extra("spec_lang.from_jax"):
        return _from_jax(spec_or_sharding, shape=shape, dtype=dtype, mesh=mesh)


def mesh_from_jax(mesh: Any) -> Mesh:
    """A jax Mesh -> Mesh, its devices' ids as the global ranks. jax is imported lazily."""
    from spec_lang.jax_interop import mesh_from_jax as _mesh_from_jax

    with needs_extra("spec_lang.mesh_from_jax"):
        return _mesh_from_jax(mesh)


def to_jax(t: TensorType | str, mesh: Mesh | str | Any) -> NamedSharding:
    """TensorType (or its string) -> jax.sharding.NamedSharding on the first N devices."""
    from spec_lang.jax_interop import to_jax as _to_jax

    with needs_extra("spec_lang.to_jax"):
        return _to_jax(t, mesh)


__all__ = [
    "DTYPES", "AxisType", "Dim", "LocalType", "Mesh", "SpecError", "TensorType",
    "format_type", "from_jax", "mesh_from_jax", "parse", "parse_local_type", "parse_mesh", "parse_shard_order", "to_jax",
]
