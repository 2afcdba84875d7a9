"""Lazy package exports (PEP 562), so importing a package never imports torch or jax.

A package that uses them also imports the same names under ``TYPE_CHECKING``, so a type
checker and an IDE see each name's real signature (``tests/test_import_graph.py`` checks
that the two agree). A name or call that needs an optional dependency which is not
installed raises a ModuleNotFoundError that names the extra bringing it (``needs_extra``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

# the optional dependencies, each brought by the extra of its name (pyproject.toml)
EXTRAS = ("torch", "jax")


@contextmanager
def needs_extra(what: str) -> Iterator[None]:
    """Around the code of ``what`` (a public name) that imports torch or jax: where that
    module is not installed (or does not import), a ModuleNotFoundError that says which
    extra to install, instead of the bare one (its ``name`` kept)."""
    try:
        yield
    except ModuleNotFoundError as e:
        extra = (e.name or "").partition(".")[0]
        if extra not in EXTRAS:
            raise
        raise ModuleNotFoundError(
            f"{what} needs {extra}, which is not installed or does not import ({e}): "
            f"install the {extra} extra, pip install 'shardc[{extra}]' ('.[{extra}]' in a source checkout)",
            name=e.name) from None

# every package's table (name -> the module that defines it), by package, as registered
TABLES: dict[str, Mapping[str, str]] = {}


def lazy_exports(package: str, exports: dict[str, str],
                 defined: Iterable[str] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each name in ``exports`` is imported from
    its module on first use, then kept in the package namespace; ``__dir__`` lists them and
    the public names the package defines itself (``defined``)."""
    TABLES[package] = dict(exports)
    listed = sorted([*exports, *defined])
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        with needs_extra(f"{package}.{name}"):
            imported = importlib.import_module(module)
        value = imported if module == f"{package}.{name}" else getattr(imported, name)  # a subpackage itself
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return list(listed)

    return __getattr__, __dir__
