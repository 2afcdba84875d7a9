"""The IR: small frozen dataclasses for a mesh and a sharded tensor type.

A ``TensorType`` is JAX's printed array type plus seed 004's per-axis local types:

* a mesh axis listed on a dim (``8@(dp,tp)``) *shards* that dim; locally it is Varying
  and the order of the list is major to minor;
* ``{U:tp}`` / ``{P(op):tp}``: Partial on ``tp`` (a pending reduction, ``U`` is sum);
* ``{R:tp}``: Replicate (JAX *reduced*): replicated values whose gradient is partial;
* ``{I:tp}`` or no mention at all: Invariant, replicated with a replicated gradient
  (what JAX assumes for an unannotated axis);
* ``{V:tp}``: Varying with no partition spec (inside ``shard_map``): the dims are
  the per-rank shape and the values differ per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from spec_lang.errors import SpecError

# canonical (JAX) name -> (short name, bytes per element)
DTYPES: dict[str, tuple[str, int]] = {
    "float32": ("f32", 4),
    "float64": ("f64", 8),
    "float16": ("f16", 2),
    "bfloat16": ("bf16", 2),
    "int8": ("i8", 1),
    "int16": ("i16", 2),
    "int32": ("i32", 4),
    "int64": ("i64", 8),
    "uint8": ("u8", 1),
    "bool": ("bool", 1),
}
_SHORT_TO_LONG = {short: long for long, (short, _) in DTYPES.items()}

REDUCE_OPS = ("sum", "avg", "max", "min")


def canonical_dtype(name: str) -> str | None:
    """``f32`` or ``float32`` -> ``float32``; None if unknown."""
    if name in DTYPES:
        return name
    return _SHORT_TO_LONG.get(name)


@dataclass(frozen=True)
class Mesh:
    """Named mesh axes in mesh order; rank = row-major coordinate over them."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.names) != len(self.sizes):
            raise SpecError("mesh names and sizes differ in length")
        if len(set(self.names)) != len(self.names):
            raise SpecError(f"mesh axis repeated in {self.names}", hint="give each mesh axis a unique name")
        for n, s in zip(self.names, self.sizes, strict=True):
            if s < 1:
                raise SpecError(f"mesh axis {n!r} has size {s}", hint="mesh axis sizes are at least 1")

    @cached_property
    def size(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    @property
    def ndim(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def index(self, name: str) -> int:
        return self.names.index(name)

    def axis_size(self, name: str) -> int:
        return self.sizes[self.names.index(name)]

    def group_size(self, axes: tuple[str, ...]) -> int:
        n = 1
        for a in axes:
            n *= self.axis_size(a)
        return n

    def coords(self, rank: int) -> tuple[int, ...]:
        """Row-major coordinates of ``rank`` (mesh order)."""
        out = []
        for s in reversed(self.sizes):
            out.append(rank % s)
            rank //= s
        return tuple(reversed(out))

    def rank_of(self, coords: tuple[int, ...]) -> int:
        r = 0
        for c, s in zip(coords, self.sizes, strict=True):
            r = r * s + c
        return r

    def __str__(self) -> str:
        return ",".join(f"{n}={s}" for n, s in zip(self.names, self.sizes, strict=True))


@dataclass(frozen=True)
class Dim:
    """One tensor dim: its global size and the mesh axes that shard it, major to minor."""

    size: int
    axes: tuple[str, ...] = ()


@dataclass(frozen=True)
class AxisType:
    """Seed 004 local SPMD type of a mesh axis that shards no dim: R, I, V or P(op)."""

    kind: str  # "R" | "I" | "V" | "P"
    op: str = "sum"  # the reduce op, meaningful for P only

    def __post_init__(self) -> None:
        if self.kind not in ("R", "I", "V", "P"):
            raise SpecError(f"unknown local type {self.kind!r}", hint="use one of U, R, I, V, P(op)")
        if self.kind != "P" and self.op != "sum":
            object.__setattr__(self, "op", "sum")
        if self.op not in REDUCE_OPS:
            raise SpecError(f"unknown reduce op {self.op!r}", hint=f"use one of {', '.join(REDUCE_OPS)}")

    @property
    def code(self) -> str:
        """How it prints: ``U`` for P(sum), as JAX prints unreduced."""
        if self.kind == "P":
            return "U" if self.op == "sum" else f"P({self.op})"
        return self.kind

    @property
    def is_partial(self) -> bool:
        return self.kind == "P"


R = AxisType("R")
I = AxisType("I")  # noqa: E741 - the seed's name for Invariant
V = AxisType("V")
U = AxisType("P", "sum")


@dataclass(frozen=True, eq=False)
class TensorType:
    """A global tensor type: dtype, dims (size + sharding axes), and per-axis local types.

    ``axis_types`` lists only annotated axes (in the order written); an axis that is
    neither listed on a dim nor annotated is Invariant. Equality ignores that order.
    """

    dtype: str
    dims: tuple[Dim, ...]
    axis_types: tuple[tuple[str, AxisType], ...] = field(default=())

    # computed once: the planner hashes and compares states hundreds of thousands of times
    @cached_property
    def _key(self) -> tuple:
        return (self.dtype, self.dims, frozenset(self.axis_types))

    @cached_property
    def _hash(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, TensorType) and self._hash == other._hash
                                 and self._key == other._key)

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> dict:
        # a string's hash differs between processes: never ship the cached one
        return {k: v for k, v in self.__dict__.items() if k not in ("_key", "_hash")}

    def __str__(self) -> str:
        from spec_lang.printer import format_type

        return format_type(self)

    def __repr__(self) -> str:
        return f"TensorType({str(self)!r})"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][1]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.dims:
            n *= d.size
        return n

    @cached_property
    def sharded_axes(self) -> tuple[str, ...]:
        return tuple(a for d in self.dims for a in d.axes)

    def dim_of(self, axis: str) -> int | None:
        """The tensor dim that ``axis`` shards, or None."""
        for i, d in enumerate(self.dims):
            if axis in d.axes:
                return i
        return None

    def axis_type(self, axis: str) -> AxisType:
        """Local type of an axis that shards no dim (I when unannotated)."""
        for name, t in self.axis_types:
            if name == axis:
                return t
        return I

    @cached_property
    def partial_axes(self) -> tuple[str, ...]:
        return tuple(a for a, t in self.axis_types if t.kind == "P")

    @property
    def partial_op(self) -> str | None:
        ops = {t.op for _, t in self.axis_types if t.kind == "P"}
        return ops.pop() if ops else None

    def axes_of_kind(self, kind: str) -> tuple[str, ...]:
        return tuple(a for a, t in self.axis_types if t.kind == kind)

    def replace(
        self,
        dims: tuple[Dim, ...] | None = None,
        axis_types: tuple[tuple[str, AxisType], ...] | None = None,
        dtype: str | None = None,
    ) -> TensorType:
        return TensorType(
            dtype if dtype is not None else self.dtype,
            dims if dims is not None else self.dims,
            axis_types if axis_types is not None else self.axis_types,
        )

    def is_even(self, mesh: Mesh) -> bool:
        """True when every sharded dim divides evenly by its axes (JAX can express it)."""
        for d in self.dims:
            if d.size % mesh.group_size(d.axes) != 0:
                return False
        return True
