"""The import graph of spec_lang, lowering, jax_backend and torch_backend, read from the source as ``ast``
sees it: imports at module level, under ``TYPE_CHECKING`` and inside functions alike, and a
name imported through a lazy package (``spec_lang.lazy.lazy_exports``) as an import of the
module that defines it (a lazy package itself imports every module of its table). The
packages import one way (spec_lang -> lowering -> jax_backend -> torch_backend: jax_backend never
imports torch_backend, whose CLI may run it) and form no import cycle;
no private name crosses modules; the data (Step, Program, Cost) reaches no step-kind
registry and no planner, and the step kinds reach no planner; no file name is used by two
packages; and a lazy package's ``TYPE_CHECKING`` imports are its table, so a type checker
sees what the package hands out."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from spec_lang.lazy import TABLES

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("spec_lang", "lowering", "jax_backend", "torch_backend")  # in import order (the CLI runs jax_backend)
PLANNER = {"lowering.planner", "lowering.labels", "lowering.moves", "lowering.fallback", "lowering.bounds",
           "lowering.uneven_planner"}

# Exceptions to both rules, each of which must still be there (the test fails once one is
# gone, so these only shrink). None: issue 27's one execution stack removed the last ones.
KNOWN_CYCLES: set[frozenset[str]] = set()
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for f in (ROOT / package).rglob("*.py"):
            out[".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")] = f
    return out


MODULES = _modules()


def _lazy_tables() -> dict[str, dict[str, str]]:
    """Each lazy package's table (name -> defining module), as the package registers it."""
    lazy = [m for m, f in MODULES.items() if f.name == "__init__.py" and "lazy_exports(" in f.read_text()]
    for package in lazy:
        importlib.import_module(package)  # imports no torch or jax: that is what the tables are for
    return {package: dict(TABLES[package]) for package in lazy}


LAZY = _lazy_tables()


def _owner(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _target(base: str, name: str) -> str | None:
    """The module that ``from base import name`` reaches: a submodule, the module a lazy
    package's table names, else ``base``'s own module."""
    if f"{base}.{name}" in MODULES:
        return f"{base}.{name}"
    if name in LAZY.get(base, {}):
        return LAZY[base][name]
    return _owner(base)


def _imports(module: str) -> list[tuple[str, str]]:
    """(imported module, imported name) for every import in ``module``'s source (the name is
    empty for ``import x``)."""
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
            out += [(_target(base, a.name), a.name) for a in node.names]
    out += [(target, name) for name, target in LAZY.get(module, {}).items()]
    return [(t, name) for t, name in out if t is not None and t != module]


GRAPH = {m: {t for t, _ in _imports(m)} for m in MODULES}


def _reach(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for t in GRAPH[todo.pop()] - seen:
            seen.add(t)
            todo.append(t)
    return seen


REACH = {m: _reach(m) for m in MODULES}


def _cycles() -> set[frozenset[str]]:
    """The import cycles: each set of modules that reach one another."""
    return {frozenset({m} | {t for t in REACH[m] if m in REACH[t]}) for m in MODULES if m in REACH[m]}


def _private_imports() -> set[tuple[str, str, str]]:
    return {(m, t, name) for m in MODULES for t, name in _imports(m)
            if name.startswith("_") and not name.startswith("__")}


def test_the_import_graph_sees_function_level_and_lazy_imports() -> None:
    # inside a function: the public door imports the IR function it wraps
    assert "lowering.layout.per_rank" in GRAPH["lowering"]
    # through a lazy package: kinds/__init__ takes local_shapes from lowering.layout
    assert "lowering.layout.per_rank" in GRAPH["lowering.kinds"]
    assert "lowering.layout" not in GRAPH["lowering.kinds"]
    # torch_backend's api reaches the planner through lowering's table
    assert "lowering.planner" in REACH["torch_backend.api"]


def test_the_packages_import_one_way() -> None:
    for i, package in enumerate(PACKAGES):
        later = PACKAGES[i + 1:]
        upward = sorted((m, t) for m in MODULES if m.split(".")[0] == package
                        for t in GRAPH[m] if t.split(".")[0] in later)
        assert not upward, upward


def test_no_import_cycle_but_the_known_ones() -> None:
    cycles = _cycles()
    assert not cycles - KNOWN_CYCLES, [sorted(c) for c in cycles - KNOWN_CYCLES]
    assert not KNOWN_CYCLES - cycles, ("gone: take them off KNOWN_CYCLES", [sorted(c) for c in KNOWN_CYCLES - cycles])


def test_no_private_name_crosses_modules_but_the_known_ones() -> None:
    crossing = _private_imports()
    assert not crossing - KNOWN_PRIVATE_IMPORTS, sorted(crossing - KNOWN_PRIVATE_IMPORTS)
    assert not KNOWN_PRIVATE_IMPORTS - crossing, ("gone: take them off KNOWN_PRIVATE_IMPORTS",
                                                   sorted(KNOWN_PRIVATE_IMPORTS - crossing))


def test_the_known_exceptions_are_torch_backends_alone() -> None:
    named = {m for c in KNOWN_CYCLES for m in c} | {m for i in KNOWN_PRIVATE_IMPORTS for m in i[:2]}
    assert all(m.startswith("torch_backend.") for m in named), sorted(named)


def test_the_data_reaches_no_step_kind_and_no_planner() -> None:
    reached = REACH["lowering.program"]
    assert not {m for m in reached if m.startswith("lowering.kinds") or m in PLANNER}, sorted(reached)


def test_the_step_kinds_reach_no_planner() -> None:
    for m in (m for m in MODULES if m.startswith("lowering.kinds")):
        assert not REACH[m] & PLANNER, (m, sorted(REACH[m] & PLANNER))


def test_no_file_name_in_two_packages() -> None:
    def names(package: str) -> set[str]:
        return {f.name for f in (ROOT / package).rglob("*.py")} - {"__init__.py"}

    for i, a in enumerate(PACKAGES):
        for b in PACKAGES[i + 1:]:
            assert not names(a) & names(b), (a, b, sorted(names(a) & names(b)))


def _type_checking_imports(package: str) -> dict[str, str]:
    """name -> module of the names ``package``'s ``__init__`` imports under ``TYPE_CHECKING``
    as themselves (``from m import x as x``: re-exported to a type checker)."""
    out = {}
    for node in ast.parse(MODULES[package].read_text()).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom):
                    out |= {a.name: _target(imp.module or "", a.name) for a in imp.names if a.asname == a.name}
    return out


def test_a_type_checker_sees_every_lazy_name_from_its_module() -> None:
    assert set(LAZY) == {"lowering", "lowering.layout", "torch_backend"}
    for package, table in LAZY.items():
        assert _type_checking_imports(package) == table, package


def test_a_lazy_package_lists_its_own_doors_too() -> None:
    for package in LAZY:
        module = importlib.import_module(package)
        assert dir(module) == sorted(module.__all__), package
        if not package.startswith("torch_backend"):  # its names import torch
            assert all(hasattr(module, name) for name in module.__all__), package


def test_no_runner_asks_which_communication_implementation_runs() -> None:
    # the communication interface answers what it can do through its own functions
    # (comm.has_p2p, launches, least_chunk, one_block): ``comm.of(ctx)`` stays inside comm
    root = Path(__file__).resolve().parents[1] / "torch_backend"
    asking = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "comm.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "of"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "comm"):
                asking.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert not asking, asking


def test_jax_backend_imports_torch_only_inside_to_torch_and_from_torch() -> None:
    # the JAX engine runs where torch is not installed: torch only where a tensor is asked for
    found = set()

    def visit(node: ast.AST, where: str, module: str) -> None:
        for child in ast.iter_child_nodes(node):
            names = ([a.name for a in child.names] if isinstance(child, ast.Import)
                     else [child.module or ""] if isinstance(child, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "torch" for n in names):
                found.add((module, where))
            visit(child, child.name if isinstance(child, ast.FunctionDef) else where, module)

    for module, path in MODULES.items():
        if module.startswith("jax_backend"):
            visit(ast.parse(path.read_text()), "<module>", module)
    assert found == {("jax_backend.torch_blocks", "to_torch"), ("jax_backend.torch_blocks", "from_torch")}, found


# torch.distributed's communication functions: what moves data or waits on the other ranks
COMMUNICATION = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_object",
    "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all",
    "all_to_all_single", "broadcast", "broadcast_object_list", "reduce", "gather", "gather_object", "scatter",
    "scatter_object_list", "send", "recv", "isend", "irecv", "batch_isend_irecv", "P2POp", "barrier",
    "monitored_barrier", "send_object_list", "recv_object_list", "wait_tensor",
})
NETWORK_MODULES = {"comm.py", "groups.py"}  # the network module, and the one that makes the groups


