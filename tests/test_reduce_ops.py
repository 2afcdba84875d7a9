"""Every reduce op on every dtype class, against numpy written here from the definition.

``P(op)`` over mesh axes S: each group of ranks that differ only on S holds, between them,
``op`` over their local values, elementwise: the sum (an integer sum wraps as a
collective's SUM does; a bool sum is the logical or), the max, the min (bool: or, and), or
the average: the sum divided once by |S|, integers truncating toward zero (bool: or). See
docs/planner.md, "Reductions". The reference below computes that in Python numbers, never
through ``lowering.kinds``; programs run in ``lowering.simulate`` and under LocalTensorMode.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from torch_utils import from_local, local_mode, to_local  # noqa: E402

import lowering  # noqa: E402
import torch_backend  # noqa: E402
from lowering import make_program, make_step  # noqa: E402
from lowering.simulator import simulate  # noqa: E402
from spec_lang import SpecError, parse_mesh  # noqa: E402
from spec_lang.ir import Mesh  # noqa: E402
from torch_backend.executor import execute  # noqa: E402

DTYPES = {
    "float": ("float32", "float64"),
    "integer": ("int8", "int32", "int64", "uint8"),
    "bool": ("bool",),
    "complex": ("complex64", "complex128"),
}
OPS = ("sum", "avg", "max", "min")
P_AXES = ("x", "y", "z")
LENGTH = 144  # a multiple of every group size drawn below (at most 16 ranks): even blocks


def is_integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def wrap(s: int, dtype: str) -> int:
    info = np.iinfo(dtype)
    return (s - int(info.min)) % (int(info.max) - int(info.min) + 1) + int(info.min)


def reference(op: str, dtype: str, arrays: list[np.ndarray]) -> np.ndarray:
    """``op`` over ``arrays`` elementwise, from the definition, in Python numbers."""
    n = len(arrays)
    out = []
    for vals in zip(*(a.tolist() for a in arrays)):
        if dtype == "bool":
            out.append(all(vals) if op == "min" else any(vals))
        elif op in ("max", "min"):
            out.append(max(vals) if op == "max" else min(vals))
        elif is_integer(dtype):
            s = wrap(sum(vals), dtype)
            out.append(s if op == "sum" else (abs(s) // n) * (1 if s >= 0 else -1))
        else:
            out.append(sum(vals) if op == "sum" else sum(vals) / n)
    return np.array(out, dtype=dtype)


def assert_same(got: np.ndarray, want: np.ndarray, dtype: str, what: str) -> None:
    if dtype.startswith(("float", "complex")):
        # an average over several axes is divided per axis (docs/planner.md): one rounding each
        tol = 1e-6 if dtype in ("float32", "complex64") else 1e-13
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)
    else:
        assert got.dtype == want.dtype, what
        np.testing.assert_array_equal(got, want, err_msg=what)


def coords(mesh: Mesh, rank: int) -> dict[str, int]:
    return dict(zip(mesh.names, (int(c) for c in np.unravel_index(rank, mesh.sizes))))


def type_text(dtype: str, op: str, shard: tuple[str, ...], partial: tuple[str, ...]) -> str:
    dim = f"{LENGTH}@({','.join(shard)})" if shard else str(LENGTH)
    return f"{dtype}[{dim}]" + (f"{{P({op}):({','.join(partial)})}}" if partial else "")


def inputs_for(mesh: Mesh, partial: tuple[str, ...], dtype: str, seed: int) -> tuple[list[np.ndarray], dict]:
    """Each rank's block of a P(op) source over ``partial``: one random block per coordinate
    on those axes (ranks that differ only on other axes hold copies). Small values: no sum
    here leaves its dtype, so the definition's wrap never fires."""
    rng = np.random.default_rng(seed)
    held: dict[tuple[int, ...], np.ndarray] = {}
    blocks = []
    for r in range(mesh.size):
        key = tuple(coords(mesh, r)[a] for a in partial)
        if key not in held:
            if dtype == "bool":
                held[key] = rng.random(LENGTH) < 0.3
            elif is_integer(dtype):
                lo = 0 if dtype.startswith("uint") else -9
                held[key] = rng.integers(lo, 10, size=LENGTH).astype(dtype)
            else:
                v = rng.integers(-40, 40, size=LENGTH) / 4
                if dtype.startswith("complex"):
                    v = v + 1j * rng.integers(-40, 40, size=LENGTH) / 4
                held[key] = v.astype(dtype)
        blocks.append(held[key])
    return blocks, held


