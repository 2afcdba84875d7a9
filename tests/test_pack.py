"""Pack and unpack: the folded copy plans move exactly the elements the pieces name, the
send buffer is a view where the pieces are one run, narrow runs keep their bits, and a
prepared program's reused buffers never show through in a result. CUDA tests skip
cleanly where no GPU is visible."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from soak_cases import random_redistributions  # noqa: E402
from torch_utils import as_numpy, from_local, local_mode, random_blocks, to_local  # noqa: E402

import lowering  # noqa: E402
import torch_backend  # noqa: E402
from lowering.kinds import rank_pieces  # noqa: E402
from lowering.kinds.copies import Copy, View, as_run, plan_copies  # noqa: E402
from lowering.simulator import simulate  # noqa: E402
from spec_lang import parse, parse_mesh  # noqa: E402
from torch_backend.collectives import _receive_into, _unpack_exchange, pack_exchange  # noqa: E402
from torch_backend.strided import run_copies  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")
FakePG = Callable[[int], None]


def _pack_per_piece(plan, t: torch.Tensor) -> torch.Tensor:
    parts = [t[p.src].reshape(-1) for p in plan.send if p.numel]
    return torch.cat(parts) if parts else t.new_empty(0)


def _unpack_per_piece(plan, t: torch.Tensor, recv: torch.Tensor) -> torch.Tensor:
    y = torch.full(plan.out_shape, -1, dtype=t.dtype)
    sp = plan.self_piece
    if sp.numel:
        y[sp.dst] = t[sp.src]
    off = 0
    for p in plan.recv:
        if p.numel:
            y[p.dst] = recv[off:off + p.numel].view(p.shape)
            off += p.numel
    return y


def _steps(kinds: tuple[str, ...], n: int = 80, seed: int = 11):
    for m, s, d in random_redistributions(n, seed=seed):
        mesh = parse_mesh(m)
        for step in lowering.compile(parse(s), parse(d), mesh).steps:
            if step.kind in kinds:
                yield step, mesh


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.float64])
def test_exchange_copy_plans_match_per_piece(dtype: torch.dtype) -> None:
    seen = 0
    for step, mesh in _steps(("all_to_all", "permute")):
        for r in range(mesh.size):
            plan = rank_pieces(step, mesh, r)
            x = torch.arange(int(np.prod(plan.in_shape)), dtype=torch.int64).to(dtype).view(plan.in_shape)
            assert torch.equal(pack_exchange(plan, x), _pack_per_piece(plan, x)), step.describe()
            recv = torch.arange(plan.recv_elems, dtype=torch.int64).to(dtype) + 3
            want = _unpack_per_piece(plan, x, recv)
            assert torch.equal(_unpack_exchange(plan, x, recv), want), step.describe()
            y, landing = _receive_into(plan, x)  # a real group's receive: in place where it can
            landing.copy_(recv)
            assert torch.equal(_unpack_exchange(plan, x, landing, y), want), step.describe()
            seen += 1
    assert seen > 50


@pytest.mark.parametrize("mesh_text,src,dst", [
    ("x=8", "f32[32768@x,64]", "f32[32768,64@x]"),  # narrow column pieces: wide elements
    ("x=8", "f32[32768@x,8]", "f32[32768,8@x]"),  # one-element columns: a transposing pack
    ("dp=2,tp=4", "f32[4096,64@(dp,tp),16]", "f32[4096,64,16@(dp,tp)]"),  # interleaved peers in the output
    ("dp=2,tp=4", "f32[8@dp,30000@tp,10]", "f32[8,30000,10@(dp,tp)]"),  # odd strides
    ("x=4", "f64[65536,6@x]", "f64[65536@x,6]"),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.bfloat16, torch.int8, torch.bool])
def test_large_blocks_take_the_fast_paths_and_match(mesh_text: str, src: str, dst: str, dtype: torch.dtype) -> None:
    """Blocks big enough for the column-by-column copies and wide elements."""
    mesh = parse_mesh(mesh_text)
    for step in lowering.compile(parse(src), parse(dst), mesh).steps:
        if step.kind not in ("all_to_all", "permute"):
            continue
        for r in range(mesh.size):
            plan = rank_pieces(step, mesh, r)
            x = torch.randint(-100, 100, plan.in_shape).to(dtype)
            recv = torch.randint(-100, 100, (plan.recv_elems,)).to(dtype)
            assert torch.equal(pack_exchange(plan, x), _pack_per_piece(plan, x))
            assert torch.equal(_unpack_exchange(plan, x, recv), _unpack_per_piece(plan, x, recv))


def test_regular_exchange_folds_to_two_copies_and_a_run_is_a_view() -> None:
    mesh = parse_mesh("x=8")
    step = lowering.compile(parse("f32[64@x,64]"), parse("f32[64,64@x]"), mesh).steps[0]
    for r in range(8):
        plan = rank_pieces(step, mesh, r)
        assert len(plan.pack_copies) <= 2 and len(plan.unpack_copies) <= 2  # before and after the own piece
    # S(1) -> S(0) on rows: each peer's piece is a run of the input, back to back
    step = lowering.compile(parse("f32[64,64@x]"), parse("f32[64@x,64]"), mesh).steps[0]
    plan = rank_pieces(step, mesh, 0)
    x = torch.randn(plan.in_shape)
    if as_run(plan.pack_copies, plan.send_elems) is not None:
        send = pack_exchange(plan, x)
        assert send.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert torch.equal(pack_exchange(plan, x), _pack_per_piece(plan, x))


def test_fold_steps_and_runs() -> None:
    # three (2, 3) boxes of a [2, 12] block, 3 apart, into a flat buffer 6 apart
    pairs = [(View(3 * k, (2, 3), (12, 1)), View(6 * k, (2, 3), (3, 1))) for k in (1, 2, 3)]
    (c,) = plan_copies(pairs)
    assert c == Copy(View(3, (3, 2, 3), (3, 12, 1)), View(6, (3, 2, 3), (6, 3, 1)))
    # back-to-back runs merge into one run
    (c,) = plan_copies([(View(10 + 4 * k, (4,), (1,)), View(4 * k, (4,), (1,))) for k in range(5)])
    assert c == Copy(View(10, (20,), (1,)), View(0, (20,), (1,)))
    assert as_run([c], 20) == 10 and as_run([c], 21) is None and as_run([c], 20, into=True) is None
    assert plan_copies([(View(0, (0, 3), (3, 1)), View(0, (0, 3), (3, 1)))]) == ()


def test_narrow_runs_keep_their_bits() -> None:
    """Rows of 2 float32s are copied as one int64 each: NaN payloads must survive."""
    bits = torch.randint(-2**31, 2**31 - 1, (4096,), dtype=torch.int32)
    bits[:4] = torch.tensor([0x7F800001, 0x7FC00001, 0x7FBFFFFF, -1], dtype=torch.int32)
    src = bits.view(torch.float32)
    dst = torch.zeros(4096 * 2)
    (c,) = plan_copies([(View(0, (2048, 2), (2, 1)), View(2, (2048, 2), (4, 1)))])
    run_copies([c], src, dst)
    got = dst.view(torch.int32).view(2048, 4)[:, 2:].reshape(-1)
    assert torch.equal(got, bits)
    assert torch.equal(dst.view(2048, 4)[:, :2], torch.zeros(2048, 2))


_BITS_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.bool,
                torch.int16, torch.int32, torch.int64, torch.complex64, torch.complex128] + [
    getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32") if hasattr(torch, n)]


def _random_bits(n: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """``n`` elements of random bits (NaN payloads, negative zeros, subnormals included); bools 0 or 1."""
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).to(torch.bool)
    raw = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=g)
    return raw.view(dtype)


def _window(pool: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    """``n`` random elements: a window of ``pool`` at a random start (a view). Drawing every
    buffer's bytes anew took most of the test's time (torch draws bytes one by one), and a
    random window of random bits is as random."""
    start = int(torch.randint(0, pool.numel() - n + 1, (), generator=g))
    return pool[start:start + n]


@functools.lru_cache(maxsize=16)  # a view recurs across the storage offsets and both directions
def _flat_indices(v: View) -> torch.Tensor:
    """Every element's flat index in ``v``, in its order."""
    idx = torch.full((), v.offset, dtype=torch.int64)
    for n, st in zip(v.size, v.stride):
        idx = idx.unsqueeze(-1) + torch.arange(n) * st
    return idx.reshape(-1)


