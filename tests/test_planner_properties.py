"""Property test: simulate(compile(src, dst)) gives exactly the dst shards, on random cases."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_oracle import expected, reduce_partial, shards_of

from lowering.planner import compile
from lowering.simulate import simulate
from spec_lang.ir import AxisType, Dim, Mesh, TensorType

AXES = ("a", "b", "c", "d")


@st.composite
def meshes(draw: st.DrawFn) -> Mesh:
    n = draw(st.integers(1, 4))
    sizes = [draw(st.sampled_from([1, 2, 2, 3, 4])) for _ in range(n)]
    while np.prod(sizes) > 16:
        sizes[sizes.index(max(sizes))] = 2
    return Mesh(AXES[:n], tuple(sizes))


@st.composite
def layouts(draw: st.DrawFn, mesh: Mesh, shape: tuple[int, ...], partial: frozenset[str], op: str) -> TensorType:
    """A random assignment of the mesh axes to dims (in random order), partial or replicated."""
    dims: list[list[str]] = [[] for _ in shape]
    types: list[tuple[str, AxisType]] = []
    order = draw(st.permutations(mesh.names))
    for a in order:
        if a in partial:
            types.append((a, AxisType("P", op)))
            continue
        choice = draw(st.integers(-2, len(shape) - 1)) if shape else -1
        if choice >= 0:
            dims[choice].append(a)
        elif choice == -2:
            types.append((a, AxisType("R")))
    return TensorType("float32", tuple(Dim(s, tuple(ax)) for s, ax in zip(shape, dims)), tuple(types))


@st.composite
def cases(draw: st.DrawFn) -> tuple[TensorType, TensorType, Mesh]:
    mesh = draw(meshes())
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    op = draw(st.sampled_from(["sum", "sum", "avg", "max", "min"]))
    src_p = frozenset(draw(st.sets(st.sampled_from(mesh.names), max_size=2)))
    # dst keeps some of src's partial axes (and, for sum, may add new ones from replicated axes)
    dst_p = frozenset(a for a in src_p if draw(st.booleans()))
    src = draw(layouts(mesh, shape, src_p, op))
    if op == "sum" or not src_p:
        extra = [a for a in mesh.names if a not in src.sharded_axes and a not in src_p]
        dst_p |= frozenset(a for a in extra if draw(st.integers(0, 3)) == 0)
    dst = draw(layouts(mesh, shape, dst_p, op if (src_p or op == "sum") else "sum"))
    return src, dst, mesh


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(0, 2**31))
def test_simulated_program_gives_destination_shards(case: tuple, seed: int) -> None:
    src, dst, mesh = case
    prog = compile(src, dst, mesh)
    rng = np.random.default_rng(seed)
    full = rng.integers(-20, 20, size=src.shape).astype(np.float64)
    outs = simulate(prog, shards_of(full, src, mesh, rng))
    want = expected(full, dst, mesh)
    got = reduce_partial(outs, dst, mesh)
    for r, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, (str(prog), r)
        if "avg" in (src.partial_op, dst.partial_op):
            # a mean over 3 ranks is not exact in binary floating point
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-9, err_msg=f"rank {r}\n{prog}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"rank {r}\n{prog}")
    # the per-rank shapes the program states are the ones it produces
    if prog.steps:
        assert [tuple(o.shape) for o in outs] == list(prog.steps[-1].out_shapes)
