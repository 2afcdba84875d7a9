"""One test per rank diagram of the SPMD type system, forward and backward, on 3 ranks
under LocalTensorMode; each letter is a distinct number (``A+B`` their sum)."""

from __future__ import annotations

import pytest
from spmd_utils import T, Tv, run_typed, same

from torch_backend import spmd
from torch_backend.spmd import I, P, R, S, V

ABC = [T("A"), T("B"), T("C")]
ROWS = [Tv("A0", "A1"), Tv("B0", "B1"), Tv("C0", "C1")]
FLAT = Tv("A0", "A1", "B0", "B1", "C0", "C1")


def _p(suffix: str, names: list[str]) -> list[str]:
    return [n + suffix for n in names]


def _pending(names: list[str]) -> list:
    """+[Ax, Bx, Cx] / +[Ay, ...] / +[Az, ...]: the per-rank pieces of a pending sum."""
    return [Tv(*_p(s, names)) for s in "xyz"]


def _summed(names: list[str]) -> list[str]:
    return [f"{n}x+{n}y+{n}z" for n in names]


def _op(name: str, **kw):
    return lambda x: getattr(spmd, name)(x, "x", **kw)


# ---- all_gather ---------------------------------------------------------------------------

def test_all_gather_V_R(fake_pg) -> None:
    outs, gin, ty = run_typed(fake_pg, _op("all_gather", src=V, dst=R), ABC, _pending(["A", "B", "C"]))
    same(outs, [Tv("A", "B", "C")] * 3)
    same(gin, [T(s) for s in _summed(["A", "B", "C"])])  # backward: reduce_scatter(V)
    assert ty == {"x": R}


def test_all_gather_V_I(fake_pg) -> None:
    outs, gin, ty = run_typed(fake_pg, _op("all_gather", src=V, dst=I), ABC, [Tv("A", "B", "C")] * 3)
    same(outs, [Tv("A", "B", "C")] * 3)
    same(gin, ABC)  # backward: convert(I, V)
    assert ty == {"x": I}


def test_all_gather_S0_R(fake_pg) -> None:
    names = ["A0", "A1", "B0", "B1", "C0", "C1"]
    outs, gin, _ = run_typed(fake_pg, _op("all_gather", src=S(0), dst=R), ROWS, _pending(names))
    same(outs, [FLAT] * 3)
    s = _summed(names)
    same(gin, [Tv(*s[0:2]), Tv(*s[2:4]), Tv(*s[4:6])])  # backward: reduce_scatter(S(0))


def test_all_gather_S0_I(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("all_gather", src=S(0), dst=I), ROWS, [FLAT] * 3)
    same(outs, [FLAT] * 3)
    same(gin, ROWS)  # backward: convert(I, S(0)), a local chunk with no sum


# ---- all_reduce ---------------------------------------------------------------------------

def test_all_reduce_P_R(fake_pg) -> None:
    xs = [T("Ax"), T("Ay"), T("Az")]
    outs, gin, ty = run_typed(fake_pg, _op("all_reduce", src=P, dst=R), xs, [T("Gx"), T("Gy"), T("Gz")])
    same(outs, [T("Ax+Ay+Az")] * 3)
    same(gin, [T("Gx+Gy+Gz")] * 3)  # backward: all_reduce(R)
    assert ty == {"x": R}


def test_all_reduce_P_I(fake_pg) -> None:
    xs = [T("Ax"), T("Ay"), T("Az")]
    outs, gin, _ = run_typed(fake_pg, _op("all_reduce", src=P, dst=I), xs, [T("A")] * 3)
    same(outs, [T("Ax+Ay+Az")] * 3)
    same(gin, [T("A")] * 3)  # backward: reinterpret(I, R), nothing moves


# ---- reduce_scatter -----------------------------------------------------------------------

def test_reduce_scatter_P_V(fake_pg) -> None:
    outs, gin, ty = run_typed(fake_pg, _op("reduce_scatter", src=P, dst=V), _pending(["A", "B", "C"]), ABC)
    same(outs, [T(s) for s in _summed(["A", "B", "C"])])
    same(gin, [Tv("A", "B", "C")] * 3)  # backward: all_gather(V, R)
    assert ty == {"x": V}


