"""The factorised exchange pricing equals the all-pairs definition."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import cases, permutations, sampled_from

from lowering.bounds import lower_bound_detail
from lowering.kinds.exchange_geometry import (
    exchange_bytes,
    exchange_bytes_bruteforce,
    exchange_bytes_factorised,
    max_senders_factorised,
)
from lowering.layout import box_numel, boxes, group_ranks, overlap
from lowering.moves import exchange_move, with_dims
from spec_lang.ir import Dim, Mesh, TensorType


@st.composite
def exchanges(draw: st.DrawFn) -> tuple[TensorType, TensorType, Mesh]:
    n = draw(st.integers(1, 4))
    mesh = Mesh(("a", "b", "c", "d")[:n], tuple(draw(sampled_from((1, 2, 3, 4))) for _ in range(n)))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=1, max_size=3)))
    src_dims: list[list[str]] = [[] for _ in shape]
    for a in draw(permutations(mesh.names)):
        k = draw(st.integers(-1, len(shape) - 1))
        if k >= 0:
            src_dims[k].append(a)
    src = TensorType("float32", tuple(Dim(s, tuple(ax)) for s, ax in zip(shape, src_dims)))
    # dst: the same axes (or a subset) redistributed over the dims in a random order
    keep = [a for a in src.sharded_axes if draw(st.booleans())]
    dst_dims: list[list[str]] = [[] for _ in shape]
    for a in draw(permutations(tuple(keep))):
        dst_dims[draw(st.integers(0, len(shape) - 1))].append(a)
    return src, with_dims(src, [tuple(x) for x in dst_dims]), mesh


@settings(max_examples=400, deadline=None)
@given(exchanges())
def test_factorised_pricing_equals_all_pairs(case: tuple) -> None:
    src, dst, mesh = case
    mv = exchange_move(src, dst, mesh)
    assume(mv is not None)
    np.testing.assert_array_equal(
        exchange_bytes_factorised(src, dst, mesh, mv.axes), exchange_bytes_bruteforce(src, dst, mesh, mv.axes)
    )
    # the planner's price (the tiled shortcut where the group's dst blocks tile every src block)
    np.testing.assert_array_equal(exchange_bytes(src, dst, mesh, mv.axes),
                                  exchange_bytes_bruteforce(src, dst, mesh, mv.axes))
    sb, db = boxes(src, mesh), boxes(dst, mesh)
    heard = 0
    for r in range(mesh.size):
        group = np.array([q for q in group_ranks(mesh, mv.axes, r) if q != r], dtype=np.int64)
        heard = max(heard, int((box_numel(overlap(sb[group], db[r])) > 0).sum()))  # every peer's box at once
    assert max_senders_factorised(src, dst, mesh, mv.axes) == heard


@settings(max_examples=300, deadline=None)
@given(cases(reducing=True))
def test_lower_bound_sent_avg_equals_element_counting(case: tuple) -> None:
    """The vectorised coverage count equals counting needers element by element."""
    src, dst, mesh = case
    detail = lower_bound_detail(src, dst, mesh)
    src_p, dst_p = set(src.partial_axes), set(dst.partial_axes)
    # the reduction branch is the one that uses the coverage grid: the strategy draws only it
    assert not (dst_p - src_p) and src_p - dst_p
    reduced = [a for a in mesh.names if a in src_p and a not in dst_p]
    k = int(np.prod([mesh.axis_size(a) for a in reduced]))
    assert k > 1  # over axes of size 1 nothing is left to reduce: see the test below
    kept = [mesh.index(a) for a in mesh.names if a in dst_p]
    db = boxes(dst, mesh)
    needers: dict[tuple, int] = {}
    for r in range(mesh.size):
        key = tuple(mesh.coords(r)[i] for i in kept)
        for idx in np.ndindex(*[int(hi - lo) for lo, hi in db[r]]):
            e = tuple(int(lo) + i for (lo, _), i in zip(db[r], idx))
            needers[(key, e)] = needers.get((key, e), 0) + 1
    total = sum(k - 1 + n - 1 for n in needers.values())
    assert detail["sent_avg_bytes"] == pytest.approx(total / mesh.size * src.itemsize)


def test_a_reduction_over_axes_of_size_one_is_free() -> None:
    """P over an axis of size 1 already holds the sum: no rank must send anything, even
    where several ranks need each element (a replicated axis beside it)."""
    from spec_lang import parse, parse_mesh

    mesh = parse_mesh("a=1,b=1,c=1,d=2")
    src, dst = parse("f32[1]{U:c, V:(a,b)}"), parse("f32[1@c]{R:d, V:(a,b)}")
    assert lower_bound_detail(src, dst, mesh)["bytes"] == 0
    from lowering import compile

    assert compile(src, dst, mesh).cost.bytes_max == 0
