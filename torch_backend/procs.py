"""Starting rank processes on this machine quickly.

Each rank needs torch, whose import dominates a rank's start-up (seconds each, and a
machine with few cores imports them a few at a time). Ranks are therefore forked from
a fork server that imported torch and shardc once (``multiprocessing``'s "forkserver"
start method, preloaded); where that method does not exist they are spawned. Neither
inherits the parent's state: the server is a fresh interpreter that has run nothing but
imports (no CUDA, no thread pool), so a forked rank starts as clean as a spawned one.

The server is one per parent process and runs with the parent's environment at its
start (set ``OMP_NUM_THREADS`` and the like before :func:`rank_context`); starting it
before the parent imports torch lets the two imports run side by side. Unlike a
spawned process it does not get the parent's ``sys.path``, so a rank's entry point is
named (module and function) and looked up only once the parent's path is in place.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

# what every rank loads anyway: paid once, in the server
PRELOAD = ["torch_backend.rank_preload"]


def rank_context(preload: Sequence[str] = ()) -> Any:
    """The multiprocessing context that starts ranks: forkserver with torch preloaded, or spawn.

    Starts the server now (if it is not running), so that it imports torch while the caller
    goes on; the ranks' ``OMP_NUM_THREADS`` defaults to 1 (one thread per rank). ``preload``:
    more modules for the server to import, if this call starts it (the first caller's
    list stays: ranks import what is missing themselves)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, *preload])  # no effect once this process's server runs
    forkserver.ensure_running()
    return ctx


def rank_process(ctx: Any, target: Callable[..., Any], *args: Any) -> Any:
    """A daemon process (not started) running ``target(*args)``; ``target`` is a module-level
    function, found by name under the parent's ``sys.path`` (``args`` travel as pickles,
    so their types must import without it: builtins, queues, shardc's own)."""
    return ctx.Process(target=_run, args=(list(sys.path), target.__module__, target.__qualname__, args),
                       daemon=True)


def _run(path: list[str], module: str, name: str, args: tuple[Any, ...]) -> None:
    sys.path[:0] = [p for p in path if p not in sys.path]
    getattr(importlib.import_module(module), name)(*args)
