"""The IR: small frozen dataclasses for a mesh and a sharded tensor type.

A ``TensorType`` is JAX's printed array type plus the SPMD type system's per-axis local types:

* a mesh axis listed on a dim (``8@(dp,tp)``) *shards* that dim; locally it is Varying
  and the order of the list is major to minor;
* ``{U:tp}`` / ``{P(op):tp}``: Partial on ``tp`` (a pending reduction, ``U`` is sum);
* ``{R:tp}``: Replicate (JAX *reduced*): replicated values whose gradient is partial;
* ``{I:tp}`` or no mention at all: Invariant, replicated with a replicated gradient
  (what JAX assumes for an unannotated axis). The two are the same object: the
  constructor drops an explicit ``I``;
* ``{V:tp}``: Varying with no partition spec (inside ``shard_map``): the dims are
  the per-rank shape and the values differ per rank.

Every invariant lives in the constructors (``__post_init__``), so a type built in code
is checked exactly as a parsed one, and there is one canonical object per meaning: the
dtype is its long JAX name, sizes are plain ints, axes are tuples, explicit ``I`` is
dropped. Bad fields raise ``SpecError``; the parser adds the caret.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from functools import lru_cache

from spec_lang.errors import SpecError, number_text, value_text
from spec_lang.local_type import REDUCE_OPS, I, LocalType, R, U, V  # noqa: F401 - the IR's names too
from spec_lang.memo import memo as _memo
from spec_lang.memo import unmemoised_state
from spec_lang.split import INT64_LIMIT, Split

# canonical (JAX's long) name -> (JAX's short name, bytes per element). The names are
# exactly what ``jax.typeof`` prints (``str`` and ``str_short``). Sub-byte types (int1,
# int2, int4, uint1, uint2, uint4, float4_e2m1fn, float6_*) count one byte per element:
# that is how numpy (ml_dtypes) and JAX hold them in host memory, unpacked.
DTYPES: dict[str, tuple[str, int]] = {
    "bool": ("bool", 1),
    "int1": ("i1", 1),
    "int2": ("i2", 1),
    "int4": ("i4", 1),
    "int8": ("i8", 1),
    "int16": ("i16", 2),
    "int32": ("i32", 4),
    "int64": ("i64", 8),
    "uint1": ("u1", 1),
    "uint2": ("u2", 1),
    "uint4": ("u4", 1),
    "uint8": ("u8", 1),
    "uint16": ("u16", 2),
    "uint32": ("u32", 4),
    "uint64": ("u64", 8),
    "float4_e2m1fn": ("f4_e2m1fn", 1),
    "float6_e2m3fn": ("f6_e2m3fn", 1),
    "float6_e3m2fn": ("f6_e3m2fn", 1),
    "float8_e3m4": ("f8_e3m4", 1),
    "float8_e4m3": ("f8_e4m3", 1),
    "float8_e4m3b11fnuz": ("f8_e4m3b11fnuz", 1),
    "float8_e4m3fn": ("f8_e4m3fn", 1),
    "float8_e4m3fnuz": ("f8_e4m3fnuz", 1),
    "float8_e5m2": ("f8_e5m2", 1),
    "float8_e5m2fnuz": ("f8_e5m2fnuz", 1),
    "float8_e8m0fnu": ("f8_e8m0fnu", 1),
    "float16": ("f16", 2),
    "bfloat16": ("bf16", 2),
    "float32": ("f32", 4),
    "float64": ("f64", 8),
    "complex64": ("c64", 8),
    "complex128": ("c128", 16),
}
# the dtypes whose division truncates: an integer P(avg) is divided once, by the whole group
INTEGER_DTYPES = frozenset(name for name in DTYPES if name.startswith(("int", "uint")))

_SHORT_TO_LONG = {short: long for long, (short, _) in DTYPES.items()}
DTYPE_HINT = (
    "use a dtype as jax.typeof prints it: f32, bf16, f16, f64, f8_e4m3fn, f8_e5m2 (and the other float8s), "
    "i8..i64, u8..u64, i4, u4, c64, c128, bool, or their long names (float32, float8_e4m3fn, uint16, ...)"
)

# numpy arrays have at most 64 dimensions, and the layout algebra builds one with a dim per mesh axis
MAX_MESH_AXES = 63
# The layout algebra and the planner hold int64 arrays with a row per rank (coordinates,
# boxes, bytes sent): at 2**20 ranks each is a few MiB and a compile takes seconds; a
# mesh of 10**18 ranks would ask for exabytes. Today's largest clusters have far fewer.
MAX_WORLD = 2**20

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def canonical_dtype(name: str) -> str | None:
    """``f32`` or ``float32`` -> ``float32``; None if unknown."""
    if not isinstance(name, str):
        return None
    if name in DTYPES:
        return name
    return _SHORT_TO_LONG.get(name)


def _check_name(name: object, what: str) -> str:
    """A mesh axis name: a str that is an identifier (so it prints and parses back)."""
    if not isinstance(name, str):
        raise SpecError(
            f"{what} must be a str, got {type(name).__name__} {name!r}",
            hint="mesh axes are named by identifiers like dp, tp, fsdp",
        )
    if not _IDENT.fullmatch(name):
        raise SpecError(
            f"{what} {name!r} is not an identifier", subject=name,
            hint="mesh axis names are letters, digits and _, not starting with a digit (dp, tp, ep_1)",
        )
    return name


def _check_int(value: object, what: str, lowest: int, too_small: str, hint: str) -> int:
    """A plain int in [lowest, 2**63): bool refused, numpy ints canonicalised to int."""
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)  # type: ignore[arg-type]  # any object: int and numpy ints pass, not float
    except TypeError:
        raise SpecError(f"{what} must be an int, got {type(value).__name__} {value_text(value)}", hint=hint) from None
    if n < lowest:
        raise SpecError(too_small.format(number_text(n)), subject=number_text(n), hint=hint)
    if n >= INT64_LIMIT:
        raise SpecError(
            f"{what} {number_text(n)} does not fit in int64 (at most 2**63-1)", subject=number_text(n),
            hint="sizes, element counts and byte counts must stay below 2**63",
        )
    return n


def _as_tuple(value: object, what: str) -> tuple:
    if isinstance(value, tuple):
        return value
    if isinstance(value, list):
        return tuple(value)
    raise SpecError(f"{what} must be a tuple, got {type(value).__name__} {value_text(value)}")


@dataclass(frozen=True)
class Mesh:
    """Named mesh axes in mesh order; rank = row-major coordinate over them.

    ``ranks`` names the global rank of each mesh rank (row-major order of the coordinates):
    ``None`` means ``0..size-1``, and a tuple equal to that is stored as ``None``, so one
    mesh has one canonical object. Two meshes over different ranks are what a cross-mesh
    program (``lowering.compile(..., dst_mesh=)``) moves a tensor between."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    ranks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        names = _as_tuple(self.names, "mesh names")
        sizes = _as_tuple(self.sizes, "mesh sizes")
        if len(names) != len(sizes):
            raise SpecError(f"mesh names {names} and sizes {sizes} differ in length")
        if not names:
            raise SpecError("a mesh has at least one axis", hint="a single device is a one-axis mesh, e.g. dp=1")
        if len(names) > MAX_MESH_AXES:
            raise SpecError(
                f"the mesh has {len(names)} axes; at most {MAX_MESH_AXES} are supported",
                subject=names[MAX_MESH_AXES] if isinstance(names[MAX_MESH_AXES], str) else None,
                hint="numpy arrays (and the layout algebra built on them) have at most 64 dimensions; "
                     "merge axes that always move together",
            )
        seen: set[str] = set()
        for n in names:
            _check_name(n, "mesh axis name")
            if n in seen:
                raise SpecError(f"mesh axis {n!r} is repeated", subject=n, hint="give each mesh axis a unique name")
            seen.add(n)
        sizes = tuple(_check_int(
            s, f"the size of mesh axis {n!r}", 1, f"mesh axis {n!r} has size {{}}", "mesh axis sizes are at least 1",
        ) for n, s in zip(names, sizes, strict=True))
        total = 1
        for n, s in zip(names, sizes, strict=True):
            total *= s
            if total > MAX_WORLD:
                raise SpecError(
                    f"the mesh's rank count ({number_text(math.prod(sizes))}) is more than the {MAX_WORLD:,} (2**20) "
                    f"a mesh may have; mesh axis {n!r} takes it past", subject=n,
                    hint="shardc lays a mesh out in int64 arrays with a row per rank; check the axis sizes "
                         "(a mesh has at most 2**20 ranks)",
                )
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "ranks", _check_ranks(self.ranks, math.prod(sizes)))

    # hashed on every cached layout lookup: once per object (not shipped, as TensorType's)
    @_memo
    def _hash(self) -> int:
        return hash((self.names, self.sizes) if self.ranks is None else (self.names, self.sizes, self.ranks))

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> dict:
        return unmemoised_state(self)

    @_memo
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

    @property
    def global_ranks(self) -> tuple[int, ...]:
        """The global rank of each mesh rank, in mesh-rank order (``0..size-1`` by default)."""
        return tuple(range(self.size)) if self.ranks is None else self.ranks

    def __str__(self) -> str:
        axes = ",".join(f"{n}={s}" for n, s in zip(self.names, self.sizes, strict=True))
        return axes if self.ranks is None else f"{axes}@[{ranks_text(self.ranks)}]"


