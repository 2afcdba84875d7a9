"""One execution stack (issue 27): ``redistribute``, a ``Redistributor``'s call and
``redistribute_many``, sync and async, run one bound object (``torch_backend.bound.BoundCall``)
on one autograd Function whose backward is the same object's dual; one cache of bound
calls, least recently used evicted first. Values against numpy written from the layout's
definition (an all_gather over dp is the concatenation of the blocks, its gradient the slice)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_utils import from_local, local_mode, to_local  # noqa: E402

import torch_backend  # noqa: E402
from spec_lang.local_type import P, R, S  # noqa: E402
from torch_backend import api, spmd  # noqa: E402
from torch_backend.bound import BoundCall  # noqa: E402

MESH, SRC, DST = "dp=4", "f64[8@dp,3]", "f64[8,3]"


def _blocks(rng: np.random.Generator) -> tuple[np.ndarray, list[torch.Tensor]]:
    g = rng.standard_normal((8, 3))
    return g, [torch.tensor(g[2 * r:2 * r + 2]) for r in range(4)]


def test_every_call_form_is_one_function_with_the_same_values_and_gradients(fake_pg: Callable[[int], None]) -> None:
    rng = np.random.default_rng(0)
    g, blocks = _blocks(rng)
    grad = rng.standard_normal((8, 3))
    with local_mode(fake_pg, 4) as lm:
        f = torch_backend.redistributor(SRC, DST, MESH)
        calls = {
            "redistribute": lambda x: torch_backend.redistribute(x, SRC, DST, MESH),
            "redistributor": lambda x: f(x),
            "redistribute_many": lambda x: torch_backend.redistribute_many([x], [SRC], [DST], MESH)[0],
            "async": lambda x: torch_backend.redistribute(x, SRC, DST, MESH, async_op=True).wait(),
            "redistributor async": lambda x: f(x, async_op=True).wait(),
            "many async": lambda x: torch_backend.redistribute_many([x], [SRC], [DST], MESH, async_op=True).wait()[0],
        }
        functions = set()
        for name, call in calls.items():
            x = to_local(lm, blocks, requires_grad=True)
            y = call(x)
            functions.add(type(y.grad_fn).__name__)
            (gx,) = torch.autograd.grad(y, x, grad_outputs=to_local(lm, [torch.tensor(grad)] * 4))
            for r, (yr, gr) in enumerate(zip(from_local(y), from_local(gx))):
                np.testing.assert_array_equal(yr.numpy(), g, err_msg=f"{name}: rank {r}'s result")
                np.testing.assert_array_equal(gr.numpy(), grad[2 * r:2 * r + 2], err_msg=f"{name}: rank {r}'s gradient")
    assert len(functions) == 1, functions


def test_the_dual_is_a_bound_made_once_and_its_dual_runs_the_forward(fake_pg: Callable[[int], None]) -> None:
    with local_mode(fake_pg, 4):
        b = torch_backend.redistributor(SRC, DST, MESH)._bound
        d = b.dual()
        assert isinstance(d, BoundCall) and d is b.dual()
        assert d.scratch is not None  # a prepared call's backward reuses buffers of its own too
        assert d.program.src == b.program.dst and [s.kind for s in d.program.steps] == ["slice"]
        assert d.dual().programs == b.programs


def test_redistribute_many_of_one_is_redistribute_s_bound(fake_pg: Callable[[int], None]) -> None:
    from torch_backend.coalesce import prepare_many

    fake_pg(4)  # a process group of 4 ranks (this is rank 0), no LocalTensorMode: contexts are cached
    one = api.bound_for((SRC,), (DST,), MESH)
    assert prepare_many([SRC], [DST], MESH) is one
    assert api.hot_bound(SRC, DST, MESH) is one  # the fast path's one lookup finds it too
    many = prepare_many([SRC, DST], [DST, SRC], MESH)
    assert len(many.programs) == 2 and many.pieces[0] is one.pieces[0]  # the one-program bound's pieces


def test_the_cache_evicts_the_least_recently_used_call_one_at_a_time(fake_pg: Callable[[int], None],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pairs = [("f64[8@dp,3]", "f64[8,3]"), ("f64[8,3]", "f64[8@dp,3]"), ("f64[8@dp,3]", "f64[8,3@dp]"),
             ("f64[8,3@dp]", "f64[8@dp,3]")]
    from spec_lang import parse_mesh

    mesh = parse_mesh(MESH)  # a Mesh, not a string: one cache entry per call (no string key beside it)
    fake_pg(4)
    torch_backend.clear_caches()
    monkeypatch.setattr(api, "_BOUND_MAX", 3)
    made = [api.bound_for((s,), (d,), mesh) for s, d in pairs[:3]]
    assert api.bound_for(*zip(pairs[0]), mesh) is made[0]  # now the most recently used
    api.bound_for(*zip(pairs[3]), mesh)  # a fourth: one entry goes, the least recently used
    assert len(api._BOUND) == 3
    assert api.bound_for(*zip(pairs[0]), mesh) is made[0]
    assert api.bound_for(*zip(pairs[2]), mesh) is made[2]
    assert api.bound_for(*zip(pairs[1]), mesh) is not made[1]  # evicted, so made again


def test_the_typed_spmd_collectives_run_a_bound_whose_dual_is_their_backward(fake_pg: Callable[[int], None]) -> None:
    from lowering.spmd.programs import backward_program
    from torch_backend import spmd

    rng = np.random.default_rng(1)
    g, blocks = _blocks(rng)
    grad = rng.standard_normal((8, 3))
    with local_mode(fake_pg, 4) as lm:
        def call() -> tuple[torch.Tensor, torch.Tensor]:
            x = to_local(lm, blocks, requires_grad=True)
            return x, spmd.all_gather(x, "dp", src="S(0)", dst="R", mesh=MESH)

        x, y = call()
        plain = torch_backend.redistribute(to_local(lm, blocks, requires_grad=True), SRC, DST, MESH)
        assert type(y.grad_fn) is type(plain.grad_fn)  # the one autograd Function of every call
        bound = y.grad_fn.bound
        assert isinstance(bound, BoundCall) and bound.backward is not BoundCall.backward
        (gx,) = torch.autograd.grad(y, x, grad_outputs=to_local(lm, [torch.tensor(grad)] * 4))
        dual = bound.dual()
        assert dual.programs == (backward_program(bound.program),)  # the kinds' duals
        x2, y2 = call()
        assert y2.grad_fn.bound is bound  # bound once, from the one cache
        (gx2,) = torch.autograd.grad(y2, x2, grad_outputs=to_local(lm, [torch.tensor(grad)] * 4))
        assert bound.dual() is dual  # the backward's bound, made once
        for r in range(4):
            np.testing.assert_array_equal(from_local(y)[r].numpy(), g)
            # all_gather(S, R)'s gradient: reduce_scatter of the (R -> P) incoming gradients
            np.testing.assert_array_equal(from_local(gx)[r].numpy(), 4 * grad[2 * r:2 * r + 2])
            np.testing.assert_array_equal(from_local(gx2)[r].numpy(), 4 * grad[2 * r:2 * r + 2])


def test_a_repeated_local_tensor_mode_call_hits_the_cache_and_a_new_mode_gets_its_own(
        fake_pg: Callable[[int], None]) -> None:
    from torch.distributed._local_tensor import LocalTensorMode

    from torch_backend.groups import context

    rng = np.random.default_rng(2)
    g, blocks = _blocks(rng)
    fake_pg(4)
    torch_backend.clear_caches()
    with LocalTensorMode(4) as lm:
        x = to_local(lm, blocks)
        torch_backend.redistribute(x, SRC, DST, MESH)
        entries, ctx, bound = len(api._BOUND), context(MESH), api.bound_for((SRC,), (DST,), MESH)
        for _ in range(3):
            y = torch_backend.redistribute(x, SRC, DST, MESH)
        assert context(MESH) is ctx and ctx.local_mode is lm
        assert api.bound_for((SRC,), (DST,), MESH) is bound and len(api._BOUND) == entries  # hits, no new entries
    for r in range(4):
        np.testing.assert_array_equal(from_local(y)[r].numpy(), g)
    with LocalTensorMode(4) as lm2:  # the same world, another mode: nothing of the first is reused
        assert context(MESH) is not ctx and context(MESH).local_mode is lm2
        assert api.bound_for((SRC,), (DST,), MESH) is not bound
        y = torch_backend.redistribute(to_local(lm2, blocks), SRC, DST, MESH)
    for r in range(4):
        np.testing.assert_array_equal(from_local(y)[r].numpy(), g)


def _first_call_counts(call: Callable[[], object]) -> tuple[list[str], list[str], int, int]:
    """The types ``lowering.check_type`` (the public door) and ``lowering.checks.check_type``
    (the check itself, wherever it is asked for) checked, and how many times
    ``api.checked_program`` and the planner's ``compile`` ran, in ``call()``."""
    import sys

    import lowering
    from lowering import checks, planner

    codes = {lowering.check_type.__code__: "check", checks.check_type.__code__: "inner",
             api.checked_program.__code__: "program"}
    compiles = {f.__code__ for f in vars(planner).values() if callable(f) and getattr(f, "__name__", "") == "compile"
                and hasattr(f, "__code__")} | {getattr(planner.compile, "__wrapped__", planner.compile).__code__}
    seen: list[str] = []
    inner: list[str] = []
    counts = {"program": 0, "compile": 0}

    def profile(frame: Any, event: str, arg: object) -> None:
        if event != "call":
            return
        what = codes.get(frame.f_code)
        if what == "check":
            seen.append(str(frame.f_locals["t"]))
        elif what == "inner":
            inner.append(str(frame.f_locals["t"]))
        elif what == "program":
            counts["program"] += 1
        elif frame.f_code in compiles:
            counts["compile"] += 1

    lowering.clear_caches()
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen, inner, counts["program"], counts["compile"]


