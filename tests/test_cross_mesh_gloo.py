"""Cross-mesh redistribution on 8 real gloo ranks (the shared ``gloo_pool``): every
scenario against ``lowering.simulate`` and a numpy oracle cut from the global array by
the definition of each layout (``local_slices``); the caller's block never modified; a
call wrong on one rank fails on every rank before any message."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import lowering  # noqa: E402
from spec_lang import parse, parse_mesh  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

# (name, src, mesh, dst, dst_mesh)
CASES = [
    ("weight-sync", "f32[16@fsdp,8]", "fsdp=4@[0-3]", "f32[16,8@tp]{R:rep}", "rep=2,tp=2@[4-7]"),
    ("shrink-8-6", "f32[48@dp,6]", "dp=8", "f32[48@dp,6]", "dp=6@[0,1,2,4,6,7]"),
    ("grow-6-8", "f32[48@dp,6]", "dp=6@[0,1,2,4,6,7]", "f32[48@dp,6]", "dp=8"),
    ("pending-sum", "f32[8,8@dp]{U:tp}", "dp=2,tp=2", "f32[8,8@tp]", "tp=2@[4,5]"),
    ("overlap", "f32[12@(dp,tp),5]", "dp=2,tp=2@[2-5]", "f32[12,5@x]", "x=4@[4,5,6,7]"),
    ("reshape-same-ranks", "f32[8@fsdp,12]", "fsdp=8", "f32[8@dp,12@tp]", "dp=2,tp=4"),
    ("replicated-src-uneven", "bf16[7,10]", "dp=2@[6,7]", "bf16[7@tp,10]", "tp=3@[0,3,1]"),
    ("permuted", "i32[6@a,4]", "a=3@[5,1,3]", "i32[6,4@b]", "b=2@[3,0]"),
]


def inputs(src: str, mesh: str, seed: int) -> tuple[np.ndarray, list[np.ndarray | None], int]:
    """(global array, one block per world rank or None, world): integer values, so the
    addends of a pending sum over ``tp`` add up exactly."""
    s, m = parse(src), parse_mesh(mesh)
    rng = np.random.default_rng(seed)
    g = rng.integers(-50, 50, size=s.shape).astype(np.float32)
    part = rng.integers(-50, 50, size=s.shape).astype(np.float32)
    world = 8
    out: list[np.ndarray | None] = [None] * world
    for i, (r, sl) in enumerate(zip(m.global_ranks, lowering.local_slices(s, m), strict=True)):
        block = g[sl]
        if s.partial_axes:  # tp coordinate 0 holds ``part``, 1 holds the rest
            block = part[sl] if i % m.sizes[m.index("tp")] == 0 else (g - part)[sl]
        out[r] = np.ascontiguousarray(block)
    return g, out, world


def _run_cases(rank: int, world: int) -> dict:
    from torch_backend import redistribute
    from torch_backend.dtypes import to_torch_dtype

    out: dict = {}
    for k, (name, src, mesh, dst, dst_mesh) in enumerate(CASES):
        _, xs, _ = inputs(src, mesh, k)
        dt = to_torch_dtype(parse(src).dtype)
        x = None if xs[rank] is None else torch.from_numpy(xs[rank]).to(dt)
        x0 = None if x is None else x.clone()
        y = redistribute(x, src, dst, mesh, dst_mesh=dst_mesh, timeout=20)
        out[name] = (None if y is None else y.float().numpy(), x is None or torch.equal(x, x0))
    # a bad call: rank 7 is off the source mesh but passes a tensor; every rank must fail,
    # and nothing may be in flight afterwards (the good call after it gets its own data)
    x = torch.zeros(4, 4) if rank in (0, 1, 2, 3, 7) else None
    try:
        redistribute(x, "f32[16@dp,4]", "f32[16,4@tp]", "dp=4@[0-3]", dst_mesh="tp=4@[4-7]", timeout=20)
        out["bad"] = "no error"
    except ValueError as e:
        out["bad"] = f"{type(e).__name__}: {e}"
    _, xs, _ = inputs("f32[16@dp,4]", "dp=4@[0-3]", 99)
    x = None if xs[rank] is None else torch.from_numpy(xs[rank])
    y = redistribute(x, "f32[16@dp,4]", "f32[16,4@tp]", "dp=4@[0-3]", dst_mesh="tp=4@[4-7]", timeout=20)
    out["after-bad"] = None if y is None else y.numpy()
    # prepared, called twice
    from torch_backend import redistributor

    f = redistributor("f32[16@dp,4]", "f32[16,4@tp]", "dp=4@[0-3]", dst_mesh="tp=4@[4-7]", timeout=20)
    out["prepared"] = [None if (y := f(x)) is None else y.numpy() for _ in range(2)]
    # gradients where both meshes cover the same ranks: upstream gradients drawn alike on every rank
    for name, src, dst in GRADS:
        _, xs, _ = inputs(src, "fsdp=8", 7)
        x = torch.from_numpy(xs[rank]).double().requires_grad_(True)
        y = redistribute(x, src, dst, "fsdp=8", dst_mesh="dp=2,tp=4", timeout=20)
        w = torch.from_numpy(upstream(dst)[rank])
        (gx,) = torch.autograd.grad(y, x, w)
        out[name] = gx.numpy()
    return out


GRADS = [("grad-reshape", "f64[8@fsdp,12]", "f64[8@dp,12@tp]"),
         ("grad-replicated", "f64[8@fsdp,12]", "f64[8,12@tp]{R:dp}")]


def upstream(dst: str) -> list[np.ndarray]:
    d, m = parse(dst), parse_mesh("dp=2,tp=4")
    rng = np.random.default_rng(5)
    return [rng.integers(-9, 9, size=shape).astype(np.float64) for shape in lowering.local_shapes(d, m)]


@pytest.fixture(scope="module")
def gloo_cross(gloo_pool) -> dict:
    return gloo_pool.run(_run_cases, timeout_s=150)


def _expected(src: str, mesh: str, dst: str, dst_mesh: str, seed: int) -> tuple[list, list]:
    g, xs, world = inputs(src, mesh, seed)
    p = lowering.CrossProgram(lowering.compile(src, dst, mesh, dst_mesh=dst_mesh))
    sim = lowering.simulate(p.program, xs[:p.world]) + [None] * (world - p.world)
    d, dm = parse(dst), parse_mesh(dst_mesh)
    oracle: list = [None] * world
    for r, sl in zip(dm.global_ranks, lowering.local_slices(d, dm), strict=True):
        oracle[r] = g[sl]
    if d.dtype == "bfloat16":  # what a bf16 block holds of the values
        oracle = [None if o is None else torch.from_numpy(o).bfloat16().float().numpy() for o in oracle]
    return sim, oracle


@pytest.mark.parametrize("k", range(len(CASES)), ids=[c[0] for c in CASES])
def test_cross_mesh_on_gloo(gloo_cross, k):
    name, src, mesh, dst, dst_mesh = CASES[k]
    sim, oracle = _expected(src, mesh, dst, dst_mesh, k)
    for rank in range(8):
        y, untouched = gloo_cross[rank][name]
        assert untouched, (name, rank)
        if oracle[rank] is None:
            assert y is None, (name, rank)
        else:
            assert y is not None, (name, rank)
            np.testing.assert_array_equal(y, oracle[rank], err_msg=f"{name} rank {rank}")
            np.testing.assert_array_equal(y, np.asarray(sim[rank], dtype=np.float32), err_msg=f"{name} rank {rank}")


def test_bad_call_fails_on_every_rank_before_any_message(gloo_cross):
    for rank in range(8):
        msg = gloo_cross[rank]["bad"]
        assert msg.startswith("SpecError"), (rank, msg)
        assert ("rank 7 is off the source mesh" in msg) if rank == 7 else \
            ("a cross-mesh call: the ranks do not agree on this call: rank 7 failed its checks (rank 7: rank 7 is "
             "off the source mesh" in msg), (rank, msg)
    _, oracle = _expected("f32[16@dp,4]", "dp=4@[0-3]", "f32[16,4@tp]", "tp=4@[4-7]", 99)
    for rank in range(8):
        y = gloo_cross[rank]["after-bad"]
        assert (y is None) == (oracle[rank] is None)
        if y is not None:
            np.testing.assert_array_equal(y, oracle[rank])


def test_prepared(gloo_cross):
    _, oracle = _expected("f32[16@dp,4]", "dp=4@[0-3]", "f32[16,4@tp]", "tp=4@[4-7]", 99)
    for rank in range(8):
        for y in gloo_cross[rank]["prepared"]:
            assert (y is None) == (oracle[rank] is None)
            if y is not None:
                np.testing.assert_array_equal(y, oracle[rank])


@pytest.mark.parametrize("name,src,dst", GRADS)
def test_gradient_on_the_same_ranks_reshaped(gloo_cross, name, src, dst):
    # the gradient's global value, from the definition: each upstream block added at the
    # place its rank holds (an R axis's replicas each hold a gradient of the same value)
    d, dm = parse(dst), parse_mesh("dp=2,tp=4")
    s, sm = parse(src), parse_mesh("fsdp=8")
    grad = np.zeros(s.shape)
    for sl, w in zip(lowering.local_slices(d, dm), upstream(dst), strict=True):
        grad[sl] += w
    for rank, sl in enumerate(lowering.local_slices(s, sm)):
        np.testing.assert_array_equal(gloo_cross[rank][name], grad[sl], err_msg=f"{name} rank {rank}")


def _groups_stay_in_step(rank: int, world: int) -> dict:
    """A pending sum finished on ranks 0-3 over tp ({0,1}, {2,3}), then a world mesh whose
    tp groups include those ranks with the same timeout, then its dp groups: torch names a
    group made by its members after how many groups each already has, so a group the
    cross-mesh call left on ranks 0-3 only would make ranks 4-7 one group ahead, and the dp
    groups ({0,2,4,6}, {1,3,5,7}) would never form."""
    import torch.distributed.distributed_c10d as c10d

    from torch_backend import redistribute

    t = 7.5  # a timeout no other test uses: its groups are new to this job
    _, xs, _ = inputs("f32[8,8@dp]{U:tp}", "dp=2,tp=2", 3)
    x = None if xs[rank] is None else torch.from_numpy(xs[rank])
    redistribute(x, "f32[8,8@dp]{U:tp}", "f32[8,8@tp]", "dp=2,tp=2", dst_mesh="tp=2@[4,5]", timeout=t)
    after_cross = len(c10d._world.pg_names)
    one = torch.full((8, 4), float(rank))
    summed = redistribute(one, "f32[8,4]{U:tp}", "f32[8,4]", "dp=4,tp=2", timeout=t)  # over tp
    gathered = redistribute(torch.full((2, 4), float(rank)), "f32[8@dp,4]", "f32[8,4]", "dp=4,tp=2", timeout=t)
    return {"after_cross": after_cross, "after": len(c10d._world.pg_names),
            "summed": summed.numpy(), "gathered": gathered.numpy()}


def test_later_groups_form_after_a_cross_mesh_finish(gloo_pool):
    got = gloo_pool.run(_groups_stay_in_step, timeout_s=60)
    assert len({got[r]["after_cross"] for r in range(8)}) == 1, got
    assert len({got[r]["after"] for r in range(8)}) == 1, got
    for r in range(8):
        pair = r - r % 2
        np.testing.assert_array_equal(got[r]["summed"], np.full((8, 4), pair + pair + 1.0))
        # gathered over dp among the ranks of r's tp coordinate: rank 2d + r%2 gave rows 2d, 2d+1
        want = np.repeat(np.arange(0.0, 8.0, 2.0) + r % 2, 2)[:, None] * np.ones((8, 4))
        np.testing.assert_array_equal(got[r]["gathered"], want)


# a state dict of mixed dtypes, fsdp=4 on ranks 0-3 -> two tp=2 replicas on ranks 4-7
MANY = [("f32[16@fsdp,8]", "f32[16,8@tp]{R:rep}"), ("bf16[8@fsdp]", "bf16[8]{R:(rep,tp)}"),
        ("f64[12@fsdp,6]", "f64[12@tp,6]{R:rep}"), ("i32[4@fsdp,3]", "i32[4,3]{R:(rep,tp)}")]


def _many_cases(rank: int, world: int) -> dict:
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.device_mesh import DeviceMesh

    from torch_backend import redistribute, redistribute_many
    from torch_backend.dtypes import to_torch_dtype

    out: dict = {}
    xs = []
    for k, (src, _) in enumerate(MANY):
        _, blocks, _ = inputs(src, "fsdp=4@[0-3]", 20 + k)
        dt = to_torch_dtype(parse(src).dtype)
        xs.append(None if blocks[rank] is None else torch.from_numpy(blocks[rank]).to(dt))
    ys = redistribute_many(xs, [s for s, _ in MANY], [d for _, d in MANY], "fsdp=4@[0-3]",
                           dst_mesh="rep=2,tp=2@[4-7]", timeout=20)
    out["many"] = [None if y is None else y.double().numpy() for y in ys]
    from torch_backend.prepared import redistributor_many

    joint = redistributor_many([s for s, _ in MANY], [d for _, d in MANY], "fsdp=4@[0-3]", "rep=2,tp=2@[4-7]",
                               timeout=20)
    out["joint"] = [[None if y is None else y.double().numpy() for y in joint(xs)] for _ in range(2)]
    # DTensor in, DTensor out: DeviceMeshes over the two rank sets, read as the meshes' ranks
    # (made without their own process groups, which a DTensor's local view does not need)
    src_dm = DeviceMesh("cpu", [0, 1, 2, 3], mesh_dim_names=("fsdp",), _init_backend=False)
    dst_dm = DeviceMesh("cpu", [[4, 5], [6, 7]], mesh_dim_names=("rep", "tp"), _init_backend=False)
    x = None
    if rank < 4:
        from torch.distributed.tensor import DTensor, Shard

        x = DTensor.from_local(torch.from_numpy(inputs("f32[16@fsdp,8]", "fsdp=4@[0-3]", 20)[1][rank]), src_dm,
                               [Shard(0)], run_check=False)
    y = redistribute(x, None if rank < 4 else "f32[16@fsdp,8]", "f32[16,8@tp]{R:rep}",
                     None if rank < 4 else src_dm, dst_mesh=dst_dm, timeout=20)
    out["dtensor"] = None if y is None else (type(y).__name__, [str(p) for p in y.placements],
                                             y.to_local().numpy(), y.full_tensor().numpy() if False else None)
    # a stated source type that is not the DTensor's layout: every rank fails before any message
    try:
        redistribute(x, "f32[16,8@fsdp]", "f32[16,8@tp]{R:rep}", None if rank < 4 else src_dm, dst_mesh=dst_dm,
                     timeout=20)
        out["dtensor-mismatch"] = "no error"
    except ValueError as e:
        out["dtensor-mismatch"] = f"{type(e).__name__}: {e}"
    # one rank asks for another destination: every rank fails before any message
    try:
        redistribute(xs[0], MANY[0][0], "f32[16,8@tp]" + ("" if rank == 5 else "{R:rep}"), "fsdp=4@[0-3]",
                     dst_mesh="rep=2,tp=2@[4-7]", timeout=20)
        out["differs"] = "no error"
    except ValueError as e:
        out["differs"] = f"{type(e).__name__}: {e}"
    out["groups"] = len(c10d._world.pg_names)
    return out


@pytest.fixture(scope="module")
def gloo_many(gloo_pool) -> dict:
    return gloo_pool.run(_many_cases, timeout_s=120)


def test_redistribute_many_across_meshes(gloo_many):
    for k, (src, dst) in enumerate(MANY):
        sim, oracle = _expected(src, "fsdp=4@[0-3]", dst, "rep=2,tp=2@[4-7]", 20 + k)
        for rank in range(8):
            for y in [gloo_many[rank]["many"][k]] + [call[k] for call in gloo_many[rank]["joint"]]:
                assert (y is None) == (oracle[rank] is None), (k, rank)
                if y is not None:
                    np.testing.assert_array_equal(y, oracle[rank], err_msg=f"{dst} rank {rank}")
                    np.testing.assert_array_equal(y, np.asarray(sim[rank], dtype=np.float64))


def test_dtensor_in_dtensor_out_across_meshes(gloo_many):
    _, oracle = _expected("f32[16@fsdp,8]", "fsdp=4@[0-3]", "f32[16,8@tp]{R:rep}", "rep=2,tp=2@[4-7]", 20)
    for rank in range(8):
        got = gloo_many[rank]["dtensor"]
        if rank < 4:
            assert got is None
            continue
        name, placements, local, _ = got
        assert name == "DTensor" and placements == ["R", "S(1)"], got
        np.testing.assert_array_equal(local, oracle[rank])


def test_a_different_call_on_one_rank_fails_everywhere(gloo_many):
    # every rank names the odd rank and says what it passed, and what the others passed,
    # as the one-mesh agreement does (the one agreement protocol, torch_backend.agree)
    for rank in range(8):
        msg = gloo_many[rank]["differs"]
        assert msg.startswith("SpecError: a cross-mesh call: the ranks do not agree on this call: rank 5 passed "
                              "float32[16@fsdp,8] on mesh fsdp=4 -> float32[16,8@tp] on mesh rep=2,tp=2@[4-7]; "
                              "the other 7 ranks passed float32[16@fsdp,8] on mesh fsdp=4 -> "
                              "float32[16,8@tp]{R:rep} on mesh rep=2,tp=2@[4-7]"), (rank, msg)
        assert "see the error on rank 5" in msg and "False" not in msg, (rank, msg)
    assert len({gloo_many[r]["groups"] for r in range(8)}) == 1


def test_one_message_per_pair_of_ranks_and_round():
    from torch_backend.cross_rounds import rounds

    programs = [lowering.CrossProgram(lowering.compile(s, d, "fsdp=4@[0-3]", dst_mesh="rep=2,tp=2@[4-7]"))
                for s, d in MANY]
    for me in range(8):
        joint = rounds(programs, me)
        alone = [rounds([p], me) for p in programs]
        assert len(joint) == max(len(a) for a in alone)
        for k, rnd in enumerate(joint):
            for side in ("sends", "recvs"):
                peers = [m.peer for m in getattr(rnd, side)]
                assert len(peers) == len(set(peers))  # one message a peer
                assert set(peers) == {m.peer for a in alone if k < len(a) for m in getattr(a[k], side)}
                for m in getattr(rnd, side):  # every piece aligned for its dtype, back to back
                    at = 0
                    for pc in m.pieces:
                        assert pc.offset == at and pc.offset % programs[pc.i].src.itemsize == 0
                        at += pc.nbytes
                    assert at == m.nbytes


def test_a_piece_lands_in_place_only_where_it_is_one_run_of_the_output():
    from torch_backend.cross_rounds import output_run

    rng = np.random.default_rng(0)
    at = ((2, 6), (10, 13), (0, 4))  # the output's global box, shape (4, 3, 4)
    out = torch.arange(48.0).view(4, 3, 4)
    for _ in range(300):
        box = tuple((int(lo), int(lo + rng.integers(1, hi - lo + 1))) for lo, hi in
                    ((int(rng.integers(a, b)), b) for a, b in at))
        sl = tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(box, at))
        flat = np.arange(48).reshape(4, 3, 4)[sl].ravel()
        one_run = bool(np.array_equal(flat, np.arange(flat[0], flat[0] + flat.size)))
        run = output_run((at, out), box)
        assert (run is not None) == one_run, box
        if run is not None:
            np.testing.assert_array_equal(run.numpy(), out[sl].reshape(-1).numpy())
    assert output_run((at, out), ((0, 2), (10, 13), (0, 4))) is None  # not inside the output


def _across_a_new_world(rank: int, world: int, path: str) -> dict:
    """The same cross-mesh finish before and after the world is destroyed and made again:
    the groups kept for it belong to the old world and must not be used in the new one."""
    from datetime import timedelta

    from torch_backend import redistribute

    def move() -> np.ndarray | None:
        _, xs, _ = inputs("f32[8,8@dp]{U:tp}", "dp=2,tp=2", 3)
        x = None if xs[rank] is None else torch.from_numpy(xs[rank])
        y = redistribute(x, "f32[8,8@dp]{U:tp}", "f32[8,8@tp]", "dp=2,tp=2", dst_mesh="tp=2@[4,5]", timeout=9)
        return None if y is None else y.numpy()

    first = move()
    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    second = move()
    gathered = redistribute(torch.full((2, 4), float(rank)), "f32[8@dp,4]", "f32[8,4]", "dp=4,tp=2", timeout=9)
    return {"first": first, "second": second, "gathered": gathered.numpy()}


def test_a_new_world_gets_new_groups(tmp_path):
    import functools

    from torch_utils import run_once

    got = run_once(8, functools.partial(_across_a_new_world, path=str(tmp_path / "store")),
                   collective_timeout_s=30, timeout_s=90)
    _, oracle = _expected("f32[8,8@dp]{U:tp}", "dp=2,tp=2", "f32[8,8@tp]", "tp=2@[4,5]", 3)
    for r in range(8):
        for y in (got[r]["first"], got[r]["second"]):
            assert (y is None) == (oracle[r] is None), r
            if y is not None:
                np.testing.assert_array_equal(y, oracle[r])
        want = np.repeat(np.arange(0.0, 8.0, 2.0) + r % 2, 2)[:, None] * np.ones((8, 4))
        np.testing.assert_array_equal(got[r]["gathered"], want)


def test_a_dtensor_that_is_not_its_stated_type_fails_everywhere(gloo_many):
    for rank in range(8):
        msg = gloo_many[rank]["dtensor-mismatch"]
        assert msg.startswith("SpecError"), (rank, msg)
        assert ("does not match the DTensor" in msg) if rank < 4 else ("ranks [0, 1, 2, 3] failed their checks" in msg
                                                                       and "see the error on ranks [0, 1, 2, 3]" in msg), \
            (rank, msg)


# gradients across meshes over different rank sets: (name, src, mesh, dst, dst_mesh); rank 1
# is on both meshes of the overlap, ranks 4-7 on neither of the first two
ACROSS = [
    ("pipeline", "f32[8@dp,4]", "dp=2@[0,1]", "f32[8,4@tp]", "tp=2@[2,3]"),
    ("replicated-overlap", "f32[8@dp,4]", "dp=2@[0,1]", "f32[8,4]{R:rep}", "rep=2@[1,2]"),
    ("weight-sync", "f32[16@fsdp,8]", "fsdp=4@[0-3]", "f32[16,8@tp]{R:rep}", "rep=2,tp=2@[4-7]"),
]


def upstream_across(dst: str, dst_mesh: str, seed: int) -> list[np.ndarray | None]:
    """The destination ranks' upstream gradients (integers: every sum exact), None elsewhere."""
    d, dm = parse(dst), parse_mesh(dst_mesh)
    rng = np.random.default_rng(seed)
    out: list[np.ndarray | None] = [None] * 8
    for r, shape in zip(dm.global_ranks, lowering.local_shapes(d, dm), strict=True):
        out[r] = rng.integers(-9, 9, size=shape).astype(np.float32)
    return out


