"""The uneven placements' worked examples under LocalTensorMode (the same cases run on real
gloo ranks in test_gloo_uneven.py), the bytes handed to the collective (never padded),
bad input refused before any communication, and regressions the properties found."""

from __future__ import annotations

import numpy as np
import pytest
from planner_oracle import expected, reduce_partial, shards_of
from uneven_cases import ALIGNED, SKEWED, UNALIGNED, WORKED, block, case_types, global_array

from lowering import DynamicShard, PartitionedShard, compile
from lowering.checks import resolve
from lowering.kinds import rank_pieces
from lowering.simulator import simulate
from spec_lang import DTYPES, parse, parse_mesh
from spec_lang.errors import SpecError

torch = pytest.importorskip("torch")
from torch_utils import from_local, local_mode, to_local  # noqa: E402

import torch_backend  # noqa: E402
from torch_backend import comm  # noqa: E402

CASES = [(w, *c) for w, cs in WORKED.items() for c in cs]


@pytest.mark.parametrize("world,name,mesh,src,dst", CASES, ids=[f"{w}-{c[0]}" for w, *c in CASES])
def test_worked_example_there_and_back(fake_pg, world: int, name: str, mesh: str, src: str, dst: str) -> None:
    m, s, d = case_types(mesh, src, dst)
    assert m.size == world
    start = [torch.from_numpy(block(s, m, r)) for r in range(world)]
    with local_mode(fake_pg, world) as lm:
        x = to_local(lm, start)
        y = torch_backend.redistribute(x, s, d, m)
        z = torch_backend.redistribute(y, d, s, m)
        mid, back, after = from_local(y), from_local(z), from_local(x)
    for r in range(world):
        assert np.array_equal(mid[r].numpy(), block(d, m, r)), f"rank {r}"
        assert torch.equal(back[r], start[r]) and torch.equal(after[r], start[r]), f"rank {r}"


def test_partitioned_worked_example_values(fake_pg) -> None:
    """unaligned -> aligned: shard 0 = [P00:4, P10:2, P01:6, P11:4], shard 1 = [P02:4, P12:8,
    P03:2, P13:2]; the pieces cross in the split exchange's sizes and order."""
    m, un, al = case_types("ep=2", UNALIGNED, ALIGNED)
    full = global_array(un)
    with local_mode(fake_pg, 2) as lm:
        y = torch_backend.redistribute(to_local(lm, [torch.from_numpy(block(un, m, r)) for r in range(2)]),
                                       un, al, m)
        rows = [t[:, 0].long().div(3, rounding_mode="floor").tolist() for t in from_local(y)]
    assert rows[0] == [*range(0, 4), *range(4, 6), *range(6, 12), *range(12, 16)]
    assert rows[1] == [*range(16, 20), *range(20, 28), *range(28, 30), *range(30, 32)]
    assert full[16:20, 0].tolist() == [48.0, 51.0, 54.0, 57.0]
    p = PartitionedShard(0, 4, ((4, 6, 4, 2), (2, 4, 8, 2)))
    assert p.exchange_splits() == [(4, 6, 2, 4), (4, 2, 8, 2)]
    assert p.realigned().exchange_splits() == [(4, 6, 4, 2), (2, 4, 8, 2)]
    # the exchange moves exactly the pieces of the split exchange held by the peer
    (step,) = compile(un, al, m).steps
    for r, got in enumerate(p.exchange_splits()):
        pieces = rank_pieces(step, m, r)
        from_peer = sum(got[2:]) if r == 0 else sum(got[:2])
        assert [pc.numel for pc in pieces.recv if pc.peer != r] == [from_peer * 3]  # type: ignore[attr-defined]
        assert pieces.covered - pieces.recv_elems == (sum(got) - from_peer) * 3  # type: ignore[attr-defined]


@pytest.mark.parametrize("mesh,src,dst", SKEWED)
def test_collective_gets_the_exact_bytes(fake_pg, monkeypatch, mesh: str, src: str, dst: str) -> None:
    m, s, d = case_types(mesh, src, dst)
    program = compile(s, d, m)
    seen: list[tuple[int, int]] = []
    real = comm.all_to_all

    def counting(ctx, send, send_splits, recv_splits, group, out=None):
        item = send.element_size()
        for r, splits in send_splits.items():
            assert send._local_tensors[r].numel() == sum(splits)  # nothing padded
        seen.append((sum(map(sum, send_splits.values())) * item, sum(map(sum, recv_splits.values())) * item))
        return real(ctx, send, send_splits, recv_splits, group, out)

    monkeypatch.setattr(comm, "all_to_all", counting)
    rng = np.random.default_rng(3)
    full = rng.integers(-9, 9, size=s.shape).astype(np.float32)
    ins = shards_of(full, s, m, rng)
    with local_mode(fake_pg, m.size) as lm:
        y = torch_backend.redistribute(to_local(lm, [torch.from_numpy(a) for a in ins]), s, d, m)
        got = [t.numpy() for t in from_local(y)]
    price = sum(sum(st.bytes_sent) for st in program.steps)
    assert price > 0 and sum(a for a, _ in seen) == price and sum(b for _, b in seen) == price
    assert all(np.array_equal(a, b) for a, b in zip(reduce_partial(got, d, m), expected(full, d, m)))


BAD = [
    ("f64[8@dp<3,4>]", "f64[8]", "dp=2", "sum to 7"),
    ("f64[8@dp<ragged 1,2,1>]", "f64[8]", "dp=2", "3 local units for mesh axis 'dp'"),
    ("f64[6@ep<aligned 1,1,1|1,1,1>]", "f64[6]", "ep=2", "divisible by the 2 shards"),
    ("f64[8@dp<3,-1>]", "f64[8]", "dp=2", "unexpected '-' \\(expected a number\\)"),
]