def ranks_text(ranks: tuple[int, ...]) -> str:
    """``0-3,6,9,8``: runs of three or more consecutive ascending ranks as ``a-b``."""
    out: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{ranks[i]}-{ranks[j]}")
        else:
            out += [str(r) for r in ranks[i:j + 1]]
        i = j + 1
    return ",".join(out)


_RANKS_HINT = "list each mesh rank's global rank once, in row-major order of the mesh, e.g. dp=2,tp=2@[8-11]"


def _check_ranks(ranks: object, size: int) -> tuple[int, ...] | None:
    if ranks is None:
        return None
    values = _as_tuple(ranks, "mesh ranks")
    if len(values) != size:
        raise SpecError(f"the mesh has {size} ranks but {len(values)} global ranks are listed", hint=_RANKS_HINT)
    seen: set[int] = set()
    for r in values:
        if isinstance(r, bool) or not isinstance(r, int):
            raise SpecError(f"a mesh's global rank must be an int, got {value_text(r)}", hint=_RANKS_HINT)
        if r < 0 or r >= MAX_WORLD:
            raise SpecError(f"global rank {r} is out of range (0 to {MAX_WORLD - 1:,})", subject=str(r),
                            hint=_RANKS_HINT)
        if r in seen:
            raise SpecError(f"global rank {r} is listed twice", subject=str(r), hint=_RANKS_HINT)
        seen.add(r)
    out = tuple(int(r) for r in values)
    return None if out == tuple(range(size)) else out


