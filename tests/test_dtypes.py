"""Every dtype jax.typeof prints: parsed, printed as JAX prints it, mapped to torch.

JAX is the oracle for the names (long and short) and numpy for the byte sizes. torch
either holds a dtype (same element size, and redistributions under LocalTensorMode
move its bits unchanged, as a same-size carrier where gloo lacks the dtype) or the
dtype is a clear SpecError.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
torch = pytest.importorskip("torch")

from torch_utils import from_local, local_mode, random_blocks, to_local  # noqa: E402
from typed_data import pairing  # noqa: E402

import lowering  # noqa: E402
import torch_backend  # noqa: E402
from spec_lang import DTYPES, SpecError, format_type, from_jax, parse  # noqa: E402
from torch_backend.data import global_tensor  # noqa: E402
from torch_backend.dtypes import TORCH_DTYPES, dtype_name, to_torch_dtype, wire_view  # noqa: E402


def _jax_dtypes() -> dict[str, object]:
    """Every scalar type jax.numpy exports, by numpy dtype name (aliases folded)."""
    scalar_type = type(jnp.float32)
    out: dict[str, object] = {}
    for n in dir(jnp):
        obj = getattr(jnp, n)
        if isinstance(obj, scalar_type):
            out.setdefault(np.dtype(obj).name, obj)
    return out


JAX_DTYPES = _jax_dtypes()
# what torch cannot hold (a shell dtype with no copy kernel, a packed form, or nothing)
NO_TORCH = {"int1", "int2", "int4", "uint1", "uint2", "uint4", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn",
            "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz"}


def test_every_jax_dtype_is_a_dsl_dtype() -> None:
    assert len(JAX_DTYPES) >= 25
    assert set(JAX_DTYPES) == set(DTYPES)


@pytest.mark.parametrize("name", sorted(JAX_DTYPES))
def test_jax_printed_types_parse_and_print_back(name: str) -> None:
    aval = jax.core.ShapedArray((8, 4), JAX_DTYPES[name])  # what jax.typeof returns
    t = parse(str(aval))
    assert t.dtype == name and t.shape == (8, 4)
    assert str(t) == str(aval)
    assert format_type(t, short_dtype=True) == aval.str_short(short_dtypes=True)
    assert parse(aval.str_short(short_dtypes=True)) == t
    assert t.itemsize == np.dtype(JAX_DTYPES[name]).itemsize


# XLA on CPU makes no float6 arrays; their printed form is covered by the ShapedArray test
@pytest.mark.parametrize("name", sorted(n for n in JAX_DTYPES if not n.startswith("float6")))
def test_jax_typeof_of_a_real_array_parses(name: str) -> None:
    with jax.enable_x64(True):
        x = jnp.zeros((8,), JAX_DTYPES[name])
        text = str(jax.typeof(x))
        assert parse(text).dtype == np.dtype(x.dtype).name
        assert str(parse(text)) == text
        assert from_jax(jax.sharding.PartitionSpec(), shape=x.shape, dtype=x.dtype) == parse(text)


def test_float8_names_parse_with_a_sharding() -> None:
    assert str(parse("float8_e4m3fn[8@dp]")) == "float8_e4m3fn[8@dp]"
    assert parse("f8_e5m2[8@(dp,tp)]{U:cp}").dtype == "float8_e5m2"
    with pytest.raises(SpecError, match="unknown dtype 'float8_e9m9'") as info:
        parse("float8_e9m9[8]")
    assert info.value.pos == 0 and "f8_e4m3fn" in info.value.hint


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_torch_mapping_or_a_clear_refusal(name: str) -> None:
    if name in NO_TORCH:
        with pytest.raises(SpecError, match=f"dtype {name} has no torch equivalent"):
            to_torch_dtype(name)
        return
    dt = to_torch_dtype(name)
    assert torch.empty(0, dtype=dt).element_size() == DTYPES[name][1]
    assert dtype_name(dt) == name
    g = global_tensor(parse(f"{name}[6,4]"))  # test data exists for every torch dtype
    assert g.dtype == dt and g.shape == (6, 4)


def test_torch_dtypes_the_dsl_cannot_write_are_refused() -> None:
    with pytest.raises(SpecError, match="has no shardc type"):
        dtype_name(torch.float4_e2m1fn_x2)
    with pytest.raises(SpecError, match="unknown dtype"):
        to_torch_dtype("float33")


_GLOO = {torch.int8, torch.int32, torch.int64, torch.uint8, torch.float16, torch.bfloat16, torch.float32,
         torch.float64, torch.complex64, torch.complex128}


@pytest.mark.parametrize("name", sorted(TORCH_DTYPES))
def test_wire_view_carries_every_dtype_gloo_lacks_bit_for_bit(name: str) -> None:
    x = global_tensor(parse(f"{name}[12]"))
    w = wire_view(x)
    assert w.dtype in _GLOO and w.numel() == x.numel() and w.element_size() == x.element_size()
    assert w.data_ptr() == x.data_ptr()  # a view: nothing copied
    if name.startswith("float8") or name in ("uint16", "uint32", "uint64"):
        with pytest.raises(SpecError, match=f"reduction of {name} cannot be carried out"):
            wire_view(x, True)
    else:
        assert wire_view(x, True).numel() == x.numel()


MESH = "dp=2,tp=2"
NEW = ["uint16", "uint32", "uint64", "int16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
       "float8_e5m2fnuz", "float8_e8m0fnu", "complex64", "complex128", "bool"]


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8)


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize(("src", "dst"), [("[8@(dp,tp),6]", "[8,6@tp]"), ("[8@dp,6]", "[8@tp,6@dp]")])
def test_redistribute_new_dtypes_under_local_tensor_mode(fake_pg, name: str, src: str, dst: str) -> None:
    g = global_tensor(parse(f"{name}[8,6]"))
    with local_mode(fake_pg, 4):
        x = torch_backend.distribute(g, MESH, name + src)
        outs = from_local(torch_backend.redistribute(x, name + src, name + dst, MESH))
    for r, sl in enumerate(lowering.local_slices(name + dst, MESH)):
        assert outs[r].dtype == g.dtype
        assert torch.equal(_bits(outs[r]), _bits(g[sl])), f"rank {r}"


@pytest.mark.parametrize("name", ["complex64", "complex128"])
@pytest.mark.parametrize(("src", "dst"), [("[8,6]{P(avg):(dp,tp)}", "[8@tp,6]"), ("[8,6]{P(avg):dp}", "[8,6]"),
                                          ("[8,6]{U:(dp,tp)}", "[8,6@dp]")])
def test_complex_sums_and_means_keep_both_parts(fake_pg, name: str, src: str, dst: str) -> None:
    """A mean of complex pieces divides both parts (an integer's truncating division has no
    complex form), and every element's imaginary part arrives with its real part."""
    g = global_tensor(parse(f"{name}[8,6]"))
    assert bool((g.imag != 0).any())
    with local_mode(fake_pg, 4):
        x = torch_backend.distribute(g, MESH, name + src)
        outs = from_local(torch_backend.redistribute(x, name + src, name + dst, MESH))
    for r, sl in enumerate(lowering.local_slices(name + dst, MESH)):
        assert outs[r].dtype == g.dtype
        torch.testing.assert_close(outs[r], g[sl], rtol=0, atol=1e-6, msg=f"rank {r}")


