"""PyTorch's own DTensor tests with shardc's DTensor engine off and on, in one run.

    PYTHONPATH=. python bench/pytorch_dtensor_tests.py [FOLDER] [--timeout 300] [-k EXPR]

FOLDER (default ``bench/.pytorch_tests``, gitignored) holds ``test_redistribute.py`` and
``test_dtensor.py`` from pytorch/pytorch's ``test/distributed/tensor/`` and, in ``_deps``,
``expecttest`` (torch's test harness imports it; ``pip install --target FOLDER/_deps
expecttest``). Nothing here touches the network. Each file runs under pytest twice, in torch's
own harness (DTensorTestBase: one gloo process per rank; its ``...WithLocalTensor`` twins: all
ranks in one process under LocalTensorMode): engine off, then engine on for the whole test
process and every rank it spawns (``bench/pytorch_tests_site/sitecustomize.py``, read at
start-up, calls ``torch_backend.use_dtensor_engine()``). The same hook holds the one
compatibility shim: the test files name ``MaskPartial``, which torch 2.13 names
``_MaskPartial``.

Prints per file passed/failed/errored/skipped off and on, every test that fails with the
engine on and passes with it off, sorted into three kinds (``collective``: the test checks
DTensor's own choice of collectives, counted by CommDebugMode or traced by DebugMode;
``defect``: it checks a known DTensor defect that shardc fixes; ``bug``: anything else), the
tests the engine fixes, and ``dtensor_engine_stats()`` summed over the engine-on processes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FILES = ("test_redistribute.py", "test_dtensor.py")

# tests whose engine-on failure was triaged by reading the test (kind, one-line reason);
# a failure not listed here is sorted by its traceback, and one that matches nothing is a bug
TRIAGED: dict[str, tuple[str, str]] = {}

_COLLECTIVE = re.compile(r"comm_counts|get_total_counts|trace_str")


def _run(folder: Path, name: str, engine: bool, timeout: int, kexpr: str | None,
         stats_dir: Path) -> tuple[dict[str, tuple[str, str]], float, str]:
    xml = stats_dir / f"{name}.{int(engine)}.xml"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE / "pytorch_tests_site"), str(folder / "_deps"), str(ROOT), env.get("PYTHONPATH", "")])
    env["SHARDC_PYTORCH_TESTS"] = "1"
    env["SHARDC_DTENSOR_ENGINE"] = "1" if engine else "0"
    env["SHARDC_ENGINE_STATS"] = str(stats_dir)
    cmd = [sys.executable, "-m", "pytest", str(folder / name), "-q", "-p", "no:cacheprovider",
           f"--timeout={timeout}", f"--junitxml={xml}", "--rootdir", str(folder), "-o", "addopts="]
    if kexpr:
        cmd += ["-k", kexpr]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    results: dict[str, tuple[str, str]] = {}
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            test = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
            outcome, text = "passed", ""
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = {"failure": "failed", "error": "errored", "skipped": "skipped"}[child.tag]
                    text = (child.get("message") or "") + "\n" + (child.text or "")
                    break
            results[test] = (outcome, text)
    return results, wall, proc.stdout[-3000:] + proc.stderr[-3000:]


def _counts(results: dict[str, tuple[str, str]]) -> dict[str, int]:
    out = {"passed": 0, "failed": 0, "errored": 0, "skipped": 0}
    for outcome, _ in results.values():
        out[outcome] += 1
    return out


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("Traceback"):
            return line[:160]
    return ""


def _failing_source(folder: Path, name: str, text: str) -> str:
    """The statement of the test file the failure points at (a rank's traceback says
    ``FILE", line N``, pytest's report ``FILE:N:``; the assertion spans a few lines)."""
    hits = re.findall(rf'{re.escape(name)}(?:", line |:)(\d+)', text)
    if not hits:
        return ""
    lines = (folder / name).read_text().splitlines()
    at = int(hits[-1]) - 1
    return "\n".join(lines[at:at + 4])


def _sort(folder: Path, name: str, test: str, text: str) -> tuple[str, str]:
    method = test.split("::")[-1]
    base = re.sub(r"_(float32|complex64|cfloat)$", "", method)
    for key in (test, method, base):
        if key in TRIAGED:
            return TRIAGED[key]
    if _COLLECTIVE.search(_failing_source(folder, name, text)):
        return "collective", "counts DTensor's own collectives: " + _first_line(text)
    return "bug", _first_line(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", nargs="?", default=str(HERE / ".pytorch_tests"))
    ap.add_argument("--files", nargs="*", default=list(FILES))
    ap.add_argument("--timeout", type=int, default=300, help="seconds per test (pytest-timeout)")
    ap.add_argument("-k", dest="kexpr", default=None, help="pytest -k expression, e.g. WithLocalTensor")
    ap.add_argument("--json", default=None, help="write the raw outcomes here")
    args = ap.parse_args()
    folder = Path(args.folder).resolve()
    missing = [f for f in args.files if not (folder / f).exists()]
    if missing:
        sys.exit(f"missing in {folder}: {', '.join(missing)} (copy them from pytorch/pytorch's "
                 "test/distributed/tensor/)")
    stats_dir = Path(tempfile.mkdtemp(prefix="shardc_pt_tests_"))
    rows, regressions, fixed, raw = [], [], [], {}
    for name in args.files:
        off, wall_off, tail_off = _run(folder, name, False, args.timeout, args.kexpr, stats_dir)
        on, wall_on, tail_on = _run(folder, name, True, args.timeout, args.kexpr, stats_dir)
        if not off or not on:
            print(f"{name}: no results; pytest said:\n{tail_off if not off else tail_on}")
        rows.append((name, _counts(off), _counts(on), wall_off, wall_on))
        raw[name] = {"off": off, "on": on}
        for test, (outcome, text) in sorted(on.items()):
            was = off.get(test, ("missing", ""))[0]
            if outcome in ("failed", "errored") and was == "passed":
                regressions.append((name, test, *_sort(folder, name, test, text)))
            if outcome == "passed" and was in ("failed", "errored"):
                fixed.append((name, test, _first_line(off[test][1])))
    head = f"{'file':24} {'engine':6} {'passed':>6} {'failed':>6} {'errored':>7} {'skipped':>7} {'wall s':>7}"
    print(head)
    for name, c_off, c_on, w_off, w_on in rows:
        for label, c, w in (("off", c_off, w_off), ("on", c_on, w_on)):
            print(f"{name:24} {label:6} {c['passed']:6} {c['failed']:6} {c['errored']:7} {c['skipped']:7} {w:7.0f}")
    kinds = {"collective": 0, "defect": 0, "bug": 0}
    print(f"\nfail with the engine on, pass with it off: {len(regressions)}")
    for name, test, kind, reason in regressions:
        kinds[kind] += 1
        print(f"  [{kind}] {name}::{test}: {reason}")
    print("  by kind: " + ", ".join(f"{k} {v}" for k, v in kinds.items()))
    print(f"\npass with the engine on, fail with it off: {len(fixed)}")
    for name, test, reason in fixed:
        print(f"  {name}::{test}: {reason}")
    stats = {"taken": 0, "fallback": 0, "reasons": {}}
    for f in stats_dir.glob("*.json"):
        s = json.loads(f.read_text())
        stats["taken"] += s["taken"]
        stats["fallback"] += s["fallback"]
        for r, n in s["reasons"].items():
            stats["reasons"][r] = stats["reasons"].get(r, 0) + n
    print(f"\ndtensor_engine_stats() summed over the engine-on processes: {json.dumps(stats)}")
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
