"""``jax_backend.redistribute`` / ``redistributor`` against JAX's own resharding.

Oracles: ``jax.sharding.reshard`` (values and sharding, pending sums included) and
``jax.device_put`` of the global array, eagerly and under ``jax.jit`` (the source type read
from ``jax.typeof``), and ``jax.grad`` of the same map through ``reshard``. 8 CPU devices
(conftest sets XLA_FLAGS).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_backend  # noqa: E402
import lowering  # noqa: E402
from spec_lang import SpecError, from_jax, parse, to_jax  # noqa: E402
from spec_lang.jax_interop import mesh_from_jax  # noqa: E402

if len(jax.devices()) < 8:
    pytest.skip("jax sees fewer than 8 devices (XLA_FLAGS was set too late)", allow_module_level=True)

CASES = [
    ("f32[16@(tp,dp),8]", "f32[16,8@dp]", "dp=4,tp=2"),
    ("f32[16,8]{U:tp}", "f32[16@tp,8]", "dp=2,tp=4"),
    ("f32[16@dp,8@tp]", "f32[16@tp,8@dp]", "dp=2,tp=4"),
    ("f32[16@(dp,tp),8]", "f32[16@(tp,dp),8]", "dp=2,tp=4"),
    ("f32[16@dp,8]", "f32[16,8@(dp,tp)]", "dp=2,tp=4"),
    ("f32[16,8]{U:(dp,tp)}", "f32[16,8]", "dp=2,tp=4"),
    # XLA aborts on reshard between two sets of unreduced axes (shardy's explicit_reshards
    # check): only the simulator judges this one
    ("f32[16@tp,8]{U:dp}", "f32[16,8@dp]{U:tp}", "dp=2,tp=4"),
    ("f32[8@a,4@b]", "f32[8@c,4]{R:a}", "a=2,b=2,c=2"),
]


def _array(text: str, mesh: str, seed: int = 0) -> jax.Array:
    """An array of type ``text``: each rank's block of a random global array, a pending sum
    a different addend for each coordinate of its summed axes (equal copies elsewhere)."""
    t, m = lowering.resolve(text, mesh)
    rng = np.random.default_rng(seed)
    summed = [m.index(a) for a in t.partial_axes]
    addends: dict[tuple[int, ...], np.ndarray] = {}
    blocks = []
    for r, sl in enumerate(lowering.local_slices(t, m)):
        key = tuple(m.coords(r)[i] for i in summed)
        addends.setdefault(key, rng.integers(-9, 10, size=t.shape).astype(np.float32))
        blocks.append(addends[key][sl])
    return jax_backend.from_blocks(blocks, t, to_jax(t, m).mesh)


_blocks = jax_backend.blocks_of


def _same(a: jax.Array, b: jax.Array) -> bool:
    return all(np.array_equal(u, v) for u, v in zip(_blocks(a), _blocks(b), strict=True))


@pytest.mark.parametrize("src,dst,mesh", CASES)
def test_eager_equals_reshard_and_device_put(src: str, dst: str, mesh: str) -> None:
    x = _array(src, mesh)
    want = to_jax(dst, x.sharding.mesh)
    y = jax_backend.redistribute(x, dst)
    assert y.sharding.is_equivalent_to(want, len(x.shape))
    program = lowering.compile(src, dst, mesh)
    expected = lowering.simulate(program, _blocks(x))
    assert all(np.array_equal(a, b) for a, b in zip(_blocks(y), expected, strict=True))
    if parse(src).partial_axes and parse(dst).partial_axes:
        return
    with jax.set_mesh(x.sharding.mesh):
        ref = jax.sharding.reshard(x, want)
    assert _same(y, ref)
    if not parse(src).partial_axes and not parse(dst).partial_axes:
        assert np.array_equal(np.asarray(y), np.asarray(jax.device_put(np.asarray(x), want)))


@pytest.mark.parametrize("src,dst,mesh", CASES[:4])
def test_under_jit_reads_the_traced_type(src: str, dst: str, mesh: str) -> None:
    x = _array(src, mesh, seed=1)
    jm = x.sharding.mesh
    want = to_jax(dst, jm)
    with jax.set_mesh(jm):
        y = jax.jit(lambda v: jax_backend.redistribute(v, want.spec))(x)
        ref = jax.sharding.reshard(x, want)
    assert _same(y, ref) and y.sharding.is_equivalent_to(want, len(x.shape))


def test_redistributor_is_jittable_and_prepared() -> None:
    src, dst, mesh = CASES[0]
    x = _array(src, mesh, seed=2)
    jm = x.sharding.mesh
    f = jax_backend.redistributor(src, P(None, "dp"), jm)
    with jax.set_mesh(jm):
        ref = jax.sharding.reshard(x, to_jax(dst, jm))
        assert _same(f(x), ref)
        assert _same(jax.jit(lambda v: f(v) * 2)(x), ref * 2)


@pytest.mark.parametrize("src,dst,mesh", [CASES[0], CASES[1], CASES[2], CASES[4]])
def test_grad_equals_reshards(src: str, dst: str, mesh: str) -> None:
    x = _array(src, mesh, seed=3)
    jm = x.sharding.mesh
    want = to_jax(dst, jm)
    w = jnp.asarray(np.random.default_rng(4).standard_normal(x.shape).astype(np.float32))
    with jax.set_mesh(jm):
        mine = jax.grad(lambda v: jnp.sum(jax_backend.redistribute(v, want) * w))(x)
        ref = jax.grad(lambda v: jnp.sum(jax.sharding.reshard(v, want) * w))(x)
    assert np.allclose(np.asarray(mine), np.asarray(ref))
    assert mine.sharding.is_equivalent_to(ref.sharding, len(x.shape))


def test_src_overrides_and_bad_input_is_a_spec_error() -> None:
    x = _array("f32[16@dp,8]", "dp=2,tp=4")
    jm = x.sharding.mesh
    y = jax_backend.redistribute(x, "f32[16@dp,8@tp]", src="f32[16@dp,8]")
    assert y.sharding.is_equivalent_to(to_jax("f32[16@dp,8@tp]", jm), 2)
    with pytest.raises(SpecError, match="shape"):
        jax_backend.redistribute(x, "f32[8@dp,8]")
    with pytest.raises(SpecError, match="not on the mesh"):
        jax_backend.redistribute(x, "f32[16@zz,8]")
    with pytest.raises(SpecError, match="has no JAX equivalent"):  # refused before planning
        jax_backend.redistribute(x, "f32[16@dp,8]", src="f32[16@dp,8]{P(avg):tp}")
    with pytest.raises(SpecError, match="does not divide evenly"):  # JAX holds no uneven sharding
        jax_backend.redistribute(_array("f32[16@dp,6]", "dp=2,tp=4"), "f32[16,6@tp]")
    with pytest.raises(SpecError, match="jax.Array"):
        jax_backend.redistribute(np.zeros((16, 8)), "f32[16,8]")


def test_under_jit_on_auto_axes_the_source_type_is_asked_for() -> None:
    from jax.sharding import AxisType

    auto = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
    x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(auto, P("dp", "tp")))
    with pytest.raises(SpecError, match="pass src="):
        jax.jit(lambda v: jax_backend.redistribute(v, P("tp", "dp")))(x)
    y = jax.jit(lambda v: jax_backend.redistribute(v, P("tp", "dp"), src="f32[8@dp,8@tp]"))(x)
    assert np.array_equal(y, x) and y.sharding.spec == P("tp", "dp")
    assert jax_backend.redistribute(x, P("tp", "dp")).sharding.spec == P("tp", "dp")  # eagerly: its sharding


def test_from_jax_and_to_jax_take_a_traced_values_abstract_mesh() -> None:
    x = _array("f32[16@tp,8]{U:dp}", "dp=2,tp=4")
    seen = []

    def f(v: jax.Array) -> jax.Array:
        aval = jax.typeof(v)
        t = from_jax(aval.sharding, aval.shape, aval.dtype)
        seen.append((t, to_jax(t, aval.sharding.mesh), mesh_from_jax(aval.sharding.mesh)))
        return v

    with jax.set_mesh(x.sharding.mesh):
        jax.jit(f)(x)
    t, sharding, m = seen[0]
    assert t == parse("f32[16@tp,8]{U:dp}") and m.names == ("dp", "tp") and m.ranks is None
    assert isinstance(sharding, NamedSharding) and sharding.spec == x.sharding.spec


@pytest.mark.parametrize("dtype,bits", [("f32", False), ("i32", False), ("bf16", True)])
def test_only_narrow_floats_move_as_bits(dtype: str, bits: bool) -> None:
    # a bitcast is a kernel more for XLA to compile (a tiny exchange's first call); only bf16
    # and f16 gain from moving as unsigned integers (XLA:CPU widens them in its copies)
    t, m = lowering.resolve(f"{dtype}[8@(dp,tp),16]", "dp=2,tp=4")
    x = jax_backend.from_blocks([b.astype(jnp.dtype(t.dtype)) for b in _blocks(_array("f32[8@(dp,tp),16]", "dp=2,tp=4"))],
                                t, to_jax(t, m).mesh)
    move = jax_backend.redistributor(f"{dtype}[8@(dp,tp),16]", f"{dtype}[8@tp,16]", x.sharding.mesh)
    assert ("bitcast_convert" in move.lower(x).as_text()) is bits
    dst = to_jax(f"{dtype}[8@tp,16]", x.sharding.mesh)
    with jax.set_mesh(x.sharding.mesh):
        assert _same(move(x), jax.sharding.reshard(x, dst))


def test_small_programs_compile_with_cheap_cpu_codegen() -> None:
    # a small program's first call is mostly XLA compiling its copies; a large one keeps
    # XLA's optimised code
    from jax_backend.engine import CHEAP_CPU_CODEGEN, compile_options, device_mesh

    m = lowering.resolve("f32[8]", "dp=2,tp=4")[1]
    small = lowering.compile("f32[8@(dp,tp),16]", "f32[8@tp,16]", m)
    large = lowering.compile("f32[2048@(dp,tp),2048]", "f32[2048@dp,2048]", m)
    assert compile_options(small, device_mesh(m)) == CHEAP_CPU_CODEGEN
    assert compile_options(large, device_mesh(m)) == {}
    x = _array("f32[8@(dp,tp),16]", "dp=2,tp=4")
    with jax.set_mesh(x.sharding.mesh):
        want = jax.sharding.reshard(x, to_jax("f32[8@tp,16]", x.sharding.mesh))
    assert _same(jax_backend.redistribute(x, "f32[8@tp,16]"), want)


@pytest.mark.parametrize("mesh,src,dst,static", [
    # rd-pub-035 runs as whole blocks gathered within groups (test below): no per-rank index at all
    ("dp=4,tp=2", "f32[8@dp]", "f32[8@tp]", True),
    ("dp=2,tp=4", "f32[8@(dp,tp),16]", "f32[8@tp,16@dp]", False),  # rd-pub-013: two rounds on one grid
    ("dp=4,tp=2", "f32[32,16@tp]", "f32[32,16@(dp,tp)]", False),  # rd-pub-064
    # every rank sends the same cells and places what it gets alike: no lookup at all
    ("dp=4,tp=2", "f32[16@(tp,dp),16]", "f32[16,16@dp]", True),
])
def test_per_rank_tables_compile_to_few_kernels(mesh: str, src: str, dst: str, static: bool) -> None:
    # a tiny exchange's first call is mostly XLA compiling its index computations: each
    # per-rank table is one dynamic_slice (none where every rank's row is equal), and no
    # slice or pick carries JAX's negative-index fix-up (a compare and a select per index)
    x = _array(src, mesh)
    jm = x.sharding.mesh
    with jax.set_mesh(jm):
        prepared = jax_backend.redistributor(src, dst, jm)
        hlo = prepared.lower(x).compile().as_text()
        y = prepared(x)
        ref = jax.jit(lambda v: jax.sharding.reshard(v, to_jax(dst, jm)))(x)
    assert " compare(" not in hlo and " select(" not in hlo, hlo
    assert (" partition-id(" not in hlo) == static, hlo
    assert _same(y, ref)


_GROUPS = re.compile(r"replica_groups=\{\{([\d,]*)\}")


def _collectives(hlo: str) -> list[tuple[str, int]]:
    """(op, members of its first replica group) of each all-gather / collective-permute."""
    out = []
    for line in hlo.splitlines():
        for op in ("all-gather(", "collective-permute("):
            if f" {op}" in line:
                groups = _GROUPS.search(line)
                size = len(groups.group(1).split(",")) if groups else 0
                if groups is None and "replica_groups=[" in line:  # XLA's iota form: [groups,members]<=...
                    size = int(re.search(r"replica_groups=\[\d+,(\d+)\]", line).group(1))  # type: ignore[union-attr]
                out.append((op[:-1], size))
    return out


@pytest.mark.parametrize("mesh,src,dst", [
    ("dp=4,tp=2", "f32[8@dp]", "f32[8@tp]"),  # rd-pub-035
    ("dp=4,tp=2", "f32[16,16,16@dp]", "f32[16,16,16@tp]"),  # rd-pub-078: the blocks side by side on a minor dim
    ("dp=2,cp=2,tp=2", "f32[16@(dp,cp),4]", "f32[16@tp,4]"),
])
def test_whole_blocks_gather_within_groups_as_xla_does(mesh: str, src: str, dst: str) -> None:
    # every destination block is two whole source blocks: the planner's groups are mesh axes,
    # so it sends each rank a piece and gathers over 4; XLA (and now shardc) sends each rank
    # one of its source blocks whole, then gathers within pairs (1.17x XLA's time -> 1.00)
    x = _array(src, mesh, seed=5)
    jm = x.sharding.mesh
    want = to_jax(dst, jm)
    w = jnp.asarray(np.random.default_rng(6).standard_normal(x.shape).astype(np.float32))
    with jax.set_mesh(jm):
        prepared = jax_backend.redistributor(src, dst, jm)
        mine = _collectives(prepared.lower(x).compile().as_text())
        xla_fn = jax.jit(lambda v: jax.sharding.reshard(v, want))
        theirs = _collectives(xla_fn.lower(x).compile().as_text())
        y, ref = prepared(x), xla_fn(x)
        grad = jax.grad(lambda v: jnp.sum(prepared(v) * w))(x)
        grad_ref = jax.grad(lambda v: jnp.sum(jax.sharding.reshard(v, want) * w))(x)
    assert _same(y, ref) and y.sharding.is_equivalent_to(want, len(x.shape))
    assert np.allclose(np.asarray(grad), np.asarray(grad_ref))
    assert [c for c, _ in mine] == ["collective-permute", "all-gather"], mine
    assert dict(mine)["all-gather"] == dict(theirs)["all-gather"] == 2, (mine, theirs)


def test_a_program_that_is_one_gather_keeps_its_form() -> None:
    from jax_backend.block_gather import block_gather

    for src, dst, mesh in [("f32[16@(dp,tp),8]", "f32[16@dp,8]", "dp=4,tp=2"),  # big-gather's pair, smaller
                           ("f32[8@dp]", "f32[8@tp]", "dp=4,tp=2")]:
        program = lowering.compile(src, dst, mesh, cost_model=jax_backend.default_cost_model(lowering.resolve(src, mesh)[1]))
        found = block_gather(program)
        assert (found is None) == (len(program.steps) == 1), (program, found)


@pytest.mark.parametrize("mesh,src,dst", [
    ("dp=2,cp=2,tp=2", "f32[8,16]{U:(dp,cp,tp)}", "f32[8@dp,16@(cp,tp)]"),  # rd-pub-040
    ("dp=2,cp=2,tp=2", "f32[8,16]{U:(dp,cp,tp)}", "f32[8@(tp,cp),16@dp]"),  # axes out of mesh order
    ("dp=4,tp=2", "f32[8,6,4]{U:(dp,tp)}", "f32[8,6@tp,4@dp]"),
])
def test_a_pending_sum_onto_several_dims_is_one_reduce_scatter(mesh: str, src: str, dst: str) -> None:
    # XLA:CPU pays a latency a collective: one psum_scatter over every dim's axes (the dims'
    # group parts moved to the front), not one a dim (rd-pub-040: 1.10-1.15x XLA's time -> 1.0)
    x = _array(src, mesh, seed=7)
    jm = x.sharding.mesh
    want = to_jax(dst, jm)
    with jax.set_mesh(jm):
        prepared = jax_backend.redistributor(src, dst, jm)
        hlo = prepared.lower(x).compile().as_text()
        y = prepared(x)
        ref = jax.sharding.reshard(x, want)
    program = lowering.compile(src, dst, mesh, cost_model=jax_backend.default_cost_model(lowering.resolve(src, mesh)[1]))
    assert [s.kind for s in program.steps] == ["reduce_scatter"], program
    assert hlo.count(" reduce-scatter(") == 1 and " all-reduce(" not in hlo, hlo
    assert _same(y, ref) and y.sharding.is_equivalent_to(want, len(x.shape))
