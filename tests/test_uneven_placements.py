"""The uneven placements' semantics: the design's worked examples, each rule's refusal, and
every shard's elements against an independent oracle (torch.narrow, JAX)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from uneven_oracle import indices, local_shape

from lowering import DynamicShard, PartitionedShard, RaggedShard, check_placements, local_indices
from spec_lang.errors import SpecError

SPLITS = ((4, 6, 4, 2), (2, 4, 8, 2))


def test_partitioned_worked_example() -> None:
    un = PartitionedShard(0, 4, SPLITS)
    al = PartitionedShard(0, 4, SPLITS, aligned=True)
    # global order P00 P10 P01 P11 P02 P12 P03 P13
    assert un.piece_starts().tolist() == [[0, 6, 16, 28], [4, 12, 20, 30]]
    assert [un.local_splits(s) for s in range(2)] == [(4, 6, 4, 2), (2, 4, 8, 2)]
    # unaligned -> aligned: shard 0 = [P00:4, P10:2, P01:6, P11:4], shard 1 = [P02:4, P12:8, P03:2, P13:2]
    assert [al.local_splits(s) for s in range(2)] == [(4, 2, 6, 4), (4, 8, 2, 2)]
    assert al.local_order(0) == [(0, 0), (1, 0), (0, 1), (1, 1)]
    # the split-information exchange delivers these, before the local reorder
    assert un.exchange_splits() == [(4, 6, 2, 4), (4, 2, 8, 2)]
    # and the reverse conversion gives the start back
    assert al.exchange_splits() == [(4, 6, 4, 2), (2, 4, 8, 2)]
    assert al.realigned() == un and un.realigned().realigned() == un
    full = np.arange(32 * 3).reshape(32, 3)
    rows = [full.reshape(-1)[i].reshape(-1, 3)[:, 0] // 3 for i in indices(un, (32, 3), 2)]
    assert rows[0].tolist() == [*range(0, 4), *range(6, 12), *range(16, 20), *range(28, 30)]
    assert local_shape(un, (32, 3), 2, 1) == (16, 3) and local_shape(al, (32, 3), 2, 0) == (16, 3)


def test_dynamic_shard_matches_narrow() -> None:
    torch = pytest.importorskip("torch")
    shape, sizes = (3, 9, 2), (4, 0, 5)
    p = DynamicShard(1, sizes)
    full = torch.arange(math.prod(shape)).reshape(shape)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    for s, idx in enumerate(indices(p, shape, 3)):
        want = full.narrow(1, int(offsets[s]), sizes[s])
        assert idx.tolist() == want.reshape(-1).tolist()
        assert local_shape(p, shape, 3, s) == tuple(want.shape)


def test_ragged_shard_local_tensors() -> None:
    shape = (4, 6, 5)  # prefix (0, 1): 24 positions of 5 elements
    p = RaggedShard((0, 1), (1, 2, 1, 2))
    idx = indices(p, shape, 4)
    assert [len(i) for i in idx] == [20, 40, 20, 40]
    assert idx[1].tolist() == list(range(20, 60))  # a contiguous run of memory
    assert local_shape(p, shape, 4, 1) == (40,)  # 1-D over several prefix dims
    q = RaggedShard((0,), (1, 3))
    assert local_shape(q, (8, 6, 5), 2, 1) == (6, 6, 5)  # dims == (0,): trailing dims kept


@st.composite
def placements(draw: st.DrawFn) -> tuple[object, tuple[int, ...], int]:
    n = draw(st.integers(1, 5))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    kind = draw(st.sampled_from(["dynamic", "ragged", "partitioned"]))
    if kind == "dynamic":
        dim = draw(st.integers(0, len(shape) - 1))
        cuts = sorted(draw(st.lists(st.integers(0, shape[dim]), min_size=n - 1, max_size=n - 1)))
        sizes = tuple(b - a for a, b in zip([0, *cuts], [*cuts, shape[dim]]))
        return DynamicShard(dim, sizes), shape, n
    if kind == "ragged":
        k = draw(st.integers(1, len(shape)))
        units = tuple(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
        if sum(units) == 0:
            units = (1,) + units[1:]
        # scale dim 0 by the unit sum: the flattened prefix then divides by it
        return RaggedShard(tuple(range(k)), units), (shape[0] * sum(units),) + shape[1:], n
    parts = draw(st.integers(1, 3)) * n if draw(st.booleans()) else draw(st.integers(1, 5))
    aligned = parts % n == 0 and draw(st.booleans())
    splits = tuple(tuple(draw(st.lists(st.integers(0, 3), min_size=parts, max_size=parts))) for _ in range(n))
    dim = draw(st.integers(0, len(shape) - 1))
    shape = shape[:dim] + (sum(map(sum, splits)),) + shape[dim + 1:]
    return PartitionedShard(dim, parts, splits, aligned), shape, n


@given(placements())
def test_every_element_has_one_holder(case: tuple[object, tuple[int, ...], int]) -> None:
    p, shape, n = case
    idx = indices(p, shape, n)  # type: ignore[arg-type]
    allidx = np.concatenate(idx) if idx else np.zeros(0)
    assert sorted(allidx.tolist()) == list(range(math.prod(shape)))
    for s in range(n):
        assert math.prod(local_shape(p, shape, n, s)) == len(idx[s])  # type: ignore[arg-type]


@pytest.mark.parametrize("make,shape,n,message", [
    (lambda: DynamicShard(0, (3, 4)), (8,), 2, "sum to 7"),
    (lambda: DynamicShard(0, (3, -1)), (2,), 2, "negative size"),
    (lambda: DynamicShard(0, (3, 5)), (8,), 3, "2 chunk sizes for mesh axis 'x' of 3 ranks"),
    (lambda: DynamicShard(2, (3, 5)), (8,), 2, "out of range for a 1-d tensor"),
    (lambda: RaggedShard((0,), (1, 2)), (8,), 3, "2 local units for mesh axis 'x' of 3 ranks"),
    (lambda: RaggedShard((0, 1), (1, 1)), (8,), 2, "over 2 dims, but the tensor has 1"),
    (lambda: RaggedShard((0,), (1, 2)), (8,), 2, "does not divide by the 3 units"),
    (lambda: RaggedShard((1,), (1, 1)), (8, 2), 2, "must be a prefix"),
    (lambda: RaggedShard((0,), (0, 0)), (8,), 2, "at least one positive"),
    (lambda: PartitionedShard(0, 3, ((1, 1, 1), (1, 1, 1)), aligned=True), (6,), 2, "divisible by the 2 shards"),
    (lambda: PartitionedShard(0, 2, ((1, -1), (1, 1))), (2,), 2, "negative size"),
    (lambda: PartitionedShard(0, 2, ((1, 1), (1, 1))), (5,), 2, "sum to 4"),
    (lambda: PartitionedShard(0, 2, ((1, 1, 1), (1, 1))), (5,), 2, "every row with the same number"),
    (lambda: PartitionedShard(0, 2, ((1, 1, 1), (1, 1, 1))), (6,), 2, "one row of 2 sizes per shard"),
    (lambda: PartitionedShard(0, 2, ((1, 1), (1, 1))), (4,), 3, "2 rows of splits for mesh axis 'x' of 3 ranks"),
])
def test_refusals_name_the_rule(make: object, shape: tuple[int, ...], n: int, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        check_placements([make()], None, f"x={n}", len(shape), shape)  # type: ignore[operator]


def test_placements_are_frozen_and_hashable() -> None:
    a, b = PartitionedShard(0, 4, SPLITS), PartitionedShard(0, 4, [list(r) for r in SPLITS])
    assert a == b and hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.dim = 1  # type: ignore[misc]
    assert len({DynamicShard(0, (1, 2)), DynamicShard(0, [1, 2]), RaggedShard((0,), (1, 1))}) == 2


def test_local_indices_match_jax() -> None:
    jax = pytest.importorskip("jax")
    from jax.sharding import Mesh as JaxMesh
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    shape = (8, 6)
    mesh = JaxMesh(np.asarray(jax.devices()[:8]).reshape(2, 4), ("dp", "tp"))
    sharding = NamedSharding(mesh, P(("dp", "tp"), None))
    by_device = sharding.devices_indices_map(shape)
    full = np.arange(48).reshape(shape)
    ours = local_indices("f32[8@(dp,tp),6]", "dp=2,tp=4")
    for r, d in enumerate(mesh.devices.reshape(-1)):
        assert ours[r].tolist() == full[by_device[d]].reshape(-1).tolist()
