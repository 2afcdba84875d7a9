"""JAX interop: PartitionSpec / NamedSharding / jax.Array <-> TensorType.

The DSL *is* JAX's printed type (``float32[8@dp,16]{U:tp}``), so the mapping is direct:

* a PartitionSpec entry (an axis or a tuple of axes) is a dim's sharding, major->minor;
* ``unreduced={...}`` is ``U`` (P(sum)) and ``reduced={...}`` is ``R``;
* a mesh axis the spec does not mention is Invariant (I), as JAX treats it.

Some types have no JAX form, and ``to_jax`` refuses them rather than guess: uneven dims
(shardc uses the torch.chunk rule axis by axis, XLA pads the flattened tiling, and they
differ for uneven multi-axis dims; JAX's public API refuses uneven shardings anyway),
uneven splits (explicit sizes, ragged units, partitions: a JAX sharding cuts evenly),
``P(avg|max|min)`` (DTensor-only reductions) and ``V`` (shard_map's per-rank view).

jax is imported only inside these functions, so ``spec_lang`` imports without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spec_lang.errors import SpecError, locate, value_text
from spec_lang.ir import DTYPE_HINT, AxisType, Dim, Mesh, TensorType, canonical_dtype
from spec_lang.parser import parse, parse_mesh

if TYPE_CHECKING:  # jax is imported only inside the functions
    from jax.sharding import NamedSharding


def _dtype(dtype: Any) -> str:
    """float32 / 'f32' / np.float32 / jnp.bfloat16 / np.dtype -> canonical long name."""
    if dtype is None:
        return "float32"
    if isinstance(dtype, str):
        name = canonical_dtype(dtype.removeprefix("torch."))
    else:
        try:
            name = canonical_dtype(str(dtype).removeprefix("torch."))
        except Exception:  # a str() that raises: no dtype
            name = None
        if name is None:
            try:
                import numpy as np

                name = canonical_dtype(np.dtype(dtype).name)
            except Exception:  # numpy's refusal of a non-dtype: a TypeError, or a ValueError for a tensor
                name = None
    if name is None:
        raise SpecError(f"unknown dtype {value_text(dtype)}", hint=DTYPE_HINT)
    return name


def _mesh_from_jax(mesh: Any) -> Mesh:
    """A jax Mesh (or AbstractMesh) -> shardc Mesh, axis order kept; a concrete Mesh's
    devices name its ranks (each device's id, row-major over the mesh)."""
    names = tuple(str(n) for n in mesh.axis_names)
    shape = mesh.shape  # OrderedDict name -> size on both Mesh and AbstractMesh
    from jax.sharding import AbstractMesh

    ranks = None
    if not isinstance(mesh, AbstractMesh):  # a traced value's AbstractMesh raises on .devices
        devices = getattr(mesh, "devices", None)
        ranks = None if devices is None else tuple(int(d.id) for d in devices.flat)
    return Mesh(names, tuple(int(shape[n]) for n in names), ranks)


def mesh_from_jax(mesh: Any) -> Mesh:
    """The shardc Mesh of a jax Mesh: its axes, and its devices' ids as the global ranks."""
    if isinstance(mesh, (Mesh, str)) or not (hasattr(mesh, "axis_names") and hasattr(mesh, "shape")):
        raise SpecError(f"expected a jax Mesh, got {type(mesh).__name__}",
                        hint="pass a jax.sharding.Mesh; parse a mesh string with spec_lang.parse_mesh")
    return _mesh_from_jax(mesh)


def _as_mesh(mesh: Any) -> Mesh | None:
    if mesh is None:
        return None
    if isinstance(mesh, (Mesh, str)):
        return parse_mesh(mesh)
    if hasattr(mesh, "axis_names") and hasattr(mesh, "shape"):
        return _mesh_from_jax(mesh)
    raise SpecError(f"expected a mesh, got {type(mesh).__name__}", hint="give a mesh like dp=2,tp=4 or a jax Mesh")


def _spec_entry_axes(entry: Any, dim: int) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, (tuple, list)) and all(isinstance(a, str) for a in entry):
        return tuple(entry)
    raise SpecError(
        f"PartitionSpec entry {entry!r} for dim {dim} is not None, an axis name or a tuple of names",
        hint="P.UNCONSTRAINED and other markers have no shardc type; give the sharding explicitly",
    )