_REPEAT_HINT = "a mesh axis may shard one dim or carry one local type, not both or twice"


@dataclass(frozen=True)
class Dim:
    """One tensor dim: its global size and the mesh axes that shard it, major to minor.

    ``split`` (an uneven placement: explicit sizes, ragged units or partitions) replaces
    torch.chunk's even rule for the axis ``axes[split_at]``. The other axes of the dim keep
    the even rule, in mesh order semantics (major to minor): axes before the split cut the
    dim first, and the split applies within each of their chunks (each chunk must then be
    as long as the split says); axes after it cut the split's run evenly.
    """

    size: int
    axes: tuple[str, ...] = ()
    split: Split | None = None
    split_at: int = 0

    # hashed with every state's dims: once per object (not shipped, as TensorType's)
    @_memo
    def _hash(self) -> int:
        return hash((self.size, self.axes, self.split, self.split_at))

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> dict:
        return unmemoised_state(self)

    def __post_init__(self) -> None:
        if isinstance(self.axes, str):
            raise SpecError(
                f"Dim axes must be a tuple of mesh axis names, got the string {self.axes!r}",
                hint=f"write Dim({self.size!r}, ({self.axes!r},))",
            )
        axes = _as_tuple(self.axes, "Dim axes")
        try:
            _dim_axes_ok(axes)
        except TypeError:  # unhashable entries: check them uncached, which raises
            _dim_axes_ok.__wrapped__(axes)
        if type(self.size) is not int or not 0 <= self.size < INT64_LIMIT:
            object.__setattr__(self, "size", _check_int(
                self.size, "a dim size", 0, "dim size {} is negative", "dim sizes are at least 0",
            ))
        if axes is not self.axes:
            object.__setattr__(self, "axes", axes)
        if self.split is not None:
            _check_split(self)