def check_outputs(outs: list[np.ndarray], mesh: Mesh, op: str, dtype: str, whole: np.ndarray,
                  shard: tuple[str, ...], kept: tuple[str, ...], what: str) -> None:
    """Each rank holds its chunk of ``whole`` (dim 0 split over ``shard``, major first), as a
    pending ``op`` over ``kept``: ``op`` over the ranks that differ only on ``kept``."""
    chunk = len(whole) // mesh.group_size(shard)
    for r in range(mesh.size):
        c = coords(mesh, r)
        i = 0
        for a in shard:
            i = i * mesh.axis_size(a) + c[a]
        peers = [q for q in range(mesh.size) if all(coords(mesh, q)[a] == c[a] for a in mesh.names if a not in kept)]
        got = reference(op, dtype, [outs[q] for q in peers]) if kept else outs[r]
        assert_same(got, whole[i * chunk:(i + 1) * chunk], dtype, f"{what}: rank {r}")


def splits(mesh: Mesh, dtype: str, op: str, done: tuple[str, ...], left: tuple[str, ...]) -> bool:
    """A step that finishes ``done`` and leaves ``left`` pending divides an integer average twice."""
    return op == "avg" and is_integer(dtype) and mesh.group_size(done) > 1 and mesh.group_size(left) > 1


@st.composite
def reduce_cases(draw: st.DrawFn) -> dict:
    k = draw(st.sampled_from((3, 2, 1)))
    partial = P_AXES[:k]
    sizes = [draw(st.sampled_from((2, 3, 2, 1))) for _ in range(k)]
    spare = draw(st.sampled_from((2, 0, 1)))  # an axis the source replicates (0: none)
    names = partial + (("r",) if spare else ())
    sizes += [spare] if spare else []
    while math.prod(sizes) > 16:
        big = sizes.index(max(sizes))
        sizes[big] -= 1
    mesh = Mesh(names, tuple(sizes))
    kept = tuple(a for a in partial if draw(st.booleans()))
    if len(kept) == k:
        kept = kept[1:]
    done = tuple(a for a in partial if a not in kept)
    order = draw(st.permutations(done))  # the several-step route finishes them in this order
    shard = tuple(draw(st.permutations(done + (("r",) if spare else ()))))
    shard = shard[: draw(st.integers(0, len(shard)))]
    return {"mesh": mesh, "partial": partial, "kept": kept, "order": tuple(order), "shard": shard,
            "pick": draw(st.integers(0, 11)), "seed": draw(st.integers(0, 2**31))}


def _run_local(fake_pg, mesh: Mesh, blocks: list[np.ndarray], run) -> list[np.ndarray]:
    with local_mode(fake_pg, mesh.size) as lm:
        x = to_local(lm, [torch.from_numpy(b.copy()) for b in blocks])
        return [t.numpy() for t in from_local(run(x))]


