"""A collective that failed, and which rank is at fault: a roll call in the default store
(docs/running.md, "Timeouts and failures", says what each verdict means).

A rank whose collective (or group creation) failed adds one to its count of failures in
the default process group's store, which outlives a rank that died, and waits a bounded
time for the other members to do the same; the store is touched only after a failure.
Two more records keep a victim from being named: a rank's refusal of a call
(``refused``), and the mesh's alarm, which a rank blocked in a gloo collective looks for
between slices of its wait (``watched_wait``).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from datetime import timedelta
from typing import Any


class CollectiveError(RuntimeError):
    """A collective failed or timed out (a peer died, hung, or the group broke)."""


# a peer left: gloo's closed connection, or this rank stopped waiting after a peer reported
_CLOSED = re.compile(r"(closed|reset) by peer", re.IGNORECASE)
_PEER_CLOSED = re.compile(_CLOSED.pattern + r"|stopped waiting", re.IGNORECASE)
_POLL_S = (0.02, 0.05, 0.1, 0.2, 0.5)  # the roll call's polls, then every 0.5 s
SLICE_S = 1.0  # how long a gloo collective is waited on between two looks at the mesh's alarm
_SLICE = timedelta(seconds=SLICE_S)
_RECORDING: ContextVar[bool] = ContextVar("shardc_refusals_recorded", default=True)


def grace_s(timeout_s: float) -> float:
    """How long the members of one collective may differ in failing (half the timeout, 2-10 s)."""
    return min(max(timeout_s / 2, 2.0), 10.0)


def wait_s(timeout_s: float, peer_closed: bool) -> float:
    """The roll call's longest wait: a grace, and after a closed connection the collective
    timeout too (at most a minute: a member blocked longer is named as not reporting)."""
    return grace_s(timeout_s) + (min(timeout_s, 60.0) if peer_closed else 0.0)


def group_timeout(pg: Any) -> timedelta | None:
    """A process group's own collective timeout, where torch says it (None otherwise)."""
    import torch

    for device in ("cpu", "cuda"):
        with suppress(Exception):  # no such backend on this group, or a torch without these names
            return pg._get_backend(torch.device(device)).options._timeout
    return None


def default_store() -> Any | None:
    """The default process group's store (None where there is none)."""
    import torch.distributed as dist

    with suppress(Exception):
        return dist.distributed_c10d._get_default_store()
    return None


def _key(rank: int) -> str:
    return f"shardc/faults/{rank}"


def _refused_key(rank: int, count: int) -> str:
    return f"shardc/faults/refused/{rank}/{count}"


def _alarm_key(scope: Sequence[int], count: int) -> str:
    """The mesh's alarm: how many of the ranks ``scope`` reported their ``count``-th failure."""
    digest = hashlib.blake2b(",".join(map(str, sorted(scope))).encode(), digest_size=8).hexdigest()
    return f"shardc/faults/mesh/{digest}/{count}"


def failures(store: Any, rank: int) -> int:
    """How many failed collectives (global) ``rank`` has reported in ``store``."""
    return int(store.add(_key(rank), 0))


def roll_call(store: Any, members: Sequence[int], me: int, peer_closed: bool, timeout_s: float,
              scope: Sequence[int] = ()) -> tuple[list[int], bool]:
    """The members (global ranks) at fault for this failure, and whether they refused it:
    this rank's count (and the alarm of the mesh's ranks ``scope``) goes up by one, then
    the others' are polled until one refused this call, each caught up, (``peer_closed``)
    all but one did, or ``wait_s`` passed; then the members that did not report."""
    mine = int(store.add(_key(me), 1))
    store.add(_alarm_key(scope or members, mine), 1)
    deadline = time.monotonic() + wait_s(timeout_s, peer_closed)
    missing = [r for r in members if r != me]
    polls = 0
    while True:
        refusers = [r for r in members if r != me and store.check([_refused_key(r, mine)])]
        if refusers:
            return refusers, True
        missing = [r for r in missing if failures(store, r) < mine]
        if len(missing) <= int(peer_closed) or time.monotonic() >= deadline:
            return missing, False
        time.sleep(_POLL_S[min(polls, len(_POLL_S) - 1)])
        polls += 1


@contextmanager
def unrecorded() -> Iterator[None]:
    """Within the block a refused call is not recorded (``agree=True``'s checks: every rank
    raises together, so no rank is left waiting on another)."""
    token = _RECORDING.set(False)
    try:
        yield
    finally:
        _RECORDING.reset(token)


