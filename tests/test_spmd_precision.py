"""``op_dtype``/``out_dtype`` on the reducing collectives (issue 30, part 3 item 4): bf16 on
the wire, fp32 sums, as Megatron's reduce-scatter with fp32 accumulation.

The oracle is the definition in ``torch_backend.spmd.precision`` computed in float64: the
addends as sent (x's dtype), summed exactly, rounded once to ``out_dtype``; the backward is
the table's backward collective on the gradient cast to x's dtype, reduced (all_reduce(P,R)'s
backward) in op_dtype, returned in x's dtype; on data every dtype holds exactly, the
forward and backward are exact adjoints."""

from __future__ import annotations

import pytest
import torch
from spmd_utils import same
from torch_utils import from_local, local_mode, to_local

from spec_lang.errors import SpecError
from torch_backend import spmd
from torch_backend.spmd import I, P, R, S, V

N = 3
BF, F32, F64 = torch.bfloat16, torch.float32, torch.float64


def bf16_blocks(*shape: int, seed: int = 0, high: int = 4096) -> list[torch.Tensor]:
    """Integers below ``high`` rounded to bf16 (8 significant bits): three of them add up
    exactly in fp32, rarely in bf16."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-high, high, shape, generator=g).to(BF) for _ in range(N)]


def run(fake_pg, fn, xs, gs=None):
    with local_mode(fake_pg, N) as lm, spmd.use_mesh(f"x={N}"):
        x = to_local(lm, xs, requires_grad=gs is not None)
        y = fn(x)
        gx = None
        if gs is not None:
            (g,) = torch.autograd.grad(y, x, grad_outputs=to_local(lm, gs))
            gx = from_local(g)
        return from_local(y), gx, spmd.typeof(y), y.dtype


def exact_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    return sum(x.to(F64) for x in xs)


def test_all_reduce_sums_in_fp32_what_bf16_sends(fake_pg) -> None:
    """op_dtype=f32, out_dtype=f32: the exact sum of the bf16 addends (float64's), on every
    rank; the plain bf16 all_reduce rounds it (the reason for the option)."""
    xs = bf16_blocks(64)
    ys, _, t, dtype = run(fake_pg, lambda x: spmd.all_reduce(x, "x", src=P, dst=R, op_dtype=F32,
                                                             out_dtype=F32), xs)
    same(ys, [exact_sum(xs).to(F32)] * N)
    assert t == {"x": R} and dtype == F32
    plain, _, _, _ = run(fake_pg, lambda x: spmd.all_reduce(x, "x", src=P, dst=R), xs)
    assert not torch.equal(plain[0].to(F64), exact_sum(xs))


def test_out_dtype_rounds_once(fake_pg) -> None:
    """op_dtype=f32 with the result in bf16: the exact sum rounded once to bf16, on every rank."""
    xs = bf16_blocks(64, seed=3)
    ys, _, _, dtype = run(fake_pg, lambda x: spmd.all_reduce(x, "x", src=P, dst=R, op_dtype="f32"), xs)
    same(ys, [exact_sum(xs).to(BF)] * N)
    assert dtype == BF
    # out_dtype alone: reduced in x's dtype (the plain collective), then cast
    ys2, _, _, dtype2 = run(fake_pg, lambda x: spmd.all_reduce(x, "x", src=P, dst=R, out_dtype=F64), xs)
    plain, _, _, _ = run(fake_pg, lambda x: spmd.all_reduce(x, "x", src=P, dst=R), xs)
    same(ys2, [p.to(F64) for p in plain])
    assert dtype2 == F64


def test_all_reduce_backward_mirrors_the_options(fake_pg) -> None:
    """all_reduce(P,R)'s backward is all_reduce(P,R): the fp32 gradient goes out as bf16 (x's
    dtype), is summed in fp32 and comes back bf16: the exact sum of the bf16-cast gradients,
    rounded once. all_reduce(P,I)'s backward sends nothing: each rank's gradient, cast."""
    xs = bf16_blocks(16)
    g = torch.Generator().manual_seed(7)
    gs = [torch.randint(-4096, 4096, (16,), generator=g).to(F32) / 3 for _ in range(N)]
    _, gx, _, _ = run(fake_pg, lambda x: spmd.all_reduce(x, "x", src=P, dst=R, op_dtype=F32, out_dtype=F32), xs, gs)
    same(gx, [exact_sum([g.to(BF) for g in gs]).to(BF)] * N)
    gi = [gs[0]] * N
    _, gx, t, _ = run(fake_pg, lambda x: spmd.all_reduce(x, "x", src=P, dst=I, op_dtype=F32, out_dtype=F32), xs, gi)
    same(gx, [gs[0].to(BF)] * N)
    assert t == {"x": I}


@pytest.mark.parametrize("dst,shape,d,kw", [(S(0), (6, 2), 0, {}), (S(-1), (2, 6), 1, {}),
                                            (V, (2, N), 1, {"scatter_dim": 1})], ids=["S(0)", "S(-1)", "V-dim1"])
def test_reduce_scatter_accumulates_in_fp32(fake_pg, dst, shape, d, kw) -> None:
    """Rank r's piece of the exact sum (chunk r of the split dim, or slot r of dim 1 for V),
    rounded once; backward: all_gather (nothing to add) of the gradients in bf16."""
    xs = bf16_blocks(*shape, seed=1)
    total = exact_sum(xs)
    want = [total.select(d, r) for r in range(N)] if dst == V else list(total.chunk(N, d))
    g = torch.Generator().manual_seed(2)
    gs = [torch.randint(-9, 10, want[0].shape, generator=g).to(F32) for _ in range(N)]
    ys, gx, t, dtype = run(fake_pg, lambda x: spmd.reduce_scatter(x, "x", src=P, dst=dst, op_dtype=F32,
                                                                  out_dtype=F32, **kw), xs, gs)
    same(ys, [w.to(F32) for w in want])
    assert dtype == F32 and t["x"].base == "V"
    back = (torch.stack if dst == V else torch.cat)([g.to(BF) for g in gs], d)
    same(gx, [back] * N)
    # on data every dtype holds exactly, the forward and backward are adjoints
    lhs = sum(float((y.to(F64) * gg.to(F64)).sum()) for y, gg in zip(ys, gs))
    rhs = sum(float((x.to(F64) * gi.to(F64)).sum()) for x, gi in zip(xs, gx))
    assert lhs == rhs


def test_other_reductions_and_redistribute(fake_pg) -> None:
    xs = bf16_blocks(8, seed=4)
    ys, _, _, _ = run(fake_pg, lambda x: spmd.all_reduce(x, "x", src=P("max"), dst=R, op_dtype=F32, out_dtype=F32), xs)
    same(ys, [torch.stack(xs).amax(0).to(F32)] * N)
    ys, _, _, _ = run(fake_pg, lambda x: spmd.all_reduce(x, "x", src=P("avg"), dst=R, op_dtype=F32, out_dtype=F64), xs)
    torch.testing.assert_close(ys[0], exact_sum(xs) / N, rtol=2.0**-23, atol=0)
    ys, _, t, _ = run(fake_pg, lambda x: spmd.redistribute(x, "x", src=P, dst=S(0), op_dtype=F32, out_dtype=F32),
                      bf16_blocks(6, seed=5))
    same(ys, list(exact_sum(bf16_blocks(6, seed=5)).to(F32).chunk(N)))
    assert t == {"x": S(0)}


def test_dtype_options_refused_where_they_mean_nothing(fake_pg) -> None:
    fake_pg(N)
    x = torch.ones(6, dtype=BF)
    with pytest.raises(SpecError, match="inplace=True.*takes no op_dtype"):
        spmd.all_reduce(x, "x", src=P, dst=R, op_dtype=F32, inplace=True, mesh="x=3")
    with pytest.raises(SpecError, match="integer P\\('avg'\\) reduced in torch.int64 would truncate"):
        spmd.all_reduce(torch.ones(6, dtype=torch.int32), "x", src=P("avg"), dst=R, op_dtype=torch.int64, mesh="x=3")
    with pytest.raises(SpecError, match="unknown dtype 'fp99'"):
        spmd.all_reduce(x, "x", src=P, dst=R, op_dtype="fp99", mesh="x=3")
    with pytest.raises(SpecError, match="op_dtype takes a torch dtype or its name"):
        spmd.all_reduce(x, "x", src=P, dst=R, op_dtype=4, mesh="x=3")
    with pytest.raises(SpecError, match=r"dim 0 of the local tensor \(\[7\]\) must split into 3 equal pieces"):
        spmd.reduce_scatter(torch.ones(7, dtype=BF), "x", src=P, dst=S(0), op_dtype=F32, mesh="x=3")


def test_no_gradient_through_a_pending_max(fake_pg) -> None:
    """As the plain call: P('max') has no typed gradient, with op_dtype too."""
    xs = bf16_blocks(4)
    with pytest.raises(SpecError, match=r"no gradient through a pending max"):
        run(fake_pg, lambda x: spmd.all_reduce(x, "x", src=P("max"), dst=R, op_dtype=F32), xs, [torch.ones(4)] * N)


def _wire(monkeypatch) -> list:
    """What each reducing collective sends: (kind, dtype, bytes)."""
    from torch_backend import comm

    sent: list = []
    for name, at in (("all_reduce", 1), ("reduce_scatter", 2), ("all_to_all", 1), ("all_gather", 2)):
        orig = getattr(comm, name)

        def spy(*a, _orig=orig, _name=name, _at=at, **k):
            buf = a[_at]
            sent.append((_name, buf.dtype, buf.numel() * buf.element_size()))
            return _orig(*a, **k)

        monkeypatch.setattr(comm, name, spy)
    return sent


@pytest.mark.parametrize("call", ["all_reduce", "reduce_scatter"])
def test_a_narrower_op_dtype_casts_before_the_wire(fake_pg, monkeypatch, call) -> None:
    """f32 data with op_dtype=bf16: cast to bf16 first, so the one collective sends half the
    bytes and adds in bf16 (the peer's meaning), the result returned in f32 (out_dtype's
    default, x's dtype) or out_dtype; it used to send f32 and add in bf16 after an
    all_to_all. The backward is the same collective's dual in bf16, returned in f32."""
    xs = [x.to(F32) + 0.25 for x in bf16_blocks(6, seed=8)]  # not all bf16-exact: the cast rounds
    fn = {"all_reduce": lambda x, **k: spmd.all_reduce(x, "x", src=P, dst=R, **k),
          "reduce_scatter": lambda x, **k: spmd.reduce_scatter(x, "x", src=P, dst=S(0), **k)}[call]
    sent = _wire(monkeypatch)
    gs = [torch.full((6,) if call == "all_reduce" else (2,), 0.5 + r, dtype=F32) for r in range(N)]
    ys, gx, t, dtype = run(fake_pg, lambda x: fn(x, op_dtype=BF), xs, gs)
    back_kind = "all_reduce" if call == "all_reduce" else "all_gather"  # the table's backward
    assert [(k, d) for k, d, _ in sent] == [(call, BF), (back_kind, BF)]  # one bf16 collective each way
    assert sent[0][2] == 6 * 2  # 6 bf16 elements: half the f32 bytes
    total = sum(x.to(BF) for x in xs)  # bf16 addends, added in bf16 in rank order
    want = [total.to(F32)] * N if call == "all_reduce" else list(total.to(F32).chunk(N))
    same(ys, want)
    assert dtype == F32 and t == {"x": R if call == "all_reduce" else S(0)}
    back = [sum(g.to(BF) for g in gs).to(F32)] * N if call == "all_reduce" else [torch.cat(gs).to(BF).to(F32)] * N
    same(gx, back)
    ys2, _, _, dtype2 = run(fake_pg, lambda x: fn(x, op_dtype="bf16", out_dtype=BF), xs)
    same(ys2, [y.to(BF) for y in want])
    assert dtype2 == BF

    # wider (bf16 data, op_dtype=f32): the wire still carries bf16, the sums are f32 after it
    sent.clear()
    run(fake_pg, lambda x: fn(x, op_dtype=F32), bf16_blocks(6))
    assert sent[0][:2] == ("all_to_all", BF) and all(d == BF for _, d, _ in sent)


@pytest.mark.parametrize("name,kw,want_wire,want_out", [
    ("all_gather", {"op_dtype": BF}, BF, F32),              # op_dtype: the wire's; the result x's dtype
    ("all_gather", {"out_dtype": BF}, BF, BF),              # out_dtype alone, narrower: cast before the wire
    ("all_gather", {"op_dtype": BF, "out_dtype": F64}, BF, F64),
    ("all_to_all", {"op_dtype": "bf16"}, BF, F32),
    ("redistribute", {"op_dtype": BF}, BF, F32),            # routed to all_gather
])
def test_dtype_options_on_a_collective_that_adds_nothing(fake_pg, monkeypatch, name, kw, want_wire, want_out) -> None:
    """all_gather, all_to_all (and redistribute where it routes to one) take op_dtype (the
    dtype the blocks travel in: x is cast before the wire) and out_dtype (the result's,
    default x's); out_dtype alone, narrower than x's, is cast before the wire too (the same
    values: nothing is added). The values are the blocks rounded to the wire's dtype; the
    backward is the table's backward in the wire's dtype, returned in x's dtype."""
    xs = [torch.tensor([1.0 + 2.0**-10 * (r + 1), 256.0 + r, 3.0 + 2.0**-9], dtype=F32) for r in range(N)]
    fn = {"all_gather": lambda x: spmd.all_gather(x, "x", src=V, dst=R, **kw),
          "all_to_all": lambda x: spmd.all_to_all(x, "x", src=V, dst=V, **kw),
          "redistribute": lambda x: spmd.redistribute(x, "x", src=S(0), dst=R, **kw)}[name]
    sent = _wire(monkeypatch)
    ys, _, t, dtype = run(fake_pg, fn, xs)
    assert sent and all(d == want_wire for _, d, _ in sent) and dtype == want_out
    rounded = [x.to(want_wire) for x in xs]
    if name == "all_gather":
        want = [torch.stack(rounded).to(want_out)] * N
    elif name == "redistribute":
        want = [torch.cat(rounded).to(want_out)] * N
    else:
        want = [torch.stack([rounded[s][r] for s in range(N)]).to(want_out) for r in range(N)]
    same(ys, want)
    sent.clear()
    g = [torch.ones_like(want[0]) * (r + 1) for r in range(N)]
    _, gx, _, _ = run(fake_pg, fn, xs, g)
    assert all(d == want_wire for _, d, _ in sent) and gx[0].dtype == F32


def test_dtype_options_on_convert_and_the_diagonal(fake_pg, monkeypatch) -> None:
    """convert moves nothing: out_dtype rounds each rank's chunk; src == dst with out_dtype
    is only the cast."""
    sent = _wire(monkeypatch)
    xs = [torch.arange(6, dtype=F32) / 3] * N
    ys, _, t, dtype = run(fake_pg, lambda x: spmd.convert(x, "x", src=R, dst=S(0), out_dtype=BF), xs)
    same(ys, [c.to(BF) for c in xs[0].chunk(N)])
    assert dtype == BF and t == {"x": S(0)} and sent == []
    ys, _, t, dtype = run(fake_pg, lambda x: spmd.convert(x, "x", src=R, dst=R, out_dtype=F64), xs)
    same(ys, [x.to(F64) for x in xs])
    assert dtype == F64 and t == {"x": R}


def test_backward_options_are_the_backward_collectives_options(fake_pg, monkeypatch) -> None:
    """``backward_options`` are given to the table's backward collective, which computes the
    gradient: all_reduce(P,R) sent in bf16 forward (op_dtype) and summed in f32 backward
    (the exact f32 sum of the gradients); all_gather(V,R) of bf16 data whose backward
    reduce_scatter adds in f32 (bf16 on the wire, the exact sum rounded once to x's bf16);
    reduce_scatter(P,S(0)) of 7 rows (3, 3, 1) whose backward all_gather runs in bf16."""
    sent = _wire(monkeypatch)
    xs = [torch.arange(4, dtype=F32) + r for r in range(N)]
    gs = [torch.full((4,), 1.0 + 2.0**-12 * (r + 1), dtype=F32) for r in range(N)]  # f32 sums differ from bf16's
    _, gx, _, _ = run(fake_pg, lambda x: spmd.all_reduce(x, "x", src=P, dst=R, op_dtype=BF,
                                                         backward_options={"op_dtype": F32}), xs, gs)
    assert [(k, d) for k, d, _ in sent] == [("all_reduce", BF), ("all_reduce", F32)]
    same(gx, [sum(gs)] * N)
    sent.clear()
    xb = bf16_blocks(2, seed=9)
    gb = [g.to(BF) for g in bf16_blocks(N, 2, seed=10)]
    _, gx, _, _ = run(fake_pg, lambda x: spmd.all_gather(x, "x", src=V, dst=R, backward_options={"op_dtype": "f32"}),
                      xb, gb)
    assert sent[0][:2] == ("all_gather", BF) and all(d == BF for _, d, _ in sent[1:])
    exact = exact_sum(gb)
    same(gx, [exact[r].to(BF) for r in range(N)])
    sent.clear()
    full = torch.arange(7, dtype=F32) + 0.5
    gs7 = [full[:3], full[3:6], full[6:]]
    _, gx, _, _ = run(fake_pg, lambda x: spmd.reduce_scatter(x, "x", src=P, dst=S(0),
                                                             backward_options={"op_dtype": BF}), [full] * N, gs7)
    assert sent and all(d == BF for _, d, _ in sent[1:])  # the uneven gather (an exact exchange here) in bf16
    same(gx, [full.to(BF).to(F32)] * N)


def test_backward_options_refused_where_there_is_no_one_backward_collective(fake_pg) -> None:
    fake_pg(N)
    x = torch.ones(6)
    for kw, match in [({"backward_options": {"dtype": F32}}, "takes a dict with the keys 'op_dtype' and "
                       "'out_dtype', got 'dtype'"),
                      ({"backward_options": F32}, "takes a dict .* got dtype"),
                      ({"backward_options": {"op_dtype": 3}}, "backward_options op_dtype takes a torch dtype")]:
        with pytest.raises(SpecError, match=match):
            spmd.all_reduce(x, "x", src=P, dst=R, mesh="x=3", **kw)
    with pytest.raises(SpecError, match=r"reinterpret\(src=I, dst=V\) has no one backward collective"):
        spmd.reinterpret(x, "x", src=I, dst=V, mesh="x=3", backward_options={"op_dtype": F32})
    with pytest.raises(SpecError, match=r"all_reduce\(src=P\('avg'\), dst=R\) has no one backward collective"):
        spmd.all_reduce(x, "x", src=P("avg"), dst=R, mesh="x=3", backward_options={"op_dtype": F32})
    with pytest.raises(SpecError, match="not inplace=True"):
        spmd.all_reduce(x, "x", src=P, dst=R, mesh="x=3", inplace=True, backward_options={"op_dtype": F32})
    with pytest.raises(SpecError, match="not split sizes"):
        spmd.all_gather(x, "x", src=S(0), dst=R, mesh="x=3", split_sizes=[2, 2, 2],
                        backward_options={"op_dtype": F32})
