"""Starting rank processes on this machine quickly: forked from a fork server that
imported torch and shardc once (docs/running.md, "One machine"), a fresh interpreter that
has run nothing but imports (no CUDA, no thread pool), so a forked rank starts as clean as
a spawned one. The server starts with the parent's environment at that moment (what torch
reads as it loads, ``OMP_NUM_THREADS``, must be set before :func:`rank_context`), and
without the parent's ``sys.path``: a rank gets both from the parent when it starts, and
its entry point is found by name after that.
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
    """The context that starts ranks: forkserver with torch preloaded (started now, so that it
    imports torch while the caller goes on), or spawn; one thread per rank unless
    ``OMP_NUM_THREADS`` says otherwise. ``preload``: more modules, if this call starts the
    server (ranks import what is missing themselves)."""
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
