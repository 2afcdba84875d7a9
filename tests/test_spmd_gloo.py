"""The typed collectives on real gloo processes: a few rank diagrams on 3 processes, the
Megatron-style MLP on 2 processes against its single-process twin, and the tensor-parallel
+ FSDP MLP on 8 (dp=2, tp=4) under typecheck(), its FSDP trap refused."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from spmd_megatron import FSDP_MESH, STORED, TRAP, H, fsdp_init, fsdp_parallel, fsdp_single, parallel, single  # noqa: E402
from spmd_utils import T, Tv  # noqa: E402
from torch_utils import GlooPool  # noqa: E402


def _diagrams(rank: int, world: int) -> dict:
    from torch_backend import spmd
    from torch_backend.spmd import P, R, S, V

    out = {}
    with spmd.use_mesh("x=3"):
        # all_gather(V, R) of A, B, C; backward reduce_scatter
        x = T("ABC"[rank]).requires_grad_(True)
        y = spmd.all_gather(x, "x", src=V, dst=R)
        (g,) = torch.autograd.grad(y, x, grad_outputs=Tv(*(f"{c}{'xyz'[rank]}" for c in "ABC")))
        out["ag"] = (y.tolist(), g.item())
        # uneven all_gather(S(0), I) of 7 rows (3, 3, 1); backward: the rank's own rows
        full = torch.arange(7.0, dtype=torch.float64)
        piece = full[[slice(0, 3), slice(3, 6), slice(6, 7)][rank]].clone().requires_grad_(True)
        y = spmd.all_gather(piece, "x", src=S(0), dst=spmd.I, size=7)
        (g,) = torch.autograd.grad(y, piece, grad_outputs=full * 10)
        out["ag_uneven"] = (y.tolist(), g.tolist())
        # all_to_all(V, V); backward the same transpose
        x = Tv(*(f"{'ABC'[rank]}{k}" for k in range(3))).requires_grad_(True)
        y = spmd.all_to_all(x, "x", src=V, dst=V)
        (g,) = torch.autograd.grad(y, x, grad_outputs=y.detach())
        out["a2a"] = (y.tolist(), g.tolist())
        # reduce_scatter(P, S(0)) then all_reduce via redistribute
        z = spmd.reduce_scatter(torch.full((6,), float(rank + 1), dtype=torch.float64), "x", src=P, dst=S(0))
        out["rs"] = z.tolist()
        # all_reduce in place: a flat buffer reduced in its own memory, and a strided one
        buf = torch.full((2, 4), float(rank + 1), dtype=torch.float64)
        ptr = buf.data_ptr()
        same = spmd.all_reduce(buf, "x", src=P, dst=R, inplace=True) is buf and buf.data_ptr() == ptr
        strided = torch.full((2, 4), float(rank + 1), dtype=torch.float64)
        spmd.all_reduce(strided[:, 0], "x", src=P("avg"), dst=R, inplace=True)
        out["inplace"] = (same, buf.tolist(), strided.tolist())
        # torch.distributed's own all_reduce under the checker: the world's group is the x axis
        import torch.distributed as dist

        g = spmd.assert_type(torch.full((2,), float(rank + 1), dtype=torch.float64), {"x": P})
        with spmd.typecheck():
            dist.all_reduce(g)
            try:
                dist.all_reduce(g)  # now R: a second sum would triple it
                refused = ""
            except ValueError as e:
                refused = str(e).splitlines()[0]
        out["raw"] = (g.tolist(), spmd.typeof(g) == {"x": R}, refused)
    return out


def _peer_rules(rank: int, world: int) -> dict:
    """Issue 34's rules on real ranks: the list form of dist.all_gather, a typed output kept
    or refused (on every rank, before anything is sent: the next call still pairs up), an
    op_dtype narrower than the data's cast before the wire, output_split_sizes alone."""
    import torch.distributed as dist

    from torch_backend import spmd
    from torch_backend.spmd import I, P, R, V

    out: dict = {}
    with spmd.use_mesh("x=3"), spmd.typecheck():
        x = spmd.assert_type(Tv(f"{'ABC'[rank]}0", f"{'ABC'[rank]}1"), {"x": V})
        outs = [torch.zeros(2, dtype=torch.float64), spmd.assert_type(torch.zeros(2, dtype=torch.float64), {"x": I}),
                torch.zeros(2, dtype=torch.float64)]
        dist.all_gather(outs, x)
        out["list"] = ([o.tolist() for o in outs], [spmd.typeof(o) == t for o, t in zip(outs, ({"x": R}, {"x": I},
                                                                                              {"x": R}))])
        bad = spmd.assert_type(torch.zeros(6, dtype=torch.float64), {"x": V})
        try:
            dist.all_gather_into_tensor(bad, x)
            out["refused"] = ""
        except ValueError as e:
            out["refused"] = str(e).splitlines()[0]
        kept = spmd.assert_type(torch.zeros(6, dtype=torch.float64), {"x": I})
        dist.all_gather_into_tensor(kept, x)
        out["kept"] = (kept.tolist(), spmd.typeof(kept) == {"x": I}, bad.tolist())
    g = torch.tensor([256.0, 1.0 + 2.0**-9], dtype=torch.float32) * (rank + 1)
    y = spmd.all_reduce(g, "x", src=P, dst=R, op_dtype=torch.bfloat16, mesh="x=3")
    out["narrow"] = (y.dtype == torch.float32, y.tolist())
    import torch_backend as tb

    with spmd.use_mesh("x=3"), spmd.typecheck(strict=True):  # shardc's own c10d calls stay outside the checker
        moved = tb.redistribute(torch.arange(2.0) + 2 * rank, "f32[6@x]", "f32[6@y]", "x=3", dst_mesh="y=3@[2,0,1]")
    out["cross"] = moved.tolist()
    rows = torch.arange(3.0, dtype=torch.float64) + 10 * rank
    out["a2a"] = spmd.all_to_all(rows, "x", src=V, dst=V, output_split_sizes=[1, 1, 1], mesh="x=3").tolist()
    return out