def test_reduce_scatter_P_S0(fake_pg) -> None:
    names = ["A0", "A1", "B0", "B1", "C0", "C1"]
    outs, gin, ty = run_typed(fake_pg, _op("reduce_scatter", src=P, dst=S(0)), _pending(names), ROWS)
    s = _summed(names)
    same(outs, [Tv(*s[0:2]), Tv(*s[2:4]), Tv(*s[4:6])])
    same(gin, [FLAT] * 3)  # backward: all_gather(S(0), R)
    assert ty == {"x": S(0)}


# ---- all_to_all ---------------------------------------------------------------------------

def test_all_to_all_V_V(fake_pg) -> None:
    xs = [Tv("A0", "A1", "A2"), Tv("B0", "B1", "B2"), Tv("C0", "C1", "C2")]
    ys = [Tv("A0", "B0", "C0"), Tv("A1", "B1", "C1"), Tv("A2", "B2", "C2")]
    outs, gin, _ = run_typed(fake_pg, _op("all_to_all", src=V, dst=V), xs, ys)
    same(outs, ys)
    same(gin, xs)  # backward: all_to_all(V, V)


def test_all_to_all_S0_S1(fake_pg) -> None:
    # each rank holds a [1, 3] row; the result holds a [3, 1] column
    import torch

    xs = [Tv("A0", "A1", "A2")[None], Tv("B0", "B1", "B2")[None], Tv("C0", "C1", "C2")[None]]
    ys = [torch.stack([Tv(f"{r}{k}") for r in "ABC"]) for k in "012"]
    outs, gin, ty = run_typed(fake_pg, _op("all_to_all", src=S(0), dst=S(1)), xs, ys)
    same(outs, ys)
    same(gin, xs)  # backward: all_to_all(S(1), S(0))
    assert ty == {"x": S(1)}


# ---- reinterpret --------------------------------------------------------------------------

def test_reinterpret_R_I(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("reinterpret", src=R, dst=I), [T("A")] * 3, [T("A")] * 3)
    same(outs, [T("A")] * 3)
    same(gin, [T("A"), T("0"), T("0")])  # backward: convert(I, P)


def test_reinterpret_R_V(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("reinterpret", src=R, dst=V), [T("A")] * 3, ABC)
    same(outs, [T("A")] * 3)
    same(gin, ABC)  # backward: reinterpret(V, P), +A +B +C


def test_reinterpret_I_R(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("reinterpret", src=I, dst=R), [T("A")] * 3, [T("Ax"), T("Ay"), T("Az")])
    same(outs, [T("A")] * 3)
    same(gin, [T("Ax+Ay+Az")] * 3)  # backward: all_reduce(I)


def test_reinterpret_V_P(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("reinterpret", src=V, dst=P), ABC, [T("A")] * 3)
    same(outs, ABC)
    same(gin, [T("A")] * 3)  # backward: reinterpret(R, V)


def test_reinterpret_R_P(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("reinterpret", src=R, dst=P), [T("A")] * 3, [T("A")] * 3)
    same(outs, [T("A")] * 3)  # +A +A +A: the value is 3A
    same(gin, [T("A")] * 3)  # backward: reinterpret(R, P)


# ---- convert ------------------------------------------------------------------------------

def test_convert_R_V(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("convert", src=R, dst=V), [Tv("A", "B", "C")] * 3, ABC)
    same(outs, ABC)
    same(gin, [Tv("A", "0", "0"), Tv("0", "B", "0"), Tv("0", "0", "C")])  # backward: convert(V, P)


def test_convert_R_S0(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("convert", src=R, dst=S(0)), [FLAT] * 3, ROWS)
    same(outs, ROWS)
    same(gin, [Tv("A0", "A1", "0", "0", "0", "0"), Tv("0", "0", "B0", "B1", "0", "0"),
               Tv("0", "0", "0", "0", "C0", "C1")])  # backward: convert(S(0), P)


