"""Caches: the byte-bounded LRU of ``lowering.caching``, ``clear_caches()``, and the process
group / context caches of ``torch_backend.groups`` (keyed by what matters, DeviceMeshes
held weakly)."""

from __future__ import annotations

import gc
import weakref
from datetime import timedelta

import numpy as np
import pytest

import lowering
from lowering.caching import cache_stats, cached, estimate_bytes
from lowering.layout import boxes, mesh_coords
from spec_lang import parse, parse_mesh


def test_byte_bound_evicts_least_recently_used() -> None:
    calls: list[int] = []

    @cached(max_bytes=3 * 8000 + 500)  # room for three 8 KB arrays
    def block(i: int) -> np.ndarray:
        calls.append(i)
        return np.full(1000, i, dtype=np.int64)

    for i in range(3):
        block(i)
    block(0)  # 0 is now the most recently used
    block(3)  # evicts 1, the least recently used
    assert block.cache_info().currsize == 3
    assert block.cache_info().bytes <= block.cache_info().max_bytes
    calls.clear()
    for i in (0, 2, 3):
        assert int(block(i)[0]) == i
    assert calls == []  # all three still held
    block(1)
    assert calls == [1]  # recomputed after eviction


def test_entry_bound_and_kwargs_and_errors_not_cached() -> None:
    calls: list[tuple] = []

    @cached(maxsize=2)
    def f(a: int, b: int = 0) -> int:
        calls.append((a, b))
        if a < 0:
            raise ValueError("negative")
        return a + b

    assert f(1, b=2) == 3 and f(1, b=2) == 3
    assert f(1, 2) == 3  # a different key from the keyword form, as in lru_cache
    assert calls == [(1, 2), (1, 2)]
    f(5)
    assert f.cache_info().currsize == 2
    for _ in range(2):
        with pytest.raises(ValueError):
            f(-1)
    assert calls.count((-1, 0)) == 2
    assert f.cache_info().hits == 1
    f.cache_clear()
    assert f.cache_info().currsize == 0


def test_a_value_bigger_than_the_cache_is_returned_not_kept() -> None:
    @cached(max_bytes=1000)
    def big(n: int) -> np.ndarray:
        return np.zeros(n)

    assert big(10_000).shape == (10_000,)
    assert big.cache_info().currsize == 0


def test_estimate_counts_arrays_and_shares_equal_shapes() -> None:
    a = np.zeros((4096, 3, 2), dtype=np.int64)
    assert estimate_bytes(a) >= a.nbytes
    shape = (512, 512)
    shared = (shape,) * 4096  # one tuple for every rank: about the slots only
    distinct = tuple((512 + i, 512) for i in range(4096))
    assert estimate_bytes(shared) < 8 * 4096 + 1000
    assert estimate_bytes(distinct) > 4 * estimate_bytes(shared)
    assert estimate_bytes((a, a)) >= 2 * a.nbytes


def test_local_shapes_share_one_tuple_per_distinct_shape() -> None:
    m = parse_mesh("a=16,b=16")
    shapes = lowering.local_shapes(parse("f32[256@(a,b),8]"), m)
    assert len(shapes) == 256 and len({id(s) for s in shapes}) == 1
    uneven = lowering.local_shapes(parse("f32[250@(a,b),8]"), m)
    assert sorted({s[0] for s in uneven}) == [0, 1]


def test_boxes_shared_across_dtype_and_partial_axes() -> None:
    m = parse_mesh("dp=2,tp=4")
    assert boxes(parse("f32[8@tp,4]"), m) is boxes(parse("bf16[8@tp,4]{U:dp}"), m)


def test_clear_caches_empties_every_cache_and_compile_still_works() -> None:
    src, dst, mesh = "f32[64@tp,32]{U:dp}", "f32[64@(tp,dp),32]", "dp=2,tp=4"
    first = lowering.compile(src, dst, mesh)
    mesh_coords(parse_mesh(mesh))
    assert sum(s.currsize for s in cache_stats()) > 0
    lowering.clear_caches()
    stats = cache_stats()
    assert stats and all(s.currsize == 0 and s.bytes == 0 for s in stats)
    from spec_lang import parser

    assert parser._parse_type.cache_info().currsize == 0
    again = lowering.compile(src, dst, mesh)
    assert again == first and again is not first
    assert again.to_json() == first.to_json()


