"""The SPMD type system as Megatron-style code uses it: attribute reads and gradients under
``typecheck()``, the tables' diagonal (src == dst: nothing to do), ``local_map``'s slots.

The oracle is the type system's semantics: the rank diagrams' values (letters as distinct
numbers, LocalTensorMode on 3 ranks), its gradient table (R <-> P, I, V, S(i) their own)
and the backward of an identity being the identity."""

from __future__ import annotations

import pytest
import torch
from spmd_utils import Tv, same
from torch_utils import from_local, local_mode, to_local

from spec_lang.errors import SpecError
from torch_backend import comm, spmd
from torch_backend.spmd import I, P, R, S, V

ABC = [Tv("A", "B"), Tv("C", "D"), Tv("E", "F")]


def typed(t: dict, *shape: int) -> torch.Tensor:
    return spmd.assert_type(torch.ones(*shape or (2, 3), dtype=torch.float64), t)


# ---- attribute reads -----------------------------------------------------------------------

def test_attribute_reads_of_a_partial_tensor() -> None:
    """Structural attributes keep P (a transpose of a pending sum is the pending sum of the
    transposes); metadata reads have no type and never refuse."""
    x = typed({"tp": P, "dp": S(0)})
    with spmd.typecheck():
        assert spmd.typeof(x.T) == {"tp": P, "dp": V}  # a transpose moves dim 0: the spec is dropped
        assert spmd.typeof(x.mT) == {"tp": P, "dp": V}
        assert spmd.typeof(x.data) == {"tp": P, "dp": S(0)}
        assert spmd.typeof(x.view(3, 2)) == {"tp": P, "dp": V}
        assert spmd.typeof(x[0]) == {"tp": P, "dp": V}
        assert x.shape == (2, 3) and x.dtype == torch.float64 and x.ndim == 2 and x.device.type == "cpu"
        assert x.grad is None and x.grad_fn is None and x.is_leaf and not x.requires_grad
        assert x.is_floating_point() and len(x) == 2 and "tensor" in repr(x)
        x.grad = None  # a write is no op either
        with pytest.raises(SpecError, match="relu is not linear"):  # an op on P is still checked
            torch.relu(x)


def test_grad_has_the_gradients_type() -> None:
    """``w.grad`` is typed by the gradient table: R -> P, P -> R, I -> I, V -> V, S(i) -> S(i)."""
    for t, g in ((R, P), (P, R), (P("avg"), R), (I, I), (V, V), (S(1), S(1))):
        w = spmd.assert_type(torch.ones(2, 3, requires_grad=True), {"tp": t})
        w.grad = torch.full((2, 3), 2.0)
        with spmd.typecheck():
            assert spmd.typeof(w.grad) == {"tp": g}


def test_gradient_of_a_replicated_parameter_syncs_under_typecheck(fake_pg) -> None:
    """An R weight times V data: each rank's local gradient is a piece of a pending sum
    (+A, +C, +E ...), and ``all_reduce(w.grad, src=P, dst=R)`` is the global gradient
    A+C+E on every rank. Reading ``w.grad`` used to stamp it R, so the sync was refused."""
    with local_mode(fake_pg, 3) as lm, spmd.use_mesh("x=3"):
        x = spmd.assert_type(to_local(lm, ABC), {"x": V})
        w = spmd.assert_type(to_local(lm, [torch.ones(2, dtype=torch.float64)] * 3, requires_grad=True), {"x": R})
        with spmd.typecheck():
            y = spmd.reinterpret(w * x, "x", src=V, dst=P)  # R * V -> V; a global sum
            loss = spmd.all_reduce(y, "x", src=P, dst=I).sum()
        loss.backward()
        with spmd.typecheck():
            assert spmd.typeof(w.grad) == {"x": P}
            same(from_local(w.grad), ABC)  # the pieces: each rank's own data
            g = spmd.all_reduce(w.grad, "x", src=P, dst=R)
        assert spmd.typeof(g) == {"x": R}
        same(from_local(g), [Tv("A+C+E", "B+D+F")] * 3)


# ---- src == dst: nothing to do ------------------------------------------------------------

DIAGONAL = [(op, t) for op in ("convert", "reinterpret", "redistribute") for t in (R, I, V, P, P("avg"), S(0))
            if not (op == "reinterpret" and t.kind == "S")]


