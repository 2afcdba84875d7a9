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
        assert spmd.typeof(torch.empty_like(x)) == {} and spmd.typeof(x.new_zeros(2)) == {}  # no value flows in
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
def test_src_equal_dst_returns_the_input_itself(fake_pg, monkeypatch, op, t) -> None:
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
        assert out is x  # the input object itself, not a view of it
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


# ---- the FSDP gradient trap ---------------------------------------------------------------

def test_redistribute_outputs_carry_the_destinations_types(fake_pg) -> None:
    """Every call kind types its output per mesh axis from the destination type: a split
    axis S(i), {R:..} R, {U:..} P, an unannotated axis I; a type string's explicit {I:..} too."""
    import torch_backend as tb

    full = torch.arange(32 * 16, dtype=torch.float64).reshape(32, 16)
    src, mesh = "f64[32@(tp,dp),16]", "dp=2,tp=4"
    with local_mode(fake_pg, 8):
        w = tb.distribute(full, mesh, src)
        assert spmd.typeof(w) == {}  # distribute gives blocks; the types are the caller's to state
        assert spmd.typeof(tb.redistribute(w, src, "f64[32@tp,16]", mesh)) == {"tp": S(0), "dp": I}
        assert spmd.typeof(tb.redistribute(w, src, "f64[32@tp,16]{R:dp}", mesh)) == {"tp": S(0), "dp": R}
        assert spmd.typeof(tb.redistribute(w, src, "f64[32,16@dp]{U:tp}", mesh)) == {"tp": P, "dp": S(1)}
        assert spmd.typeof(tb.redistributor(src, "f64[32@tp,16]", mesh)(w)) == {"tp": S(0), "dp": I}
        handle = tb.redistribute(w, src, "f64[32@tp,16]{R:dp}", mesh, async_op=True)
        assert spmd.typeof(handle.wait()) == {"tp": S(0), "dp": R}
        ys = tb.redistribute_many([w, w], [src, src], ["f64[32@tp,16]{R:dp}", "f64[32,16]"], mesh)
        assert [spmd.typeof(y) for y in ys] == [{"tp": S(0), "dp": R}, {"tp": I, "dp": I}]
        handle = tb.redistribute_many([w], [src], ["f64[32@dp,16]"], mesh, async_op=True)
        assert spmd.typeof(handle.wait()[0]) == {"tp": I, "dp": S(0)}
        # the input is never modified, its types neither; types of axes off the mesh stay
        spmd.assert_type(w, {"pp": S(0), "ep": R})
        y = tb.redistribute(w, src, "f64[32@tp,16]{R:dp}", mesh)
        assert spmd.typeof(y) == {"pp": V, "ep": R, "tp": S(0), "dp": R}
        assert spmd.typeof(w) == {"pp": S(0), "ep": R}
        # a size S(i) records is what a typed all_gather needs for uneven blocks
        y = tb.redistribute(tb.distribute(full[:30], mesh, "f64[30,16]"), "f64[30,16]", "f64[30@tp,16]", mesh)
        assert spmd.typeof(spmd.all_gather(y, "tp", src=S(0), dst=R, mesh=mesh)) == {"tp": R, "dp": I}
    assert spmd.typeof(spmd.assert_type(torch.ones(8, 16), "f32[32@tp,16]{I:dp}")) == {"tp": S(0), "dp": I}
    assert spmd.typeof(spmd.assert_type(torch.ones(8, 16), "f32[32@tp,16]")) == {"tp": S(0)}  # dp left alone
    with pytest.raises(SpecError, match="axis 'dp' of the tensor is R, not I"):
        spmd.assert_type(typed({"dp": R}), "f64[2,3]{I:dp}")


