"""shardc under torch.compile(fullgraph=True) on 2 real gloo ranks (issue 27's table, row
by row): every call form compiles with no graph break, its results and gradients equal
eager shardc's bit for bit (under aot_eager and under inductor), the AOT
forward graph holds the program's collectives as functional-collective ops, and a
tensor of the wrong shape is refused at trace time with the eager checks' SpecError.
The uneven all_gather on 3 ranks compiles to one exchange each way; a compiled call under
LocalTensorMode is refused."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

AG = ["_c10d_functional.all_gather_into_tensor.default", "_c10d_functional.wait_tensor.default"]
RS = ["_c10d_functional.reduce_scatter_tensor.default", "_c10d_functional.wait_tensor.default"]
A2A = ["_c10d_functional.all_to_all_single.default", "_c10d_functional.wait_tensor.default"]
CASES = {  # the call inside the compiled function -> the functional ops of its forward graph
    "mesh string": AG, "spec_lang.Mesh": AG, "DeviceMesh": AG, "redistributor": AG, "redistribute_many": AG,
    "async_op": AG, "reduce_scatter": RS, "permute": A2A, "uneven all_to_allv": A2A, "uneven all_gatherv": A2A,
    "spmd.all_gather": AG, "local_map": AG, "DTensor": AG, "DTensor partial gradient": [],
    "uneven, a rank that sends nothing": A2A, "uneven reduce_scatterv onto one rank": A2A,
    "reduce_scatter onto an empty block": RS,
}
BACKENDS = ("aot_eager", "inductor")


def compiled_cases(rank: int, world: int) -> dict:
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    import torch_backend
    from spec_lang import SpecError, parse_mesh
    from torch_backend import spmd

    torch._dynamo.config.cache_size_limit = 64
    mesh = f"dp={world}"
    pm = parse_mesh(mesh)
    dm = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    prep = torch_backend.redistributor("f32[8@dp,6]", "f32[8,6]", mesh)
    rd = torch_backend.redistribute
    calls = {
        "mesh string": lambda x: rd(x, "f32[8@dp,6]", "f32[8,6]", mesh),
        "spec_lang.Mesh": lambda x: rd(x, "f32[8@dp,6]", "f32[8,6]", pm),
        "DeviceMesh": lambda x: rd(x, "f32[8@dp,6]", "f32[8,6]", dm),
        "redistributor": lambda x: prep(x),
        "redistribute_many": lambda x: torch_backend.redistribute_many(
            [x, x * 2], ["f32[8@dp,6]", "f32[8@dp,6]"], ["f32[8,6]", "f32[8,6]{R:dp}"], mesh)[1],
        "async_op": lambda x: rd(x, "f32[8@dp,6]", "f32[8,6]", mesh, async_op=True).wait() * 3,
        "reduce_scatter": lambda x: rd(torch.cat([x, x]), "f32[8,6]{U:dp}", "f32[8@dp,6]", mesh),
        "permute": lambda x: rd(x, "f32[8@dp,6]", "f32[8,6@dp]", mesh),
        "uneven all_to_allv": lambda x: rd(x, "f32[8@dp,6]", "f32[8@dp<5,3>,6]", mesh),
        "uneven all_gatherv": lambda x: rd(rd(x, "f32[8@dp,6]", "f32[8@dp<5,3>,6]", mesh),
                                           "f32[8@dp<5,3>,6]", "f32[8,6]", mesh),
        # rank 0 sends nothing forward in the first exchange, rank 1 in the second, and the
        # other way round backward: an empty send buffer must still follow the step's input
        "uneven, a rank that sends nothing": lambda x: rd(rd(x, "f32[8@dp,6]", "f32[8@dp<8,0>,6]", mesh),
                                                           "f32[8@dp<8,0>,6]", "f32[8@dp<2,6>,6]", mesh),
        # rank 1 receives nothing and its block is empty; backward, an all_gatherv it sends nothing to
        "uneven reduce_scatterv onto one rank": lambda x: rd(torch.cat([x, x]), "f32[8,6]{U:dp}", "f32[8@dp<8,0>,6]",
                                                              mesh),
        # the even kinds where a block is empty (1 row over 2 ranks): a padded reduce_scatter,
        # and backward an uneven all_gather, an exact all_to_all_single when compiled
        "reduce_scatter onto an empty block": lambda x: rd(x[:1] * 1, "f32[1,6]{U:dp}", "f32[1@dp,6]", mesh),
        "spmd.all_gather": lambda x: spmd.all_gather(x, "dp", src=spmd.V, dst=spmd.R, mesh=mesh),
        "local_map": lambda x: spmd.local_map(
            lambda a: spmd.all_gather(a * 2, "dp", src=spmd.V, dst=spmd.R, mesh=mesh),
            in_types=[{"dp": spmd.V}], out_types={"dp": spmd.R})(x),
        # a DTensor in and out of shardc's call, built and taken apart inside the compiled function
        "DTensor": lambda x: rd(DTensor.from_local(x, dm, [Shard(0)], run_check=False), "f32[8,6]").to_local(),
        # {R:dp} stands for Replicate and asks for a P(sum) gradient: no collective forward, a
        # reduce_scatter backward (DTensor's own backward would hand a Replicate gradient back)
        "DTensor partial gradient": lambda x: rd(DTensor.from_local(x.repeat(2, 1), dm, [Replicate()], run_check=False),
                                                 "f32[8,6]{R:dp}", "f32[8@dp,6]").to_local() * (rank + 1),
    }
    out: dict = {}
    x0 = torch.arange(24.0).view(4, 6) * (rank + 1) + 0.25
    for name, f in calls.items():
        dist.barrier()  # compiling takes one rank longer than another: start each case together
        xe = x0.clone().requires_grad_()
        want = f(xe)
        want.backward(torch.ones_like(want) * 0.5)
        backends = [("aot_eager", AotEagerAndRecordGraphs()), ("inductor", "inductor")]
        for label, backend in backends:
            x = x0.clone().requires_grad_()
            got = torch.compile(f, backend=backend, fullgraph=True)(x)
            got.backward(torch.ones_like(got) * 0.5)
            ops = []
            if label == "aot_eager":
                ops = sorted({str(n.target) for n in backend.fw_graphs[0].graph.nodes if "c10d" in str(n.target)})
            out[name, label] = (torch.equal(got, want) and torch.equal(x.grad, xe.grad), ops)
    # a DeviceMesh the eager path never saw: read inside the trace, under its fake mode
    fresh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    dist.barrier()
    got = torch.compile(lambda x: rd(x, "f32[8@fsdp,6]", "f32[8,6]", fresh), backend="aot_eager", fullgraph=True)(x0)
    out["DeviceMesh first seen compiled"] = got
    # a DTensor argument and a DTensor result of the compiled function itself
    def dt_in_out(dt):
        return rd(dt, "f32[8,6@dp]") * 2

    grads = []
    for g in (dt_in_out, torch.compile(dt_in_out, backend="aot_eager", fullgraph=True)):
        dist.barrier()
        xl = x0.clone().requires_grad_()
        y = g(DTensor.from_local(xl, dm, [Shard(0)], run_check=False))
        y.to_local().backward(torch.ones(8, 3) * (rank + 1))
        grads.append((type(y).__name__, tuple(y.placements), y.to_local().detach(), xl.grad))
    out["DTensor in and out"] = grads
    # a DTensor call the eager checks refuse is refused at trace time with their SpecError
    try:
        torch.compile(lambda x: rd(DTensor.from_local(x, dm, [Shard(0)], run_check=False), "f32[8,7]"),
                      backend="aot_eager", fullgraph=True)(x0)
        out["DTensor bad dst"] = None
    except Exception as e:
        out["DTensor bad dst raised"] = type(e).__name__
        err = e
        while err is not None and not isinstance(err, SpecError):
            err = err.__cause__ or err.__context__
        out["DTensor bad dst"] = str(err) if err is not None else f"{type(e).__name__}: {e}"
    # a tensor of another shape: traced again, and refused by the same check as eager
    f = torch.compile(calls["mesh string"], backend="aot_eager", fullgraph=True)
    try:
        f(torch.zeros(5, 6))
        out["bad shape"] = None
    except Exception as e:  # dynamo may wrap it: the SpecError must be the cause
        err = e
        while err is not None and not isinstance(err, SpecError):
            err = err.__cause__ or err.__context__
        out["bad shape"] = str(err) if err is not None else f"{type(e).__name__}: {e}"
    return out


@pytest.fixture(scope="module")
def compiled() -> dict:
    from torch_utils import run_once

    return run_once(2, compiled_cases, collective_timeout_s=240, timeout_s=300)


@pytest.mark.timeout(360)
@pytest.mark.parametrize("name", list(CASES))
def test_compiles_fullgraph_and_matches_eager(compiled, name):
    for rank, res in compiled.items():
        for label in BACKENDS:
            same, ops = res[name, label]
            assert same, f"{name} ({label}): differs from eager on rank {rank}"
        assert res[name, "aot_eager"][1] == CASES[name], f"{name}: forward graph's collectives"


@pytest.mark.timeout(360)
def test_a_changed_shape_is_refused_with_the_eager_error(compiled):
    for res in compiled.values():
        assert res["bad shape"] is not None and "the shape [4, 6]" in res["bad shape"], res["bad shape"]


@pytest.mark.timeout(360)
def test_dtensor_argument_and_result_of_the_compiled_function(compiled):
    for rank, res in compiled.items():
        eager, comp = res["DTensor in and out"]
        assert comp[0] == "DTensor" and comp[1] == eager[1], (rank, comp[:2], eager[:2])
        # independent of both: the global is arange(24)*(r+1)+0.25 stacked over r; each rank's
        # result holds its 3 columns of it doubled; the gradient of rank r's columns is 2*(r+1)
        full = torch.cat([torch.arange(24.0).view(4, 6) * (r + 1) + 0.25 for r in range(2)])
        assert torch.equal(comp[2], full[:, 3 * rank:3 * rank + 3] * 2)
        want_grad = torch.cat([torch.full((4, 3), 2.0), torch.full((4, 3), 4.0)], dim=1)
        assert torch.equal(comp[3], want_grad) and torch.equal(eager[3], comp[3])
        assert torch.equal(comp[2], eager[2])


@pytest.mark.timeout(360)
def test_a_dtensor_call_is_checked_at_trace_time(compiled):
    for res in compiled.values():
        assert res["DTensor bad dst"] is not None and "global shapes differ" in res["DTensor bad dst"], \
            res["DTensor bad dst"]
        assert res["DTensor bad dst raised"] == "TracedSpecError"  # the SpecError itself, not dynamo's


@pytest.mark.timeout(360)
def test_a_device_mesh_first_seen_inside_the_trace(compiled):
    full = torch.cat([torch.arange(24.0).view(4, 6) * (r + 1) + 0.25 for r in range(2)])
    for res in compiled.values():
        assert torch.equal(res["DeviceMesh first seen compiled"], full)


# rank 1 holds nothing: it sends nothing forward; {R:dp} asks for a P(sum) gradient, so the
# backward is the dual exchange (reduce_scatterv), where rank 1 receives nothing
GATHERV = ("f32[9@dp<4,0,5>,6]", "f32[9,6]{R:dp}")
A2A_OP = "_c10d_functional.all_to_all_single.default"


def gatherv_cases(rank: int, world: int) -> dict:
    """The uneven all_gatherv alone on 3 ranks (where a ring takes 2 rounds): compiled, one
    exact all_to_all_single each way; eager on gloo keeps its point-to-point ring."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    import torch_backend

    src, dst = GATHERV
    mesh = f"dp={world}"
    rows = [4, 0, 5][rank]
    x0 = torch.arange(rows * 6.0).view(rows, 6) + 100 * rank

    def f(x):
        return torch_backend.redistribute(x, src, dst, mesh) * 2

    out: dict = {}
    for label, backend in (("eager", None), ("aot_eager", AotEagerAndRecordGraphs()), ("inductor", "inductor")):
        dist.barrier()
        x = x0.clone().requires_grad_()
        y = (f if backend is None else torch.compile(f, backend=backend, fullgraph=True))(x)
        y.backward(torch.ones_like(y) * (rank + 1))
        out[label] = (y.detach(), x.grad)
        if label == "aot_eager":
            out["ops"] = [sum(str(n.target) == A2A_OP for n in g.graph.nodes)
                          for g in (backend.fw_graphs[0], backend.bw_graphs[0])]
    return out