def _check_split(d: Dim) -> None:
    sp = d.split
    if not isinstance(sp, Split):
        raise SpecError(f"Dim split must be a Split, got {type(sp).__name__} {value_text(sp)}",
                        hint="write Dim(10, ('dp',), Split('sizes', (3, 0, 7)))")
    if not d.axes:
        raise SpecError("an uneven split needs the mesh axis it splits over",
                        hint="write it after the axis: 10@dp<3,0,7>")
    k = d.split_at
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(d.axes):
        raise SpecError(f"split_at must index the dim's axes (0..{len(d.axes) - 1}), got {value_text(k)}",
                        hint="split_at is the position of the axis that carries the split")
    sp.check_dim(d.size, d.axes, k)


@lru_cache(maxsize=4096)  # the planner builds many Dims from few axis lists
def _dim_axes_ok(axes: tuple) -> None:
    for i, a in enumerate(axes):
        _check_name(a, "mesh axis name")
        if a in axes[:i]:
            raise SpecError(
                f"mesh axis {a!r} is used twice in one type: it is listed twice on one dim",
                subject=a, hint=_REPEAT_HINT,
            )


def byte_overflow(sizes: tuple[int, ...], itemsize: int) -> int | None:
    """The dim at which the byte count of a tensor of ``sizes`` reaches 2**63 (the parser's
    caret), or None where it stays below (a dim of 0 anywhere keeps it at 0)."""
    if 0 in sizes:
        return None
    n = itemsize
    for i, s in enumerate(sizes):
        n *= s
        if n >= INT64_LIMIT:
            return i
    return None


def bytes_error(sizes: tuple[int, ...], itemsize: int) -> SpecError:
    """The refusal of a tensor of ``sizes`` whose byte count does not fit in int64."""
    return SpecError(
        f"the tensor's byte count ({number_text(math.prod(sizes) * itemsize)}) does not fit in int64 "
        f"(limit 2**63 = {INT64_LIMIT})",
        hint="element and byte counts are int64; use smaller dims",
    )


AxisType = LocalType  # the IR's name for the local type of an annotated axis