_POOLS: dict[int, GlooPool] = {}


def _pool(world: int) -> GlooPool:
    """A pool of ``world`` gloo ranks shared by this module's tests (closed at exit)."""
    if world not in _POOLS:
        _POOLS[world] = GlooPool(world, collective_timeout_s=30)
    return _POOLS[world]


@pytest.fixture(scope="module", autouse=True)
def _close_pools() -> object:
    yield
    for p in _POOLS.values():
        p.close()
    _POOLS.clear()


def test_diagrams_on_three_gloo_processes() -> None:
    res = _pool(3).run(_diagrams, timeout_s=120)
    abc = [float(T(c)) for c in "ABC"]
    for r in range(3):
        ag, g = res[r]["ag"]
        assert ag == abc and g == sum(float(T(f"{'ABC'[r]}{s}")) for s in "xyz")
        y, g = res[r]["ag_uneven"]
        assert y == list(range(7)) and g == [10.0 * v for v in range(7)][[0, 3, 6][r]:[3, 6, 7][r]]
        y, g = res[r]["a2a"]
        assert y == [float(T(f"{c}{r}")) for c in "ABC"]
        assert g == [float(T(f"{'ABC'[r]}{k}")) for k in range(3)]
        assert res[r]["rs"] == [6.0, 6.0]
        assert res[r]["raw"] == ([6.0, 6.0], True, "torch.distributed.all_reduce of a tensor that is R on mesh "
                                 "axis 'x': a reduction finishes a pending one (P)")
        assert res[r]["inplace"] == (True, [[6.0] * 4] * 2, [[2.0] + [r + 1.0] * 3] * 2)  # the sum; column 0's average