@pytest.mark.parametrize("op,t", DIAGONAL, ids=[f"{o}({t!r},{t!r})" for o, t in DIAGONAL])
def test_src_equal_dst_returns_the_input_typed(fake_pg, monkeypatch, op, t) -> None:
    """The tables' "-": the value on every rank unchanged, typed dst, no collective, and the
    backward the identity (the exact adjoint of the identity)."""
    calls: list[str] = []
    for name in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "p2p"):
        monkeypatch.setattr(comm, name, lambda *a, _n=name, **k: calls.append(_n))
    xs = [Tv("A", "B"), Tv("C", "D"), Tv("E", "F")]
    gs = [Tv("Ax", "Bx"), Tv("Cx", "Dx"), Tv("Ex", "Fx")]
    with local_mode(fake_pg, 3) as lm, spmd.use_mesh("x=3"):
        x = spmd.assert_type(to_local(lm, xs, requires_grad=True), {"x": t, "y": V})
        out = getattr(spmd, op)(x, "x", src=t, dst=t)
        assert spmd.typeof(out) == {"x": t, "y": V} and spmd.typeof(x) == {"x": t, "y": V}
        (g,) = torch.autograd.grad(out, x, grad_outputs=to_local(lm, gs))
        same(from_local(out), xs)
        same(from_local(g), gs)
    assert calls == []


def test_src_equal_dst_still_checks_the_input(fake_pg) -> None:
    fake_pg(2)
    with pytest.raises(SpecError, match="x is V on axis 'tp', but src=R"):
        spmd.convert(typed({"tp": V}), "tp", src=R, dst=R, mesh="tp=2")
    with pytest.raises(SpecError, match="reinterpret does not take S"):
        spmd.reinterpret(typed({"tp": S(0)}), "tp", src=S(0), dst=S(0), mesh="tp=2")
    with pytest.raises(SpecError, match="is not on the mesh"):
        spmd.convert(typed({"tp": R}), "pp", src=R, dst=R, mesh="tp=2")
    with pytest.raises(SpecError, match="its source is P"):  # all_reduce has no diagonal
        spmd.all_reduce(typed({"tp": R}), "tp", src=R, dst=R, mesh="tp=2")


# ---- S(i) refines V; local_map's slots -----------------------------------------------------

def test_local_map_refines_a_varying_argument() -> None:
    """A V argument where in_types says S(0): the same local type, refined (assert_type
    accepts it alike); S(0) for S(1) and P for P('avg') are other types."""
    seen = {}

    def body(a):
        seen["a"] = spmd.typeof(a)
        return a * 2

    f = spmd.local_map(body, in_types=({"tp": S(0)},), out_types={"tp": S(0)})
    out = f(typed({"tp": V}))
    assert seen["a"] == {"tp": V} and spmd.typeof(out) == {"tp": S(0)}
    with pytest.raises(SpecError, match=r"argument 0 is S\(1\) on axis 'tp', in_types says S\(0\)"):
        f(typed({"tp": S(1)}))
    g = spmd.local_map(lambda a: a, in_types=({"tp": P},), out_types={"tp": P})
    with pytest.raises(SpecError, match=r"argument 0 is P\('avg'\) on axis 'tp', in_types says P"):
        g(typed({"tp": P("avg")}))
    assert spmd.typeof(spmd.assert_type(typed({"tp": V}), {"tp": S(0)})) == {"tp": S(0)}
    assert spmd.typeof(spmd.assert_type(typed({"tp": S(0)}), {"tp": V})) == {"tp": S(0)}  # keeps the spec
    with pytest.raises(SpecError, match=r"axis 'tp' of the tensor is S\(0\), not S\(1\)"):
        spmd.assert_type(typed({"tp": S(0)}), {"tp": S(1)})
    with pytest.raises(SpecError, match=r"axis 'tp' of the tensor is P, not P\('avg'\)"):
        spmd.assert_type(typed({"tp": P}), {"tp": P("avg")})


def test_local_map_refuses_a_tensor_in_a_none_slot() -> None:
    f = spmd.local_map(lambda a, k: a * k, in_types=({"tp": V}, None), out_types={"tp": V})
    assert spmd.typeof(f(typed({"tp": V}), 2.0)) == {"tp": V}
    with pytest.raises(SpecError, match="(?s)argument 1 is a tensor, but in_types gives it None.*hint: give "
                       "argument 1 its types"):
        f(typed({"tp": V}), typed({"tp": R}))
    with pytest.raises(SpecError, match="argument 1 is a tensor"):  # untyped too: None is for non-tensors
        f(typed({"tp": V}), torch.ones(2, 3))
    g = spmd.local_map(lambda a: (a, a), in_types=({"tp": V},), out_types=({"tp": V}, None))
    with pytest.raises(SpecError, match="output 1 is a tensor, but out_types gives it None"):
        g(typed({"tp": V}))