def _backward_across(rank: int, y, w: np.ndarray | None, sum_stand_in: bool) -> None:
    """This rank's part of the backward: a destination rank from its upstream gradient, a
    rank only on the source mesh from its stand-in."""
    if w is not None:
        torch.autograd.backward(y, torch.from_numpy(w))
    elif sum_stand_in:
        y.sum().backward()
    else:
        torch.autograd.backward(y, y.new_empty(0))


def _grad_across_cases(rank: int, world: int) -> dict:
    import torch.distributed.distributed_c10d as c10d

    from torch_backend import redistribute, redistributor

    out: dict = {}
    for k, (name, src, mesh, dst, dst_mesh) in enumerate(ACROSS):
        _, xs, _ = inputs(src, mesh, 40 + k)
        x = None if xs[rank] is None else torch.from_numpy(xs[rank]).requires_grad_(True)
        y = redistribute(x, src, dst, mesh, dst_mesh=dst_mesh, timeout=20)
        got = None if y is None else (tuple(y.shape), y.dtype == torch.float32, y.requires_grad,
                                      y.detach().numpy().copy())
        if y is not None:
            out.setdefault("grad_fns", set()).add(type(y.grad_fn).__name__)
            _backward_across(rank, y, upstream_across(dst, dst_mesh, 50 + k)[rank], sum_stand_in=k == 0)
        out[name] = (got, None if x is None else x.grad.numpy(), x is None or np.array_equal(x.detach(), xs[rank]))
    # prepared with requires_grad=True, called twice (a fresh block each time)
    name, src, mesh, dst, dst_mesh = ACROSS[2]
    f = redistributor(src, dst, mesh, timeout=20, dst_mesh=dst_mesh, requires_grad=True)
    out["prepared"] = []
    for _ in range(2):
        _, xs, _ = inputs(src, mesh, 42)
        x = None if xs[rank] is None else torch.from_numpy(xs[rank]).requires_grad_(True)
        y = f(x)
        if y is not None:
            _backward_across(rank, y, upstream_across(dst, dst_mesh, 52)[rank], sum_stand_in=False)
        out["prepared"].append((None if y is None else y.detach().numpy().copy(), None if x is None else x.grad.numpy()))
    # DTensor in, DTensor out: the gradient reaches the local block under the source DTensor
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    src_dm = DeviceMesh("cpu", [0, 1, 2, 3], mesh_dim_names=("fsdp",), _init_backend=False)
    dst_dm = DeviceMesh("cpu", [[4, 5], [6, 7]], mesh_dim_names=("rep", "tp"), _init_backend=False)
    _, xs, _ = inputs(src, mesh, 42)
    local = None if xs[rank] is None else torch.from_numpy(xs[rank]).requires_grad_(True)
    x = None if local is None else DTensor.from_local(local, src_dm, [Shard(0)], run_check=False)
    y = redistribute(x, None if rank < 4 else src, dst, None if rank < 4 else src_dm, dst_mesh=dst_dm, timeout=20)
    if rank >= 4:
        torch.autograd.backward(y.to_local(), torch.from_numpy(upstream_across(dst, dst_mesh, 52)[rank]))
    else:
        torch.autograd.backward(y, y.new_empty(0))
    out["dtensor"] = (type(y).__name__, None if rank >= 4 else local.grad.numpy())
    # bad calls fail on every rank before any message: a block that requires grad on rank 0
    # only; a destination rank (3) under no_grad while the source blocks require grad
    name, src, mesh, dst, dst_mesh = ACROSS[0]
    for bad, wants, no_grad_on in (("mixed", (0,), ()), ("no-grad-dst", (0, 1), (3,))):
        x = torch.zeros(4, 4, requires_grad=rank in wants) if rank < 2 else None
        try:
            with torch.set_grad_enabled(rank not in no_grad_on):
                redistribute(x, src, dst, mesh, dst_mesh=dst_mesh, timeout=20)
            out[bad] = "no error"
        except ValueError as e:
            out[bad] = f"{type(e).__name__}: {e}"
    # a joint call whose source ranks differ in which of its blocks require grad
    from torch_backend import redistribute_many

    xs = [torch.zeros(4, 4, requires_grad=rank == i) if rank < 2 else None for i in range(2)]
    try:
        redistribute_many(xs, [src, src], [dst, dst], mesh, dst_mesh=dst_mesh, timeout=20)
        out["joint-differs"] = "no error"
    except ValueError as e:
        out["joint-differs"] = f"{type(e).__name__}: {e}"
    out["groups"] = len(c10d._world.pg_names)
    # a mesh over the whole world still forms its groups (over dp: {0,2,4,6}, {1,3,5,7})
    out["gathered"] = redistribute(torch.full((2, 4), float(rank)), "f32[8@dp,4]", "f32[8,4]", "dp=4,tp=2",
                                   timeout=20).numpy()
    return out