def from_jax(
    spec_or_sharding: Any,
    shape: Sequence[int] | None = None,
    dtype: Any = None,
    mesh: Mesh | str | Any = None,
) -> TensorType:
    """PartitionSpec (with unreduced/reduced), NamedSharding or jax.Array -> TensorType.

    An array (anything with ``.sharding``, ``.shape``, ``.dtype``) supplies all three
    itself. A spec or sharding needs ``shape``; ``dtype`` defaults to float32. Annotation
    groups list their axes in mesh order (the NamedSharding's mesh, else ``mesh``, else
    sorted, since a PartitionSpec's unreduced/reduced are unordered sets).
    """
    obj = spec_or_sharding
    if hasattr(obj, "sharding") and hasattr(obj, "shape") and hasattr(obj, "dtype"):
        shape = tuple(obj.shape) if shape is None else shape
        dtype = obj.dtype if dtype is None else dtype
        obj = obj.sharding
    m = _as_mesh(mesh)
    if hasattr(obj, "spec") and hasattr(obj, "mesh"):  # NamedSharding
        if m is None:
            m = _mesh_from_jax(obj.mesh)
        obj = obj.spec
    if type(obj).__module__.split(".")[0] not in ("jax", "jaxlib"):
        raise SpecError(
            f"from_jax expects a PartitionSpec, NamedSharding or jax.Array, got {type(obj).__name__}",
            hint="to read a type string use spec_lang.parse",
        )
    from jax.sharding import PartitionSpec

    if not isinstance(obj, PartitionSpec):
        raise SpecError(
            f"from_jax expects a PartitionSpec, NamedSharding or jax.Array, got {type(obj).__name__}",
            hint="a positional sharding or GSPMDSharding has no axis names; use a NamedSharding",
        )
    if shape is None:
        raise SpecError(
            f"from_jax needs the global shape to type {obj!r}",
            hint="pass shape=(8, 16), or pass the jax.Array itself",
        )
    try:
        shape = tuple(shape)  # each size is checked by Dim
    except (TypeError, RuntimeError):  # not iterable, or its iteration raises (a DTensor)
        raise SpecError(f"shape must be a sequence of ints, got {value_text(shape)}") from None
    parts = tuple(getattr(obj, "partitions", None) or ())
    if len(parts) > len(shape):
        raise SpecError(
            f"PartitionSpec {obj!r} has {len(parts)} entries for a {len(shape)}-d shape {list(shape)}",
            hint="a PartitionSpec has at most one entry per dim",
        )
    entries = list(parts) + [None] * (len(shape) - len(parts))
    text = repr(obj)  # errors quote what the user passed, as JAX prints it

    def order(axes: Any) -> list[str]:
        axes = [str(a) for a in axes]
        if m is not None and all(a in m for a in axes):
            return sorted(axes, key=m.index)
        return sorted(axes)

    try:
        dims = tuple(Dim(size, _spec_entry_axes(e, i)) for i, (size, e) in enumerate(zip(shape, entries, strict=True)))
        axis_types = tuple((a, AxisType("P", "sum")) for a in order(obj.unreduced))
        axis_types += tuple((a, AxisType("R")) for a in order(getattr(obj, "reduced", ())))
        t = TensorType(_dtype(dtype), dims, axis_types)
    except SpecError as e:
        if e.text is not None:
            raise
        pos = None
        if e.subject is not None:
            pos = locate(text, e.subject)
            if pos is not None:  # a repeated name: point at its second use
                pos = locate(text, e.subject, pos + 1) or pos
        raise SpecError(
            f"PartitionSpec {text} with shape {value_text(list(shape))}: {e.message}", text=text, pos=pos,
            hint=e.hint,
        ) from None
    if m is not None:
        _check_axes(t, m, text)
    return t


def _check_axes(t: TensorType, m: Mesh, text: str) -> None:
    """Every axis the type names is on the mesh (a caret at the first one that is not)."""
    for a in list(t.sharded_axes) + [a for a, _ in t.axis_types]:
        if a not in m:
            raise SpecError(
                f"mesh axis {a!r} is not on the mesh {m}", text=text, pos=locate(text, a, max(text.find("["), 0)),
                hint=f"use one of the mesh axes {', '.join(m.names)}",
            )


def _refuse_unrepresentable(t: TensorType, m: Mesh | None) -> None:
    """Raise a SpecError saying why ``t`` has no JAX form (the even-ness check needs ``m``)."""
    text = str(t)
    _refuse_uneven(t)
    for name, at in t.axis_types:
        if at.kind == "V":
            raise SpecError(
                f"mesh axis {name!r} is Varying (V): a NamedSharding describes a global array",
                text=text, pos=text.find("{"),
                hint="V is shard_map's per-rank view; give the global sharding (8@axis) instead",
            )
        if at.kind == "P" and at.op != "sum":
            raise SpecError(
                f"P({at.op}) on {name!r} has no JAX equivalent (JAX's unreduced is a pending sum)",
                text=text, pos=text.find("{"),
                hint="reduce it first, or use U (P(sum)); P(avg|max|min) exist only in DTensor",
            )
    if m is None:
        return
    for i, d in enumerate(t.dims):
        n = m.group_size(d.axes)
        if d.size % n:
            why = "JAX's public API refuses uneven shardings"
            if len(d.axes) > 1:
                why += (
                    ", and for several axes shardc's torch.chunk rule (axis by axis, major->minor) "
                    "differs from XLA's padded tiling of the flattened axes"
                )
            raise SpecError(
                f"dim {i} of size {d.size} does not divide evenly over {_axes_text(d.axes)} ({n} shards): {why}",
                text=text, pos=_dim_pos(t, i),
                hint=f"pad dim {i} to a multiple of {n}, or use DTensor (lowering.to_placements)",
            )


