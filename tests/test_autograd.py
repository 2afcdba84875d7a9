"""Gradients of redistribute: the backward program is compile(dual(dst), dual(src)), and
it is the exact adjoint of the forward under the denotation inner product:
<redistribute(x), y>_dst == <x, grad>_src on random integer-valued float64 data."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _cases import case_params  # noqa: E402
from torch_utils import adjoint, from_local, local_mode, random_blocks, to_local  # noqa: E402
from typed_data import pairing  # noqa: E402

import lowering  # noqa: E402
import torch_backend  # noqa: E402
from spec_lang import SpecError, parse, parse_mesh  # noqa: E402
from spec_lang.dual import dual_type  # noqa: E402
from torch_backend.autograd import backward_program  # noqa: E402

# src, dst, forward kinds, backward kinds (the SPMD type system's forward/backward table), on dp=2,tp=2
DUALITY = [
    ("f64[8@dp]", "f64[8]", ["all_gather"], ["slice"]),  # all_gather(S,I) <- convert(I,S)
    ("f64[8@dp]", "f64[8]{R:dp}", ["all_gather"], ["reduce_scatter"]),  # all_gather(S,R) <- reduce_scatter
    ("f64[8]{U:dp}", "f64[8]{R:dp}", ["all_reduce"], ["all_reduce"]),  # all_reduce(R) <- all_reduce(R)
    ("f64[8]{U:dp}", "f64[8]", ["all_reduce"], ["reinterpret"]),  # all_reduce(I) <- reinterpret(I,R)
    ("f64[8]{R:dp}", "f64[8]", ["reinterpret"], ["zero_fill"]),  # reinterpret(R,I) <- convert(I,P)
    ("f64[8]", "f64[8]{R:dp}", ["reinterpret"], ["all_reduce"]),  # reinterpret(I,R) <- all_reduce(I)
    ("f64[8]{R:dp}", "f64[8]{U:dp}", ["zero_fill"], ["zero_fill"]),  # convert(R,P) <- convert(R,P)
    ("f64[8]", "f64[8]{U:dp}", ["zero_fill"], ["reinterpret"]),  # convert(I,P) <- reinterpret(R,I)
    ("f64[8@dp]", "f64[8]{U:dp}", ["zero_pad"], ["slice"]),  # convert(S,P) <- convert(R,S)
    ("f64[8]", "f64[8@dp]", ["slice"], ["all_gather"]),  # convert(I,S) <- all_gather(S,I)
    ("f64[8]{R:dp}", "f64[8@dp]", ["slice"], ["zero_pad"]),  # convert(R,S) <- convert(S,P)
    ("f64[8]{P(avg):dp}", "f64[8]", ["all_reduce"], ["reinterpret"]),  # avg: the gradient stays R
    ("f64[8]{R:dp}", "f64[8]{P(avg):dp}", ["reinterpret"], ["zero_fill"]),
    ("f64[8@tp]{V:dp}", "f64[8]{V:dp}", ["all_gather"], ["slice"]),  # V stays V
    ("f64[8@tp]{V:dp}", "f64[8]{V:dp,R:tp}", ["all_gather"], ["reduce_scatter"]),
    ("f64[8,4@tp]{V:dp}", "f64[8@tp,4]{V:dp}", ["permute"], ["permute"]),
    ("f64[6]{U:(dp,tp)}", "f64[6@tp]{R:dp}", ["reduce_scatter", "all_reduce"], ["all_reduce", "all_gather"]),
    ("f64[8@(dp,tp),6]", "f64[8@tp,6@dp]", ["all_to_all"], ["all_to_all"]),
    ("f64[10@(dp,tp)]", "f64[10]{R:(dp,tp)}", ["all_gather"], None),  # uneven: the planner's choice
]


@pytest.mark.parametrize("src,dst,fwd,bwd", DUALITY, ids=[f"{s}->{d}" for s, d, _, _ in DUALITY])
def test_duality_table(fake_pg, src, dst, fwd, bwd):
    program = lowering.compile(src, dst, "dp=2,tp=2")
    assert [s.kind for s in program.steps] == fwd
    back = backward_program(program)
    assert bwd is None or [s.kind for s in back.steps] == bwd
    assert back.src == dual_type(parse(dst)) and back.dst == dual_type(parse(src))
    lhs, rhs = adjoint(fake_pg, "dp=2,tp=2", src, dst)
    assert lhs == rhs


# P(max)/P(min) have no gradient (tested below)
@pytest.mark.parametrize("case", [p for p in case_params("redistribute.jsonl")
                                  if parse(p.values[0]["src"]).partial_op not in ("max", "min")])
def test_case_adjoint(fake_pg, case):
    src = parse(case["src"].replace("4096", "32"))
    dst = parse(case["dst"].replace("4096", "32"))
    lhs, rhs = adjoint(fake_pg, case["mesh"], str(src.replace(dtype="float64")), str(dst.replace(dtype="float64")))
    assert lhs == rhs


def test_dual_is_an_involution_for_sum():
    for text in ("f32[8@dp]{U:tp}", "f32[8]{R:(dp,tp)}", "f32[8]{V:dp}", "f32[8@tp]"):
        t = parse(text)
        assert dual_type(dual_type(t)) == t


@pytest.mark.parametrize("src,dst", [("f64[4]{P(max):dp}", "f64[4]"), ("f64[4]{R:dp}", "f64[4]{P(min):dp}")])
def test_max_min_have_no_gradient(fake_pg, src, dst):
    mesh = parse_mesh("dp=2")
    xb = random_blocks(parse(src), mesh, np.random.default_rng(1))
    with local_mode(fake_pg, 2) as lm:
        x = to_local(lm, xb, requires_grad=True)
        out = torch_backend.redistribute(x, src, dst, mesh)  # forward works
        with pytest.raises(SpecError, match="no gradient through a pending"):
            out.sum().backward()
        with torch.no_grad():
            torch_backend.redistribute(x, src, dst, mesh)


def test_gradient_flows_through_two_redistributes(fake_pg):
    """A chain: grad of sum(redistribute(redistribute(x))) is the composed backward."""
    mesh = parse_mesh("dp=2,tp=2")
    xb = random_blocks(parse("f64[8@(dp,tp),2]"), mesh, np.random.default_rng(3))
    with local_mode(fake_pg, 4) as lm:
        x = to_local(lm, xb, requires_grad=True)
        a = torch_backend.redistribute(x, "f64[8@(dp,tp),2]", "f64[8@tp,2@dp]", mesh)
        b = torch_backend.redistribute(a, "f64[8@tp,2@dp]", "f64[8,2]{R:(dp,tp)}", mesh)
        b.sum().backward()
        grads = from_local(x.grad)
    # every element was replicated on 4 ranks as R, each contributing a gradient of 1
    for g in grads:
        assert torch.equal(g, torch.full_like(g, 4.0))


# (src, dst) on dp=2,tp=2: a gather, a reduce_scatter onto two dims, an exchange, a mean
SECOND_ORDER = [("f64[8@(dp,tp),6]", "f64[8,6@tp]"), ("f64[8,6]{U:(dp,tp)}", "f64[8@tp,6@dp]"),
                ("f64[8@(dp,tp),6]", "f64[8@tp,6@dp]"), ("f64[8,6]{P(avg):dp}", "f64[8@dp,6]{R:tp}")]


@pytest.mark.parametrize("path", ["redistribute", "prepared", "async", "many", "spmd"])
def test_the_gradient_is_differentiable_itself(fake_pg, path: str) -> None:
    """create_graph=True (a gradient penalty, a Hessian-vector product): the gradient
    gx = B(gy) carries a graph, and differentiating it along v gives B's adjoint under the
    denotation pairing, as the first-order gradient is the forward's:
    <B(gy), v>_dual(src) = <gy, along_v>_dual(dst). Where dual is an involution (no
    P(avg), whose gradient is R, whose dual is a sum) that adjoint is the forward program,
    so along_v is the forward program on v. A gradient without a graph would count as a
    constant and make second-order gradients silently wrong."""
    from torch_backend import spmd

    mesh = parse_mesh("dp=2,tp=2")
    # the typed all_gather(S(0) -> R) over the flattened (dp, tp) group has this type pair
    pairs = [("f64[8@(dp,tp),6]", "f64[8,6]{R:(dp,tp)}")] if path == "spmd" else SECOND_ORDER
    rng = np.random.default_rng(5)
    with local_mode(fake_pg, 4) as lm:
        for src, dst in pairs:
            s, d = parse(src), parse(dst)
            x = to_local(lm, random_blocks(s, mesh, rng), requires_grad=True)
            gyb, vb = random_blocks(dual_type(d), mesh, rng), random_blocks(dual_type(dual_type(s)), mesh, rng)
            gy, v = to_local(lm, gyb, requires_grad=True), to_local(lm, vb)
            if path == "redistribute":
                y = torch_backend.redistribute(x, s, d, mesh)
            elif path == "prepared":
                y = torch_backend.redistributor(s, d, mesh)(x)
            elif path == "async":
                y = torch_backend.redistribute(x, s, d, mesh, async_op=True).wait()
            elif path == "many":
                y = torch_backend.redistribute_many([x], [s], [d], mesh)[0]
            else:
                with spmd.use_mesh(mesh):
                    y = spmd.all_gather(x, ("dp", "tp"), src=spmd.S(0), dst=spmd.R)
            (gx,) = torch.autograd.grad(y, x, gy, create_graph=True)
            assert gx.requires_grad and gx.grad_fn is not None, (path, src, dst)
            (along_v,) = torch.autograd.grad(gx, gy, v)
            gxs, alongs = from_local(gx.detach()), from_local(along_v)
            assert pairing(dual_type(s), mesh, gxs, vb) == pytest.approx(
                pairing(dual_type(d), mesh, gyb, alongs)), (path, src, dst)
            if dual_type(dual_type(s)) != s:
                continue
            if path == "spmd":
                with spmd.use_mesh(mesh):
                    want = spmd.all_gather(v, ("dp", "tp"), src=spmd.S(0), dst=spmd.R)
            else:
                want = torch_backend.redistribute(v, s, d, mesh)
            for r, (a, b) in enumerate(zip(alongs, from_local(want))):
                assert torch.equal(a, b), (path, src, dst, r)
