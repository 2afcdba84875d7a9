"""The hot path on real gloo ranks: a call repeated with the same strings (and a prepared
``redistributor``) gives, bit for bit, what the interpreter (``executor.execute``) and the
reference simulator give, for every one-step form the lean functions cover and for those
they leave to their runner; a tensor that does not fit after a hit still gets its
SpecError, and autograd runs through it. ``SHARDC_AGREE`` is read once per process."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

MESH = "dp=2,tp=4"
PAIRS = [  # (name, src, dst, the function a repeated call runs: torch_backend.lean's, or the interpreter)
    ("gather-dim0", "f32[8@dp,6]", "f32[8,6]", "collective"),  # c10d takes the blocks as they are
    ("gather-flat-group", "f32[16@(dp,tp),3]", "f32[16,3]", "collective"),
    ("gather-dim1", "f32[3,8@tp]", "f32[3,8]", "run"),  # not back to back: the runner
    ("gather-lead-1", "f32[1,8@tp]", "f32[1,8]", "collective"),  # back to back: flat buffers
    ("rs-dim0", "f32[8,4]{U:tp}", "f32[8@tp,4]", "collective"),
    ("rs-avg", "f32[8,4]{P(avg):dp}", "f32[8@dp,4]", "collective"),
    ("rs-dim1", "f32[4,8]{U:tp}", "f32[4,8@tp]", "run"),
    ("all-reduce", "f32[5,3]{U:(dp,tp)}", "f32[5,3]", "collective"),
    ("slice", "f32[8,6]", "f32[8@tp,6]", "slice_"),
    ("i32-gather", "i32[8@tp,2]", "i32[8,2]", "collective"),
    ("bool-gather", "bool[8@dp]", "bool[8]", "collective"),
    ("gather-two-dims", "f32[8@dp,4@tp]", "f32[8,4]", "run"),  # one ring over (dp,tp)
    ("permute", "f32[8@dp,4]", "f32[8,4@dp]", "run"),
    ("two-steps", "f32[8@dp,4]{U:tp}", "f32[8,4]", "_interpret"),
]


def _np(t):
    return t.numpy()


def scenarios(rank: int, world: int) -> dict:
    import lowering
    import torch_backend
    from lowering.simulator import simulate
    from spec_lang import SpecError, parse, parse_mesh
    from torch_backend.data import block, global_tensor
    from torch_backend.executor import execute
    from torch_backend.groups import context

    mesh = parse_mesh(MESH)
    out: dict = {}
    from torch_backend.api import hot_bound

    for name, src, dst, _ in PAIRS:
        s = parse(src)
        g = global_tensor(s)
        x = block(s, mesh, g, rank)
        x0 = x.clone()
        program = lowering.compile(src, dst, MESH)
        ref = simulate(program, [_np(block(s, mesh, g, r)) for r in range(world)])[rank]
        interpreted = execute(program, x, ctx=context(MESH))
        ys = [torch_backend.redistribute(x, src, dst, MESH) for _ in range(3)]  # the first misses
        prep = torch_backend.redistributor(src, dst, MESH)
        ys += [prep(x) for _ in range(2)]
        if x.ndim == 2 and x.shape[0] > 1 and x.shape[1] > 1:  # the same values, not contiguous
            ys.append(torch_backend.redistribute(x.t().contiguous().t(), src, dst, MESH))
            ys.append(prep(x.t().contiguous().t()))
        same = all(torch.equal(y, interpreted) and y.dtype == interpreted.dtype for y in ys)
        fresh = all(y.numel() == 0 or y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
                    for y in ys)
        distinct = ys[1].numel() == 0 or ys[1].untyped_storage().data_ptr() != ys[2].untyped_storage().data_ptr()
        out[name] = bool(same and fresh and distinct and np.array_equal(_np(ys[1]), ref) and torch.equal(x, x0))
        hot = hot_bound(src, dst, MESH)
        out[f"{name} runs"] = hot.runner().__name__ if hot is not None else None
        # after hits, a tensor that does not fit still fails its checks (alike on every rank)
        errors = []
        for bad in (torch.zeros(x.shape[0] + 1, *x.shape[1:], dtype=x.dtype), x.double() if x.is_floating_point()
                    else x.float(), x.to_sparse()):  # sparse: the right dtype, shape and device
            for call in (lambda t, s=src, d=dst: torch_backend.redistribute(t, s, d, MESH), prep):
                try:
                    call(bad)
                    errors.append(None)
                except SpecError as e:
                    errors.append(str(e))
                except Exception:  # anything else (a failed collective) is not the checks' refusal
                    errors.append(None)
        out[f"{name} errors"] = all(e is not None for e in errors)
    # autograd through the hot path: the gradient of the interpreter's run
    s = parse("f64[8@dp,6]")
    rng = np.random.default_rng(5)  # the same on every rank
    x = torch.from_numpy(rng.standard_normal((8, 6)))[4 * (rank // 4):4 * (rank // 4) + 4].clone()
    gy = torch.from_numpy(rng.standard_normal((8, 6)))
    grads = []
    for _ in range(3):
        xr = x.clone().requires_grad_(True)
        (gx,) = torch.autograd.grad(torch_backend.redistribute(xr, "f64[8@dp,6]", "f64[8,6]", MESH), xr, gy)
        grads.append(gx)
    want = execute(torch_backend.backward_program(lowering.compile(s, "f64[8,6]", MESH)), gy, ctx=context(MESH))
    out["grad"] = all(torch.equal(gx, want) for gx in grads)
    # a collective that fails: the same CollectiveError as the interpreter's (every rank fails
    # alike before anything reaches the wire, so no rank waits)
    from torch_backend import comm
    from torch_backend.comm import CollectiveError

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    x = block(parse("f32[8@dp,6]"), mesh, global_tensor(parse("f32[8@dp,6]")), rank)
    program = lowering.compile("f32[8@dp,6]", "f32[8,6]", MESH)
    real, comm.all_gather = comm.all_gather, boom
    messages = []
    try:
        for call in (lambda: torch_backend.redistribute(x, "f32[8@dp,6]", "f32[8,6]", MESH),
                     lambda: execute(program, x, ctx=context(MESH))):
            try:
                call()
            except CollectiveError as e:
                messages.append((str(e), type(e.__cause__).__name__))
    finally:
        comm.all_gather = real
    out["failure"] = len(messages) == 2 and messages[0] == messages[1] and "step 1/1" in messages[0][0] \
        and messages[0][1] == "RuntimeError"
    return out


@pytest.fixture(scope="module")
def hot8(gloo_pool) -> dict:
    return gloo_pool.run(scenarios, timeout_s=150)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("name,runs", [(n, f) for n, _, _, f in PAIRS])
def test_hot_path_matches_the_interpreter(hot8, name, runs):
    assert {res[f"{name} runs"] for res in hot8.values()} == {runs}
    bad = [r for r, res in hot8.items() if not res[name]]
    assert not bad, f"{name}: differs on ranks {bad}"
    bad = [r for r, res in hot8.items() if not res[f"{name} errors"]]
    assert not bad, f"{name}: a tensor that does not fit passed on ranks {bad}"


@pytest.mark.timeout(200)
def test_hot_path_failure_is_the_interpreters(hot8):
    bad = [r for r, res in hot8.items() if not res["failure"]]
    assert not bad, f"a failed collective reads differently on ranks {bad}"


@pytest.mark.timeout(200)
def test_hot_path_gradient(hot8):
    bad = [r for r, res in hot8.items() if not res["grad"]]
    assert not bad, f"gradient differs on ranks {bad}"


def test_agree_setting_is_read_once_until_caches_are_cleared(monkeypatch):
    import torch_backend
    from torch_backend.api import agreeing

    monkeypatch.delenv("SHARDC_AGREE", raising=False)
    torch_backend.clear_caches()
    assert agreeing() is False
    monkeypatch.setenv("SHARDC_AGREE", "1")
    assert agreeing() is False  # read once per process
    torch_backend.clear_caches()
    assert agreeing() is True
    monkeypatch.setenv("SHARDC_AGREE", "0")
    torch_backend.clear_caches()
    assert agreeing() is False
