"""Uneven placements on real gloo ranks (2 and 4 processes): the worked examples there and
back, the bytes handed to all_to_all_single and taken back from it (the program's price,
sent and busiest-direction figures, never padded), autograd,
async_op, and a bad type refused on every rank before any communication. Small tensors,
hard timeouts."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch_utils import GlooPool, pairing, random_blocks  # noqa: E402
from uneven_cases import SKEWED, WORKED, block, case_types  # noqa: E402

from lowering import compile  # noqa: E402
from spec_lang.dual import dual_type  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")
BACKWARD = ("dp=4", "f64[5@dp<ragged 1,2,1,1 over 2>,4]", "f64[5,4@dp<0,3,1,0>]")
# balanced sources on plain layouts: the replicas (y, z=0) take turns, so each serves the
# receiver at the other y (rank 2 sends to rank 1, rank 0 to rank 3; a hand-built step, since
# the planner ties it with slice + permute on 4 ranks)
BALANCED = ("y=2,z=2", "f64[4,1@z]", "f64[4@(z,y),1]")
ASYNC = ("dp=4", "f64[8@dp<3,0,5,0>,2]", "f64[8@dp<0,1,1,6>,2]")


def worked(rank: int, world: int) -> dict:
    """Every worked example of this world size: src -> dst and back, on this rank."""
    from torch_backend import redistribute

    out = {}
    for name, mesh, src, dst in WORKED[world]:
        m, s, d = case_types(mesh, src, dst)
        x = torch.from_numpy(block(s, m, rank))
        x0 = x.clone()
        y = redistribute(x, s, d, m, timeout=20)
        z = redistribute(y, d, s, m, timeout=20)
        out[name] = bool(np.array_equal(y.numpy(), block(d, m, rank)) and torch.equal(z, x0) and torch.equal(x, x0))
    return out


def counted(rank: int, world: int) -> dict:
    """The bytes this rank hands to all_to_all_single and takes back, per skewed case (each
    call's sent, and the larger of its sent and received), and the result."""
    from torch_backend import redistribute

    real = dist.all_to_all_single
    seen: list[tuple[int, int]] = []

    def counting(output, input, output_split_sizes=None, input_split_sizes=None, **kw):
        assert input.numel() == sum(input_split_sizes)  # nothing padded
        assert output.numel() == sum(output_split_sizes)
        sent, got = sum(input_split_sizes) * input.element_size(), sum(output_split_sizes) * output.element_size()
        seen.append((sent, max(sent, got)))
        return real(output, input, output_split_sizes, input_split_sizes, **kw)

    dist.all_to_all_single = counting
    out = {}
    try:
        for mesh, src, dst in SKEWED:
            m, s, d = case_types(mesh, src, dst)
            if "U:" in src:
                continue  # a partial source's contributions are not the global's blocks
            seen.clear()
            y = redistribute(torch.from_numpy(block(s, m, rank).astype(np.float32)), s, d, m, timeout=20)
            out[src, dst] = (sum(c[0] for c in seen), sum(c[1] for c in seen),
                             bool(np.array_equal(y.numpy(), block(d, m, rank).astype(np.float32))))
        from lowering import make_program, make_step
        from torch_backend.executor import execute

        m, s, d = case_types(*BALANCED)
        seen.clear()
        y = execute(make_program([make_step("all_to_allv", s, d, m)], m), torch.from_numpy(block(s, m, rank)))
        out["balanced"] = (sum(c[0] for c in seen), sum(c[1] for c in seen), bool(np.array_equal(y.numpy(), block(d, m, rank))))
    finally:
        dist.all_to_all_single = real
    # async_op: the handle's wait() gives the sync result
    m, s, d = case_types(*ASYNC)
    h = redistribute(torch.from_numpy(block(s, m, rank)), s, d, m, timeout=20, async_op=True)
    out["async"] = bool(np.array_equal(h.wait().numpy(), block(d, m, rank)))
    # autograd: this rank's output and gradient (the parent evaluates the pairings)
    m, s, d = case_types(*BACKWARD)
    rng = np.random.default_rng(5)  # the same on every rank: every rank builds the same blocks
    xb, yb = random_blocks(s, m, rng), random_blocks(dual_type(d), m, rng)
    x = xb[rank].clone().requires_grad_(True)
    y = redistribute(x, s, d, m, timeout=20)
    (grad,) = torch.autograd.grad(y, x, grad_outputs=yb[rank])
    out["backward"] = (y.detach().numpy(), grad.numpy())
    return out


def refused(rank: int, world: int) -> str:
    """A type whose sizes miss the dim: a SpecError on this rank, no collective called."""
    from spec_lang import SpecError
    from torch_backend import redistribute

    def no_comm(*_a, **_k):
        raise AssertionError("communication before the type was checked")

    names = ("all_to_all_single", "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "barrier")
    saved = {n: getattr(dist, n) for n in names}
    for n in names:
        setattr(dist, n, no_comm)
    x = torch.zeros(4, dtype=torch.float64)
    try:
        redistribute(x, "f64[8@dp<3,4>]", "f64[8]", f"dp={world}" if world == 2 else "dp=2,tp=2",
                     timeout=20)
    except SpecError as e:
        return str(e).splitlines()[0]
    finally:
        for n, f in saved.items():
            setattr(dist, n, f)
    return "no error"


@pytest.fixture(scope="module")
def pool2():
    pool = GlooPool(2, collective_timeout_s=30)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def pool4():
    pool = GlooPool(4, collective_timeout_s=30)
    yield pool
    pool.close()


@pytest.mark.timeout(300)
def test_worked_examples_on_2_ranks(pool2) -> None:
    results = pool2.run(worked, timeout_s=120)
    assert all(all(res.values()) for res in results.values()), results
    assert set(results[0]) == {c[0] for c in WORKED[2]}


@pytest.mark.timeout(300)
def test_worked_examples_on_4_ranks(pool4) -> None:
    results = pool4.run(worked, timeout_s=120)
    assert all(all(res.values()) for res in results.values()), results
    assert set(results[0]) == {c[0] for c in WORKED[4]}


@pytest.mark.timeout(300)
def test_bytes_async_and_backward_on_4_ranks(pool4) -> None:
    results = pool4.run(counted, timeout_s=120)
    n = 0
    for mesh, src, dst in SKEWED:
        if "U:" in src:
            continue
        m, s, d = case_types(mesh, src, dst)
        prog = compile(s, d, m)
        assert prog.cost.bytes_max > 0
        for r in range(4):  # per rank: what it sent, and its busier direction, step by step
            assert results[r][src, dst][0] == sum(st.bytes_sent[r] for st in prog.steps), (src, dst, r)
            assert results[r][src, dst][1] == sum(st.bytes_moved[r] for st in prog.steps), (src, dst, r)
        assert max(results[r][src, dst][0] for r in range(4)) == prog.cost.bytes_sent_max
        assert max(results[r][src, dst][1] for r in range(4)) == prog.cost.bytes_max
        assert all(results[r][src, dst][2] for r in range(4)), (src, dst)
        n += 1
    assert n == 3
    from lowering import make_step

    m, s, d = case_types(*BALANCED)
    step = make_step("all_to_allv", s, d, m)
    assert [results[r]["balanced"][:2] for r in range(4)] == [(step.bytes_sent[r], step.bytes_moved[r]) for r in range(4)]
    assert sorted(step.bytes_sent) == [0, 0, 8, 8] and all(results[r]["balanced"][2] for r in range(4))
    assert all(results[r]["async"] for r in range(4))
    m, s, d = case_types(*BACKWARD)
    rng = np.random.default_rng(5)
    xb, yb = random_blocks(s, m, rng), random_blocks(dual_type(d), m, rng)
    outs = [torch.from_numpy(results[r]["backward"][0]) for r in range(4)]
    grads = [torch.from_numpy(results[r]["backward"][1]) for r in range(4)]
    assert pairing(d, m, outs, yb) == pairing(s, m, xb, grads)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_bad_type_refused_on_every_rank(pool2, pool4, world: int) -> None:
    results = (pool2 if world == 2 else pool4).run(refused, timeout_s=60)
    assert all("sum to 7" in msg for msg in results.values()), results


def sizes_then_data(rank: int, world: int) -> dict:
    """Each rank knows only its own token count: exchange the sizes, then the data; and a
    rank whose partition sizes do not match its tensor fails every rank, no hang."""
    from spec_lang.errors import SpecError
    from torch_backend import redistribute, uneven_type

    counts = [3, 0, 5, 2][:world]
    start = sum(counts[:rank])
    x = torch.arange(start * 2, (start + counts[rank]) * 2, dtype=torch.float64).reshape(-1, 2)
    t = uneven_type(x, f"ep={world}", "ep")
    total = sum(counts)
    y = redistribute(x, t, f"f64[{total}@ep,2]", f"ep={world}", timeout=20)
    full = torch.arange(total * 2, dtype=torch.float64).reshape(total, 2)
    ok = bool(torch.equal(y, full.chunk(world)[rank] if rank < len(full.chunk(world)) else full[:0]))
    parts = [counts[rank], 0] if rank else [counts[rank] + 1, 0]  # rank 0 is wrong
    try:
        uneven_type(x, f"ep={world}", "ep", partitions=parts)
        err = ""
    except SpecError as e:
        err = e.message
    return {"type": str(t), "ok": ok, "error": err}


@pytest.mark.timeout(300)
def test_sizes_then_data_on_4_ranks(pool4) -> None:
    results = pool4.run(sizes_then_data, timeout_s=120)
    assert {res["type"] for res in results.values()} == {"float64[10@ep<3,0,5,2>,2]"}
    assert all(res["ok"] for res in results.values()), results
    assert "partition sizes [4, 0] add up to 4, not its 3 rows" in results[0]["error"], results
    assert all("rank(s) [0]" in results[r]["error"] for r in (1, 2, 3)), results
