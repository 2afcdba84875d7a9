"""What every step kind is made of: the kind interface, per-rank pieces, buffer geometry.

A *step kind* (all_gather, reduce_scatter, slice, ...) is one object that holds all
there is to know about it, torch-free:

* ``infer``    its type rule: which (src, dst) pairs over which mesh axes it accepts,
               and the tensor dims and reduce op that follow from them;
* ``price``    the elements each rank sends (vectorised over the world, for the planner);
* ``received`` the elements each rank receives (a step takes as long as its busiest link
               direction, so the planner prices it by the larger of the two per rank);
* ``pieces``   one rank's share: which piece of its input goes to which peer and where
               each received piece lands, read off the layout algebra; the simulator and
               the torch executor both run from these, and ``wire_elems`` equals the price
               (``wire_in_elems`` what it receives);
* ``simulate`` its numpy semantics over every rank's pieces (the reference interpreter);
* ``duals``    the kind of the step that computes its gradient, on the dual types (data:
               the planner builds the step, ``lowering.planner.dual_steps``).

The torch execution of each kind lives in ``torch_backend`` and is registered there
under the kind's name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, ClassVar, NamedTuple, TypeVar

import numpy as np

from spec_lang.errors import SpecError, value_text
from spec_lang.ir import INTEGER_DTYPES, Dim, Mesh, TensorType

if TYPE_CHECKING:
    from lowering.program import Step

Slices = tuple[slice, ...]


class Piece(NamedTuple):
    """A box moved between two ranks: ``src`` slices the sender's input block, ``dst``
    slices the receiver's output block (the side that does not apply is empty). A tuple:
    a rank of a 1,024-rank group builds thousands of them on its first call."""

    peer: int
    src: Slices
    dst: Slices
    shape: tuple[int, ...]
    numel: int


def pieces_of(peers: Sequence[int], boxes_: np.ndarray, base: np.ndarray, side: str) -> tuple[Piece, ...]:
    """One Piece per peer for the global boxes ``boxes_`` (n, ndim, 2), each as slices of a
    buffer holding global box ``base``, on the ``side`` ("src" or "dst") it applies to.
    Vectorised: one pass of numpy, then plain tuples (per-rank work linear in the group)."""
    ext = boxes_[..., 1] - boxes_[..., 0]
    lo = (boxes_[..., 0] - base[:, 0]).tolist()
    hi = (boxes_[..., 1] - base[:, 0]).tolist()
    numels = np.prod(ext, axis=1).tolist()
    # built by map and zip, without a Python loop or Piece's own __new__ (a 1,024-rank group
    # is a million pieces): what Piece(q, slices, (), shape, numel) builds, or with dst slices
    slices = map(tuple, map(map, repeat(slice), lo, hi))
    shapes = map(tuple, ext.tolist())
    unused = repeat(())
    fields = (peers, slices, unused, shapes, numels) if side == "src" else (peers, unused, slices, shapes, numels)
    return tuple(map(tuple.__new__, repeat(Piece), zip(*fields)))


@dataclass(frozen=True, kw_only=True)
class RankPieces:
    """One rank's share of one step; each kind adds the fields it needs."""

    kind: str
    rank: int
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    members: tuple[int, ...] = ()  # the group in process-group rank order (mesh ranks)
    wire_elems: int = 0  # elements this rank puts on the wire
    wire_in_elems: int = 0  # elements this rank takes off the wire

    @property
    def n(self) -> int:
        return len(self.members)

    @property
    def me(self) -> int:
        """This rank's process-group rank."""
        return self.members.index(self.rank)


PiecesT = TypeVar("PiecesT", bound=RankPieces)


def own_pieces(cls: type[PiecesT], pieces: Sequence[RankPieces]) -> list[PiecesT]:
    """``pieces`` as ``cls``: a kind's ``simulate`` is given the pieces its ``pieces`` built,
    each of its own class (a TypeError otherwise)."""
    out = [p for p in pieces if isinstance(p, cls)]
    if len(out) != len(pieces):
        raise TypeError(f"expected {cls.__name__} pieces, got {sorted({type(p).__name__ for p in pieces})}")
    return out


@dataclass(frozen=True)
class Signature:
    """What a kind's type rule derives from a (src, dst) pair: the group and the dims."""

    axes: tuple[str, ...]
    dims: tuple[int, ...]
    op: str | None = None