@lru_cache(maxsize=16384)  # the planner rebuilds the same layouts many times
def _check_layout(dims: tuple[Dim, ...], axis_types: tuple) -> tuple[tuple[tuple[str, AxisType], ...], int]:
    """Validate dims and annotations together: (the annotations without explicit I, numel)."""
    owner: dict[str, str] = {}
    numel = 1
    for i, d in enumerate(dims):
        if not isinstance(d, Dim):
            raise SpecError(
                f"TensorType dims must be Dim objects, got {type(d).__name__} {d!r}",
                hint="write dims=(Dim(8, ('dp',)), Dim(16))",
            )
        numel *= d.size
        if d.split is not None:
            if d.split.kind == "ragged":
                try:
                    d.split.check_ragged(i, [e.size for e in dims], [e.axes for e in dims])
                except SpecError as e:  # the split is the subject: a reader puts the caret on it
                    raise SpecError(e.message, hint=e.hint, subject=str(d.split)) from None
            if any(e.split is not None for e in dims[:i]):
                raise SpecError(
                    f"dims {next(k for k, e in enumerate(dims) if e.split is not None)} and {i} are both "
                    "split unevenly: a type splits at most one dim unevenly", subject=str(d.split),
                    hint="split one dim unevenly and shard the others evenly (or not at all)",
                )
        for a in d.axes:
            if a in owner:
                raise SpecError(
                    f"mesh axis {a!r} is used twice in one type: it shards {owner[a]} and dim {i}",
                    subject=a, hint=_REPEAT_HINT,
                )
            owner[a] = f"dim {i}"
    out = []
    ops: dict[str, str] = {}
    for pair in axis_types:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise SpecError(
                f"axis_types entries must be (mesh axis, AxisType) pairs, got {pair!r}",
                hint="write axis_types=(('tp', AxisType('P', 'sum')),)",
            )
        a, at = pair
        _check_name(a, "mesh axis name")
        if not isinstance(at, AxisType):
            raise SpecError(
                f"the local type of mesh axis {a!r} must be an AxisType, got {type(at).__name__} {at!r}",
                hint="write AxisType('R'), AxisType('P', 'max'), ...",
            )
        if at.kind == "S":
            raise SpecError(
                f"mesh axis {a!r} is {at!r}: a type writes a split as a sharded dim, not a local type",
                subject=a, hint=f"shard dim {at.dim} by the axis instead (8@{a})",
            )
        if a in owner:
            raise SpecError(
                f"mesh axis {a!r} is used twice in one type: it {'shards' if owner[a].startswith('dim') else 'is'} "
                f"{owner[a]} and is {at.code}",
                subject=a, hint=_REPEAT_HINT,
            )
        owner[a] = at.code
        if at.kind == "P":
            ops.setdefault(at.op, a)
            if len(ops) > 1:
                raise SpecError(
                    f"mixed reduce ops {sorted(ops)} in one type (mesh axis {a!r} is {at.code}, "
                    f"{ops[next(iter(ops))]!r} is {AxisType('P', next(iter(ops))).code})",
                    subject=a,
                    hint="the order of a mixed reduction changes its value; reduce one op first "
                         "(two redistributions), or use one op on every partial axis",
                )
        if at.kind != "I":
            out.append((a, at))
    return tuple(out), numel


# Annotation groups print in this order, as JAX prints unreduced before reduced.
_KIND_ORDER = ("U", "P(avg)", "P(max)", "P(min)", "R", "I", "V")


def _axes_text(axes: tuple[str, ...]) -> str:
    return axes[0] if len(axes) == 1 else "(" + ",".join(axes) + ")"


def _dim_text(d: Dim) -> str:
    if not d.axes:
        return str(d.size)
    if d.split is None:
        return f"{d.size}@{_axes_text(d.axes)}"
    if len(d.axes) == 1:
        return f"{d.size}@{d.axes[0]}{d.split}"
    return f"{d.size}@(" + ",".join(a + (str(d.split) if i == d.split_at else "") for i, a in enumerate(d.axes)) + ")"


