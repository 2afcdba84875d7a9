"""Deterministic test data: a global tensor and each rank's block of it under a type.

Used by ``shardc run --check``, the tests and the benchmarks. Values are small
integers, exact in every dtype that can be reduced (bf16 included), so sums in any order
agree. float8 holds only some of them: the global tensor is cast once and every block is
cut from it, so moves stay bit-exact (and torch cannot reduce float8 anyway).

A rank's block under ``t``: the global slice (``lowering.layout``; for an uneven type the
rank's blocks, ``lowering.layout.rank_layout``, concatenated in local order), then per
non-sharding axis kind:

* R / I: the same on every rank;
* P(op): shares whose reduction over the P group is the slice (sum: rank 0 of the group
  holds the rest; avg: +/- offsets that cancel; max/min: the other ranks hold values
  below/above it);
* V: the slice plus the rank's flattened V coordinate (V values differ per rank; a
  redistribution acts on each V index separately).
"""

from __future__ import annotations

import torch

from lowering.layout import group_ranks
from spec_lang.ir import Mesh, TensorType
from torch_backend.blocks import local_part
from torch_backend.dtypes import NO_ARITHMETIC, to_torch_dtype


def global_tensor(t: TensorType, *, seed: int = 0, device: torch.device | str = "cpu") -> torch.Tensor:
    """The global tensor of type ``t``: (i*7 + seed) mod 113 - 56, row-major (unsigned: + 56;
    complex: that plus an imaginary part (5 x that) mod 19 - 9)."""
    base = (torch.arange(t.numel, dtype=torch.int64) * 7 + seed) % 113 - 56
    dt = to_torch_dtype(t.dtype)
    if dt == torch.bool:
        return (base % 2 == 0).reshape(t.shape).to(device)
    if dt == torch.float8_e8m0fnu:  # powers of two only: 2**-4 .. 2**3
        return torch.exp2((base % 8 - 4).double()).reshape(t.shape).to(dt).to(device)
    if dt.is_complex:  # an imaginary part of its own, so a check sees both halves of each element
        return torch.complex(base.double(), (base * 5 % 19 - 9).double()).reshape(t.shape).to(dt).to(device)
    if not dt.is_signed:
        base = base + 56
    # float8 holds few of these integers exactly; casting once fixes the values every block is cut from
    return base.reshape(t.shape).to(dt).to(device)


def _coord_index(mesh: Mesh, rank: int, axes: tuple[str, ...]) -> tuple[int, int]:
    """(index of ``rank`` over ``axes`` in mesh order, group size)."""
    members = group_ranks(mesh, tuple(a for a in mesh.names if a in axes), rank)
    return members.index(rank), len(members)


def block(t: TensorType, mesh: Mesh, g: torch.Tensor, rank: int) -> torch.Tensor:
    """``rank``'s local block of global tensor ``g`` under type ``t`` (a fresh tensor)."""
    x = local_part(g, t, mesh, rank)
    v_axes = t.axes_of_kind("V")
    if v_axes:
        j, _ = _coord_index(mesh, rank, v_axes)
        if x.dtype == torch.bool:
            x = ~x if j % 2 else x
        else:  # via float64 where torch cannot add (uint16/32/64, float8)
            x = (x.double() + j).to(x.dtype) if x.dtype in NO_ARITHMETIC else x + j
    p_axes = t.partial_axes
    if p_axes:
        j, k = _coord_index(mesh, rank, p_axes)
        x = _share(x, t.partial_op or "sum", j, k)
    return x


def _share(x: torch.Tensor, op: str, j: int, k: int) -> torch.Tensor:
    """Share j of k of ``x`` under reduce ``op`` (see the module docstring)."""
    if x.dtype in NO_ARITHMETIC:  # shares exist (no reduction can run on them: see wire_view)
        return _share(x.double(), op, j, k).to(x.dtype)
    if x.dtype == torch.bool:
        return x if op == "min" or j == 0 else torch.zeros_like(x)
    if op == "sum":
        small = [(i % 3) - 1 if x.dtype != torch.uint8 else i % 2 for i in range(1, k)]
        return x - sum(small) if j == 0 else torch.full_like(x, small[j - 1])
    if op == "avg":
        # offsets that cancel in pairs: -1, +1, -1, +1, ... (0 for an odd one out)
        d = 0 if (k % 2 and j == k - 1) else (1 if j % 2 else -1)
        return x + d if x.dtype != torch.uint8 else x
    if op in ("max", "min") and j == 0:
        return x
    if op == "max":
        return torch.zeros_like(x) if x.dtype == torch.uint8 else x - 1
    if op == "min":
        return torch.full_like(x, 255) if x.dtype == torch.uint8 else x + 1
    raise ValueError(f"unknown reduce op {op!r}")


def expected_block(t: TensorType, mesh: Mesh, g: torch.Tensor, rank: int) -> torch.Tensor:
    """What ``rank`` must hold under ``t`` *after reducing its P axes*: the slice (+ V index)."""
    return block(t.replace(axis_types=tuple((a, at) for a, at in t.axis_types if at.kind != "P")), mesh, g, rank)


def all_blocks(t: TensorType, mesh: Mesh, g: torch.Tensor) -> list[torch.Tensor]:
    return [block(t, mesh, g, r) for r in range(mesh.size)]
