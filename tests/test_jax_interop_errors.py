"""JAX interop errors are SpecErrors about what the user passed (their PartitionSpec)."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
from jax.sharding import PartitionSpec as P  # noqa: E402

from spec_lang import SpecError, from_jax, parse, to_jax  # noqa: E402


def test_to_jax_without_a_mesh_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="to_jax needs a mesh") as info:
        to_jax("f32[8@dp]", None)
    assert "dp=2,tp=4" in info.value.hint


@pytest.mark.parametrize(
    ("spec", "shape", "needle", "word"),
    [
        (P("data-parallel"), (8,), "mesh axis name 'data-parallel' is not an identifier", "data-parallel"),
        (P("dp", "dp"), (8, 8), "mesh axis 'dp' is used twice", "dp"),
        (P(("dp", "dp")), (8,), "listed twice on one dim", "dp"),
        (P("dp"), (-8,), "dim size -8 is negative", None),
        (P("dp"), (8.5,), "a dim size must be an int, got float", None),
        (P("dp"), (2**62, 4), "does not fit in int64", None),
    ],
)
def test_from_jax_errors_quote_the_users_partition_spec(spec, shape, needle: str, word: str | None) -> None:
    with pytest.raises(SpecError) as info:
        from_jax(spec, shape=shape)
    e = info.value
    assert needle in e.message and repr(spec) in e.message
    assert e.text == repr(spec) and "float32[" not in str(e)  # never a type string the user did not write
    if word is not None:
        assert e.text[e.pos:].startswith(word)  # the caret is on the user's axis name


def test_from_jax_accepts_every_dsl_dtype_object() -> None:
    ml = pytest.importorskip("ml_dtypes")
    assert from_jax(P("dp"), shape=(8,), dtype=ml.float8_e4m3fn) == parse("f8_e4m3fn[8@dp]")
    assert from_jax(P(), shape=(2,), dtype="u16") == parse("uint16[2]")
    with pytest.raises(SpecError, match="unknown dtype"):
        from_jax(P(), shape=(2,), dtype="complex32")
