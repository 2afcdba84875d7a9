"""Ragged collectives for MoE dispatch (issue 30, part 3 item 3): ``all_to_all`` with split
sizes, ``split_sizes`` on ``all_gather``/``reduce_scatter``, connected to the uneven
placements (``docs/uneven.md``): the call is the redistribution between the global types
``f32[T@ep<parts S>] -> f32[T@ep<c>]`` (a PartitionedShard to a DynamicShard), run by the
uneven exchange kinds.

The oracle is the definition written with torch on the per-rank blocks: rank s's rows cut
by its split sizes, rank r receiving its experts' rows, expert by expert, source by source;
the gradient goes back to where each row came from (the exact adjoint, checked on integer
data), and ``lowering``'s numpy simulation of the same global types agrees."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from spmd_utils import same
from torch_utils import from_local, local_mode, to_local

import lowering
import torch_backend as tb
from lowering.simulator import simulate
from spec_lang.errors import SpecError
from torch_backend import spmd
from torch_backend.spmd import I, P, R, S, V

N, H = 3, 2
# SPLITS[s][p]: rows rank s routes to partition (expert) p; 2 experts per rank
SPLITS = [[1, 0, 2, 1, 0, 3], [0, 2, 1, 0, 2, 1], [2, 1, 0, 0, 1, 1]]


def tokens(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-50, 50, (sum(row), H), generator=g).double() for row in SPLITS]


def dispatched(xs: list[torch.Tensor], splits=SPLITS) -> list[torch.Tensor]:
    """The definition: rank r gets experts r*k..r*k+k-1, each with every source's rows in
    source order."""
    n, parts = len(splits), len(splits[0])
    k = parts // n
    pieces = [list(x.split(row)) for x, row in zip(xs, splits)]  # pieces[s][p]
    return [torch.cat([pieces[s][p] for p in range(r * k, r * k + k) for s in range(n)]) for r in range(n)]


def per_rank(lm, rows) -> torch.Tensor:
    from torch.distributed._local_tensor import LocalTensor

    with lm.disable():
        return LocalTensor({r: torch.tensor(row) for r, row in enumerate(rows)})


@pytest.mark.parametrize("form", ["per-rank tensor", "matrix"])
def test_dispatch_sends_each_expert_its_rows_and_back(fake_pg, form) -> None:
    xs = tokens()
    want = dispatched(xs)
    g = torch.Generator().manual_seed(1)
    gs = [torch.randint(-9, 10, w.shape, generator=g).double() for w in want]
    with local_mode(fake_pg, N) as lm, spmd.use_mesh(f"ep={N}"):
        x = to_local(lm, xs, requires_grad=True)
        splits = SPLITS if form == "matrix" else per_rank(lm, SPLITS)
        y = spmd.all_to_all(x, "ep", src=V, dst=S(0), input_split_sizes=splits)
        assert spmd.typeof(y) == {"ep": S(0)}
        (gx,) = torch.autograd.grad(y, x, grad_outputs=to_local(lm, gs))
        ys, gxs = from_local(y), from_local(gx)
    same(ys, want)
    # the backward sends every gradient row back to the row it came from
    back = [torch.empty_like(x) for x in xs]
    k = len(SPLITS[0]) // N
    offsets = [np.cumsum([0] + row) for row in SPLITS]
    for r in range(N):
        at = 0
        for p in range(r * k, r * k + k):
            for s in range(N):
                n_rows = SPLITS[s][p]
                back[s][offsets[s][p]:offsets[s][p] + n_rows] = gs[r][at:at + n_rows]
                at += n_rows
    same(gxs, back)
    assert sum(float((a * b).sum()) for a, b in zip(ys, gs)) == sum(float((a * b).sum()) for a, b in zip(xs, gxs))


def test_dispatch_is_the_partitioned_to_dynamic_shard_redistribution(fake_pg) -> None:
    """The global types say the same: f32[T@ep<parts S>,H] -> f32[T@ep<c>,H] compiles to one
    all_to_allv, lowering's numpy simulation gives the same blocks, and the output's global
    type (the ranks' sizes exchanged) is that DynamicShard, whose global tensor is the tokens
    grouped by expert."""
    xs = tokens(2)
    parts = "|".join(",".join(map(str, row)) for row in SPLITS)
    counts = [sum(w.shape[0] for w in [d]) for d in dispatched(xs)]
    src, dst = f"f64[{sum(map(sum, SPLITS))}@ep<parts {parts}>,{H}]", f"f64[{sum(counts)}@ep<{','.join(map(str, counts))}>,{H}]"
    program = lowering.compile(src, dst, f"ep={N}")
    assert [s.kind for s in program.steps] == ["all_to_allv"]
    sim = simulate(program, [x.numpy() for x in xs])
    with local_mode(fake_pg, N) as lm, spmd.use_mesh(f"ep={N}"):
        y = spmd.all_to_all(to_local(lm, xs), "ep", src=V, dst=V, input_split_sizes=per_rank(lm, SPLITS))
        assert spmd.typeof(y) == {"ep": V}
        assert str(tb.uneven_type(y, f"ep={N}", "ep")) == dst.replace("f64", "float64")
        ys = from_local(y)
    same(ys, [torch.from_numpy(b) for b in sim])
    by_expert = torch.cat(ys)
    pieces = [list(x.split(row)) for x, row in zip(xs, SPLITS)]
    same([by_expert], [torch.cat([pieces[s][p] for p in range(len(SPLITS[0])) for s in range(N)])])


def test_output_split_sizes_are_checked_and_one_expert_per_rank_is_all_to_all_single(fake_pg) -> None:
    splits = [[1, 2, 0], [0, 1, 3], [2, 0, 1]]
    xs = [torch.arange(sum(row), dtype=torch.float64).unsqueeze(1) + 10 * s for s, row in enumerate(splits)]
    with local_mode(fake_pg, N) as lm, spmd.use_mesh(f"ep={N}"):
        outs = [[splits[s][r] for s in range(N)] for r in range(N)]  # what all_to_all_single would be told
        y = spmd.all_to_all(to_local(lm, xs), "ep", src=V, dst=V, input_split_sizes=per_rank(lm, splits),
                            output_split_sizes=per_rank(lm, outs))
        same(from_local(y), dispatched(xs, splits))
        # one expert per rank: source order, as all_to_all_single lays it out
        assert from_local(y)[0].flatten().tolist() == [0.0, 20.0, 21.0]
        with pytest.raises(SpecError, match=r"rank 0's output_split_sizes \[1, 0, 3\] differ from what the input "
                           r"splits send it, \[1, 0, 2\]"):
            bad = [[1, 0, 3]] + outs[1:]
            spmd.all_to_all(to_local(lm, xs), "ep", src=V, dst=V, input_split_sizes=splits,
                            output_split_sizes=per_rank(lm, bad))
        with pytest.raises(SpecError, match=r"rank 1's row of input_split_sizes \[0, 1, 2\] adds up to 3, but it "
                           "holds 4 along dim 0"):
            spmd.all_to_all(to_local(lm, xs), "ep", src=V, dst=V, input_split_sizes=[[1, 2, 0], [0, 1, 2], [2, 0, 1]])
        with pytest.raises(SpecError, match=r"rank 1's partition sizes \[0, 1, 2\] add up to 3, not its 4 rows\n"):
            spmd.all_to_all(to_local(lm, xs), "ep", src=V, dst=V,
                            input_split_sizes=per_rank(lm, [[1, 2, 0], [0, 1, 2], [2, 0, 1]]))
        with pytest.raises(SpecError, match="4 partitions do not divide among 3 ranks"):
            spmd.all_to_all(to_local(lm, [torch.ones(4, 1)] * 3), "ep", src=V, dst=V,
                            input_split_sizes=[[1, 1, 1, 1]] * 3)
        with pytest.raises(SpecError, match=r"all_to_all\(src=P, dst=V\) takes no split sizes"):
            spmd.all_to_all(to_local(lm, xs), "ep", src=P, dst=V, input_split_sizes=splits)
        with pytest.raises(SpecError, match="rank 1 holds 4 rows along dim 0, which do not split evenly among the 3"):
            spmd.all_to_all(to_local(lm, xs), "ep", src=V, dst=V, output_split_sizes=outs)


@pytest.mark.parametrize("dst", [V, S(0)])
def test_output_split_sizes_alone_go_with_even_input_splits(fake_pg, dst) -> None:
    """``output_split_sizes`` without ``input_split_sizes``: each rank sends every rank an
    equal share of its rows (all_to_all_single's default; the peer's): rank s's 3, 6, 9 rows
    in shares of 1, 2, 3, so every rank receives [1, 2, 3]; the same as the explicit even
    splits, forward and backward. Sizes that are not what the even splits send are refused."""
    even = [[m // N] * N for m in (3, 6, 9)]
    xs = [torch.arange(3 * (s + 1), dtype=torch.float64).unsqueeze(1) + 10 * s for s in range(N)]
    want = dispatched(xs, even)
    gs = [torch.arange(len(w), dtype=torch.float64).unsqueeze(1) * (r + 2) for r, w in enumerate(want)]
    with local_mode(fake_pg, N) as lm, spmd.use_mesh(f"ep={N}"):
        x = to_local(lm, xs, requires_grad=True)
        y = spmd.all_to_all(x, "ep", src=V, dst=dst, output_split_sizes=[1, 2, 3])
        same(from_local(y), want)
        assert spmd.typeof(y) == {"ep": dst}
        (g,) = torch.autograd.grad(y, x, grad_outputs=to_local(lm, gs))
        x2 = to_local(lm, xs, requires_grad=True)
        y2 = spmd.all_to_all(x2, "ep", src=V, dst=dst, input_split_sizes=even)
        (g2,) = torch.autograd.grad(y2, x2, grad_outputs=to_local(lm, gs))
        same(from_local(g), from_local(g2))
        with pytest.raises(SpecError, match=r"rank 0's output_split_sizes \[3, 2, 1\] differ from what the input "
                           r"splits send it, \[1, 2, 3\]"):
            spmd.all_to_all(to_local(lm, xs), "ep", src=V, dst=dst, output_split_sizes=[3, 2, 1])
        same_rows = [torch.arange(6, dtype=torch.float64).unsqueeze(1) + 10 * s for s in range(N)]
        y3 = spmd.all_to_all(to_local(lm, same_rows), "ep", src=V, dst=dst, output_split_sizes=[2, 2, 2])
        same(from_local(y3), dispatched(same_rows, [[2, 2, 2]] * N))


def test_dispatch_needs_one_split_matrix_per_global_type(fake_pg) -> None:
    """On dp=2,ep=3 the ep groups at dp=0 and dp=1 route alike: one exchange per group, the
    dp axis' types kept; routing that differs over dp has no global type and is refused
    before the data moves."""
    splits = [[1, 2, 0], [0, 1, 3], [2, 0, 1]]
    xs = [torch.arange(sum(splits[r % N]), dtype=torch.float64).unsqueeze(1) + 100 * r for r in range(2 * N)]
    with local_mode(fake_pg, 2 * N) as lm, spmd.use_mesh(f"dp=2,ep={N}"):
        x = spmd.assert_type(to_local(lm, xs), {"dp": S(0)})
        y = spmd.all_to_all(x, "ep", src=V, dst=V, input_split_sizes=per_rank(lm, [splits[r % N] for r in range(6)]))
        assert spmd.typeof(y) == {"dp": S(0), "ep": V}
        same(from_local(y), dispatched(xs[:N], splits) + dispatched(xs[N:], splits))
        other = [splits[r % N] if r < N else splits[(r + 1) % N] for r in range(6)]
        with pytest.raises(SpecError, match="ranks at ep=0 disagree on their sizes"):
            spmd.all_to_all(to_local(lm, [torch.ones(sum(o), 1) for o in other]), "ep", src=V, dst=V,
                            input_split_sizes=per_rank(lm, other))
        with pytest.raises(SpecError, match="runs over one mesh axis"):
            spmd.all_to_all(x, ("dp", "ep"), src=V, dst=V, input_split_sizes=per_rank(lm, other))


def test_all_gather_with_split_sizes_is_the_dynamic_shard_gathered(fake_pg) -> None:
    """Blocks of 3, 0 and 4 rows concatenated on every rank (not torch.chunk's 3, 3, 1);
    dst=I's backward is each rank's own rows of the gradient."""
    sizes = [3, 0, 4]
    full = torch.arange(14.0, dtype=torch.float64).reshape(7, 2)
    xs = list(full.split(sizes))
    g = torch.arange(100.0, 114.0, dtype=torch.float64).reshape(7, 2)
    with local_mode(fake_pg, N) as lm, spmd.use_mesh(f"ep={N}"):
        x = to_local(lm, xs, requires_grad=True)
        y = spmd.all_gather(x, "ep", src=S(0), dst=I, split_sizes=sizes)
        assert spmd.typeof(y) == {"ep": I}
        (gx,) = torch.autograd.grad(y, x, grad_outputs=to_local(lm, [g] * N))
        same(from_local(y), [full] * N)
        same(from_local(gx), list(g.split(sizes)))
        with pytest.raises(SpecError, match="split_sizes has 2 entries for a group of 3 ranks"):
            spmd.all_gather(x, "ep", src=S(0), dst=R, split_sizes=[3, 4])
        with pytest.raises(SpecError, match=r"all_gather\(src=V\) takes no split_sizes"):
            spmd.all_gather(x, "ep", src=V, dst=R, split_sizes=sizes)
        with pytest.raises(SpecError, match="reduce_scatter: split_sizes .* add up to 6, but dim 0 of the pending sum has 7"):
            spmd.reduce_scatter(to_local(lm, [full] * N), "ep", src=P, dst=S(0), split_sizes=[3, 3, 0])
        with pytest.raises(SpecError, match="takes no op_dtype"):
            spmd.reduce_scatter(to_local(lm, [full] * N), "ep", src=P, dst=S(0), split_sizes=sizes,
                                op_dtype=torch.float32)


def test_combine_is_the_dispatch_with_the_splits_transposed(fake_pg) -> None:
    """One expert per rank: sending each source back its rows (input splits: column r of
    the matrix) restores every rank's tokens in their order; with k experts per rank the
    combine is the inverse redistribution, DynamicShard -> PartitionedShard."""
    splits = [[1, 2, 0], [0, 1, 3], [2, 0, 1]]
    xs = [torch.arange(sum(row), dtype=torch.float64).unsqueeze(1) + 10 * s for s, row in enumerate(splits)]
    back_splits = [[splits[s][r] for s in range(N)] for r in range(N)]
    with local_mode(fake_pg, N) as lm, spmd.use_mesh(f"ep={N}"):
        y = spmd.all_to_all(to_local(lm, xs), "ep", src=V, dst=V, input_split_sizes=per_rank(lm, splits))
        z = spmd.all_to_all(y * 2, "ep", src=V, dst=V, input_split_sizes=per_rank(lm, back_splits))
        same(from_local(z), [2 * x for x in xs])
        xk = tokens(3)
        yk = spmd.all_to_all(to_local(lm, xk), "ep", src=V, dst=S(0), input_split_sizes=per_rank(lm, SPLITS))
        parts = tb.uneven_type(to_local(lm, xk), f"ep={N}", "ep", partitions=per_rank(lm, SPLITS))
        zk = tb.redistribute(yk, tb.uneven_type(yk, f"ep={N}", "ep"), parts, f"ep={N}")
        same(from_local(zk), xk)
