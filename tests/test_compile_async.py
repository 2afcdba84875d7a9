"""``async_op=True`` inside torch.compile(fullgraph=True) on 2 real gloo ranks: the handle's
``wait()`` is the functional ``wait_tensor`` on the last collective, so compute the user
put between the call and ``wait()`` stands between the collective and its wait in the AOT
forward graph (where the compiler can overlap them); results and gradients equal eager's
bit for bit (under aot_eager, and under inductor for the all_gather)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

ISSUE = {"all_gather": "_c10d_functional.all_gather_into_tensor.default",
         "reduce_scatter": "_c10d_functional.reduce_scatter_tensor.default",
         "all_reduce": "_c10d_functional.all_reduce.default"}
WAIT = "_c10d_functional.wait_tensor.default"


def async_cases(rank: int, world: int) -> dict:
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    from torch.distributed.device_mesh import init_device_mesh

    import torch_backend
    from spec_lang import parse_mesh

    mesh = f"dp={world}"
    dm = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    pm = parse_mesh(mesh)
    rd = torch_backend.redistribute
    prep = torch_backend.redistributor("f32[8,6]{U:dp}", "f32[8@dp,6]", mesh)
    cases = {  # name -> (the call started async, the kind of its last collective)
        "all_gather": (lambda x: rd(x, "f32[8@dp,6]", "f32[8,6]", mesh, async_op=True), "all_gather"),
        "redistributor reduce_scatter": (lambda x: prep(torch.cat([x, x]), async_op=True), "reduce_scatter"),
        "all_reduce": (lambda x: rd(x, "f32[4,6]{U:dp}", "f32[4,6]{R:dp}", mesh, async_op=True), "all_reduce"),
        "DeviceMesh": (lambda x: rd(x, "f32[8@dp,6]", "f32[8,6]", dm, async_op=True), "all_gather"),
        "spec_lang.Mesh": (lambda x: rd(x, "f32[8@dp,6]", "f32[8,6]", pm, async_op=True), "all_gather"),
    }
    out: dict = {}
    x0 = torch.arange(24.0).view(4, 6) * (rank + 1) + 0.25
    w0 = torch.arange(36.0).view(6, 6) / 7 + rank
    for name, (start, kind) in cases.items():
        def f(x: torch.Tensor, w: torch.Tensor, start=start) -> tuple[torch.Tensor, torch.Tensor]:
            h = start(x)
            z = torch.mm(w, w)  # the user's compute between the call and its wait (a compiler
            return h.wait() * 2, z  # may sum it in another order: only shardc's part is bitwise)

        dist.barrier()
        xe = x0.clone().requires_grad_()
        want, _ = f(xe, w0)
        want.backward(torch.ones_like(want) * 0.5)
        backend = AotEagerAndRecordGraphs()
        x = x0.clone().requires_grad_()
        got, _ = torch.compile(f, backend=backend, fullgraph=True)(x, w0)
        got.backward(torch.ones_like(got) * 0.5)
        nodes = [str(n.target) for n in backend.fw_graphs[0].graph.nodes]
        issued = nodes.index(ISSUE[kind])
        mm = nodes.index("aten.mm.default")
        waits = [i for i, t in enumerate(nodes) if t == WAIT and i > issued]
        out[name] = (torch.equal(got, want), torch.equal(x.grad, xe.grad), issued < mm < waits[0] if waits else False,
                     [t for t in nodes if "c10d" in t or t == "aten.mm.default"])
        if name == "all_gather":  # and under inductor, which compiles the two regions' ops alike
            dist.barrier()
            x = x0.clone().requires_grad_()
            got, _ = torch.compile(f, backend="inductor", fullgraph=True)(x, w0)
            got.backward(torch.ones_like(got) * 0.5)
            out["inductor"] = (torch.equal(got, want), torch.equal(x.grad, xe.grad))
    return out


@pytest.fixture(scope="module")
def compiled() -> dict:
    from torch_utils import run_once

    return run_once(2, async_cases, collective_timeout_s=240, timeout_s=300)


@pytest.mark.timeout(360)
@pytest.mark.parametrize("name", ["all_gather", "redistributor reduce_scatter", "all_reduce", "DeviceMesh",
                                  "spec_lang.Mesh"])
def test_the_wait_is_where_the_user_put_it(compiled: dict, name: str) -> None:
    for rank, res in compiled.items():
        same, same_grad, overlapped, ops = res[name]
        assert same and same_grad, (rank, name, "differs from eager")
        assert overlapped, (rank, name, "the user's compute is not between the collective and its wait", ops)


def test_inductor_gives_eager_s_values_and_gradients(compiled: dict) -> None:
    for rank, res in compiled.items():
        assert res["inductor"] == (True, True), rank


def four_rank_cases(rank: int, world: int) -> dict:
    """Programs whose last collective follows other steps (a reduce_scatter, a local slice),
    on dp=2,tp=2: the first region runs those, the user's compute stands before the wait."""
    import numpy as np
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    from torch_utils import random_blocks

    import torch_backend
    from spec_lang import parse, parse_mesh

    mesh = "dp=2,tp=2"
    out = {}
    for s, d in [("f32[8@dp,6]{U:tp}", "f32[8,6]"), ("f32[8@dp,6]", "f32[8,6@tp]")]:
        x0 = random_blocks(parse(s), parse_mesh(mesh), np.random.default_rng(0))[rank].float()

        def f(x: torch.Tensor, s: str = s, d: str = d) -> tuple[torch.Tensor, torch.Tensor]:
            h = torch_backend.redistribute(x, s, d, mesh, async_op=True)
            z = x.sum() * 3
            return h.wait() * 2, z

        xe = x0.clone().requires_grad_()
        want, _ = f(xe)
        want.backward(torch.ones_like(want))
        backend = AotEagerAndRecordGraphs()
        x = x0.clone().requires_grad_()
        got, _ = torch.compile(f, backend=backend, fullgraph=True)(x)
        got.backward(torch.ones_like(got))
        nodes = [str(n.target) for n in backend.fw_graphs[0].graph.nodes]
        gather = nodes.index(ISSUE["all_gather"])
        out[s] = (torch.equal(got, want), torch.equal(x.grad, xe.grad),
                  gather < nodes.index("aten.sum.default") < nodes.index(WAIT, gather))
    return out


