"""A sharded jax.Array <-> its per-rank blocks, rank r being the mesh's r-th device
(row-major over its axes), as ``lowering.local_slices`` numbers them.

A block is a device's shard as JAX holds it: for a pending sum (unreduced axes) its
addend, which ``np.asarray`` of the whole array refuses in JAX 0.10.2.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from lowering.checks import resolve
from lowering.layout import local_shapes
from spec_lang.errors import SpecError
from spec_lang.ir import TensorType
from spec_lang.jax_interop import from_jax, mesh_from_jax, to_jax


def mesh_devices(jax_mesh: Any) -> list[Any]:
    """The mesh's devices in rank order (a SpecError for anything but a jax Mesh)."""
    mesh_from_jax(jax_mesh)
    return list(jax_mesh.devices.flat)


def check_blocks(blocks: Any, n: int) -> list[Any]:
    """``blocks`` as a list of ``n`` arrays (anything with a shape), or a SpecError."""
    if isinstance(blocks, (str, bytes, bytearray)) or not isinstance(blocks, Sequence):
        raise SpecError(f"expected a list of blocks, got {type(blocks).__name__}",
                        hint="pass one array per device, in the mesh's row-major order")
    if len(blocks) != n:
        raise SpecError(f"got {len(blocks)} blocks for a mesh of {n} devices",
                        hint="pass one block per device, in the mesh's row-major order")
    for r, b in enumerate(blocks):
        if not isinstance(getattr(b, "shape", None), tuple) and not hasattr(b, "__dlpack__"):
            raise SpecError(f"rank {r}'s block is a {type(b).__name__}, not an array",
                            hint="pass numpy arrays, jax.Arrays or torch tensors")
    return list(blocks)


def from_blocks(blocks: Sequence[Any], t: TensorType | str, jax_mesh: Any) -> jax.Array:
    """The jax.Array of type ``t`` on ``jax_mesh`` whose rank r holds ``blocks[r]`` (each
    put on its device as is: a jax.Array already there is not copied)."""
    m = mesh_from_jax(jax_mesh)
    tt, _ = resolve(t, m)
    sharding = to_jax(tt, jax_mesh)
    devices = mesh_devices(jax_mesh)
    blocks = check_blocks(blocks, len(devices))
    shapes = local_shapes(tt, m)
    placed = []
    for r, (b, d, want) in enumerate(zip(blocks, devices, shapes)):
        if tuple(b.shape) != tuple(want):
            raise SpecError(f"rank {r}'s block has shape {list(b.shape)}, {tt} says {list(want)}",
                            hint=f"give each rank its block of {tt} (lowering.local_slices)")
        placed.append(jax.device_put(b, d))
    return jax.make_array_from_single_device_arrays(tt.shape, sharding, placed)


def to_blocks(x: jax.Array) -> tuple[list[jax.Array], TensorType]:
    """``x``'s shard on each device of its mesh, in rank order, and its type."""
    t = from_jax(x)
    sharding = x.sharding
    if not isinstance(sharding, jax.sharding.NamedSharding):
        raise SpecError(f"the array's sharding {sharding} names no mesh", hint="give it a NamedSharding")
    by_device = {s.device: s.data for s in x.addressable_shards}
    devices = mesh_devices(sharding.mesh)
    missing = [d for d in devices if d not in by_device]
    if missing:
        raise SpecError(f"device {missing[0]} of the array's mesh is not addressable from this process",
                        hint="to_blocks reads every shard in one process")
    return [by_device[d] for d in devices], t


def blocks_of(x: jax.Array) -> list[np.ndarray]:
    """``to_blocks`` as numpy arrays (copies)."""
    return [np.asarray(b) for b in to_blocks(x)[0]]