def test_caches_stay_within_their_bounds_on_a_big_mesh() -> None:
    m = "a=16,b=16,c=16"  # 4,096 ranks
    for k in range(6):
        lowering.compile(f"f32[{4096 * (k + 1)}@(a,b),64@c]", f"f32[{4096 * (k + 1)}@c,64@(b,a)]", m)
    for s in cache_stats():
        assert s.bytes <= s.max_bytes, s.name
        assert s.maxsize is None or s.currsize <= s.maxsize, s.name


# ---- torch_backend.groups ----------------------------------------------------------------


def test_process_groups_are_cached_per_timeout(fake_pg, monkeypatch) -> None:
    pytest.importorskip("torch")
    import torch.distributed as dist

    from torch_backend import groups

    fake_pg(8)
    made: list[timedelta | None] = []
    real_new_group = dist.new_group

    def recording_new_group(ranks, **kwargs):
        made.append(kwargs.get("timeout"))
        return real_new_group(ranks, **kwargs)

    monkeypatch.setattr(dist, "new_group", recording_new_group)
    ranks = (0, 5)  # a group no other test makes (this process is rank 0: a member)
    five, nine = timedelta(seconds=5), timedelta(seconds=9)
    a = groups._new_group(ranks, five, None)
    b = groups._new_group(ranks, nine, None)
    assert a is not b  # the first caller's timeout does not win
    assert groups._new_group(ranks, five, None) is a
    assert groups._new_group(ranks, nine, None) is b
    assert made == [five, nine]  # each made once, with its own timeout
    # through contexts: a second timeout on the same mesh gets its own groups
    ctx5, ctx9 = groups.context("dp=2,tp=4", timeout=5), groups.context("dp=2,tp=4", timeout=9)
    assert groups.context("dp=2,tp=4", timeout=5) is ctx5
    g5, g9 = ctx5.group(("tp",), ctx5.rank), ctx9.group(("tp",), ctx9.rank)
    assert g5.members == g9.members == (0, 1, 2, 3)
    assert g5.pg is not g9.pg
    assert made[-2:] == [five, nine]


def test_context_holds_a_device_mesh_weakly(fake_pg) -> None:
    pytest.importorskip("torch")
    from torch.distributed.device_mesh import init_device_mesh

    from torch_backend import groups

    fake_pg(8)
    dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    ctx = groups.context(dm, timeout=3)
    assert groups.context(dm, timeout=3) is ctx
    assert groups.context(dm, timeout=4) is not ctx
    assert ctx.device_mesh is dm and ctx.mesh == parse_mesh("dp=2,tp=4")
    assert ctx.group(("tp",), ctx.rank).members == (0, 1, 2, 3)
    dead = weakref.ref(dm)
    del dm
    gc.collect()
    assert dead() is None  # neither the context cache nor the context kept it alive
    assert ctx.device_mesh is None


def test_context_reads_the_device_mesh_layout_once(fake_pg, monkeypatch) -> None:
    pytest.importorskip("torch")
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    from torch_backend import groups

    fake_pg(8)
    # DeviceMeshes compare by value: an equal one left by an earlier test would already be
    # resolved in the (weakly keyed) cache
    groups.clear_caches()
    dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    reads = []
    prop = DeviceMesh.mesh

    def counted(self):
        reads.append(1)
        return prop.fget(self)

    monkeypatch.setattr(DeviceMesh, "mesh", property(counted))
    first = groups.context(dm)
    for _ in range(5):
        assert groups.context(dm) is first
    assert len(reads) == 1


def test_torch_backend_clear_caches_keeps_process_groups(fake_pg) -> None:
    pytest.importorskip("torch")
    import torch_backend
    from torch_backend import groups

    fake_pg(8)
    ctx = groups.context("dp=2,tp=4")
    g = ctx.group(("tp",), ctx.rank)
    torch_backend.clear_caches()
    assert all(s.currsize == 0 for s in cache_stats())
    again = groups.context("dp=2,tp=4")
    assert again is not ctx
    assert again.group(("tp",), again.rank).pg is g.pg  # no new process group after a clear
