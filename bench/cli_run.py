"""When ``shardc run`` shows what: the program, the report, and the process's exit.

    python bench/cli_run.py [--rounds 3] [--baseline REV]

Each round runs ``shardc run --mesh dp=2 'f32[8@dp]' 'f32[8]'`` with ``--backend auto`` and
``--backend gloo`` (2 local ranks), for this tree and, with ``--baseline REV``, for git
revision REV (a ``git archive`` of it), taking turns. From the start of the command:
when the program's first line is printed, when the report (``ran on ...``) is, and when
the process has exited; medians over the rounds. The program is printed as soon as it
compiles, so ``auto`` should show it as soon as ``gloo`` does, and the exit should follow
the report at once; so should the end of its output, which a pipe (``| tee``) waits for:
the ranks' fork server holds the same stdout until it has exited too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.baseline_tree import trees as baseline_trees

ARGV = ["run", "--mesh", "dp=2", "f32[8@dp]", "f32[8]"]


def _once(tree: Path, backend: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "torch_backend.cli", *ARGV, "--backend", backend], cwd=tree,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seen: dict[str, float] = {}

    def read() -> None:  # the ranks' fork server may hold stdout open after the command exits
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("program on mesh"):
                seen.setdefault("program", time.perf_counter() - t0)
            if line.startswith("ran on"):
                seen.setdefault("report", time.perf_counter() - t0)
        seen["eof"] = time.perf_counter() - t0  # every holder of its stdout let go

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    rc = p.wait(timeout=600)
    seen["exit"] = time.perf_counter() - t0
    reader.join(timeout=30)
    if rc != 0 or "report" not in seen:
        raise SystemExit(f"shardc run --backend {backend} failed in {tree} (exit code {rc})")
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="a git revision to measure beside this tree")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = baseline_trees(args.baseline, tmp)
        rows: dict[tuple[str, str], list[dict[str, float]]] = {}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                for backend in ("auto", "gloo"):
                    rows.setdefault((name, backend), []).append(_once(tree, backend))
    print(f"shardc run {' '.join(ARGV[1:])}, seconds from the start, median of {args.rounds}")
    print(f"{'tree':>12} | backend | program shown | report | exit | exit - report | output closed - report")
    for (name, backend), got in rows.items():
        med = {k: statistics.median(r[k] for r in got) for k in ("program", "report", "exit")}
        gap = statistics.median(r["exit"] - r["report"] for r in got)
        eof = statistics.median(r["eof"] - r["report"] for r in got)
        print(f"{name:>12} | {backend:>7} | {med['program']:13.2f} | {med['report']:6.2f} | {med['exit']:4.2f} | "
              f"{gap:13.2f} | {eof:22.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
