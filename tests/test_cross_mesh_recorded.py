"""Cross-mesh plans stay as recorded: the messages each crossing sends, per round (sender,
receiver, global box), its finish on the source mesh, cost, bound and plan choice.

``tests/data/cross_transfers.json`` was written by the planner before cross-mesh steps became
step kinds (bench/cross_mesh_plan.py's seven cases at 16 ranks a mesh, test_cross_mesh's
corpus, fan-out and cut plans among random pairs): a change that moves other messages fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import lowering
import lowering.kinds
from lowering.kinds.across import CrossPieces

RECORDED = json.loads((Path(__file__).parent / "data" / "cross_transfers.json").read_text())


@pytest.mark.parametrize("case", RECORDED, ids=[" ".join(c["case"]) for c in RECORDED])
def test_cross_mesh_plans_move_the_recorded_messages(case):
    src, dst, m1, m2 = case["case"]
    program = lowering.compile(src, dst, m1, dst_mesh=m2)
    p = lowering.CrossProgram(program)
    rounds = [[s.kind, sorted([t.sender, t.receiver, [list(b) for b in t.box]] for t in s.transfers)]
              for s in p.steps]
    assert rounds == case["rounds"]
    assert (None if p.finish is None else [s.to_json() for s in p.finish.steps]) == case["finish"]
    assert [p.cost.to_json(), p.bound, p.split, list(p.fanned)] == \
        [case["cost"], case["bound"], case["split"], case["fanned"]]
    # the crossing is a step kind of the Program: its per-rank pieces are these messages
    crossing = program.steps[-1]
    assert crossing.kind == ("fan_out" if len(rounds) > 1 else "send_across") and crossing.launches == len(rounds)
    if p.world <= 64:  # every rank's pieces put on the wire, and take off it, exactly the price
        assert lowering.kinds.wire_bytes(crossing, program.mesh) == crossing.bytes_sent
        assert lowering.kinds.wire_bytes(crossing, program.mesh, received=True) == crossing.bytes_recv
    for rank in {0, p.world - 1, int(np.argmax(crossing.bytes_moved))}:
        pieces = lowering.rank_pieces(crossing, program.mesh, rank)
        assert isinstance(pieces, CrossPieces) and pieces.rounds == p.rank_part(rank)