def _refuse_uneven(t: TensorType) -> None:
    for i, d in enumerate(t.dims):
        if d.split is not None:
            text = str(t)
            raise SpecError(
                f"dim {i} has the uneven split {d.split}: a JAX sharding cuts every dim evenly",
                text=text, pos=_dim_pos(t, i),
                hint="use DTensor placements (lowering.to_placements) for explicit sizes, ragged units or partitions",
            )


def _axes_text(axes: tuple[str, ...]) -> str:
    return axes[0] if len(axes) == 1 else "(" + ",".join(axes) + ")"


def _dim_pos(t: TensorType, i: int) -> int:
    """Offset of dim ``i`` in ``str(t)`` (the canonical print), for the caret."""
    pos = len(t.dtype) + 1
    for d in t.dims[:i]:
        pos += len(str(d.size)) + (len(_axes_text(d.axes)) + 1 if d.axes else 0) + 1
        pos += len(str(d.split)) if d.split is not None else 0
    return pos


def to_jax(t: TensorType | str, mesh: Mesh | str | Any) -> NamedSharding:
    """TensorType -> NamedSharding on an Explicit-axes jax Mesh over ``jax.devices()[:N]``.

    Device r is rank r (row-major over the mesh axes), matching ``lowering.local_slices``.
    A jax Mesh may be passed instead and is used as is.
    """
    tt = parse(t)
    m = _as_mesh(mesh)
    if m is None:
        raise SpecError(f"to_jax needs a mesh to place {tt} on", hint="pass a mesh like 'dp=2,tp=4' or a jax Mesh")
    jax_mesh = None if isinstance(mesh, (Mesh, str)) else mesh  # a Mesh or a traced value's AbstractMesh
    _check_axes(tt, m, t if isinstance(t, str) else str(tt))
    _refuse_unrepresentable(tt, m)

    import jax
    import numpy as np
    from jax.sharding import AxisType as JaxAxisType
    from jax.sharding import NamedSharding, PartitionSpec

    if jax_mesh is None:
        devices = jax.devices()
        if m.ranks is not None:  # a mesh over named ranks: the devices of those ids
            by_id = {int(d.id): d for d in devices}
            missing = [r for r in m.ranks if r not in by_id]
            if missing:
                raise SpecError(f"the mesh {m} names rank {missing[0]}, but jax has no device of that id",
                                hint="name ranks among jax.devices()' ids")
            devices = [by_id[r] for r in m.ranks]
        if len(devices) < m.size:
            raise SpecError(
                f"the mesh {m} needs {m.size} devices, but jax sees {len(devices)}",
                hint=f"on CPU set XLA_FLAGS=--xla_force_host_platform_device_count={m.size} before importing jax",
            )
        jax_mesh = jax.sharding.Mesh(
            np.array(devices[: m.size]).reshape(m.sizes), m.names,
            axis_types=(JaxAxisType.Explicit,) * m.ndim,
        )
    entries = [None if not d.axes else d.axes[0] if len(d.axes) == 1 else tuple(d.axes) for d in tt.dims]
    unreduced = frozenset(a for a, at in tt.axis_types if at.kind == "P")
    reduced = frozenset(a for a, at in tt.axis_types if at.kind == "R")
    try:
        spec = PartitionSpec(*entries, unreduced=unreduced, reduced=reduced)
        return NamedSharding(jax_mesh, spec)
    except (ValueError, TypeError) as e:
        raise SpecError(f"JAX refused {tt}: {e}") from None


def partition_spec_text(t: TensorType) -> str:
    """The PartitionSpec as JAX prints it (``P(('tp', 'dp'), None, unreduced={'cp'})``), jax-free."""
    _refuse_uneven(t)
    parts = []
    for d in t.dims:
        if not d.axes:
            parts.append("None")
        elif len(d.axes) == 1:
            parts.append(repr(d.axes[0]))
        else:
            parts.append("(" + ", ".join(repr(a) for a in d.axes) + ")")
    for word, kind in (("unreduced", "P"), ("reduced", "R")):
        axes = [a for a, at in t.axis_types if at.kind == kind]
        if axes:
            parts.append(f"{word}={{" + ", ".join(repr(a) for a in axes) + "}")
    return "P(" + ", ".join(parts) + ")"


def jax_refusal(t: TensorType, mesh: Mesh | None = None) -> str | None:
    """Why ``to_jax`` would refuse ``t`` (None if representable); jax-free.

    Without a mesh only the mesh-independent reasons (V, P(avg|max|min)) are checked.
    """
    try:
        if mesh is not None:
            _check_axes(t, mesh, str(t))
        _refuse_unrepresentable(t, mesh)
    except SpecError as e:
        return e.message
    return None