def test_convert_I_V(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("convert", src=I, dst=V), [Tv("A", "B", "C")] * 3, ABC)
    same(outs, ABC)
    same(gin, [Tv("A", "B", "C")] * 3)  # backward: all_gather(V, I)


def test_convert_I_S0(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("convert", src=I, dst=S(0)), [FLAT] * 3, ROWS)
    same(outs, ROWS)
    same(gin, [FLAT] * 3)  # backward: all_gather(S(0), I)


def test_convert_R_P(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("convert", src=R, dst=P), [Tv("A")] * 3, [Tv("A")] * 3)
    same(outs, [Tv("A"), Tv("0"), Tv("0")])
    same(gin, [Tv("A"), Tv("0"), Tv("0")])  # backward: convert(R, P)


def test_convert_I_P(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("convert", src=I, dst=P), [Tv("A")] * 3, [Tv("A")] * 3)
    same(outs, [Tv("A"), Tv("0"), Tv("0")])
    same(gin, [Tv("A")] * 3)  # backward: reinterpret(R, I)


def test_convert_V_P(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("convert", src=V, dst=P), ABC, [Tv("A", "B", "C")] * 3)
    same(outs, [Tv("A", "0", "0"), Tv("0", "B", "0"), Tv("0", "0", "C")])
    same(gin, ABC)  # backward: convert(R, V)


def test_convert_S0_P(fake_pg) -> None:
    outs, gin, _ = run_typed(fake_pg, _op("convert", src=S(0), dst=P), ROWS, [FLAT] * 3)
    same(outs, [Tv("A0", "A1", "0", "0", "0", "0"), Tv("0", "0", "B0", "B1", "0", "0"),
                Tv("0", "0", "0", "0", "C0", "C1")])
    same(gin, ROWS)  # backward: convert(R, S(0))


# ---- the example of the diagram notation, and redistribute's routing ----------------------

@pytest.mark.parametrize("src,dst,kind", [(S(0), R, "all_gather"), (P, R, "all_reduce"), (P, S(0), "reduce_scatter")])
def test_redistribute_routes_to_one_collective(fake_pg, src, dst, kind) -> None:
    xs = ROWS if src == S(0) else _pending(["A0", "A1", "B0", "B1", "C0", "C1"])
    outs, _, ty = run_typed(fake_pg, _op("redistribute", src=src, dst=dst), xs, None)
    direct, _, _ = run_typed(fake_pg, _op(kind, src=src, dst=dst), xs, None)
    same(outs, direct)
    assert ty == {"x": dst}



NO_DATA = [(R, V), (R, P), (R, I), (I, R), (I, V), (I, P), (R, S(0)), (I, S(0)), (V, P), (S(0), P)]


@pytest.mark.parametrize("src,dst", NO_DATA, ids=[f"{s!r}->{d!r}" for s, d in NO_DATA])
def test_redistribute_that_moves_no_data_is_the_convert(fake_pg, monkeypatch, src, dst) -> None:
    """redistribute keeps the value; from R or I (to V, S(i), P, I or R) and from V or S(i)
    to P it needs no communication: it is the convert (R -> V keeps this rank's slot,
    R -> P zeroes all but rank 0), forward (nothing sent) and backward alike."""
    import torch

    from torch_backend import comm

    xs = ROWS if src.base == "V" else [Tv("A", "B", "C")] * 3 if dst == V else [FLAT] * 3
    want, _, _ = run_typed(fake_pg, _op("convert", src=src, dst=dst), xs, None)
    gs = [torch.arange(w.numel(), dtype=torch.float64).reshape(w.shape) + 10 * r for r, w in enumerate(want)]
    _, want_g, _ = run_typed(fake_pg, _op("convert", src=src, dst=dst), xs, gs)
    _, got_g, _ = run_typed(fake_pg, _op("redistribute", src=src, dst=dst), xs, gs)
    same(got_g, want_g)
    sent: list = []
    for name in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "p2p"):
        monkeypatch.setattr(comm, name, lambda *a, _n=name, **k: sent.append(_n))
    outs, _, ty = run_typed(fake_pg, _op("redistribute", src=src, dst=dst), xs, None)
    same(outs, want)
    assert ty == {"x": dst} and sent == []