def refused(e: BaseException, scope: Sequence[int], me: int) -> None:
    """Record that global rank ``me`` refused a call over the ranks ``scope`` with ``e``
    before its first collective, for the members that went on into theirs to name it.
    Advisory: a store that cannot be written changes nothing."""
    if not _RECORDING.get() or len(scope) < 2:
        return
    store = default_store()
    if store is None:
        return
    with suppress(Exception):
        count = int(store.add(_key(me), 1))
        store.set(_refused_key(me, count), f"{type(e).__name__}: {_first_line(e)}"[:300])
        store.add(_alarm_key(scope, count), 1)


def _peer_reported(scope: Sequence[int], me: int) -> bool:
    """Whether a rank of ``scope`` reported a failure (or a refusal) this rank has not."""
    store = default_store()
    with suppress(Exception):
        return store is not None and bool(store.check([_alarm_key(scope, failures(store, me) + 1)]))
    return False


def watched_wait(work: Any, timeout: timedelta | None, scope: Sequence[int], me: int) -> None:
    """``work.wait`` (a gloo collective's; ``timeout`` None: the group's own) in slices of
    ``SLICE_S``, looking at the mesh's alarm after each: once a rank of ``scope`` reported
    a failure, a RuntimeError that says this rank stopped waiting."""
    deadline = None if timeout is None else time.monotonic() + timeout.total_seconds()
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= SLICE_S:
            work.wait(timeout=timedelta(seconds=max(left, 0.001)))  # the call's own timeout
            return
        try:
            work.wait(timeout=_SLICE)
            return
        except RuntimeError:
            if work.is_completed():
                work.wait()  # it finished meanwhile: its own result, or its own error
                return
        if _peer_reported(scope, me):
            raise RuntimeError("this rank stopped waiting: another rank of the mesh reported a failed "
                               "collective or refused the call")


def culprit_note(e: BaseException, members: Sequence[int], me: int, timeout: timedelta | None,
                 to_mesh: Mapping[int, int] | None = None) -> str:
    """One sentence on who is at fault for ``e``, the failure of a collective over the global
    ranks ``members`` seen by global rank ``me`` (``to_mesh``: global -> mesh rank, for the
    names, over the mesh's global ranks; ``timeout``: the collective's)."""
    if len(members) < 2:
        return "at fault: cannot be told (the group has one member)"
    store = default_store()
    if store is None:
        return "at fault: cannot be told (the process group has no store to ask)"
    timeout_s = timeout.total_seconds() if timeout is not None else 60.0
    peer_closed = bool(_PEER_CLOSED.search(str(e)))
    try:
        missing, refusal = roll_call(store, members, me, peer_closed, timeout_s,
                                     sorted(to_mesh) if to_mesh is not None else members)
        named = {(to_mesh.get(r, r) if to_mesh is not None else r): r for r in missing}
        names = sorted(named)
        reason = store.get(_refused_key(named[names[0]], failures(store, me))).decode() if refusal else ""
    except Exception as err:
        return f"at fault: cannot be told (the store could not be read: {type(err).__name__}: {_first_line(err)})"
    if refusal:
        who = f"rank {names[0]} (it" if len(names) == 1 else f"ranks {names} (they"
        return f"at fault: {who} refused this call before its first collective; rank {names[0]}: {reason})"
    if not names:
        return ("at fault: cannot be told (every member of the group failed here too: a slow rank, the "
                "network, or the same error everywhere)")
    if peer_closed and len(names) == 1:
        how = "it closed its connection, so it" if _CLOSED.search(str(e)) else "it"
        return (f"at fault: rank {names[0]} (the one member of the group that did not report this failure: "
                f"{how} died or left the group)")
    one = len(names) == 1
    who = f"rank {names[0]} (it did" if one else f"ranks {names} (they did"
    return (f"at fault: {who} not report this failure within {wait_s(timeout_s, peer_closed):g} s: "
            f"{'it died, hangs' if one else 'they died, hang'}, or never reached this collective)")


def _first_line(e: BaseException) -> str:
    text = str(e)
    return text.splitlines()[0] if text else ""


def collective_failure(where: str, e: BaseException, members: Sequence[int], me: int,
                       timeout: timedelta | None, to_mesh: Mapping[int, int] | None = None) -> CollectiveError:
    """The CollectiveError of a failed collective: ``where`` it failed, the error, who is at fault."""
    return CollectiveError(f"{where} failed: {e}\n{culprit_note(e, members, me, timeout, to_mesh)}")
