"""Random uneven redistributions (``strategies_uneven``) against independent oracles:

* the compiled program, simulated, gives every rank its block of the global truth (the
  reduction of the P axes for a partial destination), exactly on integer float64 data;
* ``torch_backend.redistribute`` under LocalTensorMode equals the simulator bit for bit
  and leaves its input untouched;
* the backward pass is the adjoint of the forward (sum / avg pairs);
* ``local_indices`` agrees with the placements' semantics (``uneven_oracle``) (one placement on a 1-D mesh);
* the bytes: each exchange's price is its exact pieces, the pieces of sender and receiver
  agree, and without a pending reduction the most any rank receives is the lower bound.

The example counts add up to 1,000 (``SHARDC_UNEVEN_EXAMPLES`` scales the total, e.g.
10000 for a long run by hand).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_oracle import expected, reduce_partial, shards_of
from strategies_uneven import single_placements, uneven_pairs
from uneven_oracle import indices, local_shape

from lowering import DynamicShard, PartitionedShard, RaggedShard, local_indices
from lowering.bounds import lower_bound_detail
from lowering.kinds import rank_pieces, wire_bytes
from lowering.layout import layouts
from lowering.planner import compile
from lowering.simulator import simulate
from spec_lang.ir import Mesh, TensorType

torch = pytest.importorskip("torch")
from torch_utils import adjoint, from_local, local_mode, to_local  # noqa: E402

import torch_backend  # noqa: E402

TOTAL = int(os.environ.get("SHARDC_UNEVEN_EXAMPLES", "1000"))
SHARE = {"simulate": 0.3, "torch": 0.2, "adjoint": 0.1, "indices": 0.2, "bytes": 0.2}  # adds up to 1


def _settings(name: str) -> settings:
    return settings(max_examples=max(1, round(TOTAL * SHARE[name])), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


UNEVEN_KINDS = ("all_to_allv", "all_gatherv", "reduce_scatterv")


def _data(src: TensorType, mesh: Mesh, seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    full = rng.integers(-20, 20, size=src.shape).astype(np.float64)
    return full, shards_of(full, src, mesh, rng)


@_settings("simulate")
@given(uneven_pairs(), st.integers(0, 2**16))
def test_simulated_program_gives_the_global_truth(case: tuple[TensorType, TensorType, Mesh], seed: int) -> None:
    src, dst, mesh = case
    program = compile(src, dst, mesh)
    full, ins = _data(src, mesh, seed)
    outs = simulate(program, ins)
    for r, (got, want) in enumerate(zip(reduce_partial(outs, dst, mesh), expected(full, dst, mesh))):
        assert got.shape == want.shape, f"rank {r}: {src} -> {dst} on {mesh}"
        if "avg" in (src.partial_op, dst.partial_op):  # a mean of integers divides: rounding
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-9, err_msg=f"rank {r}: {src} -> {dst} on {mesh}")
        else:
            assert np.array_equal(got, want), f"rank {r}: {src} -> {dst} on {mesh}"


@_settings("torch")
@given(uneven_pairs(max_ranks=12), st.integers(0, 2**16))
def test_local_tensor_mode_equals_the_simulator(fake_pg, case: tuple[TensorType, TensorType, Mesh],
                                                seed: int) -> None:
    src, dst, mesh = case
    _, ins = _data(src, mesh, seed)
    want = simulate(compile(src, dst, mesh), ins)
    with local_mode(fake_pg, mesh.size) as lm:
        x = to_local(lm, [torch.from_numpy(a.copy()) for a in ins])
        y = torch_backend.redistribute(x, src, dst, mesh)
        got, after = from_local(y), from_local(x)
    for r in range(mesh.size):
        assert np.array_equal(after[r].numpy(), ins[r]), f"rank {r}'s input changed: {src} -> {dst} on {mesh}"
        assert got[r].dtype == torch.float64 and tuple(got[r].shape) == want[r].shape
        assert np.array_equal(got[r].numpy(), want[r]), f"rank {r}: {src} -> {dst} on {mesh}"


@_settings("adjoint")
@given(uneven_pairs(max_ranks=12, ops=("sum", "avg")), st.integers(0, 2**16))
def test_backward_is_the_adjoint(fake_pg, case: tuple[TensorType, TensorType, Mesh], seed: int) -> None:
    src, dst, mesh = case
    lhs, rhs = adjoint(fake_pg, mesh, src, dst, seed)
    assert abs(lhs - rhs) <= 1e-9 * max(1.0, abs(lhs)), f"{src} -> {dst} on {mesh}: {lhs} != {rhs}"


def _placement(t: TensorType) -> object:
    """The placement class the type's one uneven split stands for."""
    d = next(k for k, dim in enumerate(t.dims) if dim.split is not None)
    sp = t.dims[d].split
    assert sp is not None
    if sp.kind == "sizes":
        return DynamicShard(d, sp.values)
    if sp.kind == "ragged":
        return RaggedShard(tuple(range(sp.span)), sp.values)
    return PartitionedShard(d, len(sp.values[0]), sp.values, sp.aligned)