@pytest.fixture(scope="module")
def gatherv() -> dict:
    from torch_utils import run_once

    return run_once(3, gatherv_cases, collective_timeout_s=240, timeout_s=300)


@pytest.mark.timeout(360)
def test_uneven_all_gatherv_compiles_to_one_exchange(gatherv):
    full = torch.cat([torch.arange(n * 6.0).view(n, 6) + 100 * r for r, n in enumerate([4, 0, 5])])
    for rank, res in gatherv.items():
        assert res["ops"] == [1, 1], f"rank {rank}: all_to_all_single forward, backward: {res['ops']}"
        for label in ("eager", "aot_eager", "inductor"):
            y, grad = res[label]
            assert torch.equal(y, full * 2), (rank, label)
            # {R:dp}: the gradient is the sum of every rank's, 2*(1+2+3)
            assert torch.equal(grad, torch.full_like(grad, 12.0)), (rank, label)
            assert torch.equal(y, res["eager"][0]) and torch.equal(grad, res["eager"][1]), (rank, label)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("src,dst", [("f32[8,6]", "f32[8@dp,6]"), ("f32[8@dp,6]", "f32[8,6]{R:dp}")])
def test_local_tensor_mode_inside_compile_is_refused(fake_pg, src, dst):
    """Under LocalTensorMode a compiled region played one rank's pieces for all of them (the
    slice gave rank 0's block to every rank): refused, with a SpecError in dynamo's chain."""
    from torch_utils import from_local, local_mode

    import torch_backend
    from spec_lang import SpecError

    full = torch.arange(48.0).view(8, 6)
    with local_mode(fake_pg, 4):
        x = torch_backend.distribute(full, "dp=4", src)
        eager = from_local(torch_backend.redistribute(x, src, dst, "dp=4"))
        f = torch.compile(lambda t: torch_backend.redistribute(t, src, dst, "dp=4"), backend="aot_eager",
                          fullgraph=True)
        try:
            got = f(x)
        except Exception as e:
            err: BaseException | None = e
            while err is not None and not isinstance(err, SpecError):
                err = err.__cause__ or err.__context__
            assert err is not None and "LocalTensorMode" in str(err) and err.hint, repr(e)
        else:
            pytest.fail(f"compiled under LocalTensorMode: {[t.tolist() for t in from_local(got)]}")
    torch._dynamo.reset()
    want = [full[2 * r:2 * r + 2] for r in range(4)] if dst == "f32[8@dp,6]" else [full] * 4
    assert all(torch.equal(a, b) for a, b in zip(eager, want))  # eager is untouched


