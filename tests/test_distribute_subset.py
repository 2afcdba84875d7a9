"""``distribute`` on a mesh over some of the world's ranks (``fsdp=2@[0,1]`` in a world of
4): the mesh's ranks get their blocks, and a rank off it is refused as with a DeviceMesh
over the same ranks; a one-mesh call refuses such a mesh naming it with its ranks. One
process plays each rank of a fake 4-rank world (``distribute`` moves nothing)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from spec_lang.errors import SpecError  # noqa: E402

W = torch.arange(16.0).reshape(8, 2)


@contextmanager
def playing(rank: int, world: int = 4) -> Iterator[None]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mesh,on", [("fsdp=2@[0,1]", (0, 1)), ("fsdp=2@[2,3]", (2, 3)), ("fsdp=2@[3,1]", (3, 1)),
                                     ("fsdp=2", (0, 1))])
def test_distribute_over_some_of_the_worlds_ranks(mesh, on) -> None:
    import torch_backend as tb

    for rank in range(4):
        with playing(rank):
            if rank in on:
                i = on.index(rank)  # its mesh rank
                assert torch.equal(tb.distribute(W, mesh, "f32[8@fsdp,2]"), W[4 * i:4 * i + 4])
                assert torch.equal(tb.distribute(W, mesh, "f32[8,2]"), W)
            else:  # off the mesh: refused, as off a DeviceMesh over those ranks
                with pytest.raises(SpecError, match=re.escape(f"global rank {rank} is not on the mesh {mesh} ")) as e:
                    tb.distribute(W, mesh, "f32[8@fsdp,2]")
                assert e.value.hint


def test_a_mesh_naming_ranks_outside_the_world_is_refused() -> None:
    import torch_backend as tb

    with playing(0), pytest.raises(SpecError, match=r"the mesh fsdp=2@\[3,5\] names global rank 5, but the "
                                                    r"world has 4 ranks"):
        tb.distribute(W, "fsdp=2@[3,5]", "f32[8@fsdp,2]")


def test_a_one_mesh_call_names_the_mesh_with_its_ranks() -> None:
    import torch_backend as tb

    with playing(0), pytest.raises(SpecError, match=r"the world has 4 ranks but the mesh fsdp=2@\[0,1\] has 2") as e:
        tb.redistribute(W[:4], "f32[8@fsdp,2]", "f32[8,2]", "fsdp=2@[0,1]")
    assert "dst_mesh" in (e.value.hint or "")
