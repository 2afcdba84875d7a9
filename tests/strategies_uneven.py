"""Hypothesis strategies for uneven layouts: explicit sizes (zero-size ranks included),
ragged runs over 1..ndim flattened prefix dims, and aligned/unaligned partitions with
zero pieces, composed with plain shards of other dims by other mesh axes, R and
P(sum/avg/max/min) on the free axes; and pairs with at least one uneven side.

The shape is drawn first and every split is drawn to fit it (sizes and partition pieces
as random compositions of the dim, ragged units as a composition of a divisor of the
flattened prefix), so every drawn type is valid by construction.
"""

from __future__ import annotations

import math

from hypothesis import strategies as st
from strategies import permutations, reused, sampled_from

from spec_lang.ir import AxisType, Dim, Mesh, TensorType
from spec_lang.split import Split

AXES = ("a", "b", "c")
OPS = ("sum", "sum", "avg", "max", "min")
KINDS = ("sizes", "ragged", "parts", "aligned")
_DIM_SIZES = st.integers(0, 8) | st.integers(1, 8)  # mostly >= 1 (a zero-size dim now and then)


@reused
@st.composite
def meshes(draw: st.DrawFn, max_axes: int = 3, max_ranks: int = 16) -> Mesh:
    """1..``max_axes`` axes of 1..4 ranks, at most ``max_ranks`` ranks in all."""
    n = draw(st.integers(1, max_axes))
    sizes = [draw(st.integers(1, 4)) for _ in range(n)]
    while math.prod(sizes) > max_ranks:
        big = sizes.index(max(sizes))
        sizes[big] -= 1
    return Mesh(AXES[:n], tuple(sizes))


@reused
@st.composite
def composition(draw: st.DrawFn, total: int, parts: int) -> tuple[int, ...]:
    """``parts`` counts >= 0 that add up to ``total`` (zeros are common on small totals)."""
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=parts - 1, max_size=parts - 1)))
    return tuple(b - a for a, b in zip([0, *cuts], [*cuts, total]))


@reused
@st.composite
def splits(draw: st.DrawFn, shape: tuple[int, ...], n: int, kind: str | None = None,
           dim: int | None = None) -> tuple[int, Split]:
    """``(dim, split)``: an uneven cut over an axis of ``n`` ranks that fits ``shape`` (on
    ``dim`` where given; a ragged one over that one dim)."""
    kind = kind or draw(sampled_from(KINDS))
    if kind == "ragged":
        span = 1 if dim is not None else draw(st.integers(1, len(shape)))
        flat = math.prod(shape[:span])
        divisors = [t for t in range(1, min(flat, 12) + 1) if flat % t == 0]
        if not divisors:  # an empty prefix: no unit sum divides 0 positions but any does
            divisors = [1, 2, 3]
        total = draw(sampled_from(tuple(divisors)))
        return 0, Split("ragged", draw(composition(total, n)), span=span)
    dim = draw(st.integers(0, len(shape) - 1)) if dim is None else dim
    if kind == "sizes":
        return dim, Split("sizes", draw(composition(shape[dim], n)))
    aligned = kind == "aligned"
    parts = n * draw(st.integers(1, 2)) if aligned else draw(st.integers(1, 4))
    flat = draw(composition(shape[dim], n * parts))
    rows = tuple(tuple(flat[s * parts:(s + 1) * parts]) for s in range(n))
    return dim, Split("parts", rows, aligned=aligned)


