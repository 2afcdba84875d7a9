"""A rank that dies or stays away from a collective of the library API: every survivor
fails within about the collective timeout, and its CollectiveError names the rank at
fault (``torch_backend.faults``' roll call in the default store), or says that the
process group cannot tell. 8 real gloo ranks, started per scenario by ``shardc run``'s
launcher (a fault breaks the group); a stand-in store for the answers no single fault
reaches."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

TIMEOUT_S = 3.0  # the calls' collective timeout
MESH = "dp=2,tp=4"
# two steps: reduce_scatter over tp, then all_to_all over (dp,tp)
SRC, DST = "f32[16@dp,8]{U:tp}", "f32[16@tp,8]"
CULPRIT = 3


def fault_rank(spec: Any, store: Any) -> dict[str, Any]:
    """One rank of a scenario (``spec.fault``): the culprit exits or stays away; every
    other rank reports the error its call raised and how long the call took."""
    import torch_backend
    from lowering.layout import local_shape
    from spec_lang import parse, parse_mesh

    rank = dist.get_rank()
    x = torch.ones(local_shape(parse(SRC), parse_mesh(MESH), rank))

    def call() -> Any:
        if spec.fault.endswith("redistribute_many"):
            return torch_backend.redistribute_many([x, x.clone()], [SRC, SRC], [DST, DST], MESH, timeout=TIMEOUT_S)
        return torch_backend.redistribute(x, SRC, DST, MESH, timeout=TIMEOUT_S)

    if spec.fault != "exit before the first call":
        call()  # all well, the groups made
    if rank == CULPRIT:
        if spec.fault.startswith("exit"):
            os._exit(17)
        time.sleep(3 * TIMEOUT_S + 10)  # alive, away, until every other rank has given up
        return {"rank": rank, "ok": True, "error": None}
    start = time.monotonic()
    try:
        call()
        got = "no error"
    except torch_backend.CollectiveError as e:
        got = str(e)
    return {"rank": rank, "ok": True, "error": None, "got": got, "took": time.monotonic() - start}


def run_scenario(fault: str) -> dict[int, dict[str, Any]]:
    from torch_backend.launcher import launch_local
    from torch_backend.run_spec import RunSpec

    res = launch_local(RunSpec(MESH, SRC, DST, timeout=TIMEOUT_S, fault=fault), 8, rank_fn=fault_rank)
    survivors = {r: rep for r, rep in res.reports.items() if r != CULPRIT}
    assert sorted(survivors) == [r for r in range(8) if r != CULPRIT], res.message
    return survivors


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", [
    # its connections close: gloo fails at once on the ranks that wait on it (the others at
    # the timeout), and once all but one have reported, that one is named
    "exit",
    # alive but away: every survivor times out, and the culprit never reports
    "stay away",
    # it dies before the first call: the survivors fail making the program's first group
    "exit before the first call",
    # the packed collectives of redistribute_many name it too
    "exit in redistribute_many",
])
def test_survivors_name_the_culprit(fault):
    survivors = run_scenario(fault)
    for r, rep in survivors.items():
        assert f"\nat fault: rank {CULPRIT} (" in rep["got"], (r, rep["got"])
    if fault in ("exit", "exit in redistribute_many"):  # the ranks that wait on it see it close
        assert any("the one member of the group that did not report this failure: it closed its connection"
                   in rep["got"] for rep in survivors.values()), survivors
    # within about the timeout: the roll call waits at most its grace after a timeout, and
    # the collective timeout after a closed connection (generous: 8 ranks on 2 busy cores)
    assert max(rep["took"] for rep in survivors.values()) < 4 * TIMEOUT_S + 10, survivors


# A wrong shape on one rank of dp=2,tp=2 (the case): the one-step all_gather over
# (dp,tp) on the default group, whose timeout is long (the default is 30 minutes): before the
# refusal was recorded, ranks 0 and 2 waited 70 s for rank 3, blocked in the same all_gather,
# and named ranks [1, 3]
ODD_MESH, ODD_SRC, ODD_DST, ODD = "dp=2,tp=2", "f32[8@(dp,tp),4]", "f32[8,4]", 1
LONG_TIMEOUT_S = 100.0


def odd_rank(spec: Any, store: Any) -> dict[str, Any]:
    """One rank of ``spec.fault``: rank ``ODD`` refuses the call (a wrong shape) and leaves
    the group, or refuses and stays, or leaves without a call; the others report what
    their call raised."""
    import torch_backend

    rank = dist.get_rank()
    x = torch.ones(2, 4)
    torch_backend.redistribute(x, ODD_SRC, ODD_DST, ODD_MESH)  # all well
    start = time.monotonic()
    if rank == ODD:
        if spec.fault != "leave":
            with pytest.raises(ValueError, match="shape"):
                torch_backend.redistribute(x[:1], ODD_SRC, ODD_DST, ODD_MESH)
        if spec.fault == "refuse and stay":
            time.sleep(6)  # alive, in the group, away: the others stop without waiting for it
        dist.destroy_process_group()
        return {"rank": rank, "ok": True, "error": None}
    try:
        torch_backend.redistribute(x, ODD_SRC, ODD_DST, ODD_MESH)
        got = "no error"
    except torch_backend.CollectiveError as e:
        got = str(e)
    return {"rank": rank, "ok": True, "error": None, "got": got, "took": time.monotonic() - start}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("fault", ["refuse", "refuse and stay", "leave"])
def test_a_rank_blocked_in_the_same_collective_is_not_named(fault):
    from torch_backend.launcher import launch_local
    from torch_backend.run_spec import RunSpec

    res = launch_local(RunSpec(ODD_MESH, ODD_SRC, ODD_DST, timeout=LONG_TIMEOUT_S, fault=fault), 4,
                       rank_fn=odd_rank)
    others = {r: rep for r, rep in res.reports.items() if r != ODD}
    assert sorted(others) == [0, 2, 3], res.message
    for r, rep in others.items():
        note = rep["got"].splitlines()[-1]
        assert note.startswith(f"at fault: rank {ODD} ("), (r, rep["got"])
        if fault != "leave":  # the refusal is quoted
            assert "refused this call" in note and "has shape [1, 4]" in note, note
    # seconds, not the 70 s the roll call waits for a member that never reports (2 busy cores)
    assert max(rep["took"] for rep in others.values()) < 15, others


class _Store:
    """A stand-in for the default store: counters and values, or one that is gone."""

    def __init__(self, counts: dict[str, Any] | None = None) -> None:
        self.counts = counts

    def add(self, key: str, n: int) -> int:
        if self.counts is None:
            raise RuntimeError("Connection reset by peer")
        self.counts[key] = self.counts.get(key, 0) + n
        return self.counts[key]

    def check(self, keys: list[str]) -> bool:
        return self.counts is not None and all(k in self.counts for k in keys)

    def get(self, key: str) -> bytes:
        assert self.counts is not None
        return str(self.counts[key]).encode()


@pytest.mark.parametrize("others,store_gone,closed,says", [
    # every member failed here too (the same error everywhere): nobody to name
    ({1: 1, 2: 1, 3: 1}, False, False, "at fault: cannot be told (every member of the group failed here too"),
    ({1: 1, 2: 1, 3: 1}, False, True, "at fault: cannot be told (every member of the group failed here too"),
    # a closed connection and one member that never reported: that one
    ({1: 1, 2: 1}, False, True, "at fault: rank 3 (the one member of the group that did not report this failure: it closed"),
    # a timeout and two members that never reported: both, after the grace
    ({1: 1}, False, False, "at fault: ranks [2, 3] (they did not report this failure within 0.2 s"),
    # a member that failed in another group (a step earlier) is a fellow victim, not at fault
    ({1: 1, 2: 1, 3: 2}, False, False, "at fault: cannot be told (every member"),
    # no store to ask: say so
    ({}, True, False, "at fault: cannot be told (the store could not be read: RuntimeError: Connection reset"),
    # a member refused this call (its count moved with this one's): that member alone, at
    # once, though another never reported
    ({1: 1, "refused/1/1": "SpecError: bad shape"}, False, False,
     "at fault: rank 1 (it refused this call before its first collective; rank 1: SpecError: bad shape)"),
    # a refusal of an earlier call (another count) is not this failure's
    ({0: 1, 1: 2, 2: 2, 3: 2, "refused/1/1": "SpecError: bad shape"}, False, False, "at fault: cannot be told"),
])
def test_culprit_note_answers(monkeypatch, others, store_gone, closed, says):
    from torch_backend import faults

    store = _Store(None if store_gone else {f"shardc/faults/{r}": n for r, n in others.items()})
    monkeypatch.setattr(faults, "default_store", lambda: store)
    monkeypatch.setattr(faults, "grace_s", lambda timeout_s: 0.2)  # keep the test fast
    error = RuntimeError("Connection closed by peer [127.0.0.1]:4242" if closed else "Operation timed out!")
    note = faults.culprit_note(error, [0, 1, 2, 3], 0, None if closed else _seconds(1.8))
    assert says in note, note
    if not store_gone:
        assert store.counts["shardc/faults/0"] == others.get(0, 0) + 1  # this rank reported its own failure


def _seconds(s: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=s)
