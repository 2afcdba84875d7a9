"""The ``shardc`` command line: parse, show, plan, run, calibrate.

Each subcommand lives in its own module and is imported only when used, so
``shardc parse`` and ``shardc plan`` never import torch.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys
from typing import NoReturn

from spec_lang.errors import SpecError
from torch_backend.cli.output import json_text, torch_missing

# subcommand -> module (each defines ``add_arguments(parser)`` and ``run(args) -> int``)
SUBCOMMANDS = {
    "parse": ("torch_backend.cli.parse_cmd", "the canonical form, JAX spec, DTensor placements, local shapes"),
    "show": ("torch_backend.cli.show_cmd", "a picture of which rank holds which block"),
    "plan": ("torch_backend.cli.plan_cmd", "compile a redistribution and print its program and cost"),
    "run": ("torch_backend.cli.run_cmd", "compile and run a redistribution on local ranks or under torchrun"),
    "calibrate": ("torch_backend.cli.calibrate_cmd", "fit a cost model (alpha, beta per mesh axis) to timed "
                  "collectives on local ranks; writes JSON for compile"),
}


def version() -> str:
    """The installed package's version; the source tree's pyproject.toml when not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("shardc")
    except PackageNotFoundError:
        import re
        from pathlib import Path

        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)
        except OSError:
            m = None
        return f"{m[1]} (source tree)" if m else "unknown (not installed)"


class _Parser(argparse.ArgumentParser):
    """argparse, except that a usage error under ``--json`` is also a JSON refusal on stdout."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        if _Parser.json_errors:
            print(error_json(SpecError(message, hint=f"see {self.prog} --help")))
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="shardc", description="A sharding spec compiler for PyTorch.")
    parser.add_argument("--version", action="version", version=f"shardc {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def error_json(e: SpecError) -> str:
    """The ``--json`` form of a refusal: ok false, the message, where, and how to fix it."""
    return json_text({"ok": False, "error": e.message, "text": e.text, "position": e.pos, "hint": e.hint})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _Parser.json_errors = "--json" in argv
    args = build_parser().parse_args(argv)
    try:
        try:
            return int(importlib.import_module(args._module).run(args) or 0)
        except ModuleNotFoundError as e:  # torch absent, where only an import found out
            if (e.name or "").partition(".")[0] != "torch":
                raise
            raise torch_missing(args.command, str(e)) from None
    except SpecError as e:
        if getattr(args, "json", False):
            print(error_json(e))
        print(f"error: {e}", file=sys.stderr)
        return 2


def command() -> NoReturn:
    """The ``shardc`` console script: ``main``, then an exit that skips tearing torch down
    once it was imported (a second or two after the report: docs/running.md, "One
    machine"); the output is flushed and the exit handlers run first, as at a normal exit."""
    rc = main()
    if "torch" not in sys.modules:
        sys.exit(rc)
    import threading

    for thread in threading.enumerate():  # as at a normal exit: the threads that are not daemons first
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (shardc run | head): nothing left to flush
            rc = rc or 1
    os._exit(rc)


if __name__ == "__main__":
    command()