def _no_communication(monkeypatch) -> None:
    def refuse(*_a, **_k):
        raise AssertionError("communication before the input was checked")

    for name in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "p2p"):
        monkeypatch.setattr(comm, name, refuse)


@pytest.mark.parametrize("src,dst,mesh,message", BAD)
def test_bad_types_refused_before_communication(fake_pg, monkeypatch, src: str, dst: str, mesh: str,
                                                message: str) -> None:
    _no_communication(monkeypatch)
    m = parse_mesh(mesh)
    start = [torch.zeros(4, dtype=torch.float64) for _ in range(m.size)]
    with local_mode(fake_pg, m.size) as lm:
        x = to_local(lm, start)
        with pytest.raises(SpecError, match=message):
            torch_backend.redistribute(x, src, dst, m)
        assert all(torch.equal(a, b) for a, b in zip(from_local(x), start))


def test_negative_sizes_refused() -> None:
    with pytest.raises(SpecError, match="negative size"):
        DynamicShard(0, (-1, 3))
    with pytest.raises(SpecError, match="unexpected .-. \\(expected a number\\)") as e:
        parse("f32[2@dp<3,-1>]")
    assert e.value.pos == "f32[2@dp<3,-1>]".index("-")


def test_wrong_local_shape_refused_before_communication(fake_pg, monkeypatch) -> None:
    _no_communication(monkeypatch)
    s, d, m = "f64[8@dp<3,0,5>,2]", "f64[8,2]", parse_mesh("dp=3")
    start = [torch.zeros(3, 2, dtype=torch.float64), torch.zeros(0, 2, dtype=torch.float64),
             torch.zeros(3, 2, dtype=torch.float64)]  # rank 2 holds 5 rows
    with local_mode(fake_pg, 3) as lm:
        x = to_local(lm, start)
        with pytest.raises(SpecError, match=r"rank 2's tensor has shape \[3, 2\].*\[5, 2\]"):
            torch_backend.redistribute(x, s, d, m)
        assert all(torch.equal(a, b) for a, b in zip(from_local(x), start))


@pytest.mark.parametrize("src,dst,mesh", [
    # an accumulating unpack wrote an element twice in one folded copy: one contribution lost
    ("f64[3@a]{U:(b,c)}", "f64[3@b<3>]", "a=3,b=1,c=2"),
    ("f64[3@a]{U:c}", "f64[3@b<3>]", "a=3,b=1,c=2"),
    # the reduce-then-gather midpoint sharded a dim inside a ragged prefix
    ("f64[4,6]{U:a}", "f64[4@b<ragged 1,1 over 2>,6]", "a=2,b=2"),
    ("f64[0@b<0>,0]{U:a}", "f64[0@b<ragged 1 over 2>,0]", "a=2,b=1"),
])
def test_found_by_the_properties(fake_pg, src: str, dst: str, mesh: str) -> None:
    s, m = resolve(src, mesh)
    d, _ = resolve(dst, m)
    rng = np.random.default_rng(0)
    full = rng.integers(-20, 20, size=s.shape).astype(np.float64)
    ins = shards_of(full, s, m, rng)
    sim = simulate(compile(s, d, m), ins)
    assert all(np.array_equal(a, b) for a, b in zip(reduce_partial(sim, d, m), expected(full, d, m)))
    with local_mode(fake_pg, m.size) as lm:
        got = from_local(torch_backend.redistribute(to_local(lm, [torch.from_numpy(a) for a in ins]), s, d, m))
    assert all(np.array_equal(g.numpy(), w) for g, w in zip(got, sim))


def _representable(dt: np.dtype) -> list[float]:
    """Small values, the dtype's extremes and infinities that survive a cast to ``dt`` and back."""
    import ml_dtypes

    extremes: list[float] = [-np.inf, np.inf]
    for info in (ml_dtypes.finfo, ml_dtypes.iinfo):
        try:
            extremes += [float(info(dt).min), float(info(dt).max)]
        except ValueError:
            pass
    out = []
    for v in [-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 8.0, *extremes]:
        with np.errstate(invalid="ignore", over="ignore"):  # infinities cast to ints
            back = np.array([v]).astype(dt).astype(np.float64)[0]
        if back == v:
            out.append(v)
    return out


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("name", sorted(n for n in DTYPES if not n.startswith("complex")))
def test_uneven_max_and_min_simulate_every_real_dtype(name: str, op: str) -> None:
    """An exact exchange that finishes P(max)/P(min) starts each output from the dtype's
    identity, ml_dtypes' bfloat16, float8s, int4 ... included (numpy's own finfo/iinfo do
    not know them). Oracle: numpy's maximum/minimum of the two ranks' values in float64."""
    pytest.importorskip("ml_dtypes")
    dt = np.dtype(name)
    values = _representable(dt)
    program = compile(f"{name}[24]{{P({op}):dp}}", f"{name}[24@dp<7,17>]", "dp=2")
    assert [s.kind for s in program.steps] == ["reduce_scatterv"]
    rng = np.random.default_rng(len(name))
    xs = [np.array(rng.choice(values, 24)).astype(dt) for _ in range(2)]
    xs[0][:len(values)] = xs[1][:len(values)] = np.array(values).astype(dt)  # every value against itself
    out = simulate(program, xs)
    assert [y.dtype for y in out] == [dt, dt]
    want = (np.maximum if op == "max" else np.minimum)(*(x.astype(np.float64) for x in xs))
    np.testing.assert_array_equal(np.concatenate([y.astype(np.float64) for y in out]), want)
