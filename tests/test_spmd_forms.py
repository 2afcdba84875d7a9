"""The rest of the SPMD API's forms (issue 30, part 3 item 7): ``S(-1)``, V stacked on a
dim other than 0 (``gather_dim``/``scatter_dim``), ``redistribute`` from V, typed Python
numbers, ``out=`` and in-place results, jax ``PartitionSpec`` types, nested ``local_map``.

The oracle is the SPMD type system's semantics written with torch on the per-rank blocks
(concatenate, stack, sum: the rank diagrams), its types, and the backward as the exact
adjoint: on integer data, sum_r <f(x)_r, g_r> == sum_r <x_r, (df^T g)_r>, with the
gradient's values also written from the backward's own diagram."""

from __future__ import annotations

import pytest
import torch
from spmd_utils import same
from torch_utils import from_local, local_mode, to_local

from spec_lang.errors import SpecError
from torch_backend import spmd
from torch_backend.spmd import I, P, R, S, V

N = 3


def blocks(*shape: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-9, 10, shape, generator=g).double() for _ in range(N)]


def run(fake_pg, fn, xs, gs, t):
    """fn(x) on 3 ranks (x typed ``t`` on axis x), and x's gradient for incoming ``gs``."""
    with local_mode(fake_pg, N) as lm, spmd.use_mesh(f"x={N}"):
        x = spmd.assert_type(to_local(lm, xs, requires_grad=True), {"x": t})
        y = fn(x)
        (gx,) = torch.autograd.grad(y, x, grad_outputs=to_local(lm, gs))
        return from_local(y), from_local(gx), spmd.typeof(y)


def adjoint_holds(xs, ys, gs, gxs, once: bool = False) -> None:
    """``once``: the output is I, one value (counted once), not R's per-rank replicas."""
    lhs = sum(float((y * g).sum()) for y, g in zip(ys[:1] if once else ys, gs))
    rhs = sum(float((x * gx).sum()) for x, gx in zip(xs, gxs))
    assert lhs == rhs


# ---- S(-1) ----------------------------------------------------------------------------------

def test_negative_dims_count_from_the_end(fake_pg) -> None:
    """all_gather(S(-1), R) is the concatenation on the last dim; reduce_scatter(P, S(-1)) the
    sum chunked on it (backward: all_gather on it); the types are stored resolved, S(1)."""
    xs, gs = blocks(2, 2), blocks(2, 6, seed=1)
    ys, gx, t = run(fake_pg, lambda x: spmd.all_gather(x, "x", src=S(-1), dst=R), xs, gs, S(-1))
    same(ys, [torch.cat(xs, 1)] * N)
    same(gx, [sum(gs).chunk(N, 1)[r] for r in range(N)])  # reduce_scatter(P, S(1))
    assert t == {"x": R}
    adjoint_holds(xs, ys, gs, gx)

    xs, gs = blocks(2, 6), blocks(2, 2, seed=1)
    ys, gx, t = run(fake_pg, lambda x: spmd.reduce_scatter(x, "x", src=P, dst="S(-1)"), xs, gs, P)
    same(ys, [sum(xs).chunk(N, 1)[r] for r in range(N)])
    same(gx, [torch.cat(gs, 1)] * N)
    assert t == {"x": S(1)}
    adjoint_holds(xs, ys, gs, gx)

    assert spmd.typeof(spmd.assert_type(torch.ones(2, 3, 4), {"x": S(-2)})) == {"x": S(1)}
    with pytest.raises(SpecError, match=r"S\(-3\) counts 3 dims from the end, but the tensor has 2 dims"):
        spmd.assert_type(torch.ones(2, 3), {"x": S(-3)})
    assert spmd.typeof(spmd.assert_type(torch.ones(2, 3), {"x": " S(-1) "})) == {"x": S(1)}  # text too
    with pytest.raises(SpecError, match=r"S\(-1\) counts 1 dims from the end, but the tensor has 0 dims"):
        spmd.all_gather(torch.tensor(1.0), "x", src=S(-1), dst=R, mesh="x=3")


def test_negative_dims_in_local_map_and_all_to_all(fake_pg) -> None:
    seen = {}

    def body(a):
        seen["a"] = spmd.typeof(a)
        return a

    f = spmd.local_map(body, in_types=({"x": S(-1)},), out_types={"x": S(-1)})
    y = f(spmd.assert_type(torch.ones(2, 3), {"x": V}))
    assert seen["a"] == {"x": V} and spmd.typeof(y) == {"x": S(1)}
    xs, gs = blocks(2, 6), blocks(6, 2, seed=1)
    ys, gx, t = run(fake_pg, lambda x: spmd.all_to_all(x, "x", src=S(0), dst=S(-1)), xs, gs, S(0))
    full = torch.cat(xs, 0)
    same(ys, [full.chunk(N, 1)[r] for r in range(N)])
    assert t == {"x": S(1)}
    adjoint_holds(xs, ys, gs, gx)