def bar_cases(rank: int, world: int) -> dict:
    """The typed SPMD API's compiled step (``spmd.use_mesh`` of a DeviceMesh entered inside
    the compiled function) and the errors a compiled call shows."""
    from torch.distributed.device_mesh import init_device_mesh

    import torch_backend
    from torch_backend import spmd

    dm = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))

    def step(t):
        with spmd.use_mesh(dm):
            t = spmd.assert_type(t, {"dp": spmd.P})
            return spmd.all_reduce(t, "dp", src=spmd.P, dst=spmd.R)

    x0 = torch.arange(6.0) * (rank + 1)
    out: dict = {"eager": step(x0.clone())}
    for backend in BACKENDS:
        dist.barrier()
        out[backend] = torch.compile(step, backend=backend, fullgraph=True)(x0.clone())

    def raised(f, x) -> tuple[str, str]:
        try:
            torch.compile(f, backend="aot_eager", fullgraph=True)(x)
        except Exception as e:
            return type(e).__name__, str(e)
        return "nothing", ""

    # a wrong shape: shardc's SpecError itself, its caret and hint in the printed error
    out["bad shape"] = raised(lambda t: torch_backend.redistribute(t, "f32[8@dp,6]", "f32[8,6]", f"dp={world}"),
                              torch.zeros(5, 6))
    # use_mesh's own check, refused inside the trace
    def not_a_mesh(t):
        with spmd.use_mesh(7):
            return t * 2

    out["not a mesh"] = raised(not_a_mesh, x0)
    return out