@pytest.fixture(scope="module")
def gloo_across(gloo_pool) -> dict:
    return gloo_pool.run(_grad_across_cases, timeout_s=120)


def _grad_oracle(src: str, mesh: str, dst: str, dst_mesh: str, seed: int, wseed: int) -> tuple[list, list, list]:
    """(this move's upstream gradients, the gradient on each source rank from the
    definition, the same from ``lowering.simulate`` of the backward program)."""
    from spec_lang.dual import dual_type

    w = upstream_across(dst, dst_mesh, wseed)
    s, m, d, dm = parse(src), parse_mesh(mesh), parse(dst), parse_mesh(dst_mesh)
    # the gradient's global value: each destination rank's upstream block added where it sits
    # (the replicas over an R axis each add theirs: the gradient of a replicated value is a sum)
    grad = np.zeros(s.shape)
    for r, sl in zip(dm.global_ranks, lowering.local_slices(d, dm), strict=True):
        grad[sl] += w[r]
    want: list = [None] * 8
    for r, sl in zip(m.global_ranks, lowering.local_slices(s, m), strict=True):
        want[r] = grad[sl]
    back = lowering.CrossProgram(lowering.compile(dual_type(d), dual_type(s), dm, dst_mesh=m))
    sim = lowering.simulate(back.program, w[:back.world]) + [None] * (8 - back.world)
    return w, want, sim


