"""CUDA: LocalTensorMode on cuda tensors, a one-rank NCCL world, and (with 2+ GPUs) NCCL
ranks through ``shardc run``. Every test skips cleanly where no GPU is visible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from programs_for_tests import one_step  # noqa: E402
from torch_utils import as_numpy, from_local, local_mode, random_blocks, to_local  # noqa: E402

from lowering.simulator import simulate  # noqa: E402
from torch_backend.executor import execute  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")


@needs_cuda
@pytest.mark.parametrize("kind,axes,dims,src,dst,mesh", [
    ("all_gather", ("dp", "tp"), 0, "f64[10@(dp,tp)]", "f64[10]", "dp=2,tp=4"),
    ("reduce_scatter", "tp", 0, "f64[10,2]{U:tp}", "f64[10@tp,2]", "dp=2,tp=4"),
    ("all_to_all", "x", (0, 1), "f64[7@x,10]", "f64[7,10@x]", "x=4"),
    ("permute", ("dp", "tp"), 0, "f64[8@(dp,tp)]", "f64[8@(tp,dp)]", "dp=2,tp=4"),
])
def test_local_tensor_mode_on_cuda(fake_pg, kind, axes, dims, src, dst, mesh):
    program = one_step(kind, axes, dims, src, dst, mesh)
    blocks = random_blocks(program.src, program.mesh, np.random.default_rng(0))
    want = simulate(program, as_numpy(blocks))
    with local_mode(fake_pg, program.mesh.size) as lm:
        y = execute(program, to_local(lm, [b.cuda() for b in blocks]))
        outs = from_local(y)
    for o, w in zip(outs, want):
        assert o.is_cuda
        np.testing.assert_array_equal(o.cpu().numpy(), w)


def _shardc(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "torch_backend.cli", "run", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=170)


@needs_cuda
@pytest.mark.timeout(180)
def test_nccl_world_of_one():
    p = _shardc("--mesh", "dp=1", "f32[8@dp,4]", "f32[8,4]{U:dp}", "--backend", "nccl", "--check", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["ok"] and data["backend"] == "nccl" and data["device"].startswith("cuda")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.timeout(180)
@pytest.mark.parametrize("src,dst", [
    ("f32[10@(dp,tp)]", "f32[10]"),  # uneven ring of batch_isend_irecv
    ("f32[12@(dp,tp),10]", "f32[12@tp,10]"),  # exact all_to_all_single
    ("f32[10,6]{U:tp}", "f32[10@tp,6]"),  # reduce_scatter
])
def test_nccl_two_gpus(src, dst):
    n = torch.cuda.device_count()
    mesh = "dp=2,tp=2" if n >= 4 else "dp=1,tp=2"
    p = _shardc("--mesh", mesh, src, dst, "--backend", "nccl", "--check", "--json", "--timeout", "60")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["check"] is True
