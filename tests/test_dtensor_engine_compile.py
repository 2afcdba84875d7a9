"""shardc as DTensor's redistribution engine under torch.compile(fullgraph=True) on 2 real
gloo ranks: a DTensor program (an explicit redistribute of an uneven dim, the
redistribution op dispatch inserts for a matmul, full_tensor, and their backward)
compiles to one graph with the engine on, as with it off; its forward and backward
graphs hold shardc's functional collectives (an uneven gather is one exact
all_to_all_single, which DTensor's own path never emits); values and gradients equal
eager DTensor's, under aot_eager and inductor; the engine counts its calls at trace time
and falls back on none."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")


def compiled_program(rank: int, world: int) -> dict:
    from torch._dynamo.testing import AotEagerAndRecordGraphs, CompileCounterWithBackend
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from torch_backend.dtensor_switch import dtensor_engine, dtensor_engine_stats

    dm = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    x = distribute_tensor(torch.randn(5, 4), dm, [Shard(0)]).requires_grad_(True)
    w = distribute_tensor(torch.randn(4, 3), dm, [Shard(1)]).requires_grad_(True)

    def f(x, w):
        y = x.redistribute(dm, [Replicate()])  # 5 rows over 2 ranks: uneven
        return (y @ w).full_tensor().sum() + x.full_tensor().pow(2).sum()

    ref = f(x, w)
    ref_grads = [g.full_tensor() for g in torch.autograd.grad(ref, (x, w))]
    out: dict = {}
    off = CompileCounterWithBackend("aot_eager")
    torch.compile(f, backend=off, fullgraph=True)(x, w)
    out["frames off"] = off.frame_count
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        rec = AotEagerAndRecordGraphs() if backend == "aot_eager" else None
        counter = CompileCounterWithBackend(rec if rec is not None else backend)
        before = dtensor_engine_stats()
        with dtensor_engine():
            got = torch.compile(f, backend=counter, fullgraph=True)(x, w)
            grads = [g.full_tensor() for g in torch.autograd.grad(got, (x, w))]
        after = dtensor_engine_stats()
        out[backend] = {
            "frames": counter.frame_count,
            "value": torch.allclose(got, ref, rtol=1e-5, atol=1e-5),
            "grads": all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(grads, ref_grads)),
            "taken": after["taken"] - before["taken"],
            "fallback": after["fallback"] - before["fallback"],
        }
        if rec is not None:
            out["fw ops"] = sorted({str(n.target) for g in rec.fw_graphs for n in g.graph.nodes
                                    if "_c10d_functional" in str(n.target)})
            out["bw ops"] = sorted({str(n.target) for g in rec.bw_graphs for n in g.graph.nodes
                                    if "_c10d_functional" in str(n.target)})
            out["fw splits"] = [n.args[1:3] for g in rec.fw_graphs for n in g.graph.nodes
                                if "all_to_all_single" in str(n.target)]
    return out


@pytest.fixture(scope="module")
def compiled() -> dict:
    from torch_utils import run_once

    return run_once(2, compiled_program, collective_timeout_s=300, timeout_s=420)


@pytest.mark.timeout(480)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_engine_compiles_fullgraph_and_equals_eager(compiled, backend):
    for rank, res in compiled.items():
        r = res[backend]
        assert r["frames"] == res["frames off"] == 1, (rank, r)
        assert r["value"] and r["grads"], (rank, r)
        assert r["taken"] >= 4 and r["fallback"] == 0, (rank, r)  # counted while tracing


@pytest.mark.timeout(480)
def test_graphs_hold_shardcs_collectives(compiled):
    for rank, res in compiled.items():
        assert "_c10d_functional.all_to_all_single.default" in res["fw ops"], (rank, res["fw ops"])
        assert "_c10d_functional.wait_tensor.default" in res["bw ops"], (rank, res["bw ops"])
        # the uneven gather of 5 rows: rank 0 sends its 3 rows, rank 1 its 2, exactly
        first = [list(s) for s in res["fw splits"][0]]
        assert first == {0: [[0, 8], [0, 12]], 1: [[12, 0], [8, 0]]}[rank], (rank, res["fw splits"])
