"""torch.distributed's collectives under ``spmd.typecheck()``: a typed output tensor keeps
its declared type (refused where the call makes another), the list form of
``dist.all_gather``, an all_to_all of R refused as ``spmd.all_to_all(src=R)`` is, a group
that is no set of mesh axes, and strict mode's untyped inputs.

The oracle is the SPMD type system's typing of each collective (all_gather V -> R or I,
reduce_scatter P -> V, all_to_all V -> V, all_reduce P -> R) and the rule an op's ``out=``
already follows: a typed destination keeps its type. Values by the rank diagrams (letters
as distinct numbers, LocalTensorMode on dp=2, tp=3)."""

from __future__ import annotations

import pytest
import torch
from spmd_utils import Tv, same
from torch_utils import from_local, local_mode, to_local

from spec_lang.errors import SpecError
from torch_backend import comm, spmd
from torch_backend.spmd import I, P, R, S, V

pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")
MESH = "dp=2,tp=3"
PIECES = [Tv(f"A{r}", f"B{r}", f"C{r}") for r in range(6)]  # rank r = (dp, tp) = (r // 3, r % 3)


def _group(axes: tuple[str, ...]):
    import torch_backend as tb

    return tb.context(MESH).group(axes, 0).pg


def _out(lm, n: int, types: dict | None):
    out = to_local(lm, [torch.zeros(n, dtype=torch.float64)] * 6)
    return spmd.assert_type(out, types) if types is not None else out


def _calls():
    import torch.distributed as dist

    tp = _group(("tp",))
    return {
        "all_gather_into_tensor": (V, 9, lambda out, x: dist.all_gather_into_tensor(out, x, group=tp)),
        "reduce_scatter_tensor": (P, 1, lambda out, x: dist.reduce_scatter_tensor(out, x, group=tp)),
        "all_to_all_single": (V, 3, lambda out, x: dist.all_to_all_single(out, x, group=tp)),
    }


@pytest.mark.parametrize("name,declared,kept", [
    ("all_gather_into_tensor", R, R), ("all_gather_into_tensor", I, I),  # a gather's result may be said R or I
    ("reduce_scatter_tensor", V, V), ("reduce_scatter_tensor", S(0), S(0)),
    ("all_to_all_single", V, V),
])
def test_a_typed_output_keeps_its_type(fake_pg, name, declared, kept) -> None:
    """The declared type matches what the call makes: it stays (I is not turned into R, V
    not into S(0)); the axes it leaves untyped take the call's types (dp: the input's)."""
    with local_mode(fake_pg, 6) as lm, spmd.use_mesh(MESH), spmd.typecheck():
        src, n, call = _calls()[name]
        x = spmd.assert_type(to_local(lm, PIECES), {"tp": src, "dp": R})
        out = _out(lm, n, {"tp": declared})
        call(out, x)
        assert spmd.typeof(out) == {"tp": kept, "dp": R}


@pytest.mark.parametrize("name,declared", [
    ("all_gather_into_tensor", V), ("all_gather_into_tensor", P),
    ("reduce_scatter_tensor", R), ("reduce_scatter_tensor", P), ("reduce_scatter_tensor", S(1)),
    ("all_to_all_single", R), ("all_to_all_single", I),
])
def test_a_typed_output_of_another_type_is_refused_before_the_call(fake_pg, name, declared) -> None:
    """The destination says one type, the call makes another: refused before anything is
    written (the retyping was silent), the output's values and type untouched."""
    with local_mode(fake_pg, 6) as lm, spmd.use_mesh(MESH), spmd.typecheck():
        src, n, call = _calls()[name]
        x = spmd.assert_type(to_local(lm, PIECES), {"tp": src})
        out = _out(lm, n, {"tp": declared})
        with pytest.raises(SpecError, match=f"its output tensor is {declared!r}".replace("(", r"\(").replace(")", r"\)")
                           ) as e:
            call(out, x)
        assert "a typed destination keeps its type" in str(e.value)
    assert spmd.typeof(out) == {"tp": declared}
    same(from_local(out), [torch.zeros(n, dtype=torch.float64)] * 6)


def test_a_typed_output_is_checked_on_the_other_axes_too(fake_pg) -> None:
    """A collective over tp leaves dp's coordinates apart: an output said R on dp from an
    input that is V there is refused."""
    with local_mode(fake_pg, 6) as lm, spmd.use_mesh(MESH), spmd.typecheck():
        _, n, call = _calls()["all_gather_into_tensor"]
        x = spmd.assert_type(to_local(lm, PIECES), {"tp": V, "dp": V})
        with pytest.raises(SpecError, match="its output tensor is R on mesh axis 'dp', but the call makes it V"):
            call(_out(lm, n, {"dp": R}), x)


