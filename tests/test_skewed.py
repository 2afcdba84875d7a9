"""Skewed layouts: few ranks hold the data, many need it (a small dim sharded over many
ranks, a source replicated over a few axes). Replicas split the sending (all_to_allv's
balanced sources) and the planner may relay through an axis both ends replicate (exchange
to the goal's dims plus that axis, then gather it). Checked against a bound and a layout
written from the definition (``bench/skewed.py``, independent of ``lowering``)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowering import CostModel, compile, simulate
from lowering.kinds import rank_pieces, wire_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.skewed import chunk_boxes, independent_bound, simulated_exact, skewed_case

PURE = CostModel.make(spare_axis_bytes=0)


def test_replicas_split_the_sending() -> None:
    # y=4 replicas at z=0 hold all 6 elements; the 5 receivers (y=0, z=1..5) were all served
    # by replica y=0 (20 B); in turn they send 2 elements at most each, at the bound
    mesh, src, dst = "y=4,z=8", "i32[6,1@z]", "i32[6@z,1@y]"
    prog = compile(src, dst, mesh)
    assert [s.kind for s in prog.steps] == ["all_to_allv"]
    assert prog.cost.bytes_max == 8 == independent_bound(mesh, src, dst)  # 5 elements over 4 replicas
    step = prog.steps[0]
    sent = [rank_pieces(step, prog.mesh, r).wire_elems for r in range(prog.mesh.size)]
    assert sorted(sent, reverse=True)[:4] == [2, 1, 1, 1] and sum(sent) == 5
    assert simulated_exact(mesh, src, dst, prog)


def test_a_receiver_holding_the_data_keeps_its_own() -> None:
    # every rank of the source holds all of dim 0: nothing moves
    prog = compile("f32[6,4]", "f32[6@x,4@y]", "x=3,y=2")
    assert prog.cost.collectives == 0


def test_a_relay_through_a_replicated_axis_pays_on_a_large_tensor() -> None:
    # 16 rows held only at y=0 (replicated over cp=4), each row needed by the 4 ranks of its
    # y: the holders used to send each needer its rows (14 rows of 16 KiB). A two-phase relay
    # over (cp, y) sends each quarter row once, to one of its needers (14 quarters of 4 KiB
    # per holder), and each needer fans its quarters out to the 3 others of its y: the bound,
    # where a relay through standard layouts (slice over cp, exchange, all_gather cp) moved
    # 80 KiB, its holders taking part in the gather
    mesh, src, dst = "cp=4,y=8", "f32[16,1@y,4096]", "f32[16@y,1,4096]"
    prog = compile(src, dst, mesh)
    assert [(s.kind, s.axes) for s in prog.steps] == [("relay", ("cp", "y"))]
    assert prog.cost.bytes_max == 57344 == 14 * 4096 == independent_bound(mesh, src, dst)
    assert simulated_exact(mesh, src, dst, prog)


def test_on_a_tiny_tensor_the_default_keeps_one_collective() -> None:
    # the relay saves 40 B for a second collective over cp, which both ends replicate: below
    # a collective's latency, so only the pure bytes model takes it (at the bound)
    mesh, src, dst = "cp=4,y=8", "f32[16,1@y]", "f32[16@y,1]"
    assert (compile(src, dst, mesh).cost.bytes_max, compile(src, dst, mesh).cost.collectives) == (56, 1)
    relay = compile(src, dst, mesh, cost_model=PURE)
    assert (relay.cost.bytes_max, relay.cost.collectives) == (16, 2) == (independent_bound(mesh, src, dst), 2)
    assert simulated_exact(mesh, src, dst, relay)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_skewed_pairs_are_exact_and_never_below_the_bound(seed: int, pure: bool) -> None:
    mesh, src, dst = skewed_case(np.random.default_rng(seed))
    prog = compile(src, dst, mesh, cost_model=PURE if pure else None)
    assert simulated_exact(mesh, src, dst, prog), str(prog)
    assert prog.cost.bytes_max >= independent_bound(mesh, src, dst), str(prog)
    for step in prog.steps:  # the price (per class of replicas) is what the pieces (per pair) move
        if step.kind in ("all_to_allv", "relay"):
            assert wire_bytes(step, prog.mesh) == step.bytes_sent, str(prog)
            assert wire_bytes(step, prog.mesh, received=True) == step.bytes_recv, str(prog)
    # the peak rule: no step holds more than the larger end block and its output
    if prog.steps:
        item = prog.src.itemsize
        ends = max(int(np.prod(s)) for s in prog.steps[0].in_shapes + prog.steps[-1].out_shapes) * item
        biggest = max(int(np.prod(s)) for st_ in prog.steps for s in st_.out_shapes) * item
        assert prog.cost.peak_bytes_max <= ends + biggest, str(prog)


def test_the_bound_is_written_from_the_chunk_rule() -> None:
    # 10@(x,y) on x=2,y=4: 2,2,1,0,2,2,1,0 (torch.chunk, major axis first)
    b = chunk_boxes(["x", "y"], [2, 4], [10], [["x", "y"]])
    assert (b[:, 0, 1] - b[:, 0, 0]).tolist() == [2, 2, 1, 0, 2, 2, 1, 0]
    # the cases: what the neediest lacks, or what a holder set must send out
    assert independent_bound("y=4,x=4", "i64[1@x,24]", "i64[1,24@x]") == 48
    assert independent_bound("data_parallel=5,w=3", "i32[1@data_parallel,9]", "i32[1,9@data_parallel]") == 12
    assert independent_bound("dp=4,tp=2", "f32[4@(tp,dp),4]", "f32[4,4@tp]") == 32
    # a simulated program at the bound
    prog = compile("f32[8@x]", "f32[8]", "x=4")
    assert prog.cost.bytes_max == independent_bound("x=4", "f32[8@x]", "f32[8]") == 24
    assert all(np.array_equal(o, np.arange(8.0)) for o in simulate(prog, [np.arange(2.0) + 2 * r for r in range(4)]))
