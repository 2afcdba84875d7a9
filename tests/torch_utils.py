"""Helpers for the executor tests: LocalTensor <-> per-rank arrays, random typed data,
the denotation inner product, and a gloo process pool that runs scenarios in N ranks."""

from __future__ import annotations

import math
import os
import socket
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pool_main(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple, q: Any,
               timeout_s: float) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        q.put((rank, "ok", fn(rank, world, *args)))
    except BaseException as e:  # report everything: the parent asserts on it
        q.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_gloo(world: int, fn: Callable[..., Any], *args: Any, timeout_s: float = 60.0,
             collective_timeout_s: float = 30.0) -> dict[int, Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` gloo ranks; returns {rank: result}.

    Raises AssertionError with every rank's error if any rank fails, or if the ranks do
    not finish within ``timeout_s`` (then they are killed).
    """
    import queue as queue_mod

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    procs = [ctx.Process(target=_pool_main, args=(r, world, port, fn, args, q, collective_timeout_s))
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    import time

    deadline = time.monotonic() + timeout_s
    try:
        while len(results) + len(errors) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"gloo ranks did not finish in {timeout_s}s; done: {sorted(results)}, "
                                     f"errors: {errors}")
            try:
                rank, status, payload = q.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                        and r not in results and r not in errors]
                for r in dead:
                    errors[r] = f"exited with code {procs[r].exitcode}"
                continue
            (results if status == "ok" else errors)[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    if errors:
        raise AssertionError("rank errors:\n" + "\n".join(f"[rank {r}] {e}" for r, e in sorted(errors.items())))
    return results


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
