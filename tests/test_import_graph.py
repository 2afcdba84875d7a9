"""The planning layer's import graph, read from the source as ``ast`` sees it (imports at
module level, under ``TYPE_CHECKING`` and inside functions alike): the data (Step, Program,
Cost) reaches no step-kind registry and no planner, the step kinds reach no planner, the
planning modules form no import cycle, no private name crosses lowering's modules, and no
lowering module shares its file name with a module of another package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("spec_lang", "lowering", "torch_backend")
# the layout algebra's own cycle and file name, left to the layout part of issue 26
LAYOUT_CYCLE = {"lowering.blocks", "lowering.checks", "lowering.layout"}
SHARED_NAMES = {"blocks.py"}
PLANNER = {"lowering.planner", "lowering.labels", "lowering.moves", "lowering.fallback", "lowering.bounds",
           "lowering.uneven_planner"}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for f in (ROOT / package).rglob("*.py"):
            out[".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")] = f
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> list[tuple[str, str]]:
    """(imported module, imported name) for every import in ``module``'s source."""
    f = MODULES[module]
    package = module if f.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str | None, str]] = []
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            out += [(_owner(a.name), "") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                out.append((full if full in MODULES else _owner(base), a.name))
    return [(t, name) for t, name in out if t is not None and t != module]


GRAPH = {m: {t for t, _ in _imports(m)} for m in MODULES}


def _reach(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for t in GRAPH[todo.pop()] - seen:
            seen.add(t)
            todo.append(t)
    return seen


def test_the_data_reaches_no_step_kind_and_no_planner() -> None:
    reached = _reach("lowering.program")
    assert not {m for m in reached if m.startswith("lowering.kinds") or m in PLANNER}, sorted(reached)


def test_the_step_kinds_reach_no_planner() -> None:
    kinds = [m for m in MODULES if m.startswith("lowering.kinds")]
    for m in kinds:
        assert not _reach(m) & PLANNER, (m, sorted(_reach(m) & PLANNER))


def test_lowering_has_no_import_cycle() -> None:
    lowering = [m for m in MODULES if m.startswith("lowering")]
    cycles = {frozenset(m for m in lowering if m == start or (m in _reach(start) and start in _reach(m)))
              for start in lowering}
    cycles = {c for c in cycles if len(c) > 1 and not c <= LAYOUT_CYCLE}
    assert not cycles, [sorted(c) for c in cycles]


def test_no_private_name_crosses_lowering_modules() -> None:
    crossing = [(m, t, name) for m in MODULES if m.startswith("lowering") for t, name in _imports(m)
                if name.startswith("_") and not name.startswith("__")]
    assert not crossing, crossing


def test_no_lowering_module_shares_its_file_name_with_another_package() -> None:
    def names(package: str) -> set[str]:
        return {f.name for f in (ROOT / package).rglob("*.py")} - {"__init__.py"}

    shared = names("lowering") & (names("spec_lang") | names("torch_backend"))
    assert shared <= SHARED_NAMES, sorted(shared - SHARED_NAMES)