def test_fsdp_step_under_typecheck_and_its_trap(fake_pg) -> None:
    """The TP + FSDP MLP, its weights gathered to {R:dp}, trains under typecheck() to the
    single-process model (LocalTensorMode on 8 ranks; tests/test_spmd_gloo.py runs it on 8
    gloo processes). Gathered to 'f64[32@tp,16]' instead, a weight is I on dp: used with
    dp-varying data its gradient is not summed over dp, so the gradients are wrong (shown
    on one layer without the checker), and typecheck() refuses the op, naming the axis and
    the fix ({R:dp} in the destination type, or a reinterpret)."""
    from spmd_megatron import FSDP_MESH, GATHERED, STORED, TRAP, fsdp_init, fsdp_parallel, fsdp_single

    import torch_backend as tb

    losses, first, final = fsdp_single()
    full = fsdp_init()
    with local_mode(fake_pg, 8):
        got_losses, got_first, got_final, loss_type = fsdp_parallel(0, 8, full)
        want_first = {k: [b.tolist() for b in from_local(tb.distribute(first[k], FSDP_MESH, STORED[k]))]
                      for k in first}
        want_final = {k: [b.tolist() for b in from_local(tb.distribute(final[k], FSDP_MESH, STORED[k]))]
                      for k in final}
        with pytest.raises(SpecError) as e:
            fsdp_parallel(0, 8, full, TRAP, steps=1)
    assert loss_type == {"dp": P, "tp": I}
    for step, per_rank in enumerate(got_losses):
        assert all(v == pytest.approx(losses[step], rel=1e-12) for v in per_rank)
    for k in ("W1", "W2"):
        assert torch.allclose(torch.tensor(got_first[k]), torch.tensor(want_first[k]), rtol=0, atol=1e-12)
        assert torch.allclose(torch.tensor(got_final[k]), torch.tensor(want_final[k]), rtol=0, atol=1e-12)
    msg = str(e.value)
    assert msg.startswith("linear mixes I with S(0) on mesh axis 'dp'")
    assert "{R:dp}" in msg.split("hint:")[1] and "reinterpret(x, 'dp', src=I, dst=R)" in msg
    # what the refusal prevents, on one FSDP layer without the checker: the loss is each
    # rank's part of the total (P on dp and tp), so seeding each rank's backward with 1 is its
    # R gradient; with I on dp each dp rank keeps its own batch's gradient
    w = full["W1"].clone().requires_grad_(True)
    (torch.relu(torch.nn.functional.linear(full["x"], w)) ** 2).sum().backward()
    errors = {}
    for name, gathered in (("trap", TRAP["W1"]), ("R", GATHERED["W1"])):
        with local_mode(fake_pg, 8):
            x = tb.distribute(full["x"], FSDP_MESH, "f64[8@dp,16]")
            shard = tb.distribute(full["W1"], FSDP_MESH, STORED["W1"]).requires_grad_(True)
            w1 = tb.redistribute(shard, STORED["W1"], gathered, FSDP_MESH)
            (torch.relu(torch.nn.functional.linear(x, w1)) ** 2).sum().backward()
            want = from_local(tb.distribute(w.grad, FSDP_MESH, STORED["W1"]))
            errors[name] = max(float((a - b).abs().max()) for a, b in zip(from_local(shard.grad), want))
    assert errors["R"] < 1e-12 and errors["trap"] > 1.0


# ---- the loss' type at backward() ----------------------------------------------------------

def _loss(lm, kind: str):
    """w (R, ones) times x (V: A B / C D / E F per rank); the loss of type ``kind`` on x."""
    x = spmd.assert_type(to_local(lm, ABC), {"x": V})
    w = spmd.assert_type(to_local(lm, [torch.ones(2, dtype=torch.float64)] * 3, requires_grad=True), {"x": R})
    part = (w * x).sum()  # V: each rank's part
    loss = {"V": lambda: part,
            "P": lambda: spmd.reinterpret(part, "x", src=V, dst=P),
            "I": lambda: spmd.all_reduce(spmd.reinterpret(part, "x", src=V, dst=P), "x", src=P, dst=I),
            "R": lambda: spmd.all_reduce(spmd.reinterpret(part, "x", src=V, dst=P), "x", src=P, dst=R)}[kind]()
    return w, loss


@pytest.mark.parametrize("kind", ["I", "P"])
def test_backward_of_an_I_or_P_loss_gives_the_gradient(fake_pg, kind) -> None:
    """The loss A+B+C+D+E+F (each rank's w.x added up): d/dw = [A+C+E, B+D+F], held as a
    pending sum of each rank's own x."""
    with local_mode(fake_pg, 3) as lm, spmd.use_mesh("x=3"), spmd.typecheck():
        w, loss = _loss(lm, kind)
        loss.backward()
        g = spmd.all_reduce(w.grad, "x", src=P, dst=R)
        same(from_local(g), [Tv("A+C+E", "B+D+F")] * 3)


