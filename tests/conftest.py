"""Shared test setup, kept minimal.

jax must see 8 CPU devices before anything imports it, so XLA_FLAGS is set here at
import time. ``fake_pg`` gives tests a torch "fake" process group of a chosen world
size under which ``LocalTensorMode`` simulates every rank in one process; ``gloo_pool``
is the one set of 8 real gloo ranks that every real-process test shares.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# CI (CI=true) replays the same examples every run, so a landing never hinges on luck,
# and never fails on a slow example of a loaded runner; local runs keep exploring new ones.
# Tests that name their own max_examples keep it; the rest get the profile's. "soak" is for
# a long run by hand: ``pytest --hypothesis-profile=soak tests/test_executor_properties.py``.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None, max_examples=100,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("soak", deadline=None, max_examples=5000, suppress_health_check=[HealthCheck.too_slow])
if os.environ.get("CI"):
    settings.load_profile("ci")

_FLAGS = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _FLAGS:
    os.environ["XLA_FLAGS"] = (_FLAGS + " --xla_force_host_platform_device_count=8").strip()


@pytest.fixture(scope="session")
def fake_pg() -> Iterator[Callable[[int], None]]:
    """``fake_pg(n)`` makes the fake process group have world size ``n``.

    The group is re-created only when the size changes (a DeviceMesh over a subset
    of a bigger fake world is not something to rely on), and destroyed at session end.
    """
    pytest.importorskip("torch.distributed")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def ensure(world: int) -> None:
        if dist.is_initialized():
            if dist.get_world_size() == world:
                return
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)

    yield ensure
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def gloo_pool() -> Iterator[Any]:
    """8 real gloo ranks on this machine, started on first use and shared by every test
    (the start-up, 8 processes importing torch, is paid once). A job that fails or hangs
    fails its test within the job's timeout, and the next job gets a fresh pool."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_gloo_available():
        pytest.skip("torch built without gloo")
    from torch_utils import GlooPool

    pool = GlooPool(8, collective_timeout_s=30)
    yield pool
    pool.close()