@pytest.mark.timeout(240)
def test_steps_before_the_last_collective_run_in_the_first_region() -> None:
    from torch_utils import run_once

    results = run_once(4, four_rank_cases, collective_timeout_s=120, timeout_s=200)
    bad = {(r, s): v for r, res in results.items() for s, v in res.items() if v != (True, True, True)}
    assert not bad, bad


MANY_SRCS = ["f32[8@dp,6]", "f32[4@dp,3]", "f32[8,6]{U:dp}", "f64[6@dp]"]
MANY_DSTS = ["f32[8,6]", "f32[4,3]", "f32[8@dp,6]", "f64[6]"]


def many_cases(rank: int, world: int) -> dict:
    """``redistribute_many(..., async_op=True)``: the last round's collectives (the f32
    all_gathers packed into one, a reduce_scatter, an f64 all_gather) issued in the first
    region, each waited at ``wait()``, after the user's compute; under inductor too."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    import torch_backend

    mesh = f"dp={world}"
    shapes = [(4, 6), (2, 3), (8, 6), (3,)]
    x0 = [torch.arange(float(np.prod(s))).view(s) * (rank + 1) + 0.25 for s in shapes]
    x0[3] = x0[3].double()
    w0 = torch.arange(36.0).view(6, 6) / 7 + rank

    def f(xs: list, w: torch.Tensor) -> tuple[list, torch.Tensor]:
        h = torch_backend.redistribute_many(xs, MANY_SRCS, MANY_DSTS, mesh, async_op=True)
        z = torch.mm(w, w)
        return [y * 2 for y in h.wait()], z

    xe = [x.clone().requires_grad_() for x in x0]
    want, _ = f(xe, w0)
    sum((y * (j + 1)).sum() for j, y in enumerate(want)).backward()
    backend = AotEagerAndRecordGraphs()
    xc = [x.clone().requires_grad_() for x in x0]
    got, _ = torch.compile(f, backend=backend, fullgraph=True)(xc, w0)
    sum((y * (j + 1)).sum() for j, y in enumerate(got)).backward()
    nodes = [str(n.target) for n in backend.fw_graphs[0].graph.nodes]
    mm = nodes.index("aten.mm.default")
    issued = [i for i, t in enumerate(nodes) if t in ISSUE.values()]
    waits = [i for i, t in enumerate(nodes) if t == WAIT]
    xi = [x.clone().requires_grad_() for x in x0]
    ind, _ = torch.compile(f, backend="inductor", fullgraph=True)(xi, w0)
    sum((y * (j + 1)).sum() for j, y in enumerate(ind)).backward()
    return {"same": all(torch.equal(a, b) and torch.equal(c, b) for a, c, b in zip(got, ind, want)),
            "same_grad": all(torch.equal(a.grad, b.grad) and torch.equal(c.grad, b.grad) for a, c, b in zip(xc, xi, xe)),
            "issued": len(issued), "order": bool(issued) and max(issued) < mm < min(waits),
            "ops": [t for t in nodes if "c10d" in t or t == "aten.mm.default"]}


@pytest.mark.timeout(240)
def test_many_async_waits_where_the_user_put_it() -> None:
    from torch_utils import run_once

    results = run_once(2, many_cases, collective_timeout_s=120, timeout_s=200)
    for rank, res in results.items():
        assert res["same"] and res["same_grad"], (rank, "differs from eager")
        assert res["issued"] == 3, (rank, res["ops"])  # one per dtype and kind: the f32 all_gathers packed
        assert res["order"], (rank, "the user's compute is not between the collectives and their waits", res["ops"])
