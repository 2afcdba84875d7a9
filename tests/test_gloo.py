"""Real gloo process groups: 8 ranks (the shared ``gloo_pool`` runs every scenario in one
job) and ``shardc run`` on 4 ranks. Small tensors, hard timeouts everywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch_utils import pairing, random_blocks  # noqa: E402

import lowering  # noqa: E402
from spec_lang import parse, parse_mesh  # noqa: E402
from spec_lang.dual import dual_type  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

REPO = Path(__file__).resolve().parents[1]
MESH = "dp=2,tp=4"
FORWARD = [  # (name, src, dst): exact check against the destination's slices and the simulator
    ("flat-uneven-gather", "f32[10@(dp,tp)]", "f32[10]"),
    ("flat-listed-gather", "f32[8@(tp,dp),3]", "f32[8,3]"),
    ("uneven-all_to_all", "f32[12@(dp,tp),10]", "f32[12@tp,10]"),
    ("uneven-a2a-1axis", "f32[7@tp,10]", "f32[7,10@tp]"),
    ("permute", "f32[8@(dp,tp),2]", "f32[8@(tp,dp),2]"),
    ("two-dim-uneven-gather", "f32[10@dp,5@tp]", "f32[10,5]"),  # one ring over (dp,tp)
    ("two-dim-rs", "f32[8,6]{U:(dp,tp)}", "f32[8@tp,6@dp]"),  # one reduce_scatter onto 2 dims
    ("partial-padded-rs", "f32[10,6]{U:tp}", "f32[10@tp,6]"),
    ("partial-flat-ar", "f32[5,3]{U:(dp,tp)}", "f32[5,3]"),
    ("partial-avg", "f32[8,4]{P(avg):dp}", "f32[8,4@dp]"),
    ("partial-max", "f32[6]{P(max):tp}", "f32[6]"),
    ("partial-dst", "f32[8@dp,16]{U:tp}", "f32[8@dp,16@tp]"),
    ("bf16", "bf16[12@(dp,tp),10]", "bf16[12@tp,10]"),
    ("i32", "i32[6,10@(tp,dp)]", "i32[6@dp,10]"),
    ("bool", "bool[10@(dp,tp)]", "bool[10]"),
    ("complex-avg", "c64[8,6]{P(avg):(dp,tp)}", "c64[8@tp,6]"),  # both parts divided, both parts checked
    ("complex-a2a", "c128[12@(dp,tp),10]", "c128[12@tp,10]"),
]
BACKWARD = [
    ("f64[10@(dp,tp)]", "f64[10]{R:(dp,tp)}"),
    ("f64[12@(dp,tp),10]", "f64[12@tp,10]"),
    ("f64[8,4]{U:(dp,tp)}", "f64[8@tp,4]"),
    ("f64[8]{R:dp}", "f64[8@tp]"),
]


def _np(t):
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def scenarios(rank: int, world: int) -> dict:
    """Runs on every rank of the 8-rank gloo world."""
    import lowering
    from lowering.simulator import simulate
    from torch_backend import redistribute
    from torch_backend.data import block, global_tensor
    from torch_backend.worker import check_output

    mesh = parse_mesh(MESH)
    out: dict = {}
    for name, src, dst in FORWARD:
        s = parse(src)
        g = global_tensor(s)
        x = block(s, mesh, g, rank)
        x0 = x.clone()
        y = redistribute(x, src, dst, MESH, timeout=20)
        program = lowering.compile(src, dst, MESH)
        ref = simulate(program, [_np(block(s, mesh, g, r)) for r in range(world)])[rank]
        from torch_backend.groups import context

        ok = check_output(program, context(mesh), g, y)
        out[name] = bool(ok and np.array_equal(_np(y), ref) and torch.equal(x, x0))
    # backward: return this rank's blocks; the parent evaluates the pairings
    for src, dst in BACKWARD:
        s, d = parse(src), parse(dst)
        rng = np.random.default_rng(11)  # the same on every rank, so every rank builds the same blocks
        xb = random_blocks(s, mesh, rng)
        yb = random_blocks(dual_type(d), mesh, rng)
        x = xb[rank].clone().requires_grad_(True)
        y = redistribute(x, src, dst, MESH)
        (grad,) = torch.autograd.grad(y, x, grad_outputs=yb[rank])
        out[f"bwd {src}->{dst}"] = (y.detach().tolist(), grad.tolist())
    # a named DeviceMesh instead of a mesh string (single-axis groups come from it)
    from torch.distributed.device_mesh import init_device_mesh

    dm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    s = parse("f32[12@(dp,tp),10]")
    g = global_tensor(s)
    y = redistribute(block(s, mesh, g, rank), s, "f32[12,10@tp]", dm)
    out["device-mesh"] = bool(torch.equal(y, block(parse("f32[12,10@tp]"), mesh, g, rank)))
    # create_graph=True through the lean one-step run on a real group: the gradient's own
    # derivative along v is the forward program on v (dual is an involution here)
    src, dst = "f64[8,6]{U:(dp,tp)}", "f64[8@tp,6@dp]"
    rng = np.random.default_rng(12)
    xb, yb, vb = (random_blocks(t, mesh, rng) for t in (parse(src), dual_type(parse(dst)), parse(src)))
    x, gy = xb[rank].clone().requires_grad_(True), yb[rank].clone().requires_grad_(True)
    (gx,) = torch.autograd.grad(redistribute(x, src, dst, MESH), x, gy, create_graph=True)
    (along,) = torch.autograd.grad(gx, gy, vb[rank])
    out["second-order"] = bool(gx.requires_grad and torch.equal(along, redistribute(vb[rank], src, dst, MESH)))
    return out


@pytest.fixture(scope="module")
def gloo8(gloo_pool) -> dict:
    return gloo_pool.run(scenarios, timeout_s=150)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("name", [n for n, _, _ in FORWARD] + ["device-mesh", "second-order"])
def test_gloo_forward(gloo8, name):
    bad = [r for r, res in gloo8.items() if not res[name]]
    assert not bad, f"{name}: wrong on ranks {bad}"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("src,dst", BACKWARD)
def test_gloo_backward_is_adjoint(gloo8, src, dst):
    mesh = parse_mesh(MESH)
    s, d = parse(src), parse(dst)
    rng = np.random.default_rng(11)
    xb = random_blocks(s, mesh, rng)
    yb = random_blocks(dual_type(d), mesh, rng)
    key = f"bwd {src}->{dst}"
    outs = [torch.tensor(gloo8[r][key][0], dtype=torch.float64) for r in range(8)]
    grads = [torch.tensor(gloo8[r][key][1], dtype=torch.float64) for r in range(8)]
    assert pairing(d, mesh, [o.reshape(b.shape) for o, b in zip(outs, yb)], yb) == \
        pairing(s, mesh, xb, [g.reshape(b.shape) for g, b in zip(grads, xb)])


def test_the_run_check_sees_an_imaginary_part() -> None:
    """``shardc run --check`` compares complex blocks in complex128: a wrong imaginary part
    alone fails it (float64 would have dropped it)."""
    from types import SimpleNamespace

    from torch_backend.data import block, global_tensor
    from torch_backend.worker import check_output

    program = lowering.compile("c64[12@(dp,tp),10]", "c64[12@tp,10]", MESH)
    g = global_tensor(program.src)
    ctx = SimpleNamespace(rank=5)  # no pending axis on the destination: the check reads only the rank
    y = block(program.dst, parse_mesh(MESH), g, 5)
    assert bool((y.imag != 0).any()) and check_output(program, ctx, g, y)
    assert not check_output(program, ctx, g, y.conj().resolve_conj())


def _shardc(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "torch_backend.cli", *args], cwd=REPO, env=e,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(150)
def test_shardc_run_json_check_bench():
    p = _shardc("run", "--mesh", "dp=2,tp=2", "f32[10@(dp,tp),3]", "f32[10@tp,3]", "--check", "--bench", "3",
                "--json", "--timeout", "20")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["ok"] is True and data["ranks"] == 4 and data["check"] is True
    assert data["time_s"] > 0 and data["steps"] and all(s["time_s"] > 0 for s in data["steps"])


@pytest.mark.timeout(60)
def test_shardc_run_bad_type_fails_before_spawning():
    p = _shardc("run", "--mesh", "dp=2", "f32[8@tp]", "f32[8]", timeout=50)
    assert p.returncode == 2
    assert "not on the mesh" in p.stderr and "hint" in p.stderr


_TORCHRUN_SCRIPT = """
import torch, torch.distributed as dist
import torch_backend
dist.init_process_group("gloo")
r = dist.get_rank()
x = torch.arange(120, dtype=torch.float32).reshape(12, 10)[3 * r:3 * r + 3].clone()
for dst in ("f32[12@tp,10]", "f32[12,10@dp]", "f32[12,10]"):
    y = torch_backend.redistribute(x, "f32[12@(dp,tp),10]", dst, "dp=2,tp=2")
dist.destroy_process_group()
open(f"done{r}", "w").write(str(tuple(y.shape)))
"""


@pytest.mark.timeout(150)
def test_a_torchrun_script_exits_cleanly(tmp_path: Path) -> None:
    """Under torchrun, a script that redistributes and destroys its group exits 0. The
    groups shardc kept once outlived destroy_process_group and went down with the
    interpreter, which aborted about every other run ("terminate called without an active
    exception") and made torchrun report a failed rank."""
    script = tmp_path / "user.py"
    script.write_text(_TORCHRUN_SCRIPT)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                        str(script)], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=140)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "terminate called" not in out, out[-3000:]
    assert [(tmp_path / f"done{r}").read_text() for r in range(4)] == ["(12, 10)"] * 4
