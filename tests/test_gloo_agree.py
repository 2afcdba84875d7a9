"""``agree=True``: a tensor wrong on one rank only fails on every rank at once."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch_utils import run_gloo  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")


def one_bad_rank(rank: int, world: int) -> tuple[str, float]:
    from spec_lang import SpecError
    from torch_backend import redistribute

    x = torch.zeros(3 if rank == 2 else 2, 4)  # f32[8@(dp,tp),4] gives every rank 2 rows
    x0 = x.clone()
    start = time.monotonic()
    try:
        redistribute(x, "f32[8@(dp,tp),4]", "f32[8,4]", "dp=2,tp=2", timeout=60, agree=True)
    except SpecError as e:
        assert torch.equal(x, x0)
        return str(e).splitlines()[0], time.monotonic() - start
    return "no error", time.monotonic() - start


@pytest.mark.timeout(120)
def test_one_bad_rank_fails_everywhere_at_once() -> None:
    results = run_gloo(4, one_bad_rank, timeout_s=90, collective_timeout_s=60)
    assert "rank 2's tensor has shape [3, 4]" in results[2][0]
    for r in (0, 1, 3):
        assert "rank(s) [2] passed a tensor" in results[r][0], results[r]
    # nobody waited for the 60 s collective timeout
    assert max(t for _, t in results.values()) < 20
