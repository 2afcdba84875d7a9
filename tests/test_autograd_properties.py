"""Property test: on random layouts, the backward is the exact adjoint of the forward.

<redistribute(x), y> == <x, grad> on integer-valued float64 data, where the gradient
enters with the SPMD type system's dual of dst (R<->P, I and V unchanged) and leaves with the dual
of src. Meshes of up to 4 axes, up to 3 dims, uneven sizes, several axes per dim in any
order, R/I annotations, P(sum) and P(avg) sources and destinations.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from strategies import cases  # noqa: E402
from torch_utils import adjoint  # noqa: E402


@settings(deadline=None,  # max_examples: the profile's (conftest.py)
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cases(), st.integers(0, 2**31))
def test_backward_is_the_adjoint(fake_pg, case: tuple, seed: int) -> None:
    src, dst, mesh = case
    assume(src.partial_op not in ("max", "min") and dst.partial_op not in ("max", "min"))
    src, dst = src.replace(dtype="float64"), dst.replace(dtype="float64")
    lhs, rhs = adjoint(fake_pg, mesh, src, dst, seed)
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-9), (str(src), str(dst))