@pytest.mark.parametrize("cls", tuple(DTYPES))
@pytest.mark.parametrize("op", OPS)
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=reduce_cases())
def test_every_op_and_dtype_class_matches_the_definition(fake_pg, op: str, cls: str, case: dict) -> None:
    """Pending over 1-3 axes; finished by the planner's program, by one step, and by one
    step per axis; kept pending over some axes or none; the result sharded or not."""
    mesh, partial, kept = case["mesh"], case["partial"], case["kept"]
    dtype = DTYPES[cls][case["pick"] % len(DTYPES[cls])]
    src = type_text(dtype, op, (), partial)
    if dtype.startswith("complex") and op in ("max", "min"):
        with pytest.raises(SpecError, match="no order"):
            lowering.compile(src, src, mesh)
        return
    blocks, held = inputs_for(mesh, partial, dtype, case["seed"])
    whole = reference(op, dtype, list(held.values()))
    done, shard = tuple(a for a in partial if a not in kept), case["shard"]

    # the planner's program, simulated and run through redistribute under LocalTensorMode
    dst = type_text(dtype, op, shard, kept)
    program = lowering.compile(src, dst, mesh)
    want = simulate(program, blocks)
    check_outputs(want, mesh, op, dtype, whole, shard, kept, f"simulate {program}")
    got = _run_local(fake_pg, mesh, blocks, lambda x: torch_backend.redistribute(x, src, dst, str(mesh)))
    for r in range(mesh.size):
        assert_same(got[r], want[r], dtype, f"LocalTensorMode vs simulate, rank {r}\n{program}")

    # in one step: one all_reduce, or one reduce_scatter onto dim 0, of every finished axis
    one = [("all_reduce", type_text(dtype, op, (), kept))]
    if case["order"]:
        one.append(("reduce_scatter", type_text(dtype, op, case["order"], kept)))
    for kind, to in one:
        if splits(mesh, dtype, op, done, kept):
            with pytest.raises(SpecError, match="integer average") as err:
                make_step(kind, src, to, mesh)
            assert err.value.hint and "one step" in err.value.hint
            continue
        step = make_step(kind, src, to, mesh)
        check_outputs(simulate(make_program([step], mesh), blocks), mesh, op, dtype, whole,
                      case["order"] if kind == "reduce_scatter" else (), kept, f"one {kind}")

    # in several: one all_reduce per finished axis
    steps, at, left = [], src, tuple(done)
    for a in case["order"]:
        left = tuple(b for b in left if b != a)
        to = type_text(dtype, op, (), tuple(b for b in partial if b in left or b in kept))
        if splits(mesh, dtype, op, (a,), left + kept):
            with pytest.raises(SpecError, match="integer average"):
                make_step("all_reduce", at, to, mesh)
            return
        steps.append(make_step("all_reduce", at, to, mesh))
        at = to
    if len(steps) > 1:
        several = make_program(steps, mesh)
        want = simulate(several, blocks)
        check_outputs(want, mesh, op, dtype, whole, (), kept, f"several steps {several}")
        got = _run_local(fake_pg, mesh, blocks, lambda x: execute(several, x))
        for r in range(mesh.size):
            assert_same(got[r], want[r], dtype, f"LocalTensorMode vs simulate, rank {r}\n{several}")


# ---- the issue's case, and the places an average divides -----------------------------------

ISSUE = ("i64[2]{P(avg):(x,y)}", "x=2,y=2", (1, 0, 0, 3))  # averages to 1; halved per axis, 0


@pytest.mark.parametrize("dst", ["i64[2@x]", "i64[2@x]{P(avg):y}", "i64[2]{P(avg):x}"])
def test_issue_case_divides_once(fake_pg, dst: str) -> None:
    src, mesh_text, values = ISSUE
    mesh = parse_mesh(mesh_text)
    program = lowering.compile(src, dst, mesh)
    blocks = [np.full(2, v, dtype=np.int64) for v in values]
    shard = ("x",) if "@x" in dst else ()
    kept = tuple(a for a in "xy" if f"P(avg):{a}" in dst)
    whole = np.ones(2, dtype=np.int64)
    check_outputs(simulate(program, blocks), mesh, "avg", "int64", whole, shard, kept, str(program))
    got = _run_local(fake_pg, mesh, blocks, lambda x: torch_backend.redistribute(x, src, dst, mesh_text))
    check_outputs(got, mesh, "avg", "int64", whole, shard, kept, f"LocalTensorMode {program}")


@pytest.mark.parametrize("dst", ["i32[6]", "i32[6@r]", "i32[6]{P(avg):y}"])
def test_uneven_exchange_divides_once(fake_pg, dst: str) -> None:
    """reduce_scatterv: an uneven source, one exact exchange that finishes the average."""
    src, mesh_text = "i32[6@r<1,5>]{P(avg):(x,y)}", "x=2,y=2,r=2"
    mesh = parse_mesh(mesh_text)
    program = lowering.compile(src, dst, mesh)
    assert any(s.kind == "reduce_scatterv" for s in program.steps), program
    values = {(0, 0): 1, (0, 1): 0, (1, 0): 0, (1, 1): 3}
    sizes = {0: 1, 1: 5}
    blocks = [np.full(sizes[coords(mesh, r)["r"]], values[coords(mesh, r)["x"], coords(mesh, r)["y"]],
                      dtype=np.int32) for r in range(mesh.size)]
    whole = np.ones(6, dtype=np.int32)
    kept = ("y",) if "P(avg)" in dst else ()
    shard = ("r",) if "@r" in dst else ()
    check_outputs(simulate(program, blocks), mesh, "avg", "int32", whole, shard, kept, str(program))
    got = _run_local(fake_pg, mesh, blocks, lambda x: torch_backend.redistribute(x, src, dst, mesh_text))
    check_outputs(got, mesh, "avg", "int32", whole, shard, kept, f"LocalTensorMode {program}")