class StepKind:
    """The interface every step kind implements (see the module docstring)."""

    name: ClassVar[str]
    collective: ClassVar[bool] = False
    reduces: ClassVar[bool] = False  # finishes a pending P(op): the step carries the op
    launches: ClassVar[int] = 1  # collectives it runs (a relay's two phases: 2)
    planned: ClassVar[bool] = True  # the planner emits it (False: only the typed SPMD API builds it)
    crosses: ClassVar[bool] = False  # a step to another mesh (lowering.kinds.across), over two meshes' ranks
    # the kind of the gradient's step, per mesh axis of the step: (local type before, after)
    # -> kind, a sharded axis written S (the SPMD type system's forward/backward table in
    # step kinds); a pair it lacks, or axes that disagree, leave the gradient to the planner
    duals: ClassVar[Mapping[tuple[str, str], str]] = {}

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        raise NotImplementedError

    def refine(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> str:
        """The kind that actually runs (an all_to_all with one sender per receiver is a permute)."""
        return self.name

    def price(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        """(world,) elements each rank sends (``padded``: uneven pieces padded on the wire, where
        the kind pads); local kinds send nothing."""
        return np.zeros(mesh.size, dtype=np.int64)

    def received(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
                 padded: bool = True) -> np.ndarray:
        """(world,) elements each rank receives (as ``price``: padded where the kind pads);
        local kinds receive nothing."""
        return np.zeros(mesh.size, dtype=np.int64)

    def moved(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        """(world,) the larger of ``price`` and ``received`` per rank: what the step costs each
        rank (the planner's search prices every move by it; kinds share the work where they can)."""
        return np.maximum(self.price(src, dst, mesh, axes, padded), self.received(src, dst, mesh, axes, padded))

    def padded(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> bool:
        """Whether uneven pieces are padded on the wire (and priced so)."""
        return False

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        raise NotImplementedError

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError


KINDS: dict[str, StepKind] = {}


def register(cls: type[StepKind]) -> type[StepKind]:
    """Class decorator: make a kind known under its name."""
    KINDS[cls.name] = cls()
    return cls


def kind_of(name: str) -> StepKind:
    try:
        return KINDS[name]
    except Exception:  # not a name: unhashable, or its hash or == raises
        raise SpecError(f"unknown step kind {value_text(name)}", hint=f"use one of {', '.join(sorted(KINDS))}") from None


# ---- geometry of boxes and flat buffers ----------------------------------------------------


def rel(piece: np.ndarray, base: np.ndarray) -> Slices:
    """``piece`` (a global box) as slices of a buffer that holds global box ``base``."""
    return tuple(slice(int(p[0] - b[0]), int(p[1] - b[0])) for p, b in zip(piece, base))


def box_shape(box: np.ndarray) -> tuple[int, ...]:
    return tuple(int(hi - lo) for lo, hi in box)


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def flat_offset(sl: Slices, shape: tuple[int, ...]) -> int | None:
    """Row-major offset of sub-box ``sl`` of a ``shape`` tensor if it is one contiguous run.

    A box is one run when every dim before its last partial dim pins a single index.
    """
    ext = [s.stop - s.start for s in sl]
    if any(e == 0 for e in ext):
        return 0
    partial = [d for d in range(len(shape)) if ext[d] != shape[d]]
    if partial and any(ext[d] != 1 for d in range(partial[-1])):
        return None
    off, stride = 0, 1
    for d in reversed(range(len(shape))):
        off += sl[d].start * stride
        stride *= shape[d]
    return off


def is_run(pieces: Sequence[tuple[Slices, int]], shape: tuple[int, ...], chunk: int | None) -> bool:
    """Pieces (slices, numel) lie back to back in a ``shape`` buffer (each at i*chunk if given)."""
    pos = 0
    for i, (sl, n) in enumerate(pieces):
        at = i * chunk if chunk is not None else pos
        if n and flat_offset(sl, shape) != at:
            return False
        pos += n
    return True


def reduce_arrays(arrays: Sequence[np.ndarray], op: str) -> np.ndarray:
    """The reduction a P(op) axis denotes, in the arrays' dtype: the sum (an integer sum
    wraps on overflow, as a collective's SUM does; a bool sum is the logical or), the max,
    the min, or the average: the sum divided once by the number of arrays (``divide_sum``)."""
    stack = np.stack(arrays)
    if op in ("sum", "avg"):
        if stack.dtype.name in INTEGER_DTYPES:
            # added in 64 bits, then wrapped into the dtype (ml_dtypes' int4 has no add of its own)
            total = stack.astype(_wide(stack.dtype)).sum(axis=0).astype(stack.dtype)
        else:
            total = stack.sum(axis=0).astype(stack.dtype)  # bool: a count, nonzero where any is set
        return divide_sum(total, len(arrays)) if op == "avg" else total
    if op == "max":
        return stack.max(axis=0)
    return stack.min(axis=0)


def divide_sum(total: np.ndarray, n: int) -> np.ndarray:
    """An average's one division of the sum ``total`` by the group size ``n``, in its dtype:
    integers truncate toward zero (torch's ``rounding_mode="trunc"``, in 64 bits so that ``n``
    may exceed the dtype), floats and complex divide, and bool stays as it is (the average
    of bools is their logical or, like their sum)."""
    if n == 1 or total.dtype == np.bool_:
        return total
    if total.dtype.name not in INTEGER_DTYPES:
        return (total / n).astype(total.dtype)
    wide: np.ndarray = total.astype(_wide(total.dtype))
    q = wide // n
    q += (wide < 0) & (q * n != wide)  # floor division rounds negatives down: back toward zero
    return q.astype(total.dtype)


def _wide(dtype: np.dtype) -> type:
    return np.uint64 if dtype.name.startswith("uint") else np.int64


def splits_integer_average(src: TensorType, dst: TensorType, mesh: Mesh) -> bool:
    """Whether ``src -> dst`` finishes an integer P(avg) over some of its axes while keeping
    it pending over others (each part a group of 2+ ranks). Integer division truncates, so
    dividing by one part now and by the rest later is not dividing once by the whole group:
    1, 0, 0, 3 average to 1, but averaged in pairs they give 0 and 1, then 0."""
    if src.partial_op != "avg" or src.dtype not in INTEGER_DTYPES:
        return False
    sp, dp = set(src.partial_axes), set(dst.partial_axes)
    done = tuple(a for a in mesh.names if a in sp - dp)
    kept = tuple(a for a in mesh.names if a in sp & dp)
    return mesh.group_size(done) > 1 and mesh.group_size(kept) > 1


def check_whole_average(kind: str, src: TensorType, dst: TensorType, mesh: Mesh) -> None:
    """The type rule every reducing kind shares: an integer P(avg) is finished over all its
    pending axes in one step (``splits_integer_average``)."""
    if splits_integer_average(src, dst, mesh):
        done = [a for a in mesh.names if a in src.partial_axes and a not in dst.partial_axes]
        every = tuple(a for a in mesh.names if a in src.partial_axes)
        raise refuse(kind, src, dst, f"it finishes the integer average over {done} but keeps it pending over "
                     f"{[a for a in dst.partial_axes if a in src.partial_axes]}; dividing by part of the group "
                     "and later by the rest truncates twice",
                     f"finish the average over all of {every!r} in one step, then reinterpret R as P(avg) where "
                     "it should stay pending (equal copies average to the copy); lowering.compile plans this")


def erase(t: TensorType) -> TensorType:
    """Drop R/I annotations (the forward values are the same); keep P and V."""
    return t.replace(axis_types=tuple((a, at) for a, at in t.axis_types if at.kind in ("P", "V")))


def drop_unit_axes(t: TensorType, mesh: Mesh) -> TensorType:
    """``t`` without the mesh axes of size 1 on its dims and among its P axes: a group of one
    rank moves nothing, and a reduction over one rank is its value, so every rank holds the
    same block with the same values (``f32[8@(dp,tp)]`` is ``f32[8@tp]`` on ``dp=1,tp=4``).
    Uneven types are kept as they are (their exchanges over such axes move nothing already)."""
    unit = {a for a, n in zip(mesh.names, mesh.sizes) if n == 1}
    if not unit or t.is_uneven or (unit.isdisjoint(t.sharded_axes) and unit.isdisjoint(t.partial_axes)):
        return t
    dims = tuple(d if unit.isdisjoint(d.axes) else Dim(d.size, tuple(a for a in d.axes if a not in unit))
                 for d in t.dims)
    return t.replace(dims=dims, axis_types=tuple((a, at) for a, at in t.axis_types
                                                 if not (a in unit and at.kind == "P")))


def replicated_axes(t: TensorType, mesh: Mesh) -> tuple[str, ...]:
    """Mesh axes on which ``t`` is R or I (no dim sharded, not P, not V)."""
    used = set(t.sharded_axes) | {a for a, at in t.axis_types if at.kind in ("P", "V")}
    return tuple(a for a in mesh.names if a not in used)


def refuse(kind: str, src: TensorType, dst: TensorType, why: str, hint: str) -> SpecError:
    """The type rule's refusal: names the kind, the pair and the rule."""
    return SpecError(f"{kind} cannot take {src} to {dst}: {why}", hint=hint)


def same_except(kind: str, src: TensorType, dst: TensorType, what: str) -> None:
    """The parts a kind does not change must match (dtype, global shape, V axes)."""
    if src.dtype != dst.dtype or src.shape != dst.shape:
        raise refuse(kind, src, dst, "dtype and global shape must stay the same",
                     "a step changes the layout only")
    if set(src.axes_of_kind("V")) != set(dst.axes_of_kind("V")):
        raise refuse(kind, src, dst, "varying (V) axes must stay the same", what)


def dual_kind(step: Step) -> str | None:
    """The kind of ``step``'s gradient step (``StepKind.duals``), where every axis of the
    step names the same one; None where the gradient needs the planner (a step that turns
    several axes into different dual kinds, say R and I at once, needs more than one)."""
    table = kind_of(step.kind).duals
    found = {table.get((_letter(step.src, a), _letter(step.dst, a))) for a in step.axes}
    return found.pop() if len(found) == 1 else None


def _letter(t: TensorType, axis: str) -> str:
    return "S" if t.dim_of(axis) is not None else t.axis_type(axis).kind
