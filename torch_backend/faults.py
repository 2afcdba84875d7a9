"""A collective that failed, and which rank is at fault: a roll call in the default store.

A failed collective rarely names anyone: gloo says ``Connection reset by peer
[127.0.0.1]:24982`` (an address, not a rank) or ``Operation timed out!``, NCCL a
timeout. So a rank whose collective (or group creation) failed adds one to its count of
failed collectives in the default process group's store (the TCPStore every rank reached
at start-up, which outlives a rank that died) and waits, a bounded time, for the other
members of the group to do the same. The members that never do are the ones at fault: they
died, hang, or never reached this collective. Nothing is written on the hot path: the
store is touched only after a failure.

How long a member waits depends on what failed:

* a peer closed its connection (gloo's "closed by peer" / "reset by peer"): the peer that
  closed it cannot report, so once every member but one has reported, that one is named;
  otherwise up to the collective timeout plus a grace, by which time the members still
  blocked elsewhere in the collective have timed out and reported too;
* anything else (a timeout, above all): the members of the same collective fail at about
  the same time, so a grace after this one's failure.

Where every member reports, the process group cannot tell who is at fault, and the note
says so; where the store cannot be read, it says that instead.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any


class CollectiveError(RuntimeError):
    """A collective failed or timed out (a peer died, hung, or the group broke)."""


_PEER_CLOSED = re.compile(r"(closed|reset) by peer", re.IGNORECASE)
_POLL_S = (0.02, 0.05, 0.1, 0.2, 0.5)  # the roll call's polls, then every 0.5 s


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
        try:
            return pg._get_backend(torch.device(device)).options._timeout
        except Exception:  # no such backend on this group, or a torch without these names
            continue
    return None


def default_store() -> Any | None:
    """The default process group's store (None where there is none)."""
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def _key(rank: int) -> str:
    return f"shardc/faults/{rank}"


def failures(store: Any, rank: int) -> int:
    """How many failed collectives (global) ``rank`` has reported in ``store``."""
    return int(store.add(_key(rank), 0))


def roll_call(store: Any, members: Sequence[int], me: int, peer_closed: bool, timeout_s: float) -> list[int]:
    """The members (global ranks) that did not report this failure.

    Adds one to this rank's count of failed collectives, then polls the other members'
    until each has caught up (a member that failed in another group, say one step
    earlier, is a fellow victim too), or (``peer_closed``) all but one have, or the
    deadline (see the module docstring). Raises what the store raises."""
    mine = int(store.add(_key(me), 1))
    deadline = time.monotonic() + wait_s(timeout_s, peer_closed)
    missing = [r for r in members if r != me]
    polls = 0
    while True:
        missing = [r for r in missing if failures(store, r) < mine]
        if len(missing) <= int(peer_closed) or time.monotonic() >= deadline:
            return missing
        time.sleep(_POLL_S[min(polls, len(_POLL_S) - 1)])
        polls += 1


def culprit_note(e: BaseException, members: Sequence[int], me: int, timeout: timedelta | None,
                 to_mesh: Mapping[int, int] | None = None) -> str:
    """One sentence on who is at fault for ``e``, the failure of a collective over the global
    ranks ``members`` seen by global rank ``me`` (``to_mesh``: global -> mesh rank, for the
    names; ``timeout``: the collective's)."""
    if len(members) < 2:
        return "at fault: cannot be told (the group has one member)"
    store = default_store()
    if store is None:
        return "at fault: cannot be told (the process group has no store to ask)"
    timeout_s = timeout.total_seconds() if timeout is not None else 60.0
    peer_closed = bool(_PEER_CLOSED.search(str(e)))
    try:
        missing = roll_call(store, members, me, peer_closed, timeout_s)
    except Exception as err:
        return f"at fault: cannot be told (the store could not be read: {type(err).__name__}: {_first_line(err)})"
    names = sorted(to_mesh.get(r, r) for r in missing) if to_mesh is not None else sorted(missing)
    if not names:
        return ("at fault: cannot be told (every member of the group failed here too: a slow rank, the "
                "network, or the same error everywhere)")
    if peer_closed and len(names) == 1:
        return (f"at fault: rank {names[0]} (the one member of the group that did not report this failure: "
                "it closed its connection, so it died or left the group)")
    if len(names) == 1:
        return (f"at fault: rank {names[0]} (it did not report this failure within "
                f"{wait_s(timeout_s, peer_closed):g} s: it died, hangs, or never reached this collective)")
    return (f"at fault: ranks {names} (they did not report this failure within "
            f"{wait_s(timeout_s, peer_closed):g} s: they died, hang, or never reached this collective)")


def _first_line(e: BaseException) -> str:
    text = str(e)
    return text.splitlines()[0] if text else ""


def collective_failure(where: str, e: BaseException, members: Sequence[int], me: int,
                       timeout: timedelta | None, to_mesh: Mapping[int, int] | None = None) -> CollectiveError:
    """The CollectiveError of a failed collective: ``where`` it failed, the error, who is at fault."""
    return CollectiveError(f"{where} failed: {e}\n{culprit_note(e, members, me, timeout, to_mesh)}")
