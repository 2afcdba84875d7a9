"""The DSL dtypes torch can hold and copy, by name, without importing torch: ``shardc run``
refuses the others before any rank starts (``torch_backend.dtypes`` maps them to torch)."""

from __future__ import annotations

from spec_lang.errors import SpecError

# int1..int4 and uint1..uint4 exist in torch only as shells (no copy kernel),
# float4_e2m1fn only packed two to a byte, and the float6s, float8_e3m4, float8_e4m3 and
# float8_e4m3b11fnuz not at all
TORCH_HELD = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
)


def not_held(name: str, text: str | None = None, pos: int | None = None) -> SpecError:
    """The refusal of a DSL dtype that torch cannot hold (``name`` is its canonical name)."""
    return SpecError(
        f"dtype {name} has no torch equivalent that can hold data", text=text, pos=pos,
        hint="torch lacks it (or has only a packed or placeholder form); store the tensor in a wider "
             "dtype such as int8 or bfloat16 and write that dtype in the type",
    )