@pytest.mark.parametrize("mode", ["local", "global"])
def test_megatron_mlp_matches_single_process(mode: str) -> None:
    losses, weights = single()
    res = _pool(2).run(parallel, mode, timeout_s=120)
    h = H // 2
    for r in range(2):
        got_losses, lists = res[r]
        got = {k: torch.tensor(v, dtype=torch.float64) for k, v in lists.items()}
        assert max(abs(a - b) for a, b in zip(got_losses, losses)) < 1e-6
        rows = slice(r * h, (r + 1) * h)
        assert torch.allclose(got["W1"], weights["W1"][rows], atol=1e-6, rtol=0)
        assert torch.allclose(got["b1"], weights["b1"][rows], atol=1e-6, rtol=0)
        assert torch.allclose(got["W2"], weights["W2"][:, rows], atol=1e-6, rtol=0)
        assert torch.allclose(got["b2"], weights["b2"], atol=1e-6, rtol=0)
    assert losses[-1] < losses[0]


def _fsdp_trap(rank: int, world: int, full: dict) -> str:
    from spec_lang.errors import SpecError

    try:
        fsdp_parallel(rank, world, full, TRAP, steps=1)
    except SpecError as e:
        return str(e)
    return "not refused"


def test_megatron_tp_fsdp_step_on_eight_gloo_processes(gloo_pool) -> None:
    """Weights stored FSDP-style over (tp, dp), gathered to {R:dp} for the step, the batch
    split over dp, column- then row-parallel over tp, every op under typecheck(): the losses,
    the first step's shard gradients and the trained shards are the single-process model's.
    The same step gathering to 'f64[32@tp,16]' (I on dp) is refused on every rank."""
    from lowering.spmd.types import I, P
    from spec_lang import parse, parse_mesh
    from torch_backend.blocks import local_part

    losses, first, final = fsdp_single()
    full = fsdp_init()
    res = gloo_pool.run(fsdp_parallel, full, timeout_s=240)
    mesh = parse_mesh(FSDP_MESH)
    for r in range(8):
        got_losses, got_first, got_final, loss_type = res[r]
        assert loss_type == {"dp": P, "tp": I}
        assert got_losses == pytest.approx(losses, rel=1e-12)
        for k in ("W1", "W2"):
            t = parse(STORED[k])
            assert torch.allclose(torch.tensor(got_first[k], dtype=torch.float64), local_part(first[k], t, mesh, r), rtol=0, atol=1e-12)
            assert torch.allclose(torch.tensor(got_final[k], dtype=torch.float64), local_part(final[k], t, mesh, r), rtol=0, atol=1e-12)
    refused = gloo_pool.run(_fsdp_trap, full, timeout_s=120)
    assert all(refused[r].startswith("linear mixes I with S(0) on mesh axis 'dp'") for r in range(8)), refused[0]


def _ragged(rank: int, world: int) -> dict:
    """The ragged collectives on real ranks: each rank passes only its own split sizes."""
    from torch_backend import spmd
    from torch_backend.spmd import P, R, S, V

    splits = [[1, 2, 0], [0, 1, 3], [2, 0, 1]]
    out = {}
    with spmd.use_mesh("ep=3"):
        x = (torch.arange(sum(splits[rank]), dtype=torch.float64).unsqueeze(1) + 10 * rank).requires_grad_(True)
        y = spmd.all_to_all(x, "ep", src=V, dst=S(0), input_split_sizes=torch.tensor(splits[rank]))
        (g,) = torch.autograd.grad(y, x, grad_outputs=y.detach() * 2)
        out["a2a"] = (y.flatten().tolist(), g.flatten().tolist())
        sizes = [3, 0, 4]
        piece = torch.arange(7.0, dtype=torch.float64).split(sizes)[rank].clone().requires_grad_(True)
        z = spmd.all_gather(piece, "ep", src=S(0), dst=R, split_sizes=sizes)
        (g,) = torch.autograd.grad(z, piece, grad_outputs=torch.full((7,), float(rank + 1), dtype=torch.float64))
        out["ag"] = (z.tolist(), g.tolist())
        w = spmd.reduce_scatter(torch.full((7,), float(rank + 1), dtype=torch.float64), "ep", src=P, dst=S(0),
                                split_sizes=sizes)
        out["rs"] = w.tolist()
    return out