@pytest.mark.parametrize("door", ["redistribute", "redistribute_many", "redistributor", "redistribute, no agree"])
def test_a_first_call_checks_and_compiles_each_type_once(fake_pg: Callable[[int], None], door: str) -> None:
    # one door sequence: the checks the agreement runs are the checks the call keeps (it was
    # four check_type and two checked_program calls: the bound call checked again after it);
    # and the check itself runs once per type, not again in the planner's door, the layout
    # algebra and each rank's step pieces (it ran 10 times here: 2 + 2 + 2 + 4 ranks)
    g, blocks = _blocks(np.random.default_rng(1))
    with local_mode(fake_pg, 4) as lm:
        x = to_local(lm, blocks)
        calls = {
            "redistribute": lambda: torch_backend.redistribute(x, SRC, DST, MESH, agree=True),
            "redistribute_many": lambda: torch_backend.redistribute_many([x], [SRC], [DST], MESH, agree=True),
            "redistributor": lambda: torch_backend.redistributor(SRC, DST, MESH, agree=True),
            "redistribute, no agree": lambda: torch_backend.redistribute(x, SRC, DST, MESH),
        }
        seen, inner, programs, compiles = _first_call_counts(calls[door])
    from spec_lang import parse

    assert seen == [str(parse(SRC)), str(parse(DST))], seen
    assert inner == seen, inner
    assert programs == 1 and compiles >= 1, (programs, compiles)


