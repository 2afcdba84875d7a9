"""Shared test setup, kept minimal.

jax must see 8 CPU devices before anything imports it, so XLA_FLAGS is set here at
import time. ``fake_pg`` gives tests a torch "fake" process group of a chosen world
size under which ``LocalTensorMode`` simulates every rank in one process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from hypothesis import settings

# CI (CI=true) replays the same examples every run, so a landing never hinges on luck;
# local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
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