@pytest.mark.parametrize("k", range(len(ACROSS)), ids=[c[0] for c in ACROSS])
def test_gradient_across_meshes_over_different_ranks(gloo_across, k):
    name, src, mesh, dst, dst_mesh = ACROSS[k]
    sim_fwd, oracle = _expected(src, mesh, dst, dst_mesh, 40 + k)
    _, xs, _ = inputs(src, mesh, 40 + k)
    w, want, sim = _grad_oracle(src, mesh, dst, dst_mesh, 40 + k, 50 + k)
    on_src, on_dst = parse_mesh(mesh).global_ranks, parse_mesh(dst_mesh).global_ranks
    lhs = rhs = 0.0  # the adjoint identity <F x, w> = <x, B w> (no I axis: plain sums over ranks)
    for rank in range(8):
        got, gx, untouched = gloo_across[rank][name]
        assert untouched, (name, rank)
        if rank in on_dst:
            shape, f32, requires_grad, y = got
            assert requires_grad and f32, (name, rank)
            np.testing.assert_array_equal(y, oracle[rank], err_msg=f"{name} rank {rank}")
            np.testing.assert_array_equal(y, sim_fwd[rank])
            lhs += float((y.astype(np.float64) * w[rank]).sum())
        elif rank in on_src:  # the stand-in the rank's backward starts from
            assert got[:3] == ((0,), True, True), (name, rank, got)
        else:
            assert got is None, (name, rank)
        assert (gx is None) == (rank not in on_src), (name, rank)
        if gx is not None:
            np.testing.assert_array_equal(gx, want[rank], err_msg=f"{name} rank {rank}")
            np.testing.assert_array_equal(gx, sim[rank], err_msg=f"{name} rank {rank}")
            rhs += float((xs[rank].astype(np.float64) * gx).sum())
    assert lhs == rhs != 0.0, (name, lhs, rhs)


