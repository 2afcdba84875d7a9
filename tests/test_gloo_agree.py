"""``agree=True`` on 8 gloo ranks: a call that is wrong on one rank only (its tensor, its
types, its mesh) fails on every rank at once, each naming that rank, before any
collective of the program and before any of its groups is made."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")
TIMEOUT_S = 60  # the collective timeout of each call: a rank that waits for it fails after it
MESH = "dp=2,tp=4"
SRC, DST = "f32[16@(dp,tp),4]", "f32[16,4]"  # every rank holds 2 rows of SRC

# name -> (the odd rank, what every rank calls: fn(rank, x) with the odd rank's arguments
# differing). Each call's types give the odd rank a tensor of the right shape, except where
# the tensor itself is what differs, so only the agreement can see the difference.
ODD = 2


def _call(rank: int, x, src=SRC, dst=DST, mesh=MESH):
    import torch_backend

    return torch_backend.redistribute(x, src, dst, mesh, timeout=TIMEOUT_S, agree=True)


def _many(rank: int, x, dst=DST):
    import torch_backend

    return torch_backend.redistribute_many([x, x.clone()], [SRC, SRC], [DST, dst], MESH, timeout=TIMEOUT_S,
                                           agree=True)


def _prepared(rank: int, x, dst=DST):
    import torch_backend

    return torch_backend.redistributor(SRC, dst, MESH, timeout=TIMEOUT_S, agree=True)(x)


SCENARIOS = {
    # the tensor: a shape that does not fit on the odd rank
    "tensor shape": lambda r, x: _call(r, torch.zeros(3, 4) if r == ODD else x),
    # another source type with the same blocks' shapes (another order of the mesh axes)
    "source type": lambda r, x: _call(r, x, src="f32[16@(tp,dp),4]" if r == ODD else SRC),
    # another destination: another program, other groups
    "destination type": lambda r, x: _call(r, x, dst="f32[16@dp,4]" if r == ODD else DST),
    # the same types written differently are the same call
    "spelling": lambda r, x: _call(r, x, src="float32[16@(dp,tp),4]" if r == ODD else SRC),
    # another mesh of the same size (names and sizes)
    "mesh": lambda r, x: _call(r, x, mesh="dp=4,tp=2" if r == ODD else MESH),
    # a mesh of another size: the odd rank's mesh does not resolve, and it still takes part
    "mesh size": lambda r, x: _call(r, x[:1] if r == ODD else x, mesh="dp=1,tp=4" if r == ODD else MESH),
    # a type that does not parse on the odd rank only
    "bad type": lambda r, x: _call(r, x, dst="f32[16,4" if r == ODD else DST),
    "many": lambda r, x: _many(r, x, dst="f32[16@tp,4]" if r == ODD else DST),
    "prepared": lambda r, x: _prepared(r, x, dst="f32[16@tp,4]" if r == ODD else DST),
}


def agreement_scenarios(rank: int, world: int) -> dict[str, tuple[str, float, bool]]:
    """Each scenario on every rank: (its error, or 'ok', the seconds it took, the input
    unchanged). The ranks stay in step: a failed agreement fails on all of them at once."""
    from spec_lang import SpecError

    out = {}
    for name, call in SCENARIOS.items():
        x = torch.arange(8.0).reshape(2, 4) + 8 * rank
        x0 = x.clone()
        start = time.monotonic()
        try:
            call(rank, x)
            got = "ok"
        except SpecError as e:
            got = str(e)
        out[name] = (got, time.monotonic() - start, torch.equal(x, x0))
    return out


@pytest.fixture(scope="module")
def agreements(gloo_pool) -> dict[int, dict[str, tuple[str, float, bool]]]:
    return gloo_pool.run(agreement_scenarios, timeout_s=240)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "spelling"])
def test_odd_rank_is_named_on_every_rank(agreements, name):
    for r, res in agreements.items():
        got, took, unchanged = res[name]
        assert got != "ok", (r, name)
        # every rank failed at the agreement, long before the collective timeout (a rank that
        # ran its program, or made its groups, would have waited for the odd rank there)
        assert took < TIMEOUT_S / 2, (r, name, took)
        assert unchanged, (r, name)
        if r != ODD:
            first = got.splitlines()[0]
            assert first.startswith("agree=True: the ranks do not agree on this call"), (r, name, got)
            assert f"rank {ODD} " in first and "rank 0 " not in first, (r, name, got)


@pytest.mark.timeout(300)
def test_the_message_says_what_differs(agreements):
    others = agreements[0]
    got = others["source type"][0]
    assert "rank 2 passed float32[16@(tp,dp),4] -> float32[16,4] on mesh dp=2,tp=4, cpu tensor" in got
    assert "the other 7 ranks passed float32[16@(dp,tp),4] -> float32[16,4] on mesh dp=2,tp=4, cpu tensor" in got
    assert "float32[16@dp,4] on mesh" in others["destination type"][0]
    assert "on mesh dp=4,tp=2" in others["mesh"][0]
    assert "rank 2 failed its checks (rank 2: the world has 8 ranks but the mesh dp=1,tp=4 has 4)" \
        in others["mesh size"][0]
    assert "rank 2 failed its checks (rank 2: " in others["bad type"][0]
    assert "rank 2 failed its checks (rank 2: rank 2's tensor has shape [3, 4]" in others["tensor shape"][0]
    assert "float32[16@tp,4]" in others["many"][0] and "float32[16@tp,4]" in others["prepared"][0]
    # the odd rank raises its own error where its checks failed, else the same one
    odd = agreements[ODD]
    assert odd["tensor shape"][0].startswith("rank 2's tensor has shape [3, 4]")
    assert odd["mesh size"][0].startswith("the world has 8 ranks but the mesh dp=1,tp=4 has 4")
    assert odd["source type"][0].splitlines()[0] == others["source type"][0].splitlines()[0]


@pytest.mark.timeout(300)
def test_the_same_call_spelled_differently_agrees(agreements):
    # the canonical printer decides: 'f32' and 'float32' are one dtype, so the call runs
    assert {res["spelling"][0] for res in agreements.values()} == {"ok"}
