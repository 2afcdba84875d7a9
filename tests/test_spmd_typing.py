"""Types on tensors and the type checker: assert_type/typeof, the local rules of
typecheck(), the global rule of einsum/matmul/linear (its three conditions and explicit
partial outputs), local_map, and erasure (the same numbers with typing off)."""

from __future__ import annotations

import pytest
import torch

from spec_lang.errors import SpecError
from torch_backend import spmd
from torch_backend.spmd import I, P, R, S, V


def typed(t: dict, *shape: int) -> torch.Tensor:
    return spmd.assert_type(torch.ones(*shape or (3,), dtype=torch.float64), t)


def test_assert_type_and_typeof() -> None:
    x = torch.zeros(4, 6)
    assert spmd.typeof(x) == {}
    assert spmd.assert_type(x, {"tp": "V", "dp": P("avg")}) is x
    assert spmd.typeof(x) == {"tp": V, "dp": P("avg")}
    y = spmd.assert_type(torch.zeros(4, 6), "f32[4,6]{V:tp}")
    assert spmd.typeof(y) == {"tp": V}
    z = spmd.assert_type(torch.zeros(2, 6), "f32[8@(dp,tp),6]{U:cp, R:ep}")
    assert spmd.typeof(z) == {"dp": S(0), "tp": S(0), "cp": P, "ep": R}
    with pytest.raises(SpecError, match="axis 'tp' of the tensor is V, not R"):
        spmd.assert_type(y, {"tp": R})
    with pytest.raises(SpecError, match="not a local SPMD type"):
        spmd.assert_type(x, {"tp": "Z"})
    with pytest.raises(SpecError):
        spmd.assert_type(x, "f32[4,6]{V:tp")  # a DSL error, with its caret


@pytest.mark.parametrize("a,b,want", [(R, R, R), (I, I, I), (V, V, V), (R, V, V), (V, R, V), (P, P, P),
                                      (S(0), S(0), S(0)), (S(0), R, S(0)), (S(0), V, V)])
def test_elementwise_rules(a, b, want) -> None:
    x, y = typed({"tp": a}), typed({"tp": b})
    with spmd.typecheck():
        assert spmd.typeof(x + y) == {"tp": want}


@pytest.mark.parametrize("fn,want", [
    (lambda p, r: p * r, P), (lambda p, r: r * p, P), (lambda p, r: p * 2.0, P), (lambda p, r: -p, P),
    (lambda p, r: p.sum(), P), (lambda p, r: p.reshape(3, 1), P), (lambda p, r: p[1:], P),
    (lambda p, r: torch.cat([p, p]), P), (lambda p, r: p / 2, P), (lambda p, r: torch.relu(r), R),
])
def test_linear_ops_keep_partial(fn, want) -> None:
    p, r = typed({"tp": P}), typed({"tp": R})
    with spmd.typecheck():
        assert spmd.typeof(fn(p, r)) == {"tp": want}


@pytest.mark.parametrize("fn,op,args,fix", [
    (lambda p, r: p * p, "mul", "P, P", "all_reduce"),
    (lambda p, r: p + r, "add", "P, R", "all_reduce|convert"),
    (lambda p, r: p + 1.0, "add", "number", "all_reduce"),
    (lambda p, r: torch.relu(p), "relu", "P", "all_reduce"),
    (lambda p, r: torch.exp(p), "exp", "P", "all_reduce"),
    (lambda p, r: r / p, "div", "R, P", "all_reduce"),
])
def test_partial_violations_name_op_types_and_fix(fn, op, args, fix) -> None:
    p, r = typed({"tp": P}), typed({"tp": R})
    with spmd.typecheck(), pytest.raises(SpecError) as e:
        fn(p, r)
    msg = str(e.value)
    assert msg.startswith(op) and args in msg and "'tp'" in msg
    assert any(f in msg.split("hint:")[1] for f in fix.split("|"))


@pytest.mark.parametrize("other,fix", [(R, "reinterpret"), (V, "all_gather"), (P, "all_reduce")])
def test_invariant_never_mixes(other, fix) -> None:
    i, o = typed({"tp": I}), typed({"tp": other})
    with spmd.typecheck(), pytest.raises(SpecError, match=f"add mixes I with {other!r}") as e:
        i + o
    assert fix in str(e.value).split("hint:")[1]


def test_partial_of_other_ops_and_varying_products_are_refused() -> None:
    pm, p, v = typed({"tp": P("max")}), typed({"tp": P}), typed({"tp": V})
    with spmd.typecheck():
        assert spmd.typeof(pm.reshape(3, 1)) == {"tp": P("max")}
        with pytest.raises(SpecError, match="pending max"):
            pm + pm
        with pytest.raises(SpecError, match=r"mul\(P, V\)"):
            p * v


