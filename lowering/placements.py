"""DTensor placements <-> shardc types, with DTensor's placements/shard_order rules.

DTensor describes a layout mesh-centrically: one placement per mesh axis (``Shard(d)``,
``Replicate()``, ``Partial(op)``), plus an optional tensor-centric ``shard_order``
``{dim: [mesh dims major->minor]}`` when several mesh axes shard one dim in an order
that is not mesh order. Public ``distribute_tensor`` takes no ``shard_order``, so the
same order can also be written with ``_StridedShard(dim, split_factor)`` placements
(torch's ``DTensorSpec._convert_shard_order_to_StridedShard``).

Everything here except ``to_placements`` is torch-free: placements are normalized to
``PlacementSpec`` (a tiny frozen record), which torch objects, ``PlacementSpec`` values
and short strings (``S(0)``, ``_S(0,4)``, ``R``, ``P``, ``P(avg)``, also as a list
``[S(0), R, S(0)]``; the grammar's calls) all convert to. That keeps ``shardc parse`` and
the checks importable without torch.

The uneven placements (``DynamicShard``, ``RaggedShard``, ``PartitionedShard``; torch-free
themselves) stand among the others, one per mesh axis like ``Shard``, and become a dim's
``Split`` (``lowering.uneven_placements`` converts and checks them).

A shard_order is accepted in two forms: shardc's sparse dict ``{0: ['tp', 'dp']}``
(mesh dims by name or index, as a dict or its string) and torch's own
``DTensorSpec.shard_order``, a tuple of ``ShardOrderEntry(tensor_dim, mesh_dims)``
(mesh dim indices; torch lists every sharded dim, mesh-order ones included).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lowering import uneven_placements as uneven
from spec_lang.errors import SpecError, locate, number_text, value_text
from spec_lang.ir import AxisType, Dim, Mesh, TensorType, canonical_dtype
from spec_lang.lazy import needs_extra
from spec_lang.local_type import REDUCE_OPS
from spec_lang.parser import Call, Form, parse_mesh, parse_shard_order, read_calls
from spec_lang.split import INT64_LIMIT, size_row

_ORDER_HINT = "write shard_order as {tensor_dim: [mesh dims major->minor]}, e.g. {0: ['tp', 'dp']}"


@dataclass(frozen=True)
class PlacementSpec:
    """A torch-free placement: kind ``S`` (Shard), ``_S`` (_StridedShard), ``R``, ``P``, or
    ``uneven`` (``uneven`` holds the DynamicShard/RaggedShard/PartitionedShard, ``dim`` its dim)."""

    kind: str
    dim: int = -1
    split_factor: int = 1
    op: str = "sum"
    uneven: Any = None

    def __post_init__(self) -> None:
        for what in ("dim", "split_factor"):
            value = getattr(self, what)
            try:
                n = operator.index(value) if not isinstance(value, bool) else None
            except TypeError:
                n = None
            if n is None or not -INT64_LIMIT < n < INT64_LIMIT:
                shown = number_text(n) if n is not None else f"{type(value).__name__} {value_text(value)}"
                raise SpecError(f"a placement's {what} must be an int that fits in int64, got {shown}",
                                hint="Shard(d) and _StridedShard(d, split_factor) take small ints: a tensor dim, "
                                     "a product of mesh axis sizes")
            if type(value) is not int:
                object.__setattr__(self, what, n)

    def __str__(self) -> str:
        if self.kind == "uneven":
            return uneven.uneven_text(self.uneven)
        if self.kind == "S":
            return f"S({self.dim})"
        if self.kind == "_S":
            return f"_S({self.dim},{self.split_factor})"
        if self.kind == "P":
            return f"P({self.op})"
        return "R"

    @property
    def is_shard(self) -> bool:
        return self.kind in ("S", "_S", "uneven")


_FORMS = {
    "R": Form(),
    "P": Form(("reduce op",), 1),
    "S": Form(("tensor dim",), 1, bare=False),
    "_S": Form(("tensor dim", "split_factor"), 2, bare=False, aliases=(("sf", "split_factor"),)),
    **uneven.UNEVEN_FORMS,
}
_TEXT_HINT = ("write placements as S(d), _S(d,split_factor), R, P, P(op), DynamicShard(dim,[sizes]), "
              "RaggedShard([0,..,k-1],[units]) or PartitionedShard(dim,num_partitions,[[row] per shard],aligned=False)")


def _spec_of(call: Call, text: str) -> PlacementSpec:
    """A placement read by the grammar as a call, judged by its class (a caret on the call)."""
    args = call.args
    if call.name == "P":
        op = args.get("reduce op", "sum")
        if op not in REDUCE_OPS:
            raise SpecError(f"unknown Partial reduce op {value_text(op)}", text=text, pos=call.pos,
                            hint=f"use one of {', '.join(REDUCE_OPS)}")
        return PlacementSpec("P", op=op)
    try:
        if call.name in uneven.UNEVEN_CLASSES:
            return as_spec(uneven.UNEVEN_CLASSES[call.name](**args))
        return PlacementSpec(call.name, args.get("tensor dim", -1), args.get("split_factor", 1))  # S, _S, R
    except SpecError as e:
        raise e.at(text, call.pos) from None
    except TypeError:  # a value a constructor cannot take at all
        raise SpecError(f"cannot read the placement {call.name}", text=text, pos=call.pos, hint=_TEXT_HINT) from None


def parse_placements(text: str) -> list[PlacementSpec]:
    """``"S(0),_S(0,4),R,P(avg)"`` or ``"[S(0), R, P]"`` -> PlacementSpecs (the CLI and docs text form)."""
    if not isinstance(text, str):
        raise SpecError(f"placements text must be a str, got {type(text).__name__}", hint=_TEXT_HINT)
    return list(_placements(text))


@lru_cache(maxsize=1024)
def _placements(text: str, one: bool = False) -> tuple[PlacementSpec, ...]:
    return tuple(_spec_of(c, text) for c in read_calls(text, _FORMS, "placement", _TEXT_HINT, one=one))


def as_spec(p: Any) -> PlacementSpec:
    """A torch placement, PlacementSpec or string -> PlacementSpec, without importing torch."""
    if isinstance(p, PlacementSpec):
        return p
    if isinstance(p, str):
        return _placements(p, one=True)[0]
    if uneven.is_uneven_placement(p):
        return PlacementSpec("uneven", uneven.placement_dim(p), uneven=p)
    name = type(p).__name__
    if name == "_StridedShard":
        return PlacementSpec("_S", p.dim, p.split_factor)
    if name == "Shard":
        return PlacementSpec("S", p.dim)
    if name == "Replicate":
        return PlacementSpec("R")
    if name == "Partial":
        return PlacementSpec("P", op=str(getattr(p, "reduce_op", "sum")))
    raise SpecError(
        f"unsupported placement {p!r} ({name})",
        hint="shardc understands Shard, _StridedShard, Replicate, Partial and the uneven "
             "DynamicShard, RaggedShard and PartitionedShard (lowering)",
    )


def format_placements(placements: Sequence[Any]) -> str:
    """``S(0),_S(0,4),R,P(sum)`` for torch placements, PlacementSpecs or strings (torch-free)."""
    return ",".join(str(as_spec(p)) for p in placements)


def as_mesh(mesh: Mesh | str | Any) -> Mesh:
    """A shardc Mesh, a mesh string (``dp=2,tp=4``) or a named torch DeviceMesh -> Mesh."""
    if isinstance(mesh, (Mesh, str)):
        return parse_mesh(mesh)
    names = getattr(mesh, "mesh_dim_names", None)
    if names is not None and hasattr(mesh, "mesh"):
        return Mesh(tuple(names), tuple(int(s) for s in mesh.mesh.shape))
    if hasattr(mesh, "mesh"):
        raise SpecError("the DeviceMesh has no mesh_dim_names", hint="pass mesh_dim_names=... to init_device_mesh")
    raise SpecError(f"expected a mesh, got {type(mesh).__name__}", hint="give a mesh like dp=2,tp=4")


# ---- type -> placements ---------------------------------------------------------------


def placement_specs(
    tt: TensorType, m: Mesh, *, strided: bool = False
) -> tuple[list[PlacementSpec], dict[int, list[str]]]:
    """The torch-free core of ``to_placements`` (same results, as PlacementSpecs)."""
    from lowering.checks import check_type_once

    check_type_once(tt, m)  # a call's types are checked by then: not again
    out: list[PlacementSpec] = []
    for name in m.names:
        d = tt.dim_of(name)
        if d is not None:
            split = tt.dims[d].split
            if split is not None and len(tt.dims[d].axes) > 1:
                text = str(tt)
                raise SpecError(
                    f"dim {d} composes the uneven split {split} with other mesh axes "
                    f"({', '.join(tt.dims[d].axes)}): DTensor has no placement for that",
                    text=text, pos=text.find("<"),
                    hint="keep such types in shardc (redistribute takes them), or split the dim over one axis alone",
                )
            out.append(PlacementSpec("S", d) if split is None else as_spec(uneven.placement_of(d, split)))
            continue
        at = tt.axis_type(name)
        if at.kind == "V":
            raise SpecError(
                f"mesh axis {name!r} is Varying (V): DTensor has no placement for per-rank values",
                text=str(tt), pos=str(tt).find("{"),
                hint="V is shard_map's local view; give the global sharding (8@axis) instead",
            )
        out.append(PlacementSpec("P", op=at.op) if at.kind == "P" else PlacementSpec("R"))
    order = {
        d: list(dim.axes) for d, dim in enumerate(tt.dims)
        if len(dim.axes) > 1 and list(dim.axes) != sorted(dim.axes, key=m.index)
    }
    if not strided:
        return out, order
    for d, axes in order.items():
        mdims = [m.index(a) for a in axes]
        for idx, md in enumerate(mdims):
            # torch: product of the sizes of mesh dims earlier in the order but later in placements
            sf = math.prod(m.sizes[i] for i in mdims[:idx] if i > md)
            out[md] = PlacementSpec("S", d) if sf == 1 else PlacementSpec("_S", d, sf)
    return out, {}


def strided_refusal(tt: TensorType, m: Mesh) -> str | None:
    """Why torch's ``distribute_tensor`` cannot take ``t``'s ``_StridedShard`` form; None
    where it can (no ``_StridedShard`` at all, or every strided dim divides evenly).

    torch splits a ``_StridedShard`` dim with padding and asserts that every rank's piece
    has the same shape, so a dim that does not divide evenly over its axes fails there
    (an AssertionError on every rank; with ``src_data_rank=None`` it skips that check
    and hands some ranks other rows than the chunk rule does).
    """
    specs, _ = placement_specs(tt, m, strided=True)
    for d in sorted({s.dim for s in specs if s.kind == "_S"}):
        axes = tt.dims[d].axes
        shards = math.prod(m.axis_size(a) for a in axes)
        if tt.shape[d] % shards:
            return (f"dim {d} (size {tt.shape[d]}) does not divide evenly over ({','.join(axes)}) "
                    f"({shards} shards), and torch's _StridedShard needs even shards")
    return None


SHARD_ORDER_FORMATS = ("names", "torch")


def to_placements(
    t: TensorType | str, mesh: Mesh | str | Any, *, strided: bool = False, shard_order_format: str = "names"
) -> tuple[list[Any], Any]:
    """DTensor placements (one per mesh axis) and a shard_order for ``t``.

    ``shard_order_format="names"`` (default): a sparse dict mapping a tensor dim to mesh
    axis names (major->minor), listing only dims with 2+ axes in a non-mesh order.
    ``"torch"``: torch's ``DTensorSpec.shard_order``, a tuple of ``ShardOrderEntry(tensor_dim,
    mesh_dims)`` with mesh dim indices for every sharded dim, sorted by tensor dim.
    ``strided=True`` returns the ``_StridedShard`` form that public ``distribute_tensor``
    accepts instead, with an empty shard_order (``{}``; ``None`` in torch's format, which is
    what a ``DTensorSpec`` with ``_StridedShard`` placements requires). torch takes it
    only where each strided dim divides evenly over its axes (``strided_refusal`` says
    why not).
    R and I both become ``Replicate()`` (DTensor has no gradient-type distinction).
    A dim with an uneven split gives its placement object (``lowering.DynamicShard``,
    ``RaggedShard`` or ``PartitionedShard``), which torch has no class for.
    """
    if not isinstance(shard_order_format, str) or shard_order_format not in SHARD_ORDER_FORMATS:
        raise SpecError(f"unknown shard_order_format {value_text(shard_order_format)}",
                        hint="use 'names' (shardc's {dim: [axis names]}) or 'torch' (ShardOrderEntry tuples)")
    from lowering.checks import check_flag, resolve

    check_flag(strided, "strided", "strided=True for the _StridedShard form, False for Shard with a shard_order")

    tt, m = resolve(t, as_mesh(mesh))
    specs, order = placement_specs(tt, m, strided=strided)
    with needs_extra("lowering.to_placements"):
        placements = [_to_torch(s) for s in specs]
    if shard_order_format == "names":
        return placements, order
    if strided:
        return placements, None
    with needs_extra("lowering.to_placements"):
        from torch.distributed.tensor._dtensor_spec import ShardOrderEntry

    return placements, tuple(
        ShardOrderEntry(tensor_dim=d, mesh_dims=tuple(m.index(a) for a in dim.axes))
        for d, dim in enumerate(tt.dims) if dim.axes
    )


def _to_torch(s: PlacementSpec) -> Any:
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if s.kind == "uneven":
        return s.uneven
    if s.kind == "S":
        return Shard(s.dim)
    if s.kind == "_S":
        return _StridedShard(s.dim, split_factor=s.split_factor)
    if s.kind == "P":
        return Partial(s.op)
    return Replicate()


# ---- checks -------------------------------------------------------------------------


def _err(msg: str, placements: list[PlacementSpec], at: int | None, hint: str) -> SpecError:
    """A SpecError with a caret under placement ``at`` of the placements text."""
    text = format_placements(placements)
    pos = None
    if at is not None:
        pos = sum(len(str(p)) + 1 for p in placements[:at])
    return SpecError(msg, text=text, pos=pos, hint=hint)


def _order_err(msg: str, src: str | None, needle: str | None, hint: str, start: int = 0) -> SpecError:
    """A SpecError with a caret at ``needle`` (searched from ``start``) in the shard_order text."""
    pos = locate(src, needle, start) if src is not None and needle is not None else None
    return SpecError(msg, text=src, pos=pos, hint=hint)


def _key_pos(src: str | None, key: int) -> int:
    """Offset of tensor dim ``key``'s entry in the shard_order text (0 if not found)."""
    if src is None:
        return 0
    m = re.search(rf"(?<![0-9]){re.escape(value_text(key))}\s*:", src)
    return m.start() if m else 0