def test_a_move_across_meshes_records_the_one_autograd_function(gloo_across, fake_pg):
    # the same Function as every call on one mesh (bound._Run, through BoundCall.call_across), not one of its own
    from torch_utils import local_mode, to_local

    import torch_backend

    with local_mode(fake_pg, 2) as lm:
        y = torch_backend.redistribute(to_local(lm, [torch.ones(2, 2)] * 2, requires_grad=True), "f32[4@dp,2]",
                                       "f32[4,2]", "dp=2")
    one_mesh = type(y.grad_fn).__name__
    for rank in range(8):
        assert gloo_across[rank].get("grad_fns") == {one_mesh}, (rank, gloo_across[rank]["grad_fns"], one_mesh)


def test_prepared_gradient_across_meshes(gloo_across):
    name, src, mesh, dst, dst_mesh = ACROSS[2]
    _, oracle = _expected(src, mesh, dst, dst_mesh, 42)
    _, want, _ = _grad_oracle(src, mesh, dst, dst_mesh, 42, 52)
    for rank in range(8):
        for y, gx in gloo_across[rank]["prepared"]:
            if rank < 4:
                assert y is not None and y.shape == (0,)
                np.testing.assert_array_equal(gx, want[rank])
            else:
                np.testing.assert_array_equal(y, oracle[rank])
                assert gx is None