def test_ragged_collectives_on_three_gloo_processes() -> None:
    """Dispatch with per-rank split sizes (exchanged), its backward the way back; all_gather
    of blocks of 3, 0, 4 rows (backward: the gradients' sum, reduce_scatterv), and the
    reduce_scatter onto those blocks: the definitions' values on each rank."""
    res = _pool(3).run(_ragged, timeout_s=120)
    got = {0: [0.0, 20.0, 21.0], 1: [1.0, 2.0, 10.0], 2: [11.0, 12.0, 13.0, 22.0]}
    sent = {0: [0.0, 1.0, 2.0], 1: [10.0, 11.0, 12.0, 13.0], 2: [20.0, 21.0, 22.0]}
    for r in range(3):
        y, g = res[r]["a2a"]
        assert y == got[r] and g == [2 * v for v in sent[r]]
        z, g = res[r]["ag"]
        assert z == [float(v) for v in range(7)] and g == [6.0] * [3, 0, 4][r]
        assert res[r]["rs"] == [6.0] * [3, 0, 4][r]


def _fp32_accumulation(rank: int, world: int) -> dict:
    """bf16 addends 256, 1, 0.5 (their sum, 257.5, is no bf16 number), summed in fp32 on real ranks."""
    from torch_backend import spmd
    from torch_backend.spmd import P, R, S

    g = torch.tensor([[256.0, 1.0, 0.5][rank], 0.5] * 3, dtype=torch.bfloat16).requires_grad_(True)
    with spmd.use_mesh("x=3"):
        plain = spmd.all_reduce(g, "x", src=P, dst=R)
        y = spmd.all_reduce(g, "x", src=P, dst=R, op_dtype=torch.float32, out_dtype=torch.float32)
        (grad,) = torch.autograd.grad(y, g, grad_outputs=torch.full((6,), 1.0 + rank / 256, dtype=torch.float32))
        z = spmd.reduce_scatter(g.detach(), "x", src=P, dst=S(0), op_dtype="f32", out_dtype="f64")
    return {"plain": plain.tolist(), "y": (y.tolist(), str(y.dtype)), "grad": (grad.tolist(), str(grad.dtype)),
            "z": (z.tolist(), str(z.dtype))}


def test_fp32_accumulation_on_three_gloo_processes() -> None:
    """The wire carries bf16, the sums are fp32 (257.5 exactly, which no bf16 sum gives); the
    backward all_reduce sends the bf16-cast gradient and sums it in fp32, returned bf16."""
    res = _pool(3).run(_fp32_accumulation, timeout_s=120)
    exact = sum(torch.tensor(1.0 + r / 256).to(torch.bfloat16).double() for r in range(3))  # the bf16-cast pieces
    want_grad = float(exact.to(torch.bfloat16))
    for r in range(3):
        assert res[r]["plain"][0] != 257.5 and res[r]["plain"][1] == 1.5
        assert res[r]["y"] == ([257.5, 1.5] * 3, "torch.float32")
        assert res[r]["grad"] == ([want_grad] * 6, "torch.bfloat16")
        assert res[r]["z"] == ([257.5, 1.5], "torch.float64")


def test_peer_rules_on_three_gloo_processes() -> None:
    res = _pool(3).run(_peer_rules, timeout_s=120)
    blocks = [[float(T(f"{c}0")), float(T(f"{c}1"))] for c in "ABC"]
    bf = torch.bfloat16
    for r in range(3):
        assert res[r]["list"] == (blocks, [True] * 3)
        assert res[r]["refused"].startswith("torch.distributed.all_gather_single: its output tensor is V on mesh "
                                            "axis 'x', but the call makes it R or I")
        assert res[r]["kept"] == (sum(blocks, []), True, [0.0] * 6)
        # each rank's addends rounded to bf16 before the wire, summed in bf16, returned in f32
        want = sum(torch.tensor([256.0, 1.0 + 2.0**-9]).mul(k + 1).to(bf) for k in range(3)).float().tolist()
        assert res[r]["narrow"] == (True, want)
        assert res[r]["a2a"] == [float(r + 10 * s) for s in range(3)]
        c = [1, 2, 0][r]  # rank r's coordinate on y=3@[2,0,1]
        assert res[r]["cross"] == [2.0 * c, 2.0 * c + 1]
