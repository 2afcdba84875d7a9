"""Hypothesis strategies for redistribution cases: random meshes, layouts and partials."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from spec_lang.ir import AxisType, Dim, Mesh, TensorType

AXES = ("a", "b", "c", "d")


@st.composite
def meshes(draw: st.DrawFn) -> Mesh:
    n = draw(st.integers(1, 4))
    sizes = [draw(st.sampled_from([1, 2, 2, 3, 4])) for _ in range(n)]
    while np.prod(sizes) > 16:
        sizes[sizes.index(max(sizes))] = 2
    return Mesh(AXES[:n], tuple(sizes))


@st.composite
def layouts(draw: st.DrawFn, mesh: Mesh, shape: tuple[int, ...], partial: frozenset[str], op: str) -> TensorType:
    """A random assignment of the mesh axes to dims (in random order), partial or replicated."""
    dims: list[list[str]] = [[] for _ in shape]
    types: list[tuple[str, AxisType]] = []
    order = draw(st.permutations(mesh.names))
    for a in order:
        if a in partial:
            types.append((a, AxisType("P", op)))
            continue
        choice = draw(st.integers(-2, len(shape) - 1)) if shape else -1
        if choice >= 0:
            dims[choice].append(a)
        elif choice == -2:
            types.append((a, AxisType("R")))
    return TensorType("float32", tuple(Dim(s, tuple(ax)) for s, ax in zip(shape, dims)), tuple(types))


@st.composite
def cases(draw: st.DrawFn) -> tuple[TensorType, TensorType, Mesh]:
    mesh = draw(meshes())
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    op = draw(st.sampled_from(["sum", "sum", "avg", "max", "min"]))
    src_p = frozenset(draw(st.sets(st.sampled_from(mesh.names), max_size=2)))
    # dst keeps some of src's partial axes (and, for sum, may add new ones from replicated axes)
    dst_p = frozenset(a for a in src_p if draw(st.booleans()))
    src = draw(layouts(mesh, shape, src_p, op))
    if op == "sum" or not src_p:
        extra = [a for a in mesh.names if a not in src.sharded_axes and a not in src_p]
        dst_p |= frozenset(a for a in extra if draw(st.integers(0, 3)) == 0)
    dst = draw(layouts(mesh, shape, dst_p, op if (src_p or op == "sum") else "sum"))
    return src, dst, mesh


def random_case(rng: np.random.Generator, mesh: Mesh) -> tuple[TensorType, TensorType]:
    """A random (src, dst) pair on ``mesh`` without hypothesis (for multi-process tests,
    where every rank must draw the same cases from the same seed)."""
    ndim = int(rng.integers(1, 4))
    shape = tuple(int(rng.integers(1, 10)) for _ in range(ndim))
    op = str(rng.choice(["sum", "sum", "avg", "max", "min"]))
    # lists in mesh order, not sets: every process must draw the same cases
    src_p = [a for a in mesh.names if rng.random() < 0.2]
    dst_p = [a for a in src_p if rng.random() < 0.5]

    def layout(partial: set[str], op: str) -> TensorType:
        dims: list[list[str]] = [[] for _ in shape]
        types: list[tuple[str, AxisType]] = []
        for a in rng.permutation(list(mesh.names)):
            a = str(a)
            if a in partial:
                types.append((a, AxisType("P", op)))
                continue
            k = int(rng.integers(-2, ndim))
            if k >= 0:
                dims[k].append(a)
            elif k == -2:
                types.append((a, AxisType("R")))
        return TensorType("float64", tuple(Dim(s, tuple(ax)) for s, ax in zip(shape, dims)), tuple(types))

    src = layout(set(src_p), op)
    if op == "sum" or not src_p:
        dst_p += [a for a in mesh.names if a not in src.sharded_axes and a not in src_p and rng.random() < 0.25]
    return src, layout(set(dst_p), op if (src_p or op == "sum") else "sum")