SPMD_DOORS = {
    "all_gather": lambda x: spmd.all_gather(x, "x", src=S(0), dst=R),
    "reduce_scatter": lambda x: spmd.reduce_scatter(x, "x", src=P, dst=S(0)),
    "all_to_all": lambda x: spmd.all_to_all(x, "x", src=S(0), dst=S(1)),
    "redistribute": lambda x: spmd.redistribute(x, "x", src=S(0), dst=R),
    "all_reduce with op_dtype": lambda x: spmd.all_reduce(x.float(), "x", src=P, dst=R, op_dtype=torch.float64),
}


@pytest.mark.parametrize("door", SPMD_DOORS)
def test_a_first_typed_spmd_call_checks_and_compiles_each_type_once(fake_pg: Callable[[int], None],
                                                                      door: str) -> None:
    # the typed SPMD collectives' doors: each local type resolved once, the pair checked
    # once (it was twice: the call's check and program_for's), each type of the program
    # checked once (it was twice: make_step's and make_program's), one program compiled
    # and bound (with op_dtype: the plain program, and the all_to_all and all_gather the
    # wider reduction runs)
    import sys
    from collections import Counter

    import lowering
    from lowering import checks
    from lowering.spmd import programs, rules, types

    codes = {types.resolve.__code__: "resolve", rules.check_pair.__code__: "pair",
             checks.check_type.__code__: "check", programs.routed_program.__wrapped__.__code__: "program",
             api.bound_program.__code__: "bound"}
    counts: Counter[str] = Counter()
    checked: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: object) -> None:
        what = codes.get(frame.f_code) if event == "call" else None
        if what is not None:
            counts[what] += 1
            if what == "check":
                checked[str(frame.f_locals["t"])] += 1

    with local_mode(fake_pg, 4) as lm, spmd.use_mesh("x=4"):
        x = to_local(lm, [torch.ones(8, 4, dtype=torch.float64)] * 4)
        lowering.clear_caches()
        sys.setprofile(profile)
        try:
            SPMD_DOORS[door](x)
        finally:
            sys.setprofile(None)
    n = 3 if "op_dtype" in door else 1
    assert counts["resolve"] == 2 and counts["pair"] == 1, counts
    assert counts["program"] == counts["bound"] == n, counts
    assert checked and max(checked.values()) == 1, checked


def test_a_first_agreeing_dtensor_call_compiles_once(fake_pg: Callable[[int], None]) -> None:
    # the DTensor door's agreement compiles its program; the bound call after it binds that
    # program (it compiled it again: checked_program ran twice)
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    fake_pg(4)
    with LocalTensorMode(4):
        dm = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
        dt = distribute_tensor(torch.arange(24.0, dtype=torch.float64).reshape(8, 3), dm, [Shard(0)])
        _, inner, programs, _ = _first_call_counts(lambda: torch_backend.redistribute(dt, DST, agree=True))
    assert programs == 1, programs
    assert inner and max(inner.count(t) for t in inner) == 1, inner


def test_a_type_refused_once_is_refused_again_with_its_own_text() -> None:
    # the check is remembered only for pairs it accepted: a bad type fails every time, its
    # caret in the text it was written as
    import lowering
    from spec_lang.errors import SpecError

    for text in ("f32[8@tp]", "f32[ 8@tp]"):
        with pytest.raises(SpecError) as e:
            lowering.check_type(text, "dp=2")
        assert text in str(e.value) and "'tp' is not on the mesh" in str(e.value), str(e.value)