@pytest.mark.parametrize(("src", "dst"), [("[8@(dp,tp),6]", "[8,6@tp]"), ("[8,6]{U:(dp,tp)}", "[8@tp,6]"),
                                          ("[8,6]{P(avg):dp}", "[8,6]"), ("[8@dp,6]", "[8@tp,6@dp]")])
def test_complex_backward_is_the_adjoint(fake_pg, src: str, dst: str) -> None:
    """Every program is real-linear, so torch's complex gradient is the dual program on the
    cotangent: <L x, y> = <x, L^T y> in the bilinear pairing, real and imaginary parts alike."""
    from spec_lang import parse_mesh
    from spec_lang.dual import dual_type

    mesh, s, d = parse_mesh(MESH), parse("c128" + src), parse("c128" + dst)
    rng = np.random.default_rng(3)

    def blocks(t):  # independent real and imaginary parts, each a valid block set of its type
        return [torch.complex(a, b) for a, b in zip(random_blocks(t, mesh, rng), random_blocks(t, mesh, rng))]

    def bilinear(t, values, grads) -> tuple[float, float]:
        re, im = ([v.real for v in values], [g.real for g in grads]), ([v.imag for v in values], [g.imag for g in grads])
        return (pairing(t, mesh, re[0], re[1]) - pairing(t, mesh, im[0], im[1]),
                pairing(t, mesh, re[0], im[1]) + pairing(t, mesh, im[0], re[1]))

    xb, yb = blocks(s), blocks(dual_type(d))
    with local_mode(fake_pg, mesh.size) as lm:
        x = to_local(lm, xb, requires_grad=True)
        out = torch_backend.redistribute(x, s, d, mesh)
        (grad,) = torch.autograd.grad(out, x, grad_outputs=to_local(lm, yb))
        outs, grads = from_local(out), from_local(grad)
    assert outs[0].dtype == torch.complex128
    assert bilinear(d, outs, yb) == pytest.approx(bilinear(s, xb, grads))
    assert bilinear(s, xb, grads)[1] != 0


