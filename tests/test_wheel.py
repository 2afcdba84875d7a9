"""The package as users install it: the wheel is built from a copy of the sources,
installed into a fresh directory, and the README's examples run from there.

``make`` installs shardc in editable mode, which finds every module in the source tree,
so a package missing from the wheel shows up only here. The examples run with
``python -S`` (no ``.pth`` files, so no editable install of a checkout can answer an
import), with PYTHONPATH naming the install directory and the interpreter's
site-packages (numpy, torch, ...) only, from a directory outside the source tree; each
run then checks that every shardc module it imported came from the install.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
from doc_examples import README, REPO, blocks, commands, lines

PACKAGES = ("spec_lang", "lowering", "torch_backend", "jax_backend")
DATA = ("spec_lang/grammar.lark", "spec_lang/py.typed", "lowering/py.typed", "torch_backend/py.typed",
        "jax_backend/py.typed", "jax_backend/models/dp-2_tp-4.json")

# runs a script (argv[2:]) as __main__, then fails if a shardc module came from outside the
# install directory (argv[1]); the check is an exit handler, so that it also runs where the
# console script ends with its quick exit (torch_backend.cli.command runs the handlers first)
RUNNER = f"""
import atexit, os, runpy, sys
install, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]

def check():
    outside = sorted(n for n, m in list(sys.modules.items())
                     if n.partition(".")[0] in {PACKAGES!r}
                     and not (getattr(m, "__file__", "") or "").startswith(install))
    if outside:
        print("imported from outside the install:", outside, file=sys.stderr, flush=True)
        os._exit(3)

atexit.register(check)
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
"""


def _pip(*args: str, cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check", "--no-index"],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built (no network, no build isolation) from a copy of the sources, so
    that neither build/ left in the tree nor files git ignores can leak into it."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp / "dist"), str(src), cwd=tmp)
    (built,) = (tmp / "dist").glob("shardc-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("install")
    _pip("install", "--no-deps", "--target", str(target), str(wheel), cwd=target)
    return target


def _run(installed: Path, script: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``script`` run from the install, in a fresh directory outside the source tree."""
    cwd = installed.parent / f"run-{script.stem}"
    cwd.mkdir(exist_ok=True)
    runner = cwd / "runner.py"
    runner.write_text(RUNNER)
    # this interpreter's site-packages (a venv's, and the system's where the venv sees them)
    site_dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                 *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(installed), *dict.fromkeys(site_dirs)])
    return subprocess.run([sys.executable, "-S", str(runner), str(installed), str(script), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_holds_every_package_and_data_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            # a directory of modules without __init__.py would not be found as a package
            assert (path.parent / "__init__.py").exists(), f"{path.parent.relative_to(REPO)} has no __init__.py"
            assert rel in names, f"{rel} is not in the wheel"
    for data in DATA:
        assert data in names, f"{data} is not in the wheel"
    assert not [n for n in names if n.startswith(("tests/", "bench/", "docs/"))]


def test_the_readme_python_examples_run_from_the_install(installed: Path) -> None:
    examples = [b for b in blocks([README]) if b.lang == "python" and not b.skip]
    assert len(examples) >= 2
    for i, block in enumerate(examples):
        script = installed.parent / f"readme_example_{i}.py"
        script.write_text(block.body)
        p = _run(installed, script)
        assert p.returncode == 0, f"{block.where}:\n{p.stderr}"
        if block.expected_stdout is not None:
            assert lines(p.stdout) == lines(block.expected_stdout), block.where


def test_the_readme_shardc_commands_run_from_the_install(installed: Path) -> None:
    shardc = installed / "bin" / "shardc"  # the console script pip wrote
    examples = [c for b in blocks([README]) if not b.skip for c in commands(b.body)]
    assert examples
    for cmd, expected in examples:
        argv = shlex.split(cmd)
        assert argv[0] == "shardc"
        p = _run(installed, shardc, *argv[1:])
        assert p.returncode == 0, f"$ {cmd}\n{p.stderr}"
        assert lines(p.stdout + p.stderr) == expected, f"$ {cmd}"
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    p = _run(installed, shardc, "--version")
    assert p.returncode == 0 and p.stdout == f"shardc {version}\n", "the installed version, not the source tree's"


@pytest.mark.timeout(240)
def test_shardc_run_from_the_install(installed: Path) -> None:
    """``make demo``'s last command, on 2 ranks: rank processes started by the installed copy."""
    p = _run(installed, installed / "bin" / "shardc", "run", "--mesh", "dp=2", "f32[8@dp,3]", "f32[8,3]",
             "--backend", "gloo", "--check", timeout=200)
    assert p.returncode == 0, p.stderr
    assert "ran on 2 ranks (gloo, cpu): ok" in p.stdout
    assert "check: every rank holds its block of float32[8,3]" in p.stdout
