"""What every subcommand prints the same way: JSON, times, and the refusal of a command
that needs torch where torch is not installed."""

from __future__ import annotations

import json
from typing import Any

from spec_lang.errors import SpecError

# the extra that brings torch (pyproject.toml), and where the README says which build to take
TORCH_HINT = ("install the torch extra: pip install 'shardc[torch]' ('.[torch]' in a source checkout; the README's "
              "Install section says how to get torch's CPU-only or CUDA build); shardc parse, show and plan need no torch")


def json_text(value: Any, indent: int = 0) -> str:
    """``json.dumps(value, indent=2)``, except that a list holding no object is one line:
    per-rank shapes and slices stay one line per step, not one line per integer."""
    pad, inner = " " * indent, " " * (indent + 2)
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(str(k))}: {json_text(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and _holds_object(value):
        return "[\n" + ",\n".join(f"{inner}{json_text(v, indent + 2)}" for v in value) + f"\n{pad}]"
    return json.dumps(value)


def _holds_object(value: Any) -> bool:
    return isinstance(value, dict) or (isinstance(value, list) and any(_holds_object(v) for v in value))


def time_text(seconds: float) -> str:
    """A duration in us below 10 ms, else in ms, right-aligned in 10 columns."""
    return f"{seconds * 1e6:10.1f} us" if seconds < 1e-2 else f"{seconds * 1e3:10.2f} ms"


def torch_missing(command: str, why: str) -> SpecError:
    """The refusal of ``shardc COMMAND`` on an install whose torch does not import."""
    return SpecError(f"shardc {command} runs programs with torch, which is not installed ({why})", hint=TORCH_HINT)


def require_torch(command: str) -> None:
    """Refuse ``shardc COMMAND`` before it starts any process when torch cannot be found
    (looked up, not imported: the ranks' fork server imports it beside this process)."""
    from importlib.util import find_spec

    try:
        found = find_spec("torch") is not None
    except ImportError as e:  # a finder that refuses torch
        raise torch_missing(command, str(e)) from None
    if not found:
        raise torch_missing(command, "No module named 'torch'")
