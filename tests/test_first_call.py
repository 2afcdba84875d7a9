"""The first eager ``redistribute`` of a plain tensor in a fresh process imports neither
``torch._dynamo`` (over a second) nor ``torch.distributed.tensor`` (about 0.7 s): a
plain eager user, in a gloo group of one rank, pays for neither (``bench/first_call.py``
times it). A trace imports the marked regions itself (``torch_backend.trace_marks``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]

_FIRST_CALL = r"""
import json, sys, tempfile
import torch
import torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
import torch_backend
y = torch_backend.redistribute(torch.arange(8.0), "f32[8@dp]", "f32[8]", "dp=1")
z = torch_backend.redistribute_many([y], ["f32[8]"], ["f32[8@dp]"], "dp=1")[0]
w = torch_backend.redistributor("f32[8@dp]", "f32[8]", "dp=1")(z)
print(json.dumps({"values": w.tolist(), "loaded": [m for m in ("torch._dynamo", "torch.distributed.tensor")
                                                    if m in sys.modules]}))
"""


@pytest.mark.timeout(200)
def test_a_first_eager_call_loads_neither_dynamo_nor_dtensor() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", _FIRST_CALL], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.splitlines()[-1])
    assert got["values"] == list(range(8))
    assert got["loaded"] == []


def test_the_constant_mark_is_dynamos() -> None:
    # traced.constant_result sets what torch.compiler.assume_constant_result sets, without
    # importing dynamo: a torch release that marks another way fails here
    from torch_backend.traced import constant_result

    def f() -> int:
        return 1

    def g() -> int:
        return 1

    torch.compiler.assume_constant_result(f)
    constant_result(g)
    assert vars(f) == vars(g) == {"_dynamo_marked_constant": True}