def test_gradient_from_dtensor_to_dtensor_across_meshes(gloo_across):
    name, src, mesh, dst, dst_mesh = ACROSS[2]
    _, want, _ = _grad_oracle(src, mesh, dst, dst_mesh, 42, 52)
    for rank in range(8):
        kind, gx = gloo_across[rank]["dtensor"]
        assert kind == ("Tensor" if rank < 4 else "DTensor"), (rank, kind)  # the stand-in is a plain tensor
        if rank < 4:
            np.testing.assert_array_equal(gx, want[rank], err_msg=f"rank {rank}")


def test_a_gradient_wrong_on_one_rank_fails_everywhere(gloo_across):
    for rank in range(8):
        mixed, dst_off = gloo_across[rank]["mixed"], gloo_across[rank]["no-grad-dst"]
        assert mixed.startswith("SpecError") and "rank(s) [1] of the source mesh" in mixed, (rank, mixed)
        assert dst_off.startswith("SpecError") and "rank(s) [3] of the destination mesh" in dst_off, (rank, dst_off)
        differs = gloo_across[rank]["joint-differs"]
        assert differs.startswith("SpecError") and "differ in which blocks require grad (rank(s) [0], rank(s) [1]" \
            in differs, (rank, differs)
    assert len({gloo_across[r]["groups"] for r in range(8)}) == 1
    for r in range(8):
        want = np.repeat(np.arange(0.0, 8.0, 2.0) + r % 2, 2)[:, None] * np.ones((8, 4))
        np.testing.assert_array_equal(gloo_across[r]["gathered"], want)


