"""A cross-mesh call whose peer hangs fails within the caller's ``timeout`` (plus the roll
call) with a CollectiveError that names the peer, prepared or not: its messages go through
the one network module (``torch_backend.comm``), which bounds each wait by the timeout and
asks ``torch_backend.faults`` who is at fault. 4 real gloo ranks, started per scenario by
``shardc run``'s launcher (a fault breaks the group)."""

from __future__ import annotations

import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

TIMEOUT_S = 3.0
SRC, DST, MESH, DST_MESH = "f32[8@dp]", "f32[8@tp]", "dp=2@[0,1]", "tp=2@[2,3]"
CULPRIT = 1  # a source rank: rank 3's block comes from it alone
AWAY_S = 20.0  # how long it stays away (long after every other rank has given up)


def away_rank(spec: Any, store: Any) -> dict[str, Any]:
    """Every rank prepares (or not) the move; the culprit then hangs instead of calling it,
    every other rank reports what its call raised and how long the call took."""
    import torch_backend

    rank = dist.get_rank()
    x = torch.full((4,), float(rank)) if rank < 2 else None
    if spec.fault == "prepared":
        f = torch_backend.redistributor(SRC, DST, MESH, dst_mesh=DST_MESH, timeout=TIMEOUT_S)
    else:  # one call that goes well first: the time below is the failing call's, not the first call's set-up
        f = None
        torch_backend.redistribute(x, SRC, DST, MESH, dst_mesh=DST_MESH, timeout=TIMEOUT_S)
    if rank == CULPRIT:
        time.sleep(AWAY_S)
        return {"rank": rank, "ok": True, "error": None}
    start = time.monotonic()
    try:
        if f is not None:
            f(x)
        else:
            torch_backend.redistribute(x, SRC, DST, MESH, dst_mesh=DST_MESH, timeout=TIMEOUT_S)
        got = "no error"
    except Exception as e:  # the test asks for a CollectiveError: anything else is reported
        got = f"{type(e).__name__}: {e}"
    return {"rank": rank, "ok": True, "error": None, "got": got, "took": time.monotonic() - start}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("form", ["prepared", "redistribute"])
def test_a_hung_peer_of_a_cross_mesh_call_is_named_within_the_timeout(form: str) -> None:
    from torch_backend.launcher import launch_local
    from torch_backend.run_spec import RunSpec

    res = launch_local(RunSpec("dp=2,tp=2", "f32[8@dp]", "f32[8@tp]", timeout=AWAY_S + 30, fault=form), 4,
                       rank_fn=away_rank)
    rep = res.reports[3]  # its block only rank 1 holds
    assert rep["got"].startswith("CollectiveError: "), rep
    assert f"\nat fault: rank {CULPRIT} (" in rep["got"], rep["got"]
    # the timeout, then the roll call's grace (2 s at a 3 s timeout): ~5 s; generous on 2 busy
    # cores, and still well before the culprit's process exits (what gloo waited for)
    assert rep["took"] < TIMEOUT_S + 2 + 10 < AWAY_S, rep
    if form == "redistribute":  # the agreement waits for rank 1 on every rank: all name it
        for r in (0, 2):
            assert f"\nat fault: rank {CULPRIT} (" in res.reports[r]["got"], res.reports[r]


LATE_S = 2.5  # longer than a gloo wait's slice between two looks at the mesh's alarm
LATE_TIMEOUT_S = 20.0


def late_rank(spec: Any, store: Any) -> dict[str, Any]:
    """Every rank prepares the move; the source rank 1 calls it LATE_S late. gloo closes a
    point-to-point pair whose wait times out, so a receiver must not wait in slices."""
    import torch_backend

    rank = dist.get_rank()
    x = torch.arange(4.0) + 4 * rank if rank < 2 else None
    f = torch_backend.redistributor(SRC, DST, MESH, dst_mesh=DST_MESH, timeout=LATE_TIMEOUT_S)
    if rank == CULPRIT:
        time.sleep(LATE_S)
    try:
        y = f(x)
        got = None if y is None else y.tolist()
    except Exception as e:
        got = f"{type(e).__name__}: {e}"
    return {"rank": rank, "ok": True, "error": None, "got": got}


@pytest.mark.timeout(120)
def test_a_late_peer_of_a_cross_mesh_call_within_the_timeout_is_waited_for() -> None:
    from torch_backend.launcher import launch_local
    from torch_backend.run_spec import RunSpec

    res = launch_local(RunSpec("dp=2,tp=2", "f32[8@dp]", "f32[8@tp]", timeout=LATE_TIMEOUT_S + 30), 4,
                       rank_fn=late_rank)
    assert [res.reports[r]["got"] for r in (2, 3)] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]], res.reports