@_settings("indices")
@given(single_placements())
def test_local_indices_agree_with_the_placement_classes(case: tuple[TensorType, Mesh]) -> None:
    t, mesh = case
    n = mesh.sizes[0]
    p = _placement(t)
    want = indices(p, t.shape, n)  # type: ignore[arg-type]
    got = local_indices(t, mesh)
    full = np.arange(t.numel, dtype=np.int64).reshape(t.shape)
    for s in range(n):
        assert got[s].tolist() == want[s].tolist(), f"shard {s} of {t} on {mesh}"
        assert layouts(t, mesh)[s].shape == local_shape(p, t.shape, n, s)  # type: ignore[arg-type]
        assert expected(full, t, mesh)[s].reshape(-1).tolist() == want[s].tolist()


def _received(program: object, mesh: Mesh) -> np.ndarray:
    """Per rank, the bytes its exchanges receive over the whole program."""
    out = np.zeros(mesh.size, dtype=np.int64)
    for step in program.steps:  # type: ignore[attr-defined]
        if step.kind in UNEVEN_KINDS:
            for r in range(mesh.size):
                out[r] += rank_pieces(step, mesh, r).recv_elems * step.src.itemsize  # type: ignore[attr-defined]
    return out


@_settings("bytes")
@given(uneven_pairs())
def test_bytes_are_the_exact_pieces(case: tuple[TensorType, TensorType, Mesh]) -> None:
    src, dst, mesh = case
    program = compile(src, dst, mesh)
    for step in program.steps:
        if not step.is_collective:
            continue
        assert step.kind in UNEVEN_KINDS, f"{step.describe()} in an uneven program: {src} -> {dst}"
        assert wire_bytes(step, mesh) == step.bytes_sent
        assert wire_bytes(step, mesh, received=True) == step.bytes_recv
        pieces = [rank_pieces(step, mesh, r) for r in range(mesh.size)]
        if step.kind == "all_gatherv":  # a ring: each rank forwards all segments but its successor's
            for p in pieces:
                segs = p.segments  # type: ignore[attr-defined]
                assert all(pieces[q].segments == segs for q in p.members)  # type: ignore[attr-defined]
                succ = (p.position + 1) % p.n  # type: ignore[attr-defined]
                assert p.wire_elems == (sum(segs) - segs[succ] if p.n > 1 else 0)
            continue
        for p in pieces:
            assert sum(pc.numel for pc in p.send) == p.send_elems == p.wire_elems  # type: ignore[attr-defined]
            assert sum(pc.numel for pc in p.recv) == p.recv_elems  # type: ignore[attr-defined]
            # what q sends to r is what r expects from q
            for pc in p.recv:  # type: ignore[attr-defined]
                sent = {x.peer: x.numel for x in pieces[pc.peer].send}  # type: ignore[attr-defined]
                assert sent[p.rank] == pc.numel
    reduced = [a for a in src.partial_axes if a not in dst.partial_axes and mesh.axis_size(a) > 1]
    if not reduced and set(dst.partial_axes) <= set(src.partial_axes):
        recv = _received(program, mesh)
        assert int(recv.max()) == lower_bound_detail(src, dst, mesh)["recv_max_bytes"], f"{src} -> {dst} on {mesh}"
