"""``agree=True``: a tensor wrong on one rank only fails on every rank at once."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")
TIMEOUT_S = 120  # the collective timeout of the redistribute call


def one_bad_rank(rank: int, world: int) -> tuple[str, float]:
    from spec_lang import SpecError
    from torch_backend import redistribute

    x = torch.zeros(3 if rank == 2 else 2, 4)  # f32[16@(dp,tp),4] gives every rank 2 rows
    x0 = x.clone()
    start = time.monotonic()
    try:
        redistribute(x, "f32[16@(dp,tp),4]", "f32[16,4]", "dp=2,tp=4", timeout=TIMEOUT_S, agree=True)
    except SpecError as e:
        assert torch.equal(x, x0)
        return str(e).splitlines()[0], time.monotonic() - start
    return "no error", time.monotonic() - start


@pytest.mark.timeout(200)
def test_one_bad_rank_fails_everywhere_at_once(gloo_pool) -> None:
    results = gloo_pool.run(one_bad_rank, timeout_s=180)
    assert "rank 2's tensor has shape [3, 4]" in results[2][0]
    for r in set(range(8)) - {2}:
        assert "rank(s) [2] passed a tensor" in results[r][0], results[r]
    # every rank failed before the collective timeout, so none of them sat it out
    # (a rank that waits for it fails after TIMEOUT_S, with a collective error)
    assert max(t for _, t in results.values()) < TIMEOUT_S
