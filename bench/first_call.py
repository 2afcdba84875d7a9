"""What the first eager ``redistribute`` of a plain tensor costs a fresh process, beyond
``import torch``, and which heavy torch modules it loads:

    python bench/first_call.py [--rounds 7] [--baseline REV]

Each round starts two fresh processes: one that only imports torch, and one that imports
torch, starts a 1-rank gloo group (as a plain eager user does), then imports
``torch_backend`` and makes one ``redistribute`` (``f32[8@dp] -> f32[8]`` on ``dp=1``).
The second process times its own steps; the figure is "import torch_backend + the first
call", the time from the group being up to the result (wall, and the process's CPU
time, which a loaded machine inflates less, and of that the CPU time of the collector's
full passes: the first one after ``import torch`` walks torch's objects, whatever code runs
next), median over the rounds.
``--baseline REV`` measures git revision REV too (a ``git archive`` of it, in the same
rounds, the two trees taking turns). Target: <= 0.3 s, and neither ``torch._dynamo`` nor
``torch.distributed.tensor`` loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.baseline_tree import ROOT
from bench.baseline_tree import trees as baseline_trees

_CHILD = r"""
import gc, json, sys, tempfile, time
t0 = time.perf_counter()
import torch
import torch.distributed as dist
t1 = time.perf_counter()
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
full = []  # the collector's full passes in the window (over torch's objects, as any code after import torch meets)
gc.callbacks.append(lambda phase, info: info["generation"] == 2 and full.append((phase, time.process_time())))
t2, c2 = time.perf_counter(), time.process_time()
from torch_backend import redistribute
y = redistribute(torch.arange(8.0), "f32[8@dp]", "f32[8]", "dp=1")
t3, c3 = time.perf_counter(), time.process_time()
assert y.tolist() == list(range(8))
gc_cpu = sum(b[1] - a[1] for a, b in zip(full[::2], full[1::2]))
print(json.dumps({"import_torch": t1 - t0, "first_call": t3 - t2, "first_call_cpu": c3 - c2, "gc_cpu": gc_cpu,
                  "dynamo": "torch._dynamo" in sys.modules,
                  "dtensor": "torch.distributed.tensor" in sys.modules}))
"""


def _child(tree: Path, code: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True,
                       timeout=300, check=True)
    return json.loads(p.stdout.splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--baseline", default=None, help="a git revision to measure beside this tree")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = baseline_trees(args.baseline, tmp)
        rows: dict[str, list[dict]] = {name: [] for name in trees}
        bare: list[float] = []
        for _ in range(args.rounds):
            bare.append(_child(ROOT, "import json, time\nt = time.perf_counter()\nimport torch\n"
                                     "print(json.dumps({'s': time.perf_counter() - t}))")["s"])
            for name, tree in trees.items():
                rows[name].append(_child(tree, _CHILD))
    print(f"import torch alone: {statistics.median(bare):.3f} s (median of {args.rounds} fresh processes)")
    print(f"{'tree':>12} | import torch | torch_backend + first redistribute (CPU; full GC) | torch._dynamo | "
          "torch.distributed.tensor")
    failed = False
    for name, got in rows.items():
        first = statistics.median(r["first_call"] for r in got)
        cpu = statistics.median(r["first_call_cpu"] for r in got)
        gc_cpu = statistics.median(r["gc_cpu"] for r in got)
        dynamo, dtensor = any(r["dynamo"] for r in got), any(r["dtensor"] for r in got)
        print(f"{name:>12} | {statistics.median(r['import_torch'] for r in got):10.3f} s | {first:24.3f} s "
              f"({cpu:.3f} s; {gc_cpu:.3f} s) | "
              f"{'loaded' if dynamo else 'not loaded':>13} | {'loaded' if dtensor else 'not loaded':>24}")
        if name == "this tree":
            failed = first > 0.3 or dynamo or dtensor
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
