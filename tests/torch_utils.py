"""Helpers for the executor tests: LocalTensor <-> per-rank arrays, random typed data,
the denotation inner product, and a gloo process pool that runs scenarios in N ranks."""

from __future__ import annotations

import math
import os
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import numpy as np
import torch
from typed_data import pairing, random_arrays

from lowering.layout import local_shape
from spec_lang.ir import Mesh, TensorType

# ---- LocalTensorMode --------------------------------------------------------------------


@contextmanager
def local_mode(fake_pg: Callable[[int], None], world: int):
    """A fake world of ``world`` ranks and LocalTensorMode over all of them."""
    from torch.distributed._local_tensor import LocalTensorMode

    fake_pg(world)
    with LocalTensorMode(world) as lm:
        yield lm


def to_local(lm: Any, blocks: list[torch.Tensor], requires_grad: bool = False) -> torch.Tensor:
    from torch.distributed._local_tensor import LocalTensor

    with lm.disable():
        lt = LocalTensor({r: b.detach().clone() for r, b in enumerate(blocks)})
    if requires_grad:
        lt.requires_grad_(True)
    return lt


def from_local(t: torch.Tensor) -> list[torch.Tensor]:
    inner = t._local_tensors
    return [inner[r].detach().clone() for r in sorted(inner)]


def as_numpy(blocks: list[torch.Tensor]) -> list[np.ndarray]:
    return [b.detach().cpu().numpy() for b in blocks]


# ---- random typed data ------------------------------------------------------------------


def random_blocks(t: TensorType, mesh: Mesh, rng: np.random.Generator,
                  dtype: torch.dtype = torch.float64, lo: int = -9, hi: int = 10) -> list[torch.Tensor]:
    """``typed_data.random_arrays`` as tensors of ``dtype``."""
    return [torch.tensor(a, dtype=dtype) for a in random_arrays(t, mesh, rng, lo, hi)]


def shapes_ok(t: TensorType, mesh: Mesh, blocks: list[torch.Tensor]) -> bool:
    return all(tuple(b.shape) == local_shape(t, mesh, r) for r, b in enumerate(blocks))


# ---- real gloo ranks --------------------------------------------------------------------


