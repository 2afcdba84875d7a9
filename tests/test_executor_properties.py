"""Property test: the torch executor agrees exactly with the reference simulator.

Random meshes of up to 4 axes, up to 3 dims, uneven sizes, several axes per dim in any
order, partial sum/avg/max/min: ``torch_backend.redistribute`` under LocalTensorMode
produces, on every rank, exactly what ``lowering.simulate`` produces for the same
program and the same inputs, and leaves its input untouched.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from planner_oracle import shards_of  # noqa: E402
from strategies import cases  # noqa: E402
from torch_utils import from_local, local_mode, to_local  # noqa: E402

import torch_backend  # noqa: E402
from lowering.planner import compile  # noqa: E402
from lowering.simulator import simulate  # noqa: E402


@settings(deadline=None,  # max_examples: the profile's (conftest.py)
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cases(), st.integers(0, 2**31))
def test_executor_matches_simulator(fake_pg, case: tuple, seed: int) -> None:
    src, dst, mesh = case
    src, dst = src.replace(dtype="float64"), dst.replace(dtype="float64")
    prog = compile(src, dst, mesh)
    rng = np.random.default_rng(seed)
    full = rng.integers(-20, 20, size=src.shape).astype(np.float64)
    inputs = shards_of(full, src, mesh, rng)
    want = simulate(prog, inputs)
    blocks = [torch.from_numpy(x.copy()) for x in inputs]
    with local_mode(fake_pg, mesh.size) as lm:
        x = to_local(lm, blocks)
        y = torch_backend.redistribute(x, src, dst, str(mesh))
        got, after = from_local(y), from_local(x)
    for r in range(mesh.size):
        assert torch.equal(after[r], blocks[r]), f"rank {r}'s input was modified"
        np.testing.assert_allclose(got[r].numpy(), want[r], rtol=0, atol=1e-12, err_msg=f"rank {r}\n{prog}")