@pytest.mark.parametrize("kind,scale", [("R", 3), ("V", 1)])
def test_backward_of_an_R_or_V_loss_is_refused(fake_pg, kind, scale) -> None:
    """Without the checker an R loss's gradient is 3x the loss's (its seed is a pending sum of
    three ones); a V loss is each rank's own part (here the same sum, by luck of how it was
    built): neither says what the loss is, so typecheck() refuses both, in every form."""
    with local_mode(fake_pg, 3) as lm, spmd.use_mesh("x=3"):
        w, loss = _loss(lm, kind)
        loss.backward()
        g = spmd.all_reduce(w.grad, "x", src=P, dst=R)
        same(from_local(g), [Tv("A+C+E", "B+D+F") * scale] * 3)
        with spmd.typecheck():
            for call in (lambda w, loss: loss.backward(), lambda w, loss: torch.autograd.backward([loss]),
                         lambda w, loss: torch.autograd.grad(loss, w)):
                with pytest.raises(SpecError, match=f"of a loss that is {kind} on mesh axis 'x'") as e:
                    call(*_loss(lm, kind))
                fix = "src=R, dst=I" if kind == "R" else "src=V, dst=P"
                assert fix in str(e.value).split("hint:")[1]
            # a gradient given explicitly states what the loss's gradient is
            w, loss = _loss(lm, kind)
            loss.backward(gradient=torch.ones_like(loss))
            assert spmd.typeof(w.grad) == {"x": P}
            w, loss = _loss(lm, kind)
            (gw,) = torch.autograd.grad(loss, w, grad_outputs=torch.ones_like(loss))
            assert spmd.typeof(gw) == {"x": P}  # torch.autograd.grad's results typed like x.grad


# ---- all_reduce(..., inplace=True) ---------------------------------------------------------

@pytest.mark.parametrize("src,dst", [(P, R), (P, I), (P("avg"), R)], ids=repr)
def test_all_reduce_in_place_reduces_the_buffer_itself(fake_pg, src, dst) -> None:
    """A flat gradient buffer (+[A,B], +[C,D], +[E,F]) reduced in its own memory: the same
    tensor comes back, [A+C+E, B+D+F] (a third of it for avg) on every rank, typed dst."""
    with local_mode(fake_pg, 3) as lm, spmd.use_mesh("x=3"):
        buf = spmd.assert_type(to_local(lm, ABC), {"x": src, "dp": V})
        ptrs = [t.data_ptr() for t in buf._local_tensors.values()]
        out = spmd.all_reduce(buf, "x", src=src, dst=dst, inplace=True)
        assert out is buf and [t.data_ptr() for t in buf._local_tensors.values()] == ptrs
        want = Tv("A+C+E", "B+D+F") / (3 if src.op == "avg" else 1)
        same(from_local(buf), [want] * 3)
        assert spmd.typeof(buf) == {"x": dst, "dp": V}
        # a strided buffer: reduced through a contiguous copy, written back into it
        base = to_local(lm, [torch.stack([b, -b], 1) for b in ABC])
        col = base[:, 0]
        assert not col.is_contiguous()
        spmd.all_reduce(col, "x", src=src, dst=dst, inplace=True)
        same([b[:, 0] for b in from_local(base)], [want] * 3)
        same([b[:, 1] for b in from_local(base)], [-b for b in ABC])


def test_all_reduce_in_place_refuses_what_autograd_records(fake_pg) -> None:
    with local_mode(fake_pg, 3) as lm, spmd.use_mesh("x=3"):
        x = to_local(lm, ABC, requires_grad=True)
        with pytest.raises(SpecError, match="inplace=True. takes a tensor autograd does not record"):
            spmd.all_reduce(x, "x", src=P, dst=R, inplace=True)
        with torch.no_grad():
            y = x.detach().clone()
            assert spmd.all_reduce(y, "x", src=P, dst=R, inplace=True) is y
        with lm.disable():
            plain = torch.ones(2, dtype=torch.float64)  # one tensor, not every rank's
        with pytest.raises(SpecError, match="needs a LocalTensor"):
            spmd.all_reduce(plain, "x", src=P, dst=R, inplace=True)


# ---- torch.distributed's collectives under the checker -------------------------------------

def _group(axes: tuple[str, ...]):
    import torch_backend as tb

    return tb.context("dp=2,tp=3").group(axes, 0).pg


@pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")  # Megatron's names for the *_single calls
def test_raw_collectives_are_typed_by_their_groups_axes(fake_pg) -> None:
    """Megatron's gradient sync and loss averaging: dist.all_reduce of a pending sum over the
    tp group is R there (in place), the other axes' types kept; the gather, the
    reduce_scatter and the all_to_all as the diagrams say, values included."""
    import torch.distributed as dist

    pieces = [Tv(f"A{r}", f"B{r}", f"C{r}") for r in range(6)]  # rank r = (dp, tp) = (r // 3, r % 3)
    with local_mode(fake_pg, 6) as lm, spmd.use_mesh("dp=2,tp=3"), spmd.typecheck():
        g = spmd.assert_type(to_local(lm, pieces), {"tp": P, "dp": V})
        dist.all_reduce(g, group=_group(("tp",)))  # +A0, +A1, +A2 => A0+A1+A2 on tp
        assert spmd.typeof(g) == {"tp": R, "dp": V}
        same(from_local(g), [Tv(*(f"{c}{3 * (r // 3)}+{c}{3 * (r // 3) + 1}+{c}{3 * (r // 3) + 2}" for c in "ABC"))
                             for r in range(6)])
        v = spmd.assert_type(to_local(lm, pieces), {"tp": V, "dp": R})
        out = torch.empty(9, dtype=torch.float64)
        dist.all_gather_into_tensor(out, v, group=_group(("tp",)))  # [A0..], [A1..], [A2..] => concatenated
        assert spmd.typeof(out) == {"tp": R, "dp": R}
        same(from_local(out)[:3], [torch.cat(pieces[:3])] * 3)
        p = spmd.assert_type(to_local(lm, [Tv(f"A{r}", f"B{r}") for r in range(6)]), {"dp": P})
        half = torch.empty(1, dtype=torch.float64)
        dist.reduce_scatter_tensor(half, p, group=_group(("dp",)))  # +[Ax, Bx], +[Ay, By] => A, B
        assert spmd.typeof(half) == {"dp": S(0)}
        same(from_local(half)[:1] + from_local(half)[3:4], [Tv("A0+A3"), Tv("B0+B3")])
        a2a = torch.empty(3, dtype=torch.float64)
        dist.all_to_all_single(a2a, v, group=_group(("tp",)))  # [A0, B0, C0] on rank 0 ... => [A0, A1, A2]
        assert spmd.typeof(a2a) == {"tp": V, "dp": R}
        same(from_local(a2a)[:3], [Tv("A0", "A1", "A2"), Tv("B0", "B1", "B2"), Tv("C0", "C1", "C2")])
        # the world's group spans every axis; an untyped tensor is outside the checker
        w = spmd.assert_type(to_local(lm, pieces), {"tp": P, "dp": P})
        dist.all_reduce(w)
        assert spmd.typeof(w) == {"tp": R, "dp": R}
        plain = to_local(lm, pieces)
        dist.all_reduce(plain, group=_group(("tp",)))
        assert spmd.typeof(plain) == {}


@pytest.mark.parametrize("call,t,match,fix", [
    ("all_reduce", R, "all_reduce of a tensor that is R on mesh axis 'tp'", "nothing to reduce"),
    ("all_reduce", V, "all_reduce of a tensor that is V on mesh axis 'tp'", "src=V, dst=P"),
    ("all_reduce_max", P, r"ReduceOp.MAX of a tensor that is P on mesh axis 'tp'", "ReduceOp.SUM"),
    ("all_gather", P, "all_gather_single of a tensor that is P on mesh axis 'tp'", "reduce a pending sum"),
    ("all_gather", R, "all_gather_single of a tensor that is R", "nothing to gather"),
    ("reduce_scatter", V, "reduce_scatter_single of a tensor that is V", "src=V, dst=P"),
    ("all_to_all", P, "all_to_all_single of a tensor that is P", "reduce it first"),
])
@pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")
def test_raw_collectives_without_a_sound_typing_are_refused(fake_pg, call, t, match, fix) -> None:
    """Refused before anything is sent: the tensor keeps its values and its type."""
    import torch.distributed as dist

    calls = {"all_reduce": lambda x, g: dist.all_reduce(x, group=g),
             "all_reduce_max": lambda x, g: dist.all_reduce(x, op=dist.ReduceOp.MAX, group=g),
             "all_gather": lambda x, g: dist.all_gather_into_tensor(torch.empty(9, dtype=x.dtype), x, group=g),
             "reduce_scatter": lambda x, g: dist.reduce_scatter_tensor(torch.empty(1, dtype=x.dtype), x, group=g),
             "all_to_all": lambda x, g: dist.all_to_all_single(torch.empty_like(x), x, group=g)}
    with local_mode(fake_pg, 6) as lm, spmd.use_mesh("dp=2,tp=3"), spmd.typecheck():
        x = spmd.assert_type(to_local(lm, [Tv(f"A{r}", f"B{r}", f"C{r}") for r in range(6)]), {"tp": t})
        with pytest.raises(SpecError, match=match) as e:
            calls[call](x, _group(("tp",)))
        assert fix in str(e.value).split("hint:")[1]
        same(from_local(x), [Tv(f"A{r}", f"B{r}", f"C{r}") for r in range(6)])
        assert spmd.typeof(x) == {"tp": t}