def _entries_as_dict(shard_order: Sequence[Any]) -> dict[Any, Any]:
    """torch's shard_order, ``(ShardOrderEntry(tensor_dim, mesh_dims), ...)`` -> ``{tensor_dim: mesh_dims}``.

    Entries may be ShardOrderEntry or plain ``(tensor_dim, mesh_dims)`` pairs.
    """
    out: dict[Any, Any] = {}
    for entry in shard_order:
        if hasattr(entry, "tensor_dim") and hasattr(entry, "mesh_dims"):
            key, refs = entry.tensor_dim, entry.mesh_dims
        elif isinstance(entry, Sequence) and not isinstance(entry, (str, bytes)) and len(entry) == 2:
            key, refs = entry
        else:
            raise SpecError(f"shard_order entry {entry!r} is not a ShardOrderEntry(tensor_dim, mesh_dims)",
                            hint=_ORDER_HINT + ", or torch's (ShardOrderEntry(tensor_dim=0, mesh_dims=(2, 0)),)")
        if key in out:
            raise SpecError(f"tensor dim {value_text(key)} appears twice in shard_order "
                            f"{value_text(tuple(shard_order))}",
                            hint="give one ShardOrderEntry per tensor dim")
        out[key] = refs
    return out


def check_placements(
    placements: Sequence[Any] | str,
    shard_order: Mapping[int, Sequence[int | str]] | Sequence[Any] | str | None,
    mesh: Mesh | str | Any,
    ndim: int,
    shape: Sequence[int] | None = None,
) -> tuple[list[PlacementSpec], dict[int, tuple[int, ...]]]:
    """Apply DTensor's placements/shard_order rules; each broken rule has its own SpecError.

    ``shard_order`` is shardc's ``{tensor_dim: [mesh dims]}`` (a dict or its string) or
    torch's tuple of ``ShardOrderEntry``. Returns the normalized placements (negative Shard
    dims resolved) and the shard_order as ``{tensor_dim: mesh dim indices}``, so callers
    need not re-validate. ``shape`` (``from_placements`` passes it) lets the uneven
    placements' sizes be checked against the dims and mesh axis sizes.
    """
    m = as_mesh(mesh)
    if isinstance(ndim, bool) or not isinstance(ndim, int) or not 0 <= ndim < INT64_LIMIT:
        raise SpecError(f"ndim must be the tensor's number of dims (an int >= 0, below 2**63), got {value_text(ndim)}",
                        hint="pass len(shape), e.g. ndim=2 for a matrix")
    if isinstance(placements, str):
        placements = parse_placements(placements)
    elif isinstance(placements, (bytes, bytearray, Mapping)) or not isinstance(placements, Sequence):
        raise SpecError(f"placements must be a list with one placement per mesh dim, or their text, "
                        f"got {type(placements).__name__}",
                        hint="e.g. [Shard(0), Replicate()], or 'S(0),R'")
    specs = [as_spec(p) for p in placements]
    if len(specs) != m.ndim:
        raise _err(
            f"{len(specs)} placements for a {m.ndim}-d mesh {m}", specs, None,
            f"give exactly one placement per mesh dim ({', '.join(m.names)})",
        )
    for i, s in enumerate(specs):
        if s.is_shard:
            if not -ndim <= s.dim < ndim:
                raise _err(
                    f"placement {s} on mesh dim {m.names[i]!r} shards tensor dim {s.dim}, "
                    f"out of range for a {ndim}-d tensor", specs, i,
                    f"tensor dims are 0..{ndim - 1}",
                )
            if s.dim < 0:
                specs[i] = s = PlacementSpec(s.kind, s.dim + ndim, s.split_factor)
            if s.kind == "_S" and s.split_factor < 1:
                raise _err(f"split_factor {s.split_factor} < 1", specs, i, "split_factor is at least 1")
        elif s.kind == "P" and s.op not in REDUCE_OPS:
            raise _err(f"unknown Partial reduce op {s.op!r}", specs, i, f"use one of {', '.join(REDUCE_OPS)}")
    if any(s.kind == "uneven" for s in specs):
        uneven.check_uneven(specs, [s.dim if s.is_shard else None for s in specs], [s.uneven for s in specs],
                     m.sizes, m.names, shape, lambda msg, at, hint: _err(msg, specs, at, hint))
    src = shard_order if isinstance(shard_order, str) else None
    if isinstance(shard_order, str):
        shard_order = parse_shard_order(shard_order)
    if shard_order is None:
        return specs, {}
    if isinstance(shard_order, (tuple, list)):
        shard_order = _entries_as_dict(shard_order)
    if not isinstance(shard_order, Mapping):  # a numpy array, a set, ...: no truth value to trust
        raise SpecError(f"shard_order must be a dict, got {type(shard_order).__name__}", hint=_ORDER_HINT)
    if not shard_order:
        return specs, {}
    if src is None:
        src = "{" + ", ".join(f"{value_text(k)}: {_refs_text(v)}" for k, v in shard_order.items()) + "}"
    strided_at = next((i for i, s in enumerate(specs) if s.kind == "_S"), None)
    if strided_at is not None:
        raise _err(
            "_StridedShard placements cannot be combined with an explicit shard_order", specs, strided_at,
            "use either Shard placements + shard_order, or the _StridedShard form alone",
        )
    out: dict[int, tuple[int, ...]] = {}
    used: dict[int, int] = {}
    for key, refs in shard_order.items():
        if isinstance(key, bool) or not isinstance(key, int):
            raise _order_err(f"shard_order key {value_text(key)} is not a tensor dim (int)", src, _needle(key),
                             _ORDER_HINT)
        at = _key_pos(src, key)
        if not 0 <= key < ndim:
            raise _order_err(
                f"shard_order tensor dim {value_text(key)} is out of range for a {ndim}-d tensor", src, value_text(key),
                f"tensor dims are 0..{ndim - 1}", at,
            )
        if isinstance(refs, (str, bytes)) or not isinstance(refs, Sequence):
            raise _order_err(f"shard_order[{key}] must be a list of mesh dims", src, str(key), _ORDER_HINT, at)
        mdims: list[int] = []
        for ref in refs:
            md = _mesh_dim(ref, m, src, at)
            name = m.names[md]
            if md in mdims or md in used:
                first = locate(src, str(ref), at) if md in mdims else None
                raise _order_err(
                    f"mesh dim {name!r} is repeated in shard_order", src, str(ref),
                    "a mesh dim shards at most one tensor dim, once", at if first is None else first + 1,
                )
            p = specs[md]
            if p.kind in ("P", "R"):
                what = "Partial" if p.kind == "P" else "Replicate"
                raise _order_err(
                    f"shard_order puts mesh dim {name!r} on tensor dim {key}, but its placement is {what} "
                    f"({p}); placements are never inferred from shard_order", src, str(ref),
                    f"set placements[{md}] = Shard({key}), or drop {name!r} from shard_order", at,
                )
            if p.dim != key:
                raise _order_err(
                    f"shard_order puts mesh dim {name!r} on tensor dim {key}, but placements say {p} (inconsistent)",
                    src, str(ref), "placements and shard_order must describe the same distribution", at,
                )
            mdims.append(md)
            used[md] = key
        need = [m.names[i] for i, s in enumerate(specs) if s.is_shard and s.dim == key]
        missing = [n for n in need if m.index(n) not in mdims]
        if missing:
            raise _order_err(
                f"shard_order[{key}] must list every mesh dim that shards tensor dim {key}; missing {missing}",
                src, str(key), f"list all of {need} in the order they apply", at,
            )
        if not mdims:
            raise _order_err(
                f"shard_order[{key}] is empty", src, str(key),
                f"drop tensor dim {key} from shard_order (nothing shards it)", at,
            )
        out[key] = tuple(mdims)
    return specs, out


