"""Hypothesis strategies for redistribution cases: random meshes, layouts and partials."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec_lang.ir import AxisType, Dim, Mesh, TensorType

AXES = ("a", "b", "c", "d", "e", "f", "g", "h")
F = TypeVar("F", bound=Callable[..., st.SearchStrategy])


def reused(factory: F) -> F:
    """``factory`` memoised by its (hashable) arguments. Hypothesis validates a strategy
    object on its first draw, and a composite that builds its inner strategies per example
    pays that each time (about half of drawing a case); a reused object draws exactly the
    same choices, so the examples are the ones a fresh object would give."""
    return functools.lru_cache(maxsize=4096)(factory)  # type: ignore[return-value]


permutations = reused(st.permutations)
sampled_from = reused(st.sampled_from)


@reused
@st.composite
def meshes(draw: st.DrawFn, max_axes: int = 4, max_ranks: int = 16) -> Mesh:
    """Up to ``max_axes`` axes of 1-4 ranks, at most ``max_ranks`` ranks in all."""
    n = draw(st.integers(1, max_axes))
    sizes = [draw(sampled_from((1, 2, 2, 3, 4))) for _ in range(n)]
    while np.prod(sizes) > max_ranks:
        big = sizes.index(max(sizes))
        sizes[big] = 2 if sizes[big] > 2 else 1
    return Mesh(AXES[:n], tuple(sizes))


@reused
@st.composite
def layouts(draw: st.DrawFn, mesh: Mesh, shape: tuple[int, ...], partial: frozenset[str], op: str,
            varying: frozenset[str] = frozenset(), explicit_i: bool = False) -> TensorType:
    """A random assignment of the mesh axes to dims (in random order), partial or replicated;
    ``varying`` axes are V; with ``explicit_i`` a replicated axis may be written ``I``."""
    dims: list[list[str]] = [[] for _ in shape]
    types: list[tuple[str, AxisType]] = []
    order = draw(permutations(mesh.names))
    for a in order:
        if a in partial:
            types.append((a, AxisType("P", op)))
            continue
        if a in varying:
            types.append((a, AxisType("V")))
            continue
        choice = draw(st.integers(-2, len(shape) - 1)) if shape else -1
        if choice >= 0:
            dims[choice].append(a)
        elif choice == -2:
            types.append((a, AxisType("R")))
        elif explicit_i and draw(st.booleans()):
            types.append((a, AxisType("I")))
    return TensorType("float32", tuple(Dim(s, tuple(ax)) for s, ax in zip(shape, dims)), tuple(types))


@st.composite
def cases(draw: st.DrawFn, max_axes: int = 4, max_ranks: int = 16,
          varying: bool = False, explicit_i: bool = False,
          reducing: bool = False, even: bool = False) -> tuple[TensorType, TensorType, Mesh]:
    """A valid (src, dst, mesh). The defaults are the small cases most tests use; the wide
    ones (up to 8 axes, 1,024 ranks, V axes, explicit I) test the planner's budget. With
    ``reducing``, src has a pending reduction over an axis of 2+ ranks that dst finishes
    (and dst adds no partial axis): drawn directly, not filtered, since few cases qualify.
    With ``even``, every dim's size is a multiple of the world size, so every layout on
    the mesh, and every state a search passes through, holds even blocks."""
    mesh = draw(meshes(max_axes, max_ranks))
    scale = mesh.size if even else 1
    shape = tuple(scale * n for n in draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    op = draw(sampled_from(("sum", "sum", "avg", "max", "min")))
    v = frozenset(draw(st.sets(sampled_from(mesh.names), max_size=2))) if varying else frozenset()
    if reducing:
        big = [a for a in mesh.names if mesh.axis_size(a) > 1 and a not in v]
        assume(big)
        src_p = frozenset(draw(st.sets(sampled_from(tuple(big)), min_size=1, max_size=2)))
        finished = draw(sampled_from(tuple(sorted(src_p))))
        dst_p = frozenset(a for a in mesh.names if a in src_p and a != finished and draw(st.booleans()))
    else:
        src_p = frozenset(draw(st.sets(sampled_from(mesh.names), max_size=2))) - v
        # dst keeps some of src's partial axes (and, for sum, may add new ones from replicated axes)
        dst_p = frozenset(a for a in mesh.names if a in src_p and draw(st.booleans()))
    src = draw(layouts(mesh, shape, src_p, op, v, explicit_i))
    if not reducing and (op == "sum" or not src_p):
        extra = [a for a in mesh.names if a not in src.sharded_axes and a not in src_p and a not in v]
        dst_p |= frozenset(a for a in extra if draw(st.integers(0, 3)) == 0)
    dst = draw(layouts(mesh, shape, dst_p, op if (src_p or op == "sum") else "sum", v, explicit_i))
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
