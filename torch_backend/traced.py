"""torch.compile's door: each public call is one ``torch._dynamo.nonstrict_trace`` region
whose non-tensor arguments are constants of the trace, so AOTAutograd runs the eager code
(parsing, planning, checks) once at trace time on fake tensors, and ``comm`` its functional
collectives (docs/running.md, "torch.compile"). A DeviceMesh reaches a region as a
``FakeScriptObject``, unwrapped here before any check. This module imports no dynamo (over a
second): the entry points reach the regions through ``trace_marks``, imported only where
they find a trace running.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

import torch.utils._pytree as pytree
from torch._library.opaque_object import is_opaque_type, register_opaque_type

from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType
from spec_lang.local_type import LocalType

_ENTRIES: dict[str, Callable[..., Any]] = {}
_F = TypeVar("_F", bound=Callable[..., Any])


class TracedSpecError(SpecError, IndexError):
    """A SpecError raised while torch.compile traces a call, caught like the eager call's.

    It is an IndexError too because that is the one exception dynamo lets out of a traced
    call as it is (torch 2.13: ``torch._dynamo.utils.run_node`` re-raises an IndexError
    from a traced region, and ``convert_frame`` passes it on); any other error becomes
    dynamo's own (``Unsupported output type ...``, ``InternalTorchDynamoError``)."""


def refusing(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (run at trace time) with its SpecError raised as a ``TracedSpecError``: dynamo
    would otherwise show only its own error, with shardc's in its ``__cause__`` alone."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecError as e:
            raise e if isinstance(e, TracedSpecError) else \
                TracedSpecError(e.message, text=e.text, pos=e.pos, hint=e.hint, subject=e.subject) from None
    return run


def _fx_repr(obj: Any) -> tuple[str, dict[str, type]]:
    cls = type(obj)
    fields = ", ".join(f"{f}={getattr(obj, f)!r}" for f in cls.__dataclass_fields__)
    return f"{cls.__name__}({fields})", {cls.__name__: cls}


# frozen, hashable and compared by value: constants of a compiled region, which dynamo
# guards on by equality (a call with another mesh or type is traced again)
# type[Any]: the classes gain __fx_repr__ here, for torch's opaque-type registry to read
_OPAQUE: tuple[type[Any], ...] = (Mesh, LocalType)
for _cls in _OPAQUE:
    if not is_opaque_type(_cls):
        _cls.__fx_repr__ = _fx_repr
        register_opaque_type(_cls, typ="value")
with suppress(ValueError):  # registered already
    pytree.register_constant(TensorType)


def entry(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def put(fn: Callable[..., Any]) -> Callable[..., Any]:
        _ENTRIES[name] = fn
        return fn
    return put


def _real(a: Any) -> Any:
    if isinstance(a, (list, tuple)):
        return type(a)(_real(v) for v in a)
    if isinstance(a, dict):
        return {k: _real(v) for k, v in a.items()}
    real = getattr(a, "real_obj", None) if type(a).__name__ == "FakeScriptObject" else None
    return real if real is not None else a


@refusing
def run_region(name: str, args: Any, kwargs: Any) -> Any:
    kwargs = _real(kwargs)
    if "agree" in kwargs or "timeout" in kwargs:
        check_compiled_flags(kwargs.get("agree"), kwargs.get("timeout"))
        kwargs["agree"] = False  # SHARDC_AGREE too: the comparison cannot run in a trace
    return _ENTRIES[name](*_real(args), **kwargs)


class Ready:
    """``async_op=True`` inside a compiled region where the call cannot be split: its
    collectives' ``wait_tensor`` are in the graph, where the compiler places them."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def wait(self) -> Any:
        return self.value


def constant_result(fn: _F) -> _F:
    """``torch.compiler.assume_constant_result`` without importing dynamo (the mark it sets)."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


@constant_result
def refuse(message: str, hint: str) -> bool:
    """Raise ``SpecError(message, hint=hint)`` from code dynamo traces: at trace time, outside
    the trace, since dynamo can neither build a SpecError nor pass a raised one on."""
    raise TracedSpecError(message, hint=hint)


def has_entry(name: str) -> bool:
    return name in _ENTRIES


@constant_result
@refusing
def splits(name: str, args: Any, kwargs: Any) -> bool:
    """At trace time: whether the async call ``name`` splits around its last collective."""
    return bool(_ENTRIES[name + ".splits"](*_real(args), **_real(kwargs)))


def check_compiled_flags(agree: Any, timeout: Any) -> None:
    if agree:
        raise SpecError("agree=True cannot run inside torch.compile (its comparison reads values on the host)",
                        hint="make the call once eagerly with agree=True before compiling, or drop agree")
    if timeout is not None:
        raise SpecError("timeout= cannot be set inside torch.compile (functional collectives take the "
                        "process group's own timeout)",
                        hint="create the process group with the timeout you want, or call eagerly")
