"""The ``shardc`` command line: parse, show, plan, run.

Each subcommand lives in its own module and is imported only when used, so
``shardc parse`` and ``shardc plan`` never import torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module (each defines ``add_arguments(parser)`` and ``run(args) -> int``)
SUBCOMMANDS = {
    "parse": ("torch_backend.cli.parse_cmd", "the canonical form, JAX spec, DTensor placements, local shapes"),
    "show": ("torch_backend.cli.show_cmd", "a picture of which rank holds which block"),
    "plan": ("torch_backend.cli.plan_cmd", "compile a redistribution and print its program and cost"),
    "run": ("torch_backend.cli.run_cmd", "compile and run a redistribution on local ranks or under torchrun"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shardc", description="A sharding spec compiler for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            importlib.import_module(module).add_arguments(p)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            p.set_defaults(_missing=module)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    from spec_lang.errors import SpecError

    args = build_parser().parse_args(argv)
    if getattr(args, "_missing", None):
        print(f"shardc {args.command}: not available in this build", file=sys.stderr)
        return 2
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
