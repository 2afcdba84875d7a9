"""Random redistributions on a real 8-rank gloo world, checked against the simulator.

Every rank draws the same cases from the same seed, runs them through
``torch_backend.redistribute`` on real process groups (the direct-buffer and exact-ring
paths that LocalTensorMode does not take), and compares its block with the reference
simulator's, exactly. One pool of processes runs them all, with hard timeouts.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch_utils import run_gloo  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

MESHES = ("dp=2,tp=4", "a=2,b=2,c=2", "x=8", "p=4,q=2")
CASES_PER_MESH = 12


def random_cases(rank: int, world: int) -> list[str]:
    """Runs on every rank: returns a description of each case that went wrong here."""
    from planner_oracle import shards_of
    from strategies import random_case

    from lowering.planner import compile
    from lowering.simulator import simulate
    from spec_lang import parse_mesh
    from torch_backend import redistribute

    bad = []
    for m_text in MESHES:
        mesh = parse_mesh(m_text)
        rng = np.random.default_rng(1234)
        for i in range(CASES_PER_MESH):
            src, dst = random_case(rng, mesh)
            data_rng = np.random.default_rng(i)
            full = data_rng.integers(-20, 20, size=src.shape).astype(np.float64)
            inputs = shards_of(full, src, mesh, data_rng)
            want = simulate(compile(src, dst, mesh), inputs)[rank]
            x = torch.from_numpy(inputs[rank].copy())
            y = redistribute(x, src, dst, m_text, timeout=20)
            if not (y.shape == want.shape and np.allclose(y.numpy(), want, rtol=0, atol=1e-12)):
                bad.append(f"{m_text}: {src} -> {dst}")
            if not torch.equal(x, torch.from_numpy(inputs[rank])):
                bad.append(f"{m_text}: {src} -> {dst} modified its input")
    return bad


@pytest.mark.timeout(240)
def test_random_redistributions_on_gloo() -> None:
    results = run_gloo(8, random_cases, timeout_s=200, collective_timeout_s=30)
    bad = {r: res for r, res in results.items() if res}
    assert not bad, f"wrong blocks: {bad}"
