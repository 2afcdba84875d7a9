"""``spmd.typecheck(strict=True)``: typed and untyped tensors may not meet in an op.

Outside strict mode an untyped tensor is outside the checker, so a parameter nobody typed
passes silently. The oracle is the SPMD type system's meaning of the forgotten type: a
weight that is R on tp, left untyped, meets V data; its gradient then is the P pending
sum that nobody all-reduces (checked by value: each rank's gradient is its own piece)."""

from __future__ import annotations

import pytest
import torch
from spmd_utils import Tv, same
from torch_utils import from_local, local_mode, to_local

from spec_lang.errors import SpecError
from torch_backend import spmd
from torch_backend.spmd import P, R, S, V

ABC = [Tv("A", "B"), Tv("C", "D"), Tv("E", "F")]


def test_strict_refuses_an_untyped_parameter_and_names_it(fake_pg) -> None:
    """The forgotten type: the op runs outside strict mode (and the gradient is each rank's
    piece, not the sum: wrong for an R weight); strict mode refuses it, naming the op, the
    argument, its shape and the assert_type that fixes it."""
    with local_mode(fake_pg, 3) as lm, spmd.use_mesh("x=3"):
        x = spmd.assert_type(to_local(lm, ABC), {"x": V})
        w = to_local(lm, [torch.ones(2, dtype=torch.float64)] * 3, requires_grad=True)  # R, but untyped
        with spmd.typecheck():
            loss = spmd.reinterpret((w * x).sum(), "x", src=V, dst=P)  # the ranks' losses add up
            loss.backward()  # w unchecked: its gradient is a pending sum nobody finishes
        same(from_local(w.grad), ABC)
        with spmd.typecheck(strict=True), pytest.raises(SpecError) as e:
            x * w
        msg = str(e.value)
        assert "strict typecheck: mul takes an untyped tensor (argument 1, shape [2])" in msg
        assert "spmd.assert_type(t, {'x': spmd.R})" in msg
        with spmd.typecheck(strict=True), pytest.raises(SpecError, match=r"add takes an untyped tensor \(argument 'other'"):
            torch.add(x, other=w)
        with spmd.typecheck(strict=True), pytest.raises(SpecError, match=r"cat takes an untyped tensor \(argument 0\[1\]"):
            torch.cat([x, w])
        spmd.assert_type(w, {"x": R})
        with spmd.typecheck(strict=True):  # typed: the checker types it, and the sync is required
            y = x * w
            assert spmd.typeof(y) == {"x": V}
            assert spmd.typeof(y * 2.0 + 1) == {"x": V}  # Python numbers are not tensors: allowed


def test_strict_leaves_all_untyped_ops_metadata_and_factories_alone() -> None:
    x = spmd.assert_type(torch.ones(2, 3), {"tp": S(0)})
    u = torch.ones(2, 3)
    with spmd.typecheck(strict=True):
        assert spmd.typeof(u + u) == {}  # no typed operand: outside the checker
        assert x.shape == (2, 3) and spmd.typeof(torch.zeros_like(x)) == {}
        out = torch.empty(2, 3)
        torch.add(x, x, out=out)  # out= is written, not read
        with pytest.raises(SpecError, match="strict typecheck: where takes an untyped tensor"):
            torch.where(u > 0, x, x)  # a mask is an operand: type it too


def test_strict_global_einsum_refuses_an_untyped_operand(fake_pg) -> None:
    """``spmd.einsum``/``linear`` read an untyped operand as R; strict mode refuses it."""
    fake_pg(2)
    w = spmd.assert_type(torch.ones(3, 4), {"tp": S(0)})
    h = torch.ones(2, 4)
    assert spmd.typeof(spmd.linear(h, w)) == {"tp": S(1)}
    with spmd.typecheck(strict=True):
        with pytest.raises(SpecError, match=r"spmd.linear takes an untyped tensor \(argument 0, shape \[2, 4\]\)"):
            spmd.linear(h, w)
        with pytest.raises(SpecError, match=r"spmd.einsum\('ij,kj->ik'\) takes an untyped tensor"):
            spmd.einsum("ij,kj->ik", h, w)
    with pytest.raises(SpecError, match="takes a bool"):
        with spmd.typecheck(strict="yes"):  # type: ignore[arg-type]
            pass