@pytest.mark.parametrize("t", [R, I])
def test_all_to_all_single_of_a_replicated_tensor_is_refused_like_spmd_all_to_all(fake_pg, t) -> None:
    """All ranks hold the same value: the pieces an all_to_all sends are no rank's own
    block, so spmd.all_to_all(src=R) refuses it, and the raw call now does too (it was typed
    V), before anything is sent; the hint names convert."""
    with local_mode(fake_pg, 6) as lm, spmd.use_mesh(MESH):
        x = spmd.assert_type(to_local(lm, [PIECES[0]] * 6), {"tp": t})
        with pytest.raises(SpecError, match="is not a valid pair"):
            spmd.all_to_all(x, "tp", src=t, dst=V)
        with spmd.typecheck(), pytest.raises(SpecError, match=f"all_to_all_single of a tensor that is {t!r} on "
                                             "mesh axis 'tp'") as e:
            _calls()["all_to_all_single"][2](_out(lm, 3, None), x)
        assert "spmd.convert(x, 'tp'" in str(e.value).split("hint:")[1]
        assert spmd.typeof(x) == {"tp": t}


def test_the_list_form_of_all_gather(fake_pg) -> None:
    """``dist.all_gather(tensor_list, x, group=tp)`` of V: element k is tp-rank k's block on
    every rank (R on tp, the input's type on dp); a typed element keeps its R or I, another
    type is refused before the call; a P input is refused."""
    import torch.distributed as dist

    with local_mode(fake_pg, 6) as lm, spmd.use_mesh(MESH), spmd.typecheck():
        x = spmd.assert_type(to_local(lm, PIECES), {"tp": V, "dp": V})
        outs = [_out(lm, 3, None), _out(lm, 3, {"tp": I}), _out(lm, 3, None)]
        dist.all_gather(outs, x, group=_group(("tp",)))
        assert [spmd.typeof(o) for o in outs] == [{"tp": R, "dp": V}, {"tp": I, "dp": V}, {"tp": R, "dp": V}]
        bad = [_out(lm, 3, None), _out(lm, 3, {"tp": V}), _out(lm, 3, None)]
        with pytest.raises(SpecError, match=r"its tensor_list\[1\] is V on mesh axis 'tp', but the call makes it "
                           "R or I"):
            dist.all_gather(bad, x, group=_group(("tp",)))
        assert all(spmd.typeof(o) == t for o, t in zip(bad, ({}, {"tp": V}, {})))
        p = spmd.assert_type(to_local(lm, PIECES), {"tp": P})
        with pytest.raises(SpecError, match="all_gather of a tensor that is P on mesh axis 'tp'"):
            dist.all_gather([_out(lm, 3, None) for _ in range(3)], p, group=_group(("tp",)))


def test_the_list_form_of_all_gather_values(fake_pg) -> None:
    """A, B, C => [A], [B], [C] on every rank (the world's group: LocalTensorMode's list
    gather over a subgroup keeps only the last group's blocks)."""
    import torch.distributed as dist

    abc = [Tv("A", "B"), Tv("C", "D"), Tv("E", "F")]
    with local_mode(fake_pg, 3) as lm, spmd.use_mesh("x=3"), spmd.typecheck():
        x = spmd.assert_type(to_local(lm, abc), {"x": S(0)})
        outs = [to_local(lm, [torch.zeros(2, dtype=torch.float64)] * 3) for _ in range(3)]
        dist.all_gather(outs, x)
        for k, o in enumerate(outs):
            assert spmd.typeof(o) == {"x": R}
            same(from_local(o), [abc[k]] * 3)


