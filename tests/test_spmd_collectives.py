"""The typed collectives on torch (LocalTensorMode): the executor agrees with the numpy
semantics, autograd is the exact adjoint (integer float64, no finite differences) for
every allowed pair on 1-D and 2-D meshes and flattened axes, uneven blocks keep their
exact sizes, and a refused call issues no collective."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_spmd_rules import CASES, GROUPS, _program
from torch_utils import from_local, local_mode, to_local
from typed_data import pairing, random_arrays

from lowering.kinds import simulate_step
from spec_lang.dual import dual_type
from spec_lang.errors import SpecError
from torch_backend import comm, spmd
from torch_backend.spmd import I, P, R, S, V

TORCH_GROUPS = GROUPS


@pytest.mark.parametrize("mesh,group", TORCH_GROUPS, ids=[f"{m}:{'.'.join(g)}" for m, g in TORCH_GROUPS])
@pytest.mark.parametrize("op,s,d", CASES, ids=[f"{o}({s!r},{d!r})" for o, s, d in CASES])
def test_forward_matches_semantics_and_backward_is_adjoint(fake_pg, op, s, d, mesh, group) -> None:
    uneven = s.kind == "S"
    prog, m = _program(op, s, d, mesh, group, uneven)
    rng = np.random.default_rng(3)
    xs = random_arrays(prog.src, m, rng)
    ys = random_arrays(dual_type(prog.dst), m, rng)
    want = xs
    for st in prog.steps:
        want = simulate_step(st, m, want)
    with local_mode(fake_pg, m.size) as lm:
        x = to_local(lm, [torch.tensor(a) for a in xs], requires_grad=True)
        out = getattr(spmd, op)(x, group if len(group) > 1 else group[0], src=s, dst=d, mesh=mesh)
        (g,) = torch.autograd.grad(out, x, grad_outputs=to_local(lm, [torch.tensor(b) for b in ys]))
        outs, grads = [o.numpy() for o in from_local(out)], [b.numpy() for b in from_local(g)]
        assert spmd.typeof(out) == {a: d for a in group}
    for r in range(m.size):
        np.testing.assert_array_equal(outs[r], want[r])
    lhs, rhs = pairing(prog.dst, m, outs, ys), pairing(prog.src, m, xs, grads)
    assert lhs == (rhs if s.op == "sum" else pytest.approx(rhs, rel=1e-12))


def test_uneven_blocks_keep_exact_sizes(fake_pg) -> None:
    # 7 rows over 3 ranks: torch.chunk gives 3, 3, 1
    full = torch.arange(14.0, dtype=torch.float64).reshape(7, 2)
    with local_mode(fake_pg, 3) as lm, spmd.use_mesh("x=3"):
        x = to_local(lm, [full] * 3)
        s = spmd.reduce_scatter(spmd.convert(x, "x", src=R, dst=P), "x", src=P, dst=S(0))
        assert [b.shape[0] for b in from_local(s)] == [3, 3, 1]
        g = spmd.all_gather(s, "x", src=S(0), dst=R)
        assert all(torch.equal(b, full) for b in from_local(g))
        t = spmd.all_to_all(s, "x", src=S(0), dst=S(1))  # 7x2 -> columns of 1, 1, 0
        assert [tuple(b.shape) for b in from_local(t)] == [(7, 1), (7, 1), (7, 0)]
        back = spmd.all_to_all(t, "x", src=S(1), dst=S(0))
        assert [tuple(b.shape) for b in from_local(back)] == [(3, 2), (3, 2), (1, 2)]
        # a block layout torch.chunk does not give is refused, naming the expected shape
        bad = to_local(lm, [full[:2], full[2:5], full[5:]])
        with pytest.raises(SpecError, match=r"rank 0 holds shape \[2, 2\].*\[3, 2\]"):
            spmd.all_gather(bad, "x", src=S(0), dst=R)


COMM_CALLS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "p2p")


def _count_collectives(monkeypatch) -> list[str]:
    """Record every collective the executor issues (the functions of torch_backend.comm)."""
    from torch_backend import collectives

    calls: list[str] = []
    for name in COMM_CALLS:
        fn = getattr(comm, name)

        def spy(*a, _fn=fn, _n=name, **k):
            calls.append(_n)
            return _fn(*a, **k)

        monkeypatch.setattr(comm, name, spy)
        if getattr(collectives, name, None) is fn:
            monkeypatch.setattr(collectives, name, spy)
    return calls


def test_no_collective_before_a_refusal(fake_pg, monkeypatch) -> None:
    calls = _count_collectives(monkeypatch)
    with local_mode(fake_pg, 3) as lm, spmd.use_mesh("x=3"):
        x = to_local(lm, [torch.ones(3, dtype=torch.float64)] * 3)
        spmd.all_reduce(spmd.convert(x, "x", src=R, dst=P), "x", src=P, dst=R)
        assert calls, "the spy sees collectives"
        calls.clear()
        for bad in (lambda: spmd.all_reduce(x, "x", src=R, dst=R),
                    lambda: spmd.convert(x, "x", src=P, dst=R),
                    lambda: spmd.reinterpret(x, "x", src=V, dst=R),
                    lambda: spmd.all_gather(x, "x", src=P, dst=R),
                    lambda: spmd.all_gather(x, "y", src=V, dst=R)):
            with pytest.raises(SpecError):
                bad()
        y = to_local(lm, [torch.ones(4, dtype=torch.float64)] * 3)
        with pytest.raises(SpecError, match="group's size 3"):
            spmd.reduce_scatter(y, "x", src=P, dst=V)
        with pytest.raises(SpecError, match="not a valid pair"):
            spmd.all_gather(y, "x", src=P, dst=R)
        typed = spmd.assert_type(y, {"x": R})
        with pytest.raises(SpecError, match="x is R on axis 'x', but src=P"):
            spmd.all_reduce(typed, "x", src=P, dst=R)
        assert calls == []


def test_flattened_axes_issue_one_collective(fake_pg, monkeypatch) -> None:
    calls = _count_collectives(monkeypatch)
    with local_mode(fake_pg, 6) as lm, spmd.use_mesh("dp=2,tp=3"):
        x = to_local(lm, [torch.full((2,), float(r), dtype=torch.float64) for r in range(6)])
        out = spmd.all_reduce(spmd.reinterpret(x, ("dp", "tp"), src=V, dst=P), ("dp", "tp"), src=P, dst=R)
        assert all(torch.equal(b, torch.full((2,), 15.0, dtype=torch.float64)) for b in from_local(out))
        assert spmd.typeof(out) == {"dp": R, "tp": R}
    assert len(calls) == 1


def test_mesh_and_types_are_required(fake_pg) -> None:
    with local_mode(fake_pg, 3) as lm:
        x = to_local(lm, [torch.ones(3, dtype=torch.float64)] * 3)
        with pytest.raises(SpecError, match="no mesh"):
            spmd.all_reduce(x, "x", src=P, dst=R)
        with pytest.raises(SpecError, match="not a local SPMD type"):
            spmd.all_reduce(x, "x", src="Q", dst=R, mesh="x=3")
        with pytest.raises(SpecError, match="axis must be"):
            spmd.all_reduce(x, 3, src=P, dst=R, mesh="x=3")
        out = spmd.all_reduce(x, "x", src=P, dst=I, mesh="x=3")
        assert spmd.typeof(out) == {"x": I}


def test_a_device_mesh_names_the_axes(fake_pg) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    fake_pg(6)
    dm = init_device_mesh("cpu", (2, 3), mesh_dim_names=("dp", "tp"))
    with local_mode(fake_pg, 6) as lm, spmd.use_mesh(dm):
        x = to_local(lm, [torch.full((2,), float(r), dtype=torch.float64) for r in range(6)])
        y = spmd.all_reduce(x, "tp", src=P, dst=R)
        assert [b.tolist() for b in from_local(y)] == [[3.0, 3.0]] * 3 + [[12.0, 12.0]] * 3
        z = spmd.all_gather(x, "dp", src=V, dst=I, mesh=dm)
        assert from_local(z)[4].tolist() == [[1.0, 1.0], [4.0, 4.0]]