def test_raw_collectives_need_the_mesh_and_a_mesh_axes_group(fake_pg) -> None:
    import torch.distributed as dist

    with local_mode(fake_pg, 6) as lm:
        x = spmd.assert_type(to_local(lm, [Tv("A")] * 6), {"tp": P})
        with spmd.typecheck(), pytest.raises(SpecError, match="needs the mesh"):
            dist.all_reduce(x)
        with spmd.use_mesh("dp=2,tp=3"), spmd.typecheck(strict=True), pytest.raises(SpecError,
                                                                                match=r"ranks \[0, 1\]"):
            dist.all_reduce(x, group=dist.new_group([0, 1]))  # half of a tp group


# ---- affine ops, no_typecheck() -------------------------------------------------------------

@pytest.mark.parametrize("fn,shapes", [
    (torch.addmm, ((2, 4), (2, 3), (3, 4))), (torch.addmv, ((2,), (2, 3), (3,))), (torch.addr, ((2, 3), (2,), (3,))),
    (torch.baddbmm, ((5, 2, 4), (5, 2, 3), (5, 3, 4))), (torch.addbmm, ((2, 4), (5, 2, 3), (5, 3, 4))),
], ids=lambda v: getattr(v, "__name__", ""))
def test_affine_ops_are_a_sum_of_bias_and_product(fake_pg, fn, shapes) -> None:
    """addmm(b, m1, m2) = b + m1 @ m2: P when the bias and the product are (one P factor,
    the other R), so the reduced result is the model's; P + R, P x P refused as for + and @."""
    g = torch.Generator().manual_seed(0)
    per_rank = [[torch.randint(-4, 5, s, generator=g).double() for s in shapes] for _ in range(3)]
    with local_mode(fake_pg, 3) as lm, spmd.use_mesh("x=3"), spmd.typecheck():
        def arg(k: int, t):  # argument k of type t: per-rank pieces, or rank 0's everywhere for R
            blocks = [per_rank[0 if t == R else r][k] for r in range(3)]
            return spmd.assert_type(to_local(lm, blocks), {"x": t})

        y = fn(arg(0, P), arg(1, P), arg(2, R))
        assert spmd.typeof(y) == {"x": P}
        total = spmd.all_reduce(y, "x", src=P, dst=R)
        want = fn(sum(p[0] for p in per_rank), sum(p[1] for p in per_rank), per_rank[0][2])
        same(from_local(total), [want] * 3)
        assert spmd.typeof(fn(arg(0, V), arg(1, R), arg(2, V))) == {"x": V}
        with pytest.raises(SpecError, match=rf"{fn.__name__}\(P, R\) on mesh axis 'x'"):
            fn(arg(0, R), arg(1, P), arg(2, R))
        with pytest.raises(SpecError, match=r"\(P, P\) on mesh axis 'x'"):
            fn(arg(0, P), arg(1, P), arg(2, P))


def test_no_typecheck_turns_the_checker_off_for_a_scope() -> None:
    p = typed({"tp": P})
    with spmd.typecheck():
        with spmd.no_typecheck():
            y = torch.relu(p)  # not linear: refused under the checker
        assert spmd.typeof(y) == {}
        with pytest.raises(SpecError, match="relu is not linear"):
            torch.relu(p)