@pytest.fixture(scope="module")
def bar() -> dict:
    from torch_utils import run_once

    return run_once(2, bar_cases, collective_timeout_s=240, timeout_s=300)


@pytest.mark.timeout(360)
def test_use_mesh_of_a_device_mesh_inside_fullgraph(bar):
    want = torch.arange(6.0) * 3  # the sum over dp of arange(6) * (rank + 1)
    for rank, res in bar.items():
        assert torch.equal(res["eager"], want), rank
        for backend in BACKENDS:
            assert torch.equal(res[backend], want), (rank, backend, res[backend])


@pytest.mark.timeout(360)
def test_a_compiled_call_raises_shardcs_error(bar):
    from spec_lang import SpecError

    for rank, res in bar.items():
        kind, text = res["bad shape"]
        assert kind == "TracedSpecError", (kind, text)
        assert f"rank {rank}'s tensor has shape [5, 6], but float32[8@dp,6] gives rank {rank} the shape [4, 6]" in text
        assert "\n    float32[8@dp,6]\n           ^\nhint: give rank" in text, text  # the caret and the hint
        kind, text = res["not a mesh"]
        assert kind == "TracedSpecError" and "use_mesh takes a mesh, got int" in text, (kind, text)
    from torch_backend.traced import TracedSpecError

    assert issubclass(TracedSpecError, SpecError)