def _needle(value: Any) -> str:
    """What to look for in the shard_order text to put the caret on ``value``."""
    return value if isinstance(value, str) else value_text(value)


def _refs_text(refs: Any) -> str:
    """A shard_order entry's mesh dims as the error's text shows them (whatever was passed)."""
    if isinstance(refs, Sequence) and not isinstance(refs, (str, bytes)):
        return value_text(list(refs))
    return value_text(refs)


def _mesh_dim(ref: Any, m: Mesh, src: str | None, start: int) -> int:
    """A shard_order mesh reference (index or name) -> mesh dim index, or a SpecError."""
    if isinstance(ref, bool):
        ref = str(ref)
    if isinstance(ref, int):
        if not 0 <= ref < m.ndim:
            raise _order_err(
                f"mesh dim {value_text(ref)} is out of range for the {m.ndim}-d mesh {m}", src, value_text(ref),
                f"mesh dims are 0..{m.ndim - 1} or the names {', '.join(m.names)}", start,
            )
        return ref
    if isinstance(ref, str) and ref in m:
        return m.index(ref)
    raise _order_err(
        f"unknown mesh dim {value_text(ref)} in shard_order (mesh is {m})", src, _needle(ref),
        f"use a mesh dim index or one of {', '.join(m.names)}", start,
    )