# ---- V stacked on another dim ----------------------------------------------------------------

@pytest.mark.parametrize("dim", [1, 2, -1])
def test_gather_dim_stacks_the_blocks_there(fake_pg, dim) -> None:
    """all_gather(V, R, gather_dim=d) is torch.stack(blocks, d) on every rank; its backward,
    reduce_scatter(P, V, scatter_dim=d), gives rank r the sum of the gradients' slot r on d."""
    xs, gs = blocks(2, 4), blocks(*torch.stack(blocks(2, 4), dim).shape, seed=1)
    ys, gx, t = run(fake_pg, lambda x: spmd.all_gather(x, "x", src=V, dst=R, gather_dim=dim), xs, gs, V)
    same(ys, [torch.stack(xs, dim)] * N)
    same(gx, [sum(gs).select(dim, r) for r in range(N)])
    assert t == {"x": R}
    adjoint_holds(xs, ys, gs, gx)


@pytest.mark.parametrize("dim", [1, -1])
def test_scatter_dim_unbinds_that_dim(fake_pg, dim) -> None:
    """reduce_scatter(P, V, scatter_dim=d): rank r gets slot r of dim d of the sum; its
    backward all_gather(V, R, gather_dim=d) stacks the gradients there."""
    xs, gs = blocks(2, N), blocks(2, seed=1)
    ys, gx, t = run(fake_pg, lambda x: spmd.reduce_scatter(x, "x", src=P, dst=V, scatter_dim=dim), xs, gs, P)
    same(ys, [sum(xs).select(dim, r) for r in range(N)])
    same(gx, [torch.stack(gs, dim)] * N)
    assert t == {"x": V}
    adjoint_holds(xs, ys, gs, gx)


def test_gather_dim_invariant_and_refusals(fake_pg) -> None:
    """all_gather(V, I, gather_dim=1): backward is convert(I, V) on dim 1, each rank's own slot."""
    xs, gs = blocks(2), blocks(2, N, seed=1)
    gs = [gs[0]] * N  # an I gradient is the same on every rank
    ys, gx, _ = run(fake_pg, lambda x: spmd.all_gather(x, "x", src=V, dst=I, gather_dim=1), xs, gs, V)
    same(ys, [torch.stack(xs, 1)] * N)
    same(gx, [gs[0][:, r] for r in range(N)])
    adjoint_holds(xs, ys, gs, gx, once=True)
    fake_pg(N)
    x = spmd.assert_type(torch.ones(6, 2), {"x": S(0)})
    with pytest.raises(SpecError, match=r"takes no gather_dim: only V's blocks stack"):
        spmd.all_gather(x, "x", src=S(0), dst=R, gather_dim=1, mesh="x=3")
    with pytest.raises(SpecError, match="gather_dim=3 is out of range for a result of 3 dims"):
        spmd.all_gather(torch.ones(2, 2), "x", src=V, dst=R, gather_dim=3, mesh="x=3")
    with pytest.raises(SpecError, match=r"needs dim 1 of the group's size 3"):
        spmd.reduce_scatter(torch.ones(3, 2), "x", src=P, dst=V, scatter_dim=1, mesh="x=3")


# ---- redistribute from V ---------------------------------------------------------------------

@pytest.mark.parametrize("src,dst,oracle", [
    (V, R, lambda xs: [torch.stack(xs)] * N),
    (V, I, lambda xs: [torch.stack(xs)] * N),
    (P, V, lambda xs: [sum(xs)[r] for r in range(N)]),
], ids=["V->R", "V->I", "P->V"])
def test_redistribute_from_and_to_varying(fake_pg, src, dst, oracle) -> None:
    """redistribute keeps the value with one collective: V -> R|I is all_gather (stacked),
    P -> V reduce_scatter; the backward is that collective's."""
    shape = (N, 2) if src == P else (2,)
    xs = blocks(*shape)
    want = oracle(xs)
    gs = blocks(*want[0].shape, seed=1)
    if dst == I:
        gs = [gs[0]] * N
    ys, gx, t = run(fake_pg, lambda x: spmd.redistribute(x, "x", src=src, dst=dst), xs, gs, src)
    same(ys, want)
    assert t == {"x": dst}
    _, gx_direct, _ = run(fake_pg, lambda x: getattr(spmd, "all_gather" if src == V else "reduce_scatter")(
        x, "x", src=src, dst=dst), xs, gs, src)
    same(gx, gx_direct)
    adjoint_holds(xs, ys, gs, gx, once=dst == I)