def _by_index(c: Copy, src: torch.Tensor, dst: torch.Tensor) -> None:
    """The simple path: every element's flat index computed and moved one by one, as bytes."""
    item = dst.element_size()
    s8 = src.untyped_storage()
    d8 = dst.view(torch.uint8).view(-1, item) if dst.numel() else dst.view(torch.uint8)
    sb = torch.empty(0, dtype=torch.uint8).set_(s8).view(-1, item)
    d8[_flat_indices(c.dst)] = sb[_flat_indices(c.src) + src.storage_offset()]


def _extent(v: View) -> int:
    if 0 in v.size:
        return v.offset
    return v.offset + sum((n - 1) * st for n, st in zip(v.size, v.stride)) + 1


@pytest.mark.parametrize("dtype", _BITS_DTYPES)
def test_copies_as_other_dtypes_keep_every_bit(dtype: torch.dtype) -> None:
    """Large CPU copies run as wider or unsigned integers, split by columns or not; whatever
    the path, each moves exactly the simple per-element path's bytes: odd storage offsets,
    run lengths that no wide element tiles, rows of 1 to 9 elements, zero-size copies."""
    g = torch.Generator().manual_seed(dtype.itemsize * 7 + len(str(dtype)))
    rows = 5000  # past the size where the integer views and the column split start
    pool = _random_bits(2 * rows * 21 + 64, dtype, g)  # twice the longest buffer (k = 9, stride 2k + 3)
    for k in range(1, 10):
        for stride in (k, k + 1, 2 * k, 2 * k + 3):
            for so, do in ((0, 0), (1, 0), (0, 3), (2, 2), (4, 8)):
                off = (so + do + k) % 3 * (stride - k)  # the first or last columns of the row, or aligned
                for c in (Copy(View(off, (rows, k), (stride, 1)), View(3, (rows, k), (k, 1))),  # pack-like
                          Copy(View(3, (rows, k), (k, 1)), View(off, (rows, k), (stride, 1))),  # unpack-like
                          Copy(View(off, (k, rows), (1, stride)), View(0, (k, rows), (rows, 1))),  # transposing
                          Copy(View(off, (0, k), (stride, 1)), View(0, (0, k), (k, 1)))):  # zero-size
                    src = _window(pool, so + _extent(c.src) + 5, g).clone()[so:]  # storage offset so
                    dst = _window(pool, do + _extent(c.dst) + 5, g)  # only read: both results are copies
                    fast, ref = dst.clone()[do:], dst.clone()[do:]
                    run_copies([c], src, fast)
                    _by_index(c, src, ref)
                    assert torch.equal(fast.view(torch.uint8), ref.view(torch.uint8)), (k, stride, so, do, c)


