"""The regions of ``torch_backend.traced`` marked for dynamo, and the traced call: imported
only where a trace runs, which has imported ``torch._dynamo`` already (an eager call never does)."""

from __future__ import annotations

from typing import Any

import torch
import torch._dynamo

from torch_backend import traced

# one opaque call of the graph per region: dynamo does not trace into it, AOTAutograd runs its eager body
region = torch._dynamo.nonstrict_trace(traced.run_region)


class Waiting:
    """``async_op=True`` inside a compiled region, as two regions: the first issued the last
    collective (``name.start``, leaving ``got``); ``wait()`` is the functional ``wait_tensor``
    where the user put it, then the second region (``name.finish``) lands the rest."""

    def __init__(self, name: str, x: Any, got: tuple[list[torch.Tensor], list[torch.Tensor]],
                 args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.name, self.x, self.got, self.args, self.kwargs = name, x, got, args, kwargs
        self.out: Any = None

    def wait(self) -> Any:
        if self.out is None:
            from torch_backend import comm

            flying, carried = self.got
            done = ([comm.wait_functional(t) for t in flying], carried)
            self.out = region(self.name + ".finish", (self.x, done, *self.args), self.kwargs)
        return self.out


def call(name: str, *args: Any, async_op: bool = False, **kwargs: Any) -> Any:
    """The traced call ``name``: one opaque region, or with ``async_op`` two around the user's
    wait where ``name.splits`` says so. Arguments that are None are left out (the region takes
    no None): pass them by keyword; the tensor is the first that is one (or a list of them)."""
    kw = {k: v for k, v in kwargs.items() if v is not None}
    if async_op and traced.has_entry(name + ".splits"):
        i = next(i for i, a in enumerate(args) if isinstance(a, torch.Tensor)
                 or (isinstance(a, list) and a and all(isinstance(t, torch.Tensor) for t in a)))
        rest = args[:i] + args[i + 1:]
        plain = {k: v for k, v in kw.items() if k not in ("agree", "timeout")}
        if traced.splits(name, rest, plain):
            got = region(name + ".start", (args[i], *rest), kw)
            return Waiting(name, args[i], got, rest, kw)
    out = region(name, args, kw)
    return traced.Ready(out) if async_op else out