# ---- placements -> type ---------------------------------------------------------------


def _strided_order(specs: list[PlacementSpec], m: Mesh) -> dict[int, list[int]]:
    """Inverse of the _StridedShard conversion (torch's _maybe_convert_StridedShard_to_shard_order)."""
    orders: dict[int, list[int]] = {}
    for md in reversed(range(len(specs))):
        s = specs[md]
        if not s.is_shard:
            continue
        cur = orders.setdefault(s.dim, [])
        sf = s.split_factor if s.kind == "_S" else 1
        acc = 1
        for i in range(len(cur) + 1):
            if acc == sf:
                cur.insert(i, md)
                break
            if i < len(cur):
                acc *= m.sizes[cur[i]]
        else:
            raise _err(
                f"placement {s} on mesh dim {m.names[md]!r}: split_factor {sf} matches no order of the "
                f"mesh dims sharding tensor dim {s.dim}", specs, md,
                "split_factor must be the product of the sizes of mesh dims applied before it",
            )
    return orders


def _dtype_name(dtype: Any) -> str:
    try:
        raw = str(dtype).removeprefix("torch.")
    except Exception:  # a str() that raises: no dtype
        raw = ""
    name = canonical_dtype(raw)
    if name is None:
        raise SpecError(f"unknown dtype {value_text(dtype)}", hint="use f32, bf16, f16, f64, i8, i16, i32, i64, u8, bool")
    return name


