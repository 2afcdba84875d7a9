"""A sharded jax.Array <-> its per-device blocks as torch tensors, in one process.

Both ways go through DLPack one shard at a time: on CPU a block is the same memory on
both sides (no copy), and the round trip is exact (same bits, dtype and shape). The type
string travels beside the blocks, so ``from_torch`` rebuilds the array's NamedSharding,
unreduced axes (a pending sum's addends) included.

Under torch's ``LocalTensorMode`` one process plays every rank: ``to_torch``'s list is
exactly the per-rank blocks a ``LocalTensor`` holds (rank r: the mesh's r-th device, as
``lowering.local_slices`` numbers them), so ``LocalTensor({r: blocks[r]})`` is the same
tensor as a torch program sees it, and a LocalTensor's ``_local_tensors`` go back with
``from_torch([lt._local_tensors[r] for r in range(n)], type, mesh)``.

torch is imported inside the two functions only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from jax_backend.arrays import check_blocks, from_blocks, mesh_devices, to_blocks
from spec_lang.errors import SpecError
from spec_lang.ir import TensorType


def to_torch(x: jax.Array) -> tuple[list[Any], str]:
    """``x``'s shard on each device of its mesh as a torch tensor (rank order), and its type
    string (``f32[8@dp,4]{U:tp}``)."""
    from torch.utils.dlpack import from_dlpack

    blocks, t = to_blocks(x)
    return [from_dlpack(b) for b in blocks], str(t)


def from_torch(blocks: Sequence[Any], t: TensorType | str, jax_mesh: Any) -> jax.Array:
    """The jax.Array of type ``t`` on ``jax_mesh`` whose rank r holds the torch tensor
    ``blocks[r]`` (read through DLPack: a contiguous CPU tensor is not copied)."""
    import torch

    devices = mesh_devices(jax_mesh)
    arrays = []
    for r, (b, d) in enumerate(zip(check_blocks(blocks, len(devices)), devices)):
        if not isinstance(b, torch.Tensor):
            raise SpecError(f"rank {r}'s block is a {type(b).__name__}, not a torch tensor",
                            hint="from_torch takes torch tensors (from_blocks takes numpy or JAX arrays)")
        b = b.contiguous()
        if d.platform == "cpu" and b.__dlpack_device__()[0] == _DL_CPU:
            # every CPU device is the host: claim the block for rank r's device as it lies
            arrays.append(jax.dlpack.from_dlpack(_OnDevice(b, d.local_hardware_id)))
        else:
            arrays.append(jax.dlpack.from_dlpack(b, device=d))
    return from_blocks(arrays, t, jax_mesh)


_DL_CPU = 1  # DLPack's kDLCPU


class _OnDevice:
    """A CPU tensor's DLPack export, naming the CPU device (``local_hardware_id``) it is for:
    torch names device 0 for every CPU tensor, and JAX would copy it to any other."""

    def __init__(self, tensor: Any, device_id: int) -> None:
        self.tensor, self.device_id = tensor, device_id

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DL_CPU, self.device_id)