def _pool_worker(rank: int, world: int, port: int, tasks: Any, results: Any, timeout_s: float) -> None:
    """One rank of a :class:`GlooPool`: joins the group through the parent's store, then
    runs jobs until it is told to stop."""
    import torch.distributed as dist

    try:
        store = dist.TCPStore("127.0.0.1", port, world + 1, False, timeout=timedelta(seconds=timeout_s))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
    except BaseException as e:  # report everything: the parent asserts on it
        results.put((rank, None, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return
    results.put((rank, None, "ready", None))
    while (job := tasks.get()) is not None:
        job_id, fn, args = job
        try:
            results.put((rank, job_id, "ok", fn(rank, world, *args)))
        except BaseException as e:
            results.put((rank, job_id, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    results.close()
    results.join_thread()
    os._exit(0)  # no destroy_process_group: it waits on the peers, and the pool is done with them


class GlooPool:
    """``world`` gloo ranks, started once and reused: ``run(fn, *args)`` calls
    ``fn(rank, world, *args)`` on every rank and returns ``{rank: result}``.

    The parent hosts the TCPStore on a port the OS picks (port 0) and hands its number
    to the ranks, so no other process can take the port in between. A job that fails on
    any rank, or runs past its timeout, tears the pool down (its group may be broken)
    and raises AssertionError with every rank's error; the next job starts a fresh pool.
    """

    def __init__(self, world: int, collective_timeout_s: float = 30.0, start_timeout_s: float = 180.0) -> None:
        self.world = world
        self.collective_timeout_s = collective_timeout_s
        self.start_timeout_s = start_timeout_s
        self._procs: list[Any] = []
        self._jobs = 0

    def _start(self) -> None:
        import torch.distributed as dist

        from torch_backend.procs import rank_context, rank_process

        # the ranks shardc run starts: forked from a server that imported torch once, and here
        # what the pool's jobs load in every rank (autograd's first grad loads sympy)
        ctx = rank_context(preload=["torch.fx.experimental.symbolic_shapes", "torch.distributed._local_tensor",
                                    "torch_backend.api", "pytest"])
        self._store = dist.TCPStore("127.0.0.1", 0, self.world + 1, True, wait_for_workers=False,
                                    timeout=timedelta(seconds=self.collective_timeout_s))
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(self.world)]
        self._procs = [rank_process(ctx, _pool_worker, r, self.world, self._store.port, self._tasks[r],
                                    self._results, self.collective_timeout_s)
                       for r in range(self.world)]
        for p in self._procs:
            p.start()
        try:
            self._collect(None, self.start_timeout_s, "start")
        except AssertionError:
            self.close()
            raise

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float = 120.0) -> dict[int, Any]:
        if not self._procs:
            self._start()
        self._jobs += 1
        for q in self._tasks:
            q.put((self._jobs, fn, args))
        try:
            return self._collect(self._jobs, timeout_s, getattr(fn, "__name__", "job"))
        except BaseException:  # a failure, or the test's own timeout: the ranks may be mid-job
            self.close()
            raise

    def _collect(self, job_id: int | None, timeout_s: float, what: str) -> dict[int, Any]:
        import queue as queue_mod
        import time

        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout_s
        while len(results) + len(errors) < self.world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"gloo {what}: ranks did not finish in {timeout_s}s; done: {sorted(results)}, "
                                     f"errors: {errors}")
            try:
                rank, jid, status, payload = self._results.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                for r, p in enumerate(self._procs):
                    if p.exitcode is not None and r not in results and r not in errors:
                        errors[r] = f"exited with code {p.exitcode}"
                continue
            if jid != job_id:
                continue  # a stale report of an earlier, failed job
            (errors if status == "error" else results)[rank] = payload
        if errors:
            raise AssertionError(f"gloo {what}: rank errors:\n" +
                                 "\n".join(f"[rank {r}] {e}" for r, e in sorted(errors.items())))
        return results

    def close(self) -> None:
        """Stop the ranks (asked first, then killed) and drop the store."""
        for q in getattr(self, "_tasks", []):
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._procs = []
        self._store = None


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def adjoint(fake_pg: Callable[[int], None], mesh_text: Any, src_text: Any, dst_text: Any,
            seed: int = 0) -> tuple[float, float]:
    """<redistribute(x), y> and <x, grad> on random integer data (types as text or IR)."""
    import torch_backend
    from spec_lang import parse, parse_mesh
    from spec_lang.dual import dual_type

    mesh = parse_mesh(mesh_text)
    src, dst = parse(src_text), parse(dst_text)
    rng = np.random.default_rng(seed)
    xb = random_blocks(src, mesh, rng)
    yb = random_blocks(dual_type(dst), mesh, rng)
    with local_mode(fake_pg, mesh.size) as lm:
        x = to_local(lm, xb, requires_grad=True)
        y = to_local(lm, yb)
        out = torch_backend.redistribute(x, src, dst, mesh)
        (grad,) = torch.autograd.grad(out, x, grad_outputs=y)
        outs, grads = from_local(out), from_local(grad)
    return pairing(dst, mesh, outs, yb), pairing(src, mesh, xb, grads)


def run_once(world: int, fn: Callable[..., Any], *, collective_timeout_s: float, timeout_s: float) -> dict[int, Any]:
    """One job on a pool of ``world`` gloo ranks of its own, closed after it (a module
    fixture's whole run: the job's ranks must not share a pool with other tests)."""
    pool = GlooPool(world, collective_timeout_s=collective_timeout_s)
    try:
        return pool.run(fn, timeout_s=timeout_s)
    finally:
        pool.close()