@dataclass(frozen=True, eq=False)
class TensorType:
    """A global tensor type: dtype, dims (size + sharding axes), and per-axis local types.

    ``axis_types`` lists only annotated axes (in the order written) other than I; an
    axis that is neither listed on a dim nor annotated is Invariant. Equality ignores
    that order.
    """

    dtype: str
    dims: tuple[Dim, ...]
    axis_types: tuple[tuple[str, AxisType], ...] = field(default=())

    def __post_init__(self) -> None:
        dtype = self.dtype if type(self.dtype) is str and self.dtype in DTYPES else canonical_dtype(self.dtype)
        if dtype is None:
            lower = canonical_dtype(self.dtype.lower()) if isinstance(self.dtype, str) else None
            raise SpecError(
                f"unknown dtype {value_text(self.dtype)}", subject=self.dtype if isinstance(self.dtype, str) else None,
                hint=DTYPE_HINT if lower is None else f"dtypes are lower case: write {self.dtype.lower()!r}",
            )
        dims = self.dims if type(self.dims) is tuple else _as_tuple(self.dims, "TensorType dims")
        axis_types = self.axis_types
        if type(axis_types) is not tuple:
            axis_types = _as_tuple(axis_types, "TensorType axis_types")
        try:
            axis_types, numel = _check_layout(dims, axis_types)
        except TypeError:  # unhashable fields: check them uncached, which raises
            axis_types, numel = _check_layout.__wrapped__(dims, axis_types)
        if numel * DTYPES[dtype][1] >= INT64_LIMIT:
            raise bytes_error(tuple(d.size for d in dims), DTYPES[dtype][1])
        if dtype.startswith("complex"):
            for _, at in axis_types:
                if at.kind == "P" and at.op in ("max", "min"):
                    raise SpecError(
                        f"a pending {at.op} of {dtype}: complex numbers have no order", subject=f"P({at.op})",
                        hint="reduce complex values with U (a sum) or P(avg), or take the max of their "
                        "magnitudes as a real tensor",
                    )
        # the dataclass is frozen; these are the canonical forms of the same values
        self.__dict__.update(dtype=dtype, dims=dims, axis_types=axis_types)

    # computed once: the planner hashes and compares states hundreds of thousands of times
    @_memo
    def _key(self) -> tuple:
        return (self.dtype, self.dims, frozenset(self.axis_types))

    @_memo
    def _hash(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, TensorType) and self._hash == other._hash
                                 and self._key == other._key)

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> dict:
        return unmemoised_state(self)

    def __str__(self) -> str:
        return self.format()

    def format(self, short_dtype: bool = False) -> str:
        """The canonical text, JAX's format (``float32[8@(dp,tp),16]{U:tp}``); ``short_dtype``
        prints ``f32``."""
        dtype = DTYPES[self.dtype][0] if short_dtype else self.dtype
        groups: dict[str, list[str]] = {}
        for name, at in self.axis_types:
            groups.setdefault(at.code, []).append(name)
        ann = ", ".join(f"{code}:{_axes_text(tuple(groups[code]))}" for code in _KIND_ORDER if code in groups)
        return f"{dtype}[{','.join(map(_dim_text, self.dims))}]" + (f"{{{ann}}}" if ann else "")

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

    @_memo
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

    @_memo
    def is_uneven(self) -> bool:
        """Whether a dim carries an uneven split (its ranks then hold blocks, not one box each)."""
        return any(d.split is not None for d in self.dims)

    @_memo
    def partial_axes(self) -> tuple[str, ...]:
        return tuple(a for a, t in self.axis_types if t.kind == "P")

    @property
    def partial_op(self) -> str | None:
        """The one reduce op of the partial axes (the constructor refuses mixed ops)."""
        for _, t in self.axis_types:
            if t.kind == "P":
                return t.op
        return None

    def axes_of_kind(self, kind: str) -> tuple[str, ...]:
        return tuple(a for a, t in self.axis_types if t.kind == kind)

    def derive(self, dims: tuple[Dim, ...], axis_types: tuple[tuple[str, AxisType], ...]) -> TensorType:
        """This type with new dims and local types, built without the constructor's checks.

        For the planner, which builds thousands of states from valid ones: the caller vouches
        that ``dims`` are valid Dims of this type's sizes (even: no split) and that no mesh
        axis appears twice over ``dims`` and ``axis_types``, with one reduce op and no
        explicit I, so the result is what the constructor would build. Anything else goes
        through ``replace``, which checks.
        """
        out = object.__new__(TensorType)
        out.__dict__.update(dtype=self.dtype, dims=dims, axis_types=axis_types)
        return out

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
