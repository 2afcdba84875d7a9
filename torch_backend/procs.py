"""Starting rank processes on this machine quickly.

Each rank needs torch, whose import dominates a rank's start-up (seconds each, and a
machine with few cores imports them a few at a time). Ranks are therefore forked from
a fork server that imported torch and shardc once (``multiprocessing``'s "forkserver"
start method, preloaded); where that method does not exist they are spawned. Neither
inherits the parent's state: the server is a fresh interpreter that has run nothing but
imports (no CUDA, no thread pool), so a forked rank starts as clean as a spawned one.

The server is one per parent process. It imports the parent's main script, as spawn
does (so a function defined there can be a rank's entry point), then the preloads, with
the parent's environment at its start: what torch reads as it loads (``OMP_NUM_THREADS``)
must be set before :func:`rank_context`; each rank then gets the parent's environment as
it is when the rank starts (CUDA, NCCL and shardc settings are read after that). Starting
the server before the parent imports torch lets the two imports run side by side. Unlike
a spawned process it does not get the parent's ``sys.path``, so a rank's entry point is
named (module and function) and looked up only once the parent's path is in place.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

# the parent's main script (spawn's behaviour), then what every rank loads anyway: paid once
PRELOAD = ["__main__", "torch_backend.rank_preload"]


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
    return ctx.Process(target=_run, daemon=True,
                       args=(list(sys.path), dict(os.environ), target.__module__, target.__qualname__, args))


def _run(path: list[str], env: dict[str, str], module: str, name: str, args: tuple[Any, ...]) -> None:
    sys.path[:0] = [p for p in path if p not in sys.path]
    os.environ.clear()
    os.environ.update(env)
    getattr(importlib.import_module(module), name)(*args)