def test_untyped_tensors_are_outside_the_checker_and_axes_are_independent() -> None:
    x = typed({"tp": V, "dp": R})
    y = typed({"dp": P})
    with spmd.typecheck():
        assert spmd.typeof(torch.ones(3) + torch.ones(3)) == {}
        assert spmd.typeof(x * y) == {"tp": V, "dp": P}
        assert spmd.typeof(x + torch.ones(3)) == {"tp": V, "dp": R}
        assert x.shape == (3,) and x.numel() == 3  # metadata is not an op


def test_global_einsum_three_conditions() -> None:
    rows = typed({"tp": S(0)}, 2, 4)  # [i@tp, j]
    cols = typed({"tp": S(1)}, 4, 5)  # [j, k@tp]
    rep = typed({"tp": R}, 4, 5)
    # kept label sharded in the only operand using it -> S on the output dim
    assert spmd.typeof(spmd.einsum("ij,jk->ik", rows, rep)) == {"tp": S(0)}
    assert spmd.typeof(spmd.einsum("ij,jk->ik", typed({"tp": R}, 2, 4), cols)) == {"tp": S(1)}
    # condition 2: two operands shard different labels on the same axis
    with pytest.raises(SpecError, match="different labels"):
        spmd.einsum("ij,jk->ik", rows, cols)
    # condition 2: an operand uses the sharded label but is not sharded on it
    with pytest.raises(SpecError, match="does not shard it there"):
        spmd.einsum("ij,ik->jk", rows, typed({"tp": R}, 2, 5))
    # condition 1: a contracted sharded label needs out_partial_axes
    h, w = typed({"tp": S(1)}, 2, 4), typed({"tp": S(0)}, 4, 5)
    with pytest.raises(SpecError, match="(?s)contracts label 'j'.*out_partial_axes='tp'"):
        spmd.einsum("ij,jk->ik", h, w)
    assert spmd.typeof(spmd.einsum("ij,jk->ik", h, w, out_partial_axes="tp")) == {"tp": P}
    with spmd.typecheck(), pytest.raises(SpecError, match="matmul contracts label"):
        h @ w
    with pytest.raises(SpecError, match="kept label"):
        spmd.einsum("ij,jk->ik", rows, rep, out_partial_axes="tp")
    with pytest.raises(SpecError, match="explicit"):
        spmd.einsum("...j,jk", h, w)


def test_local_einsum_and_linear_partial_outputs() -> None:
    h, w = typed({"tp": V}, 2, 4), typed({"tp": V}, 5, 4)
    assert spmd.typeof(spmd.linear(h, w)) == {"tp": V}  # local SPMD: a per-rank matmul
    assert spmd.typeof(spmd.linear(h, w, out_partial_axes="tp")) == {"tp": P}
    hs, ws = typed({"tp": S(1)}, 2, 4), typed({"tp": S(1)}, 5, 4)
    assert spmd.typeof(spmd.linear(hs, ws, out_partial_axes="tp")) == {"tp": P}
    with pytest.raises(SpecError, match=r"add\(P, R\)"):
        spmd.linear(hs, ws, typed({"tp": R}, 5), out_partial_axes="tp")
    with pytest.raises(SpecError, match="contracts label"):
        spmd.linear(hs, ws)


def test_blocks_torch_refuses_are_a_spec_error() -> None:
    """Types that agree on blocks whose sizes do not: torch's refusal comes back as a
    SpecError naming the shapes, not a bare RuntimeError."""
    a, b = typed({"tp": V}, 2, 4), typed({"tp": V}, 3, 5)
    with pytest.raises(SpecError, match=r"(?s)einsum\('ij,jk->ik'\) cannot run on this rank's blocks of "
                       r"shapes \[2, 4\], \[3, 5\].*hint"):
        spmd.einsum("ij,jk->ik", a, b)
    with pytest.raises(SpecError, match=r"linear cannot run on this rank's blocks of shapes \[2, 4\], \[3, 5\]"):
        spmd.linear(a, b)
    assert spmd.einsum("ij,kj->ik", a, typed({"tp": V}, 3, 4)).shape == (2, 3)


