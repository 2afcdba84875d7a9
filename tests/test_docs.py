"""Every example in README.md and docs/*.md runs and prints what the docs show.

* ``$ shardc ...`` lines in fenced blocks run through the CLI entry point; the lines that
  follow (up to the next command or a blank line before one) are the expected output
  (stdout, then stderr).
* ``python`` blocks run as a script in a fresh namespace; if the next paragraph is just
  "prints", the fenced block after it is the expected stdout.
* ``>>>`` sessions (in any block) run statement by statement as the REPL does: what it
  shows (an expression's repr), or
  ``ExcType: message`` for an exception (the shown lines may stop before the hint),
  must match the lines shown under it.
* A block right after ``<!-- docs-test: skip (reason) -->`` is not run; the reason must
  say why (e.g. it needs torchrun), and only a few may exist.
"""

from __future__ import annotations

import contextlib
import io
import shlex

import pytest
from doc_examples import Block, blocks, commands, lines

from torch_backend.cli import main

MAX_SKIPS = 4

ALL = blocks()


def _reset_process_group() -> None:
    """Blocks that start their own (fake) process group must find none running."""
    import sys

    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


# ---- $ shardc ---------------------------------------------------------------------------


CLI = [(b.where, cmd, exp) for b in ALL if not b.skip for cmd, exp in commands(b.body)]


@pytest.mark.parametrize("where,cmd,expected", CLI, ids=[f"{w} {c[:40]}" for w, c, _ in CLI])
def test_shardc_example(capsys: pytest.CaptureFixture[str], where: str, cmd: str, expected: list[str]) -> None:
    argv = shlex.split(cmd)
    assert argv[0] == "shardc", f"{where}: only shardc commands are run"
    main(argv[1:])
    out, err = capsys.readouterr()
    assert lines(out + err) == expected, f"{where}: $ {cmd}"


# ---- python blocks and >>> sessions -------------------------------------------------------


def _session(body: str) -> list[tuple[str, list[str]]]:
    """(statement, expected lines) for each ``>>>`` of a block (``...`` continues one)."""
    out: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    for line in body.splitlines():
        if line.startswith(">>> "):
            out.append((line[4:], []))
            current = out[-1][1]
        elif line.startswith("... ") and out:
            out[-1] = (out[-1][0] + "\n" + line[4:], out[-1][1])
        elif line.startswith("$ "):
            current = None
        elif current is not None:
            current.append(line)
    return [(stmt, lines("\n".join(exp))) for stmt, exp in out]


def _run_session(where: str, body: str) -> None:
    ns: dict[str, object] = {"__name__": "__docs__"}
    for stmt, expected in _session(body):
        buf = io.StringIO()
        shown: list[str]
        try:
            with contextlib.redirect_stdout(buf):
                exec(compile(stmt, where, "single"), ns)  # as the REPL: expression values are shown
            shown = lines(buf.getvalue())
        except Exception as e:
            shown = lines(f"{type(e).__name__}: {e}")
            assert shown[:len(expected)] == expected, f"{where}: >>> {stmt}"
            continue
        assert [s for s in shown if s] == [e for e in expected if e], f"{where}: >>> {stmt}"


PY = [b for b in ALL if not b.skip and (b.lang == "python" or ">>> " in b.body)]


@pytest.mark.parametrize("block", PY, ids=[b.where for b in PY])
def test_python_example(block: Block) -> None:
    _reset_process_group()
    try:
        if ">>> " in block.body:
            _run_session(block.where, block.body)
            return
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(block.body, block.where, "exec"), {"__name__": "__docs__"})
        if block.expected_stdout is not None:
            assert lines(buf.getvalue()) == lines(block.expected_stdout), block.where
    finally:
        _reset_process_group()


def _shown_values(body: str) -> list[tuple[int, str]]:
    """(statement index, value shown) for each expression statement of a python block whose
    value a comment shows: ``expr  # (...)`` or ``# (...)`` on the next line (a comment that
    opens with a bracket; ``<- remark`` after it is prose). print() calls show no value."""
    import ast
    import re

    src = body.splitlines()
    out = []
    for k, stmt in enumerate(ast.parse(body).body):
        if not isinstance(stmt, ast.Expr) or (isinstance(stmt.value, ast.Call)
                                              and getattr(stmt.value.func, "id", None) == "print"):
            continue
        end = stmt.end_lineno or stmt.lineno
        for line in (src[end - 1][stmt.end_col_offset or 0:], src[end] if end < len(src) else ""):
            m = re.match(r"\s*#\s*([(\[{].*?)(\s+<-.*)?$", line)
            if m:
                out.append((k, m.group(1).rstrip()))
                break
    return out


SHOWN = [b for b in PY if ">>> " not in b.body and _shown_values(b.body)]


@pytest.mark.parametrize("block", SHOWN, ids=[b.where for b in SHOWN])
def test_values_shown_in_comments_are_what_prints(block: Block) -> None:
    """``to_placements(...)  # ([Shard(dim=0), ...], {})``: the comment is the value's repr."""
    import ast

    tree = ast.parse(block.body)
    ns: dict[str, object] = {"__name__": "__docs__"}
    shown = dict(_shown_values(block.body))
    _reset_process_group()
    try:
        for k, stmt in enumerate(tree.body):
            if k in shown:
                assert isinstance(stmt, ast.Expr)
                value = eval(compile(ast.Expression(stmt.value), block.where, "eval"), ns)
                assert repr(value) == shown[k], f"{block.where}: {ast.unparse(stmt)}"
            else:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(ast.Module([stmt], []), block.where, "exec"), ns)
    finally:
        _reset_process_group()


def test_skips_are_few_and_say_why() -> None:
    skipped = [b for b in ALL if b.skip]
    assert len(skipped) <= MAX_SKIPS, [b.where for b in skipped]
    for b in skipped:
        assert len(b.skip.split()) >= 2, f"{b.where}: say why the block cannot run here"


def test_every_example_kind_is_found() -> None:
    assert len(CLI) >= 7 and len(PY) >= 6
