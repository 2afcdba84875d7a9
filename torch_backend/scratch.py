"""Scratch buffers a bound program reuses across calls (docs/running.md, "Performance").

``buffer(plan, role, n, like)`` is a fresh flat tensor, or, inside ``using(scratch)``
(``BoundCall.run``), the buffer this (plan, role, dtype, device) got on the first call, per
thread. Only buffers that die within the step are scratch (a pack's send buffer, a
receive buffer unpacked into a new output), never a step's result, which a later call
would overwrite; async launches never use them.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from typing import Any

import torch


class Scratch:
    """The reused buffers of one bound program, per thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self, key: tuple[Any, ...], n: int, like: torch.Tensor, zero: bool) -> torch.Tensor:
        bufs = self._local.__dict__.setdefault("bufs", {})
        k = (*key, n, like.dtype, like.device)
        buf = bufs.get(k)
        if buf is None:
            buf = bufs[k] = like.new_zeros(n) if zero else like.new_empty(n)
        return buf


_ACTIVE: ContextVar[Scratch | None] = ContextVar("shardc_scratch", default=None)


class using:  # lower case: it reads as a function, ``with using(scratch):``
    """Make ``scratch`` the active buffers within the block (a class, not a generator:
    it runs on every call of a bound program)."""

    __slots__ = ("_scratch", "_token")

    def __init__(self, scratch: Scratch | None) -> None:
        self._scratch = scratch

    def __enter__(self) -> None:
        self._token = _ACTIVE.set(self._scratch)

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.reset(self._token)


def buffer(plan: object, role: str, n: int, like: torch.Tensor, zero: bool = False) -> torch.Tensor:
    """A flat ``n``-element buffer of ``like``'s dtype and device for ``role`` in ``plan``'s step.

    ``zero``: zero-filled when made (a reused one keeps whatever the step left outside
    the regions it writes, so only padding that no call writes may rely on it).
    """
    scratch = _ACTIVE.get()
    if scratch is None:
        return like.new_zeros(n) if zero else like.new_empty(n)
    return scratch.get((id(plan), role), n, like, zero)