def test_a_group_that_is_no_set_of_mesh_axes(fake_pg) -> None:
    """The peer's rule: a process group the tensor has no type for is left unchecked
    outside strict mode (the call runs, every type as it was), refused in strict mode; a
    group of one rank is the empty set of axes (nothing to type, even in strict mode)."""
    import torch.distributed as dist

    with local_mode(fake_pg, 6) as lm, spmd.use_mesh(MESH):
        half = dist.new_group([0, 1])  # half of a tp group
        one = dist.new_group([0])
        x = spmd.assert_type(to_local(lm, PIECES), {"tp": V, "dp": R})
        out = _out(lm, 6, {"dp": R})
        with spmd.typecheck():
            dist.all_gather_into_tensor(out, x, group=half)
        assert spmd.typeof(x) == {"tp": V, "dp": R} and spmd.typeof(out) == {"dp": R}
        with spmd.typecheck(strict=True), pytest.raises(SpecError, match=r"process group \(ranks \[0, 1\]\) is not "
                                                       "the group of any set of axes"):
            dist.all_gather_into_tensor(out, x, group=half)
        p = spmd.assert_type(to_local(lm, PIECES), {"tp": P})
        with spmd.typecheck(strict=True):
            dist.all_reduce(p, group=one)  # one rank: no axis, nothing finishes
        assert spmd.typeof(p) == {"tp": P}


def test_strict_mode_refuses_untyped_inputs_of_raw_collectives(fake_pg) -> None:
    """In strict mode a raw collective's input must be typed on its group's axes (untyped,
    or typed on other axes only: refused before the call); outside strict mode it runs."""
    import torch.distributed as dist

    with local_mode(fake_pg, 6) as lm, spmd.use_mesh(MESH):
        plain = to_local(lm, PIECES)
        other = spmd.assert_type(to_local(lm, PIECES), {"dp": V})
        for x in (plain, other):
            with spmd.typecheck(strict=True), pytest.raises(SpecError, match="strict typecheck: torch.distributed."
                                                           "all_gather_single takes a tensor .* no type on mesh "
                                                           "axis 'tp'"):
                dist.all_gather_into_tensor(_out(lm, 9, None), x, group=_group(("tp",)))
        with spmd.typecheck(strict=True), pytest.raises(SpecError, match="no type on mesh axis 'dp', 'tp'"):
            dist.all_reduce(plain)
        with spmd.typecheck():
            dist.all_gather_into_tensor(_out(lm, 9, None), plain, group=_group(("tp",)))


def test_strict_mode_refuses_untyped_inputs_of_typed_collectives(fake_pg) -> None:
    """``spmd.all_reduce(untyped, src=P, ...)`` in strict mode: the src is only a claim
    nobody checks; refused, naming the axes, before anything is sent. A typed input passes."""
    calls: list = []
    with local_mode(fake_pg, 6) as lm, spmd.use_mesh(MESH):
        plain = to_local(lm, PIECES)
        with spmd.typecheck(strict=True):
            orig = comm.all_reduce
            comm.all_reduce = lambda *a, **k: calls.append(a)  # type: ignore[assignment]
            try:
                with pytest.raises(SpecError, match=r"strict typecheck: spmd.all_reduce takes a tensor \(shape \[3\]\) "
                                   "with no type on mesh axis 'tp'"):
                    spmd.all_reduce(plain, "tp", src=P, dst=R)
                with pytest.raises(SpecError, match="no type on mesh axis 'dp'"):
                    spmd.all_gather(spmd.assert_type(to_local(lm, PIECES), {"tp": V}), ("dp", "tp"), src=V, dst=R)
            finally:
                comm.all_reduce = orig
            y = spmd.all_reduce(spmd.assert_type(to_local(lm, PIECES), {"tp": P}), "tp", src=P, dst=R)
            assert spmd.typeof(y) == {"tp": R}
        assert calls == []
        assert spmd.typeof(spmd.all_reduce(plain, "tp", src=P, dst=R)) == {"tp": R}  # outside strict mode


def test_strict_mode_refuses_backward_of_an_untyped_loss(fake_pg) -> None:
    """The implicit gradient (ones) is right only for an I or P loss: in strict mode an
    untyped loss is refused (outside it, it runs); an explicit gradient needs no type."""
    with local_mode(fake_pg, 3) as lm, spmd.use_mesh("x=3"):
        w = to_local(lm, [Tv("A", "B")] * 3, requires_grad=True)
        with spmd.no_typecheck():
            loss = (w * w).sum()
        with spmd.typecheck(strict=True):
            with pytest.raises(SpecError, match=r"strict typecheck: backward\(\) of an untyped loss"):
                loss.backward(retain_graph=True)
            with pytest.raises(SpecError, match=r"strict typecheck: grad\(\) of an untyped loss"):
                torch.autograd.grad(loss, w, retain_graph=True)
            loss.backward(torch.ones_like(loss), retain_graph=True)
        assert w.grad is not None
        with spmd.typecheck():
            loss.backward()