# a joint move whose float tensors carry gradients and whose others do not (the i32 cannot,
# the bf16 is detached), trainer -> replicas; and one whose every tensor carries one, from
# stage k to stage k+1
JOINT = [("f32[16@fsdp,8]", "f32[16,8@tp]{R:rep}", True), ("i32[4@fsdp,3]", "i32[4,3]{R:(rep,tp)}", False),
         ("f64[12@fsdp,6]", "f64[12@tp,6]{R:rep}", True), ("bf16[8@fsdp]", "bf16[8]{R:(rep,tp)}", False)]
JOINT_MESHES = ("fsdp=4@[0-3]", "rep=2,tp=2@[4-7]")
STAGES = [("f32[8@dp,4]", "f32[8,4@tp]", True), ("f64[6,4@dp]", "f64[6@tp,4]", True)]
STAGE_MESHES = ("dp=2@[0,1]", "tp=2@[2,3]")


def _joint_grad(rank: int, cases: list, meshes: tuple[str, str], seed: int) -> tuple[list, list]:
    from torch_backend import redistribute_many
    from torch_backend.dtypes import to_torch_dtype

    mesh, dst_mesh = meshes
    xs = []
    for k, (src, _, grad) in enumerate(cases):
        _, blocks, _ = inputs(src, mesh, seed + k)
        x = None if blocks[rank] is None else torch.from_numpy(blocks[rank]).to(to_torch_dtype(parse(src).dtype))
        xs.append(x.requires_grad_(True) if x is not None and grad else x)
    ys = redistribute_many(xs, [s for s, _, _ in cases], [d for _, d, _ in cases], mesh, dst_mesh=dst_mesh,
                           timeout=20)
    out = [None if y is None else (tuple(y.shape), y.requires_grad, y.detach().double().numpy()) for y in ys]
    carried = [(y, k) for k, (y, (_, _, grad)) in enumerate(zip(ys, cases)) if grad and y is not None]
    if rank in parse_mesh(dst_mesh).global_ranks:
        ws = [upstream_across(cases[k][1], dst_mesh, seed + 10 + k)[rank] for _, k in carried]
        torch.autograd.backward([y for y, _ in carried],
                                [torch.from_numpy(w).to(y.dtype) for (y, _), w in zip(carried, ws)])
    elif carried:  # the stand-ins: one is enough, the other's gradient is then zero
        carried[-1][0].sum().backward()
    return out, [None if x is None or not x.requires_grad else x.grad.double().numpy() for x in xs]


