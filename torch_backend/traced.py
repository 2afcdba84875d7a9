"""torch.compile's door: shardc's calls as regions dynamo does not trace into, which
AOTAutograd traces (``torch._dynamo.nonstrict_trace``).

Dynamo sees each public call (``redistribute``, a ``Redistributor``'s call,
``redistribute_many``, the typed ``torch_backend.spmd`` collectives) as one opaque call
whose non-tensor arguments are constants of the trace (strings, ``Mesh``,
``TensorType``, a DeviceMesh, a prepared ``Redistributor``). AOTAutograd then runs the
ordinary eager code once on fake tensors: the parsing, planning and every tensor check
happen at trace time, in plain Python, on static shapes, and the communication layer
picks its functional implementation (``comm.of``: ``torch.compiler.is_compiling()``),
so the graph holds ``_c10d_functional`` ops and their ``wait_tensor``; the backward is
traced the same way from the same autograd Function. A call with another shape or
dtype fails dynamo's guards and is traced again (recompiled), or refused by the same
checks as an eager call.

A DeviceMesh reaches the region as a ``FakeScriptObject`` (an opaque object of the
trace); it is unwrapped to the real DeviceMesh here, before any check looks at it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._library.opaque_object import is_opaque_type, register_opaque_type

from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType
from spec_lang.local_type import LocalType

_ENTRIES: dict[str, Callable[..., Any]] = {}

def _fx_repr(obj: Any) -> tuple[str, dict[str, type]]:
    """How the trace's code names a constant of these frozen classes (their fields)."""
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
try:
    pytree.register_constant(TensorType)
except ValueError:  # registered already
    pass


def entry(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` as the eager body of the traced call ``name``."""
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


@torch._dynamo.nonstrict_trace
def _region(name: str, args: Any, kwargs: Any) -> Any:
    kwargs = _real(kwargs)
    if "agree" in kwargs or "timeout" in kwargs:
        check_compiled_flags(kwargs.get("agree"), kwargs.get("timeout"))
        kwargs["agree"] = False  # SHARDC_AGREE too: the comparison cannot run in a trace
    return _ENTRIES[name](*_real(args), **kwargs)


class Ready:
    """``async_op=True`` inside a compiled region where the call cannot be split (several
    programs, no collective left in flight): its collectives are functional ops in the
    graph, each followed by its ``wait_tensor``, which the compiler places; ``wait()``
    gives the result."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def wait(self) -> Any:
        return self.value


class Waiting:
    """``async_op=True`` inside a compiled region, as two regions: the first ran the steps
    up to the last collective and issued it (``name.start``); ``wait()`` is the functional
    ``wait_tensor`` on its result, where the user put it (compute between the call and
    ``wait()`` stands between the collective and its wait in the graph), then the second
    region (``name.finish``): the step's result landed and the steps after it. For many
    tensors (``redistribute_many``) ``x`` is their list and ``got`` the pair (the last
    round's collectives in flight, every tensor as the first region left it): each
    collective gets its own wait."""

    def __init__(self, name: str, x: torch.Tensor, got: torch.Tensor, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.name, self.x, self.got, self.args, self.kwargs = name, x, got, args, kwargs
        self.out: Any = None

    def wait(self) -> Any:
        if self.out is None:
            from torch_backend import comm

            wait = comm.wait_functional
            if isinstance(self.got, torch.Tensor):
                done: Any = wait(self.got)
            else:
                flying, carried = self.got
                done = ([wait(t) for t in flying], carried)
            self.out = _region(self.name + ".finish", (self.x, done, *self.args), self.kwargs)
        return self.out


@torch.compiler.assume_constant_result
def _splits(name: str, args: Any, kwargs: Any) -> bool:
    """Run once at trace time (its arguments are constants of the trace): whether the async
    call ``name`` splits around its last collective (``name.splits``)."""
    return bool(_ENTRIES[name + ".splits"](*_real(args), **_real(kwargs)))


def check_compiled_flags(agree: Any, timeout: Any) -> None:
    """What a compiled region cannot do, refused at trace time."""
    if agree:
        raise SpecError("agree=True cannot run inside torch.compile (its comparison reads values on the host)",
                        hint="make the call once eagerly with agree=True before compiling, or drop agree")
    if timeout is not None:
        raise SpecError("timeout= cannot be set inside torch.compile (functional collectives take the "
                        "process group's own timeout)",
                        hint="create the process group with the timeout you want, or call eagerly")


def call(name: str, *args: Any, async_op: bool = False, **kwargs: Any) -> Any:
    """The traced call ``name`` (from inside dynamo's trace): one opaque region, or with
    ``async_op`` two around the user's wait where ``name.splits`` says so (``Waiting``).
    Arguments that are None are left out (the region takes no None): pass them by
    keyword; the tensor is the first argument that is one (or a list of them)."""
    kw = {k: v for k, v in kwargs.items() if v is not None}
    if async_op and name + ".splits" in _ENTRIES:
        i = next(i for i, a in enumerate(args) if isinstance(a, torch.Tensor)
                 or (isinstance(a, list) and a and all(isinstance(t, torch.Tensor) for t in a)))
        rest = args[:i] + args[i + 1:]
        plain = {k: v for k, v in kw.items() if k not in ("agree", "timeout")}
        if _splits(name, rest, plain):
            got = _region(name + ".start", args, kw)
            return Waiting(name, args[i], got, rest, kw)
    out = _region(name, args, kw)
    return Ready(out) if async_op else out
