"""The examples of README.md and docs/*.md, read out of their fenced blocks: what
``tests/test_docs.py`` runs from the source tree and ``tests/test_wheel.py`` runs from an
installed wheel (see test_docs.py's docstring for the forms)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n?", re.M | re.S)
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*\(([^)]+)\)\s*-->\s*$")


@dataclass
class Block:
    where: str
    lang: str
    body: str
    skip: str | None
    expected_stdout: str | None  # a python block's "prints" block


def blocks(paths: list[Path] = DOCS) -> list[Block]:
    out: list[Block] = []
    for path in paths:
        text = path.read_text()
        fences = list(FENCE.finditer(text))
        for i, m in enumerate(fences):
            before = text[fences[i - 1].end() if i else 0:m.start()].rstrip()
            skip = SKIP.search(before.splitlines()[-1]) if before else None
            expected = None
            if i + 1 < len(fences) and text[m.end():fences[i + 1].start()].strip() == "prints":
                expected = fences[i + 1].group(2)
            line = text[:m.start()].count("\n") + 1
            out.append(Block(f"{path.relative_to(REPO)}:{line}", m.group(1), m.group(2),
                             skip[1] if skip else None, expected))
    return out


def lines(text: str) -> list[str]:
    """Output as compared: lines without trailing blanks, no trailing empty lines."""
    return [line.rstrip() for line in text.rstrip().splitlines()]


def commands(body: str) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) for every ``$ shardc`` line of a block."""
    out: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif line.startswith(">>>"):
            out.append(("", []))  # ends the previous command's output
        elif out:
            out[-1][1].append(line)
    return [(cmd, lines("\n".join(exp))) for cmd, exp in out if cmd]