def _joint_grad_cases(rank: int, world: int) -> dict:
    return {"joint": _joint_grad(rank, JOINT, JOINT_MESHES, 60), "stages": _joint_grad(rank, STAGES, STAGE_MESHES, 70)}


@pytest.fixture(scope="module")
def gloo_joint_grad(gloo_pool) -> dict:
    return gloo_pool.run(_joint_grad_cases, timeout_s=90)


@pytest.mark.parametrize("which,cases,meshes,seed", [("joint", JOINT, JOINT_MESHES, 60),
                                                     ("stages", STAGES, STAGE_MESHES, 70)], ids=["joint", "stages"])
def test_gradient_through_a_joint_move_across_meshes(gloo_joint_grad, which, cases, meshes, seed):
    mesh, dst_mesh = meshes
    on_src, on_dst = parse_mesh(mesh).global_ranks, parse_mesh(dst_mesh).global_ranks
    for k, (src, dst, grad) in enumerate(cases):
        _, oracle = _expected(src, mesh, dst, dst_mesh, seed + k)
        _, want, sim = _grad_oracle(src, mesh, dst, dst_mesh, seed + k, seed + 10 + k)
        for rank in range(8):
            ys, gxs = gloo_joint_grad[rank][which]
            y, gx = ys[k], gxs[k]
            if rank in on_dst:
                assert y[1] == grad, (which, k, rank)  # only a tensor that carries a gradient requires grad
                np.testing.assert_array_equal(y[2], oracle[rank], err_msg=f"{which} {k} rank {rank}")
            elif rank in on_src and grad:
                assert y[:2] == ((0,), True), (which, k, rank, y)
            else:
                assert y is None, (which, k, rank)
            assert (gx is not None) == (grad and rank in on_src), (which, k, rank)
            if gx is not None:
                np.testing.assert_array_equal(gx, want[rank], err_msg=f"{which} {k} rank {rank}")
                np.testing.assert_array_equal(gx, sim[rank], err_msg=f"{which} {k} rank {rank}")