# ---- typed Python numbers --------------------------------------------------------------------

def test_typed_python_numbers(fake_pg) -> None:
    """A number that differs per rank (V) makes a replicated tensor varying; a pending-sum
    number adds to a pending sum; an R number does not (it would count once per rank). An
    untyped number is read as before (R-like: ``P + 1.0`` refused)."""
    with local_mode(fake_pg, N) as lm, spmd.use_mesh("x=3"):
        r = spmd.assert_type(to_local(lm, [torch.ones(2)] * N), {"x": R})
        p = spmd.assert_type(to_local(lm, [torch.ones(2)] * N), {"x": P})
        with spmd.typecheck():
            s = spmd.assert_type(0.5, {"x": V})
            assert spmd.typeof(s) == {"x": V} and s == 0.5 and isinstance(s, float)
            assert spmd.typeof(r * s) == {"x": V}
            assert spmd.typeof(p + spmd.assert_type(2, {"x": P})) == {"x": P}
            assert spmd.typeof(p * 2.0) == {"x": P}
            with pytest.raises(SpecError, match=r"add\(P, R\) on mesh axis 'x'"):
                p + spmd.assert_type(2.0, {"x": R})
            with pytest.raises(SpecError, match="a pending sum and a number"):
                p + 1.0
    v = spmd.assert_type(torch.arange(3.0), {"x": V})
    with spmd.typecheck():
        n = v.sum().item()  # each rank's own sum: V
        assert spmd.typeof(n) == {"x": V} and n == 3.0
        assert spmd.typeof(spmd.assert_type(torch.ones(2), {"x": R}) * n) == {"x": V}
    with pytest.raises(SpecError, match="a Python number has no dims to split"):
        spmd.assert_type(1.0, {"x": S(0)})
    with pytest.raises(SpecError, match="needs a tensor or a Python number"):
        spmd.assert_type("1.0", {"x": R})


# ---- out= and in-place results ---------------------------------------------------------------

def test_in_place_results_keep_their_destinations_type() -> None:
    """The value written in place has the out-of-place op's type; a typed destination must
    agree with it (its other references still read its type): R += V is refused, V += R,
    P *= R and P += P are not; x[i] = v is checked alike."""
    def t(kind):
        return spmd.assert_type(torch.ones(2, 3), {"tp": kind})

    with spmd.typecheck():
        v = t(V)
        v.add_(t(R))
        assert spmd.typeof(v) == {"tp": V}
        p = t(P)
        p.mul_(t(R))
        p += t(P)
        assert spmd.typeof(p) == {"tp": P}
        with pytest.raises(SpecError, match="add_: the result is V on mesh axis 'tp', but the tensor it writes "
                           "in place is R"):
            t(R).add_(t(V))
        with pytest.raises(SpecError, match="the tensor it writes in place is R"):
            r = t(R)
            r += t(V)
        with pytest.raises(SpecError, match="setitem: the result is V .* in place is R"):
            r = t(R)
            r[0] = t(V)[0]
        with pytest.raises(SpecError, match=r"mul\(P, P\)"):  # mul_ has mul's rule
            t(P).mul_(t(P))
        c = t(V)
        c.copy_(t(V))
        with pytest.raises(SpecError, match="copy_: the result is V .* in place is R"):
            t(R).copy_(t(V))


def test_out_tensors_take_or_must_agree_with_the_result() -> None:
    with spmd.typecheck():
        out = torch.empty(2, 3)
        torch.add(spmd.assert_type(torch.ones(2, 3), {"tp": R}), spmd.assert_type(torch.ones(2, 3), {"tp": V}), out=out)
        assert spmd.typeof(out) == {"tp": V}
        typed_out = spmd.assert_type(torch.empty(2, 3), {"tp": P})
        r = spmd.assert_type(torch.ones(2, 3), {"tp": R})
        with pytest.raises(SpecError, match="add: the result is R on mesh axis 'tp', but its out= tensor is P"):
            torch.add(r, r, out=typed_out)


# ---- PartitionSpec types ---------------------------------------------------------------------