def test_reducing_a_float8_partial_is_a_spec_error(fake_pg) -> None:
    g = global_tensor(parse("f8_e4m3fn[8]"))
    with local_mode(fake_pg, 4), pytest.raises(SpecError, match="reduction of float8_e4m3fn cannot be carried out"):
        x = torch_backend.distribute(g, MESH, "f8_e4m3fn[8]{U:dp}")
        torch_backend.redistribute(x, "f8_e4m3fn[8]{U:dp}", "f8_e4m3fn[8]", MESH)


@pytest.mark.parametrize("name", ["uint16", "float8_e5m2"])
def test_a_later_reduction_is_refused_before_the_first_collective(fake_pg, monkeypatch, name: str) -> None:
    """A program whose reduction of an unaddable dtype follows a gather fails before the
    gather runs (on a real group the gather would have gone out on every rank first)."""
    from torch_backend import comm

    short = DTYPES[name][0]
    steps = lowering.make_program([
        lowering.make_step("all_gather", f"{short}[8@tp]{{U:dp}}", f"{short}[8]{{U:dp}}", MESH),
        lowering.make_step("all_reduce", f"{short}[8]{{U:dp}}", f"{short}[8]", MESH),
    ], MESH)
    ran: list[str] = []
    for fn in ("all_gather", "all_reduce", "all_to_all"):
        real = getattr(comm, fn)
        monkeypatch.setattr(comm, fn, lambda *a, _real=real, _fn=fn, **k: (ran.append(_fn), _real(*a, **k))[1])
    g = global_tensor(parse(f"{name}[8]"))
    with local_mode(fake_pg, 4):
        x = torch_backend.distribute(g, MESH, f"{short}[8@tp]")
        with pytest.raises(SpecError, match=f"reduction of {name} cannot be carried out") as info:
            torch_backend.execute(steps, x)
    assert ran == []  # not even the gather went out
    assert "(step all_reduce" in str(info.value)


@pytest.mark.parametrize("name", sorted(TORCH_DTYPES))
@pytest.mark.parametrize("ann", ["{U:dp}", "{P(avg):dp}", "{P(max):dp}", "{P(min):dp}", "{V:dp}"])
def test_test_data_exists_for_every_dtype_and_local_type(name: str, ann: str) -> None:
    from spec_lang import parse_mesh
    from torch_backend.data import all_blocks

    if name.startswith("complex") and ann[1:6] in ("P(max", "P(min"):
        with pytest.raises(SpecError, match="complex numbers have no order"):
            parse(f"{name}[6@tp]{ann}")
        return
    t = parse(f"{name}[6@tp]{ann}")
    g = global_tensor(t)
    blocks = all_blocks(t, parse_mesh(MESH), g)
    assert [b.dtype for b in blocks] == [g.dtype] * 4
    assert [tuple(b.shape) for b in blocks] == [(3,)] * 4