@reused
@st.composite
def layouts(draw: st.DrawFn, mesh: Mesh, shape: tuple[int, ...], partial: frozenset[str], op: str,
            uneven: bool, dtype: str = "float64") -> TensorType:
    """A random layout of ``shape``: with ``uneven``, one axis cuts one dim unevenly; the other
    axes shard the other dims (never a ragged prefix), are R (written or not) or, for the
    ``partial`` axes, P(op)."""
    dims: list[list[str]] = [[] for _ in shape]
    split_at: dict[int, Split] = {}
    split_pos: dict[int, int] = {}
    blocked: set[int] = set()
    free = [a for a in mesh.names if a not in partial]
    if uneven:
        if not free:
            raise ValueError("an uneven layout needs an axis that is not partial")
        u = draw(sampled_from(tuple(free)))
        d, sp = draw(splits(shape, mesh.axis_size(u)))
        dims[d].append(u)
        split_at[d] = sp
        blocked = set(range(sp.span)) if sp.kind == "ragged" else {d}
        others = [a for a in free if a != u]
        if others and sp.span == 1 and draw(st.integers(0, 2)) == 0:
            # compose another axis on the split dim, in mesh-order semantics
            b = draw(sampled_from(tuple(others)))
            nb = mesh.axis_size(b)
            if draw(st.booleans()) and shape[d] % nb == 0:  # major: the split fits each chunk
                kind = sp.kind if sp.kind != "parts" else ("aligned" if sp.aligned else "parts")
                _, sp = draw(splits(shape[:d] + (shape[d] // nb,) + shape[d + 1:], mesh.axis_size(u), kind, d))
                split_at[d] = sp
                dims[d].insert(0, b)
                split_pos[d] = 1
            elif sp.kind != "parts":  # minor: cuts the split's single run evenly
                dims[d].append(b)
    types: list[tuple[str, AxisType]] = []
    for a in draw(permutations(mesh.names)):
        if any(a in ax for ax in dims):
            continue
        if a in partial:
            types.append((a, AxisType("P", op)))
            continue
        open_dims = [k for k in range(len(shape)) if k not in blocked]
        choice = draw(st.integers(-2, len(open_dims) - 1)) if open_dims else draw(st.integers(-2, -1))
        if choice >= 0:
            dims[open_dims[choice]].append(a)
        elif choice == -2:
            types.append((a, AxisType("R")))
    return TensorType(dtype, tuple(Dim(s, tuple(ax), split_at.get(k), split_pos.get(k, 0))
                                   for k, (s, ax) in enumerate(zip(shape, dims))),
                      tuple(types))


@reused
@st.composite
def uneven_types(draw: st.DrawFn, mesh: Mesh) -> TensorType:
    """One uneven type on ``mesh`` (no partial axes)."""
    shape = tuple(draw(st.lists(st.integers(0, 8), min_size=1, max_size=3)))
    return draw(layouts(mesh, shape, frozenset(), "sum", True))


@reused
@st.composite
def uneven_pairs(draw: st.DrawFn, max_axes: int = 3, max_ranks: int = 16,
                 ops: tuple[str, ...] = OPS) -> tuple[TensorType, TensorType, Mesh]:
    """A valid ``(src, dst, mesh)`` where at least one side is uneven: uneven <-> uneven (on
    the same or different axes and dims) or uneven <-> a plain layout (shards, R, P)."""
    mesh = draw(meshes(max_axes, max_ranks))
    shape = tuple(draw(st.lists(_DIM_SIZES, min_size=1, max_size=3)))
    op = draw(sampled_from(ops))
    sides = draw(sampled_from(((True, True), (True, False), (False, True))))
    # an uneven side needs a non-partial axis: keep at least one axis out of the partials
    src_p = frozenset(draw(st.sets(sampled_from(mesh.names), max_size=min(2, len(mesh.names) - 1))))
    dst_p = frozenset(a for a in mesh.names if a in src_p and draw(st.booleans()))
    src = draw(layouts(mesh, shape, src_p, op, sides[0]))
    if op == "sum" or not src_p:
        extra = [a for a in mesh.names if a not in src.sharded_axes and a not in src_p]
        new = frozenset(a for a in extra if draw(st.integers(0, 3)) == 0)
        if len(dst_p | new) < len(mesh.names):
            dst_p |= new
    dst = draw(layouts(mesh, shape, dst_p, op if (src_p or op == "sum") else "sum", sides[1]))
    return src, dst, mesh


@reused
@st.composite
def single_placements(draw: st.DrawFn) -> tuple[TensorType, Mesh]:
    """One uneven placement alone on a 1-D mesh of 1..4 ranks."""
    mesh = Mesh(("a",), (draw(st.integers(1, 4)),))
    return draw(uneven_types(mesh)), mesh