@pytest.mark.parametrize("kind,src,dst", [
    ("all_reduce", "i64[2]{P(avg):(x,y)}", "i64[2]{P(avg):y}"),
    ("reduce_scatter", "u8[4]{P(avg):(x,y)}", "u8[4@x]{P(avg):y}"),
    ("reduce_scatterv", "i32[6@r<1,5>]{P(avg):(x,y)}", "i32[6]{P(avg):y}"),
])
def test_a_step_that_splits_an_integer_average_is_refused(kind: str, src: str, dst: str) -> None:
    with pytest.raises(SpecError, match="integer average over \\['x'\\] but keeps it pending over \\['y'\\]") as e:
        make_step(kind, src, dst, "x=2,y=2,r=2")
    assert "in one step" in e.value.hint and "reinterpret" in e.value.hint
    # a float average, and an integer one split on a group of one rank, divide per axis
    make_step(kind, src.replace("i64", "f64").replace("u8", "f32").replace("i32", "f32"),
              dst.replace("i64", "f64").replace("u8", "f32").replace("i32", "f32"), "x=2,y=2,r=2")
    make_step(kind, src, dst, "x=2,y=1,r=2")


def test_the_simulator_divides_int64_exactly_and_wraps_like_torch(fake_pg) -> None:
    """An int64 sum beyond 2**53 is not a float64; an int8 sum wraps on the wire."""
    big = 2**60
    for dtype, values, want in (("int64", (big + 1, big + 4), big + 2), ("int8", (100, 100), -28),
                                ("uint8", (200, 100), 22)):
        src = f"{dtype}[3]{{P(avg):x}}"
        program = lowering.compile(src, f"{dtype}[3]", "x=2")
        blocks = [np.full(3, v, dtype=dtype) for v in values]
        assert [b.tolist() for b in simulate(program, blocks)] == [[want] * 3] * 2, dtype
        got = _run_local(fake_pg, program.mesh, blocks,
                         lambda x, src=src, dtype=dtype: torch_backend.redistribute(x, src, f"{dtype}[3]", "x=2"))
        assert [b.tolist() for b in got] == [[want] * 3] * 2, dtype


def test_typed_spmd_collective_refuses_part_of_an_integer_average(fake_pg) -> None:
    from torch_backend import spmd
    from torch_backend.spmd import P, R

    with local_mode(fake_pg, 4) as lm, spmd.use_mesh("x=2,y=2"):
        x = to_local(lm, [torch.full((2,), v, dtype=torch.int64) for v in ISSUE[2]])
        t = spmd.assert_type(x, "i64[2]{P(avg):(x,y)}")
        with pytest.raises(SpecError, match="integer P\\('avg'\\) that stays pending over \\['y'\\]") as e:
            spmd.all_reduce(t, "x", src=P("avg"), dst=R)
        assert "('x', 'y')" in e.value.hint
        y = spmd.all_reduce(t, ("x", "y"), src=P("avg"), dst=R)
        assert [b.tolist() for b in from_local(y)] == [[1, 1]] * 4
        f = spmd.assert_type(x.double(), "f64[2]{P(avg):(x,y)}")
        assert spmd.typeof(spmd.all_reduce(f, "x", src=P("avg"), dst=R))["y"] == P("avg")


def _gloo_issue_case(rank: int, world: int) -> dict:
    """8 gloo ranks: the issue's average over (x,y), replicated over z."""
    import torch

    from torch_backend import redistribute

    mesh = parse_mesh("x=2,y=2,z=2")
    c = coords(mesh, rank)
    x = torch.full((2,), ISSUE[2][2 * c["x"] + c["y"]], dtype=torch.int64)
    return {dst: redistribute(x, ISSUE[0], dst, "x=2,y=2,z=2", timeout=20).tolist()
            for dst in ("i64[2@x]", "i64[2@x]{P(avg):y}")}


@pytest.mark.timeout(240)
def test_issue_case_on_gloo(gloo_pool) -> None:
    results = gloo_pool.run(_gloo_issue_case, timeout_s=200)
    # every rank holds 1: its chunk of the average, or a copy of it for the pending average over y
    assert all(res == {"i64[2@x]": [1], "i64[2@x]{P(avg):y}": [1]} for res in results.values()), results