def test_partition_specs_are_types(fake_pg) -> None:
    """A jax PartitionSpec states S(d) on each axis of dim d's entry and P on its unreduced
    axes, as the type string of the same spec does."""
    jax_sharding = pytest.importorskip("jax.sharding")
    Pspec = jax_sharding.PartitionSpec
    x = spmd.assert_type(torch.ones(2, 3), Pspec(None, ("dp", "tp"), unreduced={"ep"}))
    assert spmd.typeof(x) == {"dp": S(1), "tp": S(1), "ep": P}
    assert spmd.typeof(spmd.assert_type(torch.ones(2, 3), Pspec("tp"))) == spmd.typeof(
        spmd.assert_type(torch.ones(2, 3), "f32[8@tp,3]"))
    seen = {}

    def body(a):
        seen["a"] = spmd.typeof(a)
        return a

    y = spmd.local_map(body, in_types=(Pspec(None, "tp"),), out_types=Pspec(None, "tp"))(torch.ones(2, 3))
    assert seen["a"] == {"tp": V} and spmd.typeof(y) == {"tp": S(1)}
    with pytest.raises(SpecError, match="has 3 entries for a 2-d shape"):
        spmd.assert_type(torch.ones(2, 3), Pspec("tp", None, None))
    with pytest.raises(SpecError, match="takes a dict {axis: type}, a type string or a jax PartitionSpec"):
        spmd.assert_type(torch.ones(2, 3), ["tp"])
    # the global einsum rule then reads them like any S(i)
    fake_pg(2)
    w = spmd.assert_type(torch.ones(4, 3), Pspec("tp", None))
    assert spmd.typeof(spmd.linear(torch.ones(2, 3), w)) == {"tp": S(1)}


# ---- nested local_map ------------------------------------------------------------------------

def test_local_map_slots_nest_like_the_arguments() -> None:
    """A list or tuple argument takes a list or tuple of slots, as deep as it goes; outputs
    alike; a slot count that does not match is refused naming the path."""
    seen = {}

    def body(x, pair, scale):
        seen["x"], seen["a"], seen["b"] = spmd.typeof(x), spmd.typeof(pair[0]), spmd.typeof(pair[1][0])
        return x * scale, [pair[0], (pair[1][0],)]

    f = spmd.local_map(body, in_types=({"tp": S(0)}, ({"tp": R}, [{"tp": "S(1)"}]), None),
                       out_types=({"tp": S(0)}, [{"tp": R}, ({"tp": S(1)},)]))
    x = torch.ones(2, 3)
    y, (a, (b,)) = f(x, (torch.ones(3), [torch.ones(2, 2)]), 2.0)
    assert seen == {"x": {"tp": V}, "a": {"tp": R}, "b": {"tp": V}}
    assert spmd.typeof(y) == {"tp": S(0)} and spmd.typeof(a) == {"tp": R} and spmd.typeof(b) == {"tp": S(1)}
    assert torch.equal(y, 2 * x)
    with pytest.raises(SpecError, match=r"in_types gives argument 1 2 slots, but it is a tuple of 1"):
        f(x, (torch.ones(3),), 2.0)
    with pytest.raises(SpecError, match=r"argument 1\[1\]\[0\] is a float"):
        f(x, (torch.ones(3), [1.0]), 2.0)
    with pytest.raises(SpecError, match=r"local_map in_types\[1\]\[0\] is a int"):
        spmd.local_map(body, in_types=({"tp": R}, (3,)), out_types=None)


def test_local_map_infers_the_argument_types_when_in_types_is_left_out() -> None:
    """No in_types (the peer's ``in_types=Infer``): each argument enters with the types it
    carries, unchecked, in local form (S(i) is V inside), nested ones and numbers too; the
    outputs leave with the stated out_types, which stay required."""
    seen = {}

    def body(x, pair, scale):
        seen["x"], seen["pair"] = spmd.typeof(x), [spmd.typeof(t) for t in pair]
        return x * scale, pair[0]

    x = spmd.assert_type(torch.ones(4, 3), {"tp": S(0), "dp": R})
    w = spmd.assert_type(torch.ones(3), {"tp": R})
    f = spmd.local_map(body, out_types=({"tp": S(0)}, {"tp": R}))
    y, z = f(x, (w, torch.ones(2)), 2.0)
    assert seen == {"x": {"tp": V, "dp": R}, "pair": [{"tp": R}, {}]}
    assert spmd.typeof(y) == {"tp": S(0)} and spmd.typeof(z) == {"tp": R}  # (no typecheck(): x * 2.0 is untyped)
    assert spmd.typeof(x) == {"tp": S(0), "dp": R}  # the caller's tensor keeps its types
    with pytest.raises(TypeError):
        spmd.local_map(body)  # out_types is required: returning to global SPMD says how