def test_gather_and_scatter_copy_plans(fake_pg: FakePG) -> None:
    cases = [("dp=2,tp=4", "f64[8,12@tp]", "f64[8,12]"), ("dp=2,tp=4", "f64[10@(dp,tp),3]", "f64[10,3]"),
             ("x=4", "f64[6,4@x,3]", "f64[6,4,3]"), ("dp=2,tp=4", "f64[8,12]{U:tp}", "f64[8,12@tp]"),
             ("x=4", "f64[5,7]{U:x}", "f64[5,7@x]")]
    for m, s, d in cases:
        mesh = parse_mesh(m)
        program = lowering.compile(parse(s), parse(d), mesh)
        blocks = random_blocks(program.src, mesh, np.random.default_rng(1))
        want = simulate(program, as_numpy(blocks))
        with local_mode(fake_pg, mesh.size) as lm:
            got = from_local(torch_backend.redistribute(to_local(lm, blocks), s, d, m))
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w)


def test_prepared_reuses_buffers_but_results_stay(fake_pg: FakePG) -> None:
    cases = [c for c in random_redistributions(60, seed=7)
             if any(st.kind in ("all_to_all", "all_gather", "reduce_scatter")
                    for st in lowering.compile(parse(c[1]), parse(c[2]), parse_mesh(c[0])).steps)][:12]
    assert cases
    reused = 0
    for i, (m, s, d) in enumerate(cases):
        mesh = parse_mesh(m)
        program = lowering.compile(parse(s), parse(d), mesh)
        rng = np.random.default_rng(i)
        b1 = random_blocks(program.src, mesh, rng)
        b2 = random_blocks(program.src, mesh, rng)
        with local_mode(fake_pg, mesh.size) as lm:
            f = torch_backend.redistributor(s, d, m)
            y1 = f(to_local(lm, b1))
            bufs = dict(f._bound.scratch._local.__dict__.get("bufs", {}))
            y2 = f(to_local(lm, b2))
            after = f._bound.scratch._local.__dict__.get("bufs", {})
            got1, got2 = from_local(y1), from_local(y2)
        assert bufs.keys() == after.keys() and all(bufs[k] is after[k] for k in bufs), "a buffer was remade"
        reused += bool(bufs)
        for g, w in zip(got1, simulate(program, as_numpy(b1))):
            np.testing.assert_array_equal(g.numpy(), w)
        for g, w in zip(got2, simulate(program, as_numpy(b2))):
            np.testing.assert_array_equal(g.numpy(), w)
    assert reused