def distributed_calls(package: Path) -> list[str]:
    """``path:line name`` of every use of a torch.distributed communication function in
    ``package`` outside ``comm`` and ``groups``: through a name bound to torch.distributed
    (``import torch.distributed as dist``), ``torch.distributed.X``, a name imported from
    it, its functional collectives, or ``torch.ops._c10d_functional``."""
    out = []
    for path in sorted(package.rglob("*.py")):
        if path.name in NETWORK_MODULES:
            continue
        tree = ast.parse(path.read_text())
        aliases, direct = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases |= {a.asname for a in node.names if a.name.startswith("torch.distributed") and a.asname}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.distributed"):
                direct |= {a.asname or a.name for a in node.names if a.name in COMMUNICATION}
                aliases |= {a.asname or a.name for a in node.names if a.name == "_functional_collectives"}
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute) and node.attr in COMMUNICATION:
                base = ast.unparse(node.value)
                if base in aliases or base.startswith(("torch.distributed", "torch.ops._c10d_functional")):
                    name = f"{base}.{node.attr}"
            elif isinstance(node, ast.Name) and node.id in direct and isinstance(node.ctx, ast.Load):
                name = node.id
            if name is not None:
                out.append(f"{path.relative_to(package.parent)}:{node.lineno} {name}")
    return out


def test_only_the_network_module_calls_torch_distributed_communication() -> None:
    # one network module: every collective and point-to-point message goes through comm,
    # which honours the caller's timeout and names the rank at fault on a failure
    assert distributed_calls(ROOT / "torch_backend") == []


def test_the_network_scan_sees_each_form_of_a_call(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("import torch\nimport torch.distributed as dist\n"
                              "from torch.distributed import all_reduce as ar\n"
                              "import torch.distributed._functional_collectives as fc\n"
                              "dist.barrier()\nar(x)\nfc.all_to_all_single(x)\ntorch.distributed.send(x, 1)\n"
                              "torch.ops._c10d_functional.wait_tensor(x)\ndist.get_rank()\n")
    (pkg / "comm.py").write_text("import torch.distributed as dist\ndist.all_reduce(x)\n")
    assert distributed_calls(pkg) == ["pkg/a.py:5 dist.barrier", "pkg/a.py:6 ar", "pkg/a.py:7 fc.all_to_all_single",
                                      "pkg/a.py:8 torch.distributed.send",
                                      "pkg/a.py:9 torch.ops._c10d_functional.wait_tensor"]
