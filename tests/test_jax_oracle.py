"""JAX as an oracle: layouts, round trips and printed types agree with shardc.

For even types on 2-D and 3-D meshes (several axes on one dim, in both orders):
``local_slices`` equals ``NamedSharding.devices_indices_map`` (rank r = device r),
``from_jax(to_jax(t)) == t``, and ``str(jax.typeof(x))`` of an array put with
``to_jax``'s sharding parses back to ``t`` (R/U via jit out_shardings under
``jax.set_mesh``). conftest sets XLA_FLAGS for 8 CPU devices before jax loads.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from lowering import local_slices  # noqa: E402
from spec_lang import SpecError, from_jax, parse, parse_mesh, to_jax  # noqa: E402
from spec_lang.jax_interop import jax_refusal, partition_spec_text  # noqa: E402

if len(jax.devices()) < 8:
    pytest.skip("jax sees fewer than 8 devices (XLA_FLAGS was set too late)", allow_module_level=True)


def _cases() -> list[tuple[str, str]]:
    """Even types: every ordered pair of axes on one dim, on every mesh, plus mixes."""
    out = []
    for mesh in ("dp=2,tp=4", "dp=4,tp=2", "a=2,b=2,c=2", "dp=2,cp=2,tp=2"):
        m = parse_mesh(mesh)
        for k in (1, 2, 3):
            for axes in itertools.permutations(m.names, k):
                group = axes[0] if k == 1 else "(" + ",".join(axes) + ")"
                out.append((f"f32[16@{group},4]", mesh))
                out.append((f"bf16[2,8@{group}]", mesh))
    out += [
        ("f32[8@tp,16@dp]", "dp=2,tp=4"),
        ("f32[8@(tp,dp),16]{U:cp}", "dp=2,cp=2,tp=2"),
        ("f32[4@c,8]{U:(a,b)}", "a=2,b=2,c=2"),
        ("f32[4@c,8]{U:a, R:b}", "a=2,b=2,c=2"),
        ("f32[8,16@(cp,dp)]{R:tp}", "dp=2,cp=2,tp=2"),
        ("float32[8@dp,16]{U:tp}", "dp=2,tp=4"),
        ("i32[8]{R:(dp,tp)}", "dp=2,tp=4"),
        ("f32[6,4]", "dp=2,tp=4"),
    ]
    return out


CASES = _cases()
TYPED = list(dict.fromkeys([c for c in CASES if "{" in c[0]] + CASES[::7]))  # jit compiles cost time: all R/U + a sample


def _dense(t_shape: tuple[int, ...], idx: tuple[slice, ...]) -> tuple[tuple[int, int], ...]:
    return tuple(s.indices(n)[:2] for s, n in zip(idx, t_shape, strict=True))


@pytest.mark.parametrize(("text", "mesh"), CASES)
def test_slices_match_devices_indices_map(text: str, mesh: str) -> None:
    t = parse(text)
    s = to_jax(t, mesh)
    plain = NamedSharding(s.mesh, P(*s.spec.partitions))  # devices_indices_map refuses unreduced
    dmap = plain.devices_indices_map(t.shape)
    mine = local_slices(t, mesh)
    assert len(dmap) == len(mine) == parse_mesh(mesh).size
    for dev, idx in dmap.items():
        assert _dense(t.shape, idx) == _dense(t.shape, mine[dev.id]), f"device {dev.id}"


@pytest.mark.parametrize(("text", "mesh"), CASES)
def test_round_trip(text: str, mesh: str) -> None:
    t = parse(text)
    s = to_jax(t, mesh)
    assert s.mesh.axis_names == parse_mesh(mesh).names
    assert from_jax(s, t.shape, t.dtype) == t
    assert from_jax(s.spec, t.shape, t.dtype, mesh=mesh) == t
    assert from_jax(s.spec, t.shape, t.dtype, mesh=s.mesh) == t
    assert jax_refusal(t, parse_mesh(mesh)) is None


@pytest.mark.parametrize(("text", "mesh"), TYPED)
def test_typeof_parses_to_type(text: str, mesh: str) -> None:
    t = parse(text)
    s = to_jax(t, mesh)
    with jax.set_mesh(s.mesh):
        x = jax.jit(lambda: jnp.zeros(t.shape, jnp.dtype(t.dtype)), out_shardings=s)()
    printed = str(jax.typeof(x))
    assert parse(printed) == t, printed
    assert from_jax(x) == t  # an array carries its own shape, dtype and sharding


def test_jax_prints_our_format() -> None:
    t = parse("f32[8@dp,16]{U:tp}")
    s = to_jax(t, "dp=2,tp=4")
    with jax.set_mesh(s.mesh):
        x = jax.jit(lambda: jnp.zeros((8, 16), jnp.float32), out_shardings=s)()
    assert str(jax.typeof(x)) == "float32[8@dp,16]{U:tp}" == str(t)


def test_device_put_even() -> None:
    t = parse("f32[8@(tp,dp),4@cp]")
    s = to_jax(t, "dp=2,cp=2,tp=2")
    full = np.arange(32, dtype=np.float32).reshape(8, 4)
    x = jax.device_put(full, s)
    mine = local_slices(t, "dp=2,cp=2,tp=2")
    for shard in x.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), full[mine[shard.device.id]])
    assert str(jax.typeof(x)) == str(t)


def test_partition_spec_text_matches_jax_repr() -> None:
    for text in ("f32[8@(tp,dp),16]", "f32[8@dp,16]{U:tp}", "f32[4,4]{R:cp}"):
        spec = to_jax(text, "dp=2,cp=1,tp=4").spec
        assert partition_spec_text(parse(text)) == repr(spec)


# ---- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("f32[10@(dp,tp)]", "chunk rule"),  # uneven multi-axis: chunk rule != XLA tiling
        ("f32[7@dp,4]", "uneven"),
        ("f32[8]{P(avg):tp}", "no JAX equivalent"),
        ("f32[8]{P(max):tp}", "no JAX equivalent"),
        ("f32[8]{V:tp}", "Varying"),
        ("f32[8@zz]", "not on the mesh"),
    ],
)
def test_to_jax_refuses(text: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        to_jax(text, "dp=2,tp=4")
    assert words in info.value.message
    assert info.value.hint
    assert jax_refusal(parse(text), parse_mesh("dp=2,tp=4")) == info.value.message


def test_to_jax_too_few_devices() -> None:
    with pytest.raises(SpecError) as info:
        to_jax("f32[16@a]", "a=4,b=4")
    assert "16 devices" in info.value.message
    assert "xla_force_host_platform_device_count=16" in info.value.hint


def test_from_jax_needs_shape_and_valid_input() -> None:
    with pytest.raises(SpecError, match="needs the global shape"):
        from_jax(P("dp"))
    with pytest.raises(SpecError, match="2 entries for a 1-d shape"):
        from_jax(P("dp", "tp"), (8,))
    with pytest.raises(SpecError, match="UNCONSTRAINED|not None"):
        from_jax(P(P.UNCONSTRAINED), (8,))
    with pytest.raises(SpecError, match="not on the mesh"):
        from_jax(P("zz"), (8,), mesh="dp=2")
    with pytest.raises(SpecError, match="expects a PartitionSpec"):
        from_jax("f32[8]", (8,))
    with pytest.raises(SpecError, match="unknown dtype"):
        from_jax(P("dp"), (8,), dtype="complex32")


def test_from_jax_defaults_and_dtypes() -> None:
    assert from_jax(P(("tp", "dp")), (8, 2)) == parse("f32[8@(tp,dp),2]")
    assert from_jax(P(None, "dp", unreduced={"tp"}), (2, 8), dtype=jnp.bfloat16) == parse("bf16[2,8@dp]{U:tp}")
    assert from_jax(P(reduced={"b", "a"}), (3,), dtype=np.int8, mesh="a=2,b=2") == parse("i8[3]{R:(a,b)}")
    assert str(from_jax(P(unreduced={"b", "a"}), (3,), mesh="b=2,a=2")) == "float32[3]{U:(b,a)}"  # mesh order
