"""torch dtype <-> shardc dtype names, and the dtype a collective carries on the wire."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from spec_lang.errors import SpecError
from spec_lang.ir import DTYPE_HINT, DTYPES
from torch_backend.held_dtypes import TORCH_HELD, not_held

if TYPE_CHECKING:
    from lowering.program import Program

# every DSL dtype torch can hold and copy
TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in TORCH_HELD if hasattr(torch, name)}
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}

# what gloo carries as is; the others travel as a same-size carrier (bits unchanged)
_WIRE_NATIVE = frozenset({
    torch.int8, torch.int32, torch.int64, torch.uint8, torch.float16, torch.bfloat16,
    torch.float32, torch.float64, torch.complex64, torch.complex128,
})
_CARRIER = {1: torch.uint8, 2: torch.float16, 4: torch.int32, 8: torch.int64}
# dtypes torch has no addition for (on CPU), so no reduction can run on them
NO_ARITHMETIC = frozenset(
    dt for name, dt in TORCH_DTYPES.items() if name.startswith("float8") or name in ("uint16", "uint32", "uint64")
)


def to_torch_dtype(name: str) -> torch.dtype:
    """``float32`` (canonical shardc name) -> ``torch.float32``; SpecError where torch lacks it."""
    dt = TORCH_DTYPES.get(name)
    if dt is None:
        if name in DTYPES:
            raise not_held(name)
        raise SpecError(f"unknown dtype {name!r}", hint=DTYPE_HINT)
    return dt


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``float32``; SpecError for a dtype the DSL cannot write."""
    name = _NAMES.get(dtype)
    if name is None:
        short = ", ".join(DTYPES[n][0] for n in TORCH_DTYPES)
        raise SpecError(f"tensor dtype {dtype} has no shardc type", hint=f"use one of {short}")
    return name


def short_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``f32`` (for messages)."""
    return DTYPES[dtype_name(dtype)][0]


def check_reducible(name: str, step: str | None = None) -> None:
    """Refuse a reduction of the shardc dtype ``name`` that torch cannot add (the float8s,
    uint16/32/64). A bound program asks this of every reducing step before its first
    collective, so a program whose reduction comes after other collectives fails on every
    rank before any of them, instead of halfway."""
    if TORCH_DTYPES.get(name) in NO_ARITHMETIC:
        where = f" (step {step})" if step else ""
        raise SpecError(
            f"a pending reduction of {name} cannot be carried out{where}: torch has no addition for it",
            hint="cast the tensor to a wider dtype (float32, int64) before reducing its partial axes",
        )


def check_reductions(program: Program) -> None:
    """``check_reducible`` for every step of ``program`` that reduces over more than one rank."""
    for step in program.steps:
        if step.op is not None and step.is_collective and program.mesh.group_size(step.axes) > 1:
            check_reducible(program.src.dtype, step.describe())


def wire_view(t: torch.Tensor, reducing: bool = False) -> torch.Tensor:
    """The tensor as the backends see it, a view, so no bytes are copied and the byte
    count (and element count) on the wire is unchanged.

    Moving data needs no arithmetic, so a dtype gloo lacks (bool, int16, uint16/32/64,
    the float8s) travels as a same-size carrier. A reduction does arithmetic: bool goes
    as uint8 (the op becomes MAX/MIN, see comm.reduce_op), and a dtype torch cannot add
    is a SpecError.
    """
    if t.dtype in _WIRE_NATIVE:
        return t
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if reducing:
        check_reducible(dtype_name(t.dtype))
        return t
    return t.view(_CARRIER[t.element_size()])