# ---- CUDA ------------------------------------------------------------------------------


@needs_cuda
def test_copy_plans_on_cuda_match_cpu() -> None:
    for step, mesh in _steps(("all_to_all", "permute"), n=30):
        plan = rank_pieces(step, mesh, 0)
        x = torch.randn(plan.in_shape, dtype=torch.float64)
        recv = torch.randn(plan.recv_elems, dtype=torch.float64)
        torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
        try:
            send_c = pack_exchange(plan, x.cuda())
            y_c = _unpack_exchange(plan, x.cuda(), recv.cuda())
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.equal(send_c.cpu(), pack_exchange(plan, x))
        assert torch.equal(y_c.cpu(), _unpack_exchange(plan, x, recv))


_GRAPH = r"""
import datetime, os, torch, torch.distributed as dist
import torch_backend
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29533"))
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
f = torch_backend.redistributor("f32[64@dp,32]", "f32[64,32@dp]", "dp=1")
x = torch.randn(64, 32, device="cuda")
torch.cuda.set_sync_debug_mode("error")  # no host synchronisation inside the program
want = f(x)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    f(x)  # warm-up: the prepared program's buffers are made here, outside the capture
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = f(x)
torch.cuda.set_sync_debug_mode("default")
x.copy_(torch.randn(64, 32, device="cuda"))
g.replay()
torch.cuda.synchronize()
assert torch.equal(y, f(x)), "replay differs"
dist.destroy_process_group()
print("ok")
"""


@needs_cuda
@pytest.mark.timeout(180)
def test_prepared_program_is_captured_in_a_cuda_graph() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), PORT=str(29500 + os.getpid() % 400))
    p = subprocess.run([sys.executable, "-c", _GRAPH], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=170)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr
