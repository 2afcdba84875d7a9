"""torch dtype <-> shardc dtype names, and the dtype a collective carries on the wire."""

from __future__ import annotations

import torch

from spec_lang.errors import SpecError
from spec_lang.ir import DTYPES

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


def to_torch_dtype(name: str) -> torch.dtype:
    """``float32`` (canonical shardc name) -> ``torch.float32``."""
    return TORCH_DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``float32``; SpecError for a dtype the DSL cannot write."""
    name = _NAMES.get(dtype)
    if name is None:
        short = ", ".join(s for s, _ in DTYPES.values())
        raise SpecError(f"tensor dtype {dtype} has no shardc type", hint=f"use one of {short}")
    return name


def short_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``f32`` (for messages)."""
    return DTYPES[dtype_name(dtype)][0]


def wire_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor as the backends see it: bool travels as uint8 (gloo/NCCL lack bool in places).

    A view, so no bytes are copied and the byte count on the wire is unchanged.
    """
    return t.view(torch.uint8) if t.dtype == torch.bool else t