def test_local_map_drops_and_restores_the_partition_spec() -> None:
    seen = {}

    def body(a, b):
        seen["a"], seen["b"] = spmd.typeof(a), spmd.typeof(b)
        return a * b

    f = spmd.local_map(body, in_types=({"tp": S(0)}, {"tp": R}), out_types={"tp": S(0)})
    x, y = typed({"tp": S(0)}, 3), typed({"tp": R}, 3)
    with spmd.typecheck():
        out = f(x, y)
    assert seen == {"a": {"tp": V}, "b": {"tp": R}}
    assert spmd.typeof(out) == {"tp": S(0)} and spmd.typeof(x) == {"tp": S(0)}
    with pytest.raises(SpecError, match="argument 0 is R on axis 'tp'"):
        f(typed({"tp": R}), y)
    g = spmd.local_map(lambda a: a, in_types=({"tp": V},), out_types={"tp": R})
    with pytest.raises(SpecError, match="output 0 is V on axis 'tp' inside"):
        g(typed({"tp": V}))
    # a typed slot holds a tensor; None marks the slots of anything else
    with pytest.raises(SpecError, match="argument 0 is a float, but in_types gives it"):
        g(2.0)
    with pytest.raises(SpecError, match="output 0 is a int, but out_types gives it"):
        spmd.local_map(lambda a: 3, in_types=({"tp": V},), out_types={"tp": V})(typed({"tp": V}))
    h = spmd.local_map(lambda a, k: (a * k, k), in_types=({"tp": V}, None), out_types=({"tp": V}, None))
    out, k = h(typed({"tp": V}), 2)
    assert k == 2 and spmd.typeof(out) == {"tp": V}


def test_use_mesh_checks_its_mesh_on_entry() -> None:
    with pytest.raises(SpecError, match="malformed mesh") as info:
        with spmd.use_mesh("dp="):
            pass
    assert info.value.pos == 3
    with pytest.raises(SpecError, match="use_mesh takes a mesh, got int"):
        with spmd.use_mesh(8):
            pass


def test_typing_is_erasable(fake_pg) -> None:
    from spmd_utils import Tv
    from torch_utils import from_local, local_mode, to_local

    def model(x, w):
        h = torch.tanh(x * w)
        h = spmd.reinterpret(h, "x", src=V, dst=P)
        return spmd.all_reduce(h * 0.5, "x", src=P, dst=R).sum()

    results = []
    for checked in (True, False):
        with local_mode(fake_pg, 3) as lm, spmd.use_mesh("x=3"):
            x = to_local(lm, [Tv("A", "B"), Tv("C", "D"), Tv("E", "F")])
            w = to_local(lm, [torch.full((2,), 0.01, dtype=torch.float64)] * 3)
            if checked:
                spmd.assert_type(x, {"x": V})
                spmd.assert_type(w, {"x": R})
                with spmd.typecheck():
                    results.append(from_local(model(x, w)))
            else:
                results.append(from_local(model(x, w)))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_affine_ops_and_local_einsum_under_typecheck() -> None:
    p, r, v = typed({"tp": P}, 2, 3), typed({"tp": R}, 4, 3), typed({"tp": V}, 2, 3)
    with spmd.typecheck():
        assert spmd.typeof(torch.nn.functional.linear(p, r)) == {"tp": P}
        with pytest.raises(SpecError, match=r"add\(P, R\)"):
            torch.nn.functional.linear(p, r, typed({"tp": R}, 4))
        with pytest.raises(SpecError, match=r"addmm\(P, R\)"):  # R bias + the P product (test_spmd_usage)
            torch.addmm(typed({"tp": R}, 2, 4), p, r.t())
        assert spmd.typeof(torch.einsum("...j,kj->...k", v, r)) == {"tp": V}  # local: no partition spec


@pytest.mark.parametrize("first_read", ["outside typecheck", "inside typecheck"])
def test_a_gradient_has_one_type_however_it_is_first_read(first_read) -> None:
    """typeof(w.grad) is the gradient's type (V's V, R's P) whether it is first read inside
    typecheck() or outside it, and stays so: before, outside it was {} until the checker
    had once read w.grad, and the checker's type then stuck."""
    want = {"tp": V, "dp": P}
    w = spmd.assert_type(torch.ones(3, requires_grad=True), {"tp": V, "dp": R})
    (w * 2).sum().backward()
    reads = []
    for inside in ((False, True) if first_read == "outside typecheck" else (True, False)):
        if inside:
            with spmd.typecheck():
                reads.append(spmd.typeof(w.grad))
        else:
            reads.append(spmd.typeof(w.grad))
    assert reads == [want, want], reads
    # a new gradient tensor (zero_grad(set_to_none=True)) is typed when backward makes it
    w.grad = None
    (w * 3).sum().backward()
    assert spmd.typeof(w.grad) == want
    # a gradient that existed before the tensor was typed is typed with it
    u = torch.ones(3, requires_grad=True)
    u.sum().backward()
    spmd.assert_type(u, {"tp": R})
    assert spmd.typeof(u.grad) == {"tp": P}