def from_placements(
    placements: Sequence[Any],
    mesh: Mesh | str | Any,
    shape: Sequence[int],
    dtype: Any = "f32",
    shard_order: Mapping[int, Sequence[int | str]] | Sequence[Any] | str | None = None,
) -> TensorType:
    """DTensor placements (+ shard_order or _StridedShard) -> TensorType, after ``check_placements``.

    ``shard_order`` takes either form ``check_placements`` does (shardc's dict or torch's
    ``ShardOrderEntry`` tuple).

    ``Replicate`` becomes an unannotated axis (I) and ``Partial(op)`` becomes ``P(op)``;
    an uneven placement becomes its dim's ``Split``.
    """
    m = as_mesh(mesh)
    shape = size_row(shape, "shape", "pass the global shape as a sequence of ints, e.g. (8, 16)")
    specs, order = check_placements(placements, shard_order, m, len(shape), shape)
    orders = _strided_order(specs, m) if any(s.kind == "_S" for s in specs) else {}
    if not orders:
        for md, s in enumerate(specs):
            if s.is_shard:
                orders.setdefault(s.dim, []).append(md)
        for d, mdims in order.items():
            orders[d] = list(mdims)
    ops = {s.op for s in specs if s.kind == "P"}
    if len(ops) > 1:
        raise _err(
            f"mixed Partial reduce ops {sorted(ops)}", specs, next(i for i, s in enumerate(specs) if s.kind == "P"),
            "the order of a mixed reduction changes its value; reduce one op first",
        )
    splits = dict(uneven.split_of(s.uneven) for s in specs if s.kind == "uneven")
    dims = tuple(Dim(size, tuple(m.names[i] for i in orders.get(d, ())), splits.get(d)) for d, size in enumerate(shape))
    axis_types = tuple((m.names[i], AxisType("P", s.op)) for i, s in enumerate(specs) if s.kind == "P")
    return TensorType(_dtype_name(dtype), dims, axis_types)
