"""shardc as DTensor's redistribution engine (``torch_backend.dtensor_engine()``): one
switch routes every redistribution DTensor performs to shardc's planner and runners.

Every redistribution DTensor makes (``DTensor.redistribute``, ``full_tensor()``,
``to_local(grad_placements=...)``, the ones its op dispatch inserts for an op's
arguments, and the backward of each) calls ``redistribute_local_tensor(local, src_spec,
dst_spec)``. While the engine is on, that name, in every module that imported it, is
``_engine``: the two ``DTensorSpec``s become shardc types on the DeviceMesh's root mesh
(``torch_backend.dtensor_specs``), the pair is compiled and bound once (cached per spec
pair, anchored to the process group or LocalTensorMode it was bound for), and the bound
program runs on the local tensor. A pair shardc cannot express goes DTensor's own way,
counted under a named reason (``dtensor_specs.REASONS``). Leaving the switch puts
DTensor's own function back in every module it was taken from.

DTensor's backward is just another call here: it redistributes the incoming gradient,
with its own placements, back to the source's (a Partial source normalised to
Replicate), and the engine gives that call DTensor's answer.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from lowering.caching import anchored_get, anchored_put, on_clear
from lowering.layout import local_shapes
from spec_lang.errors import SpecError
from torch_backend.bound import BoundCall, Handle, bind
from torch_backend.dtensor_specs import REASONS, plan_pair
from torch_backend.groups import local_tensor_mode

_NAME = "redistribute_local_tensor"
_STATS: dict[str, Any] = {"taken": 0, "fallback": 0, "reasons": Counter()}
# (src spec, dst spec) -> (anchor, BoundCall or a fallback reason); the anchor is the default
# process group or the LocalTensorMode the BoundCall was made under (compared by identity)
_PLANS: OrderedDict[tuple[Any, Any], tuple[Any, Any]] = OrderedDict()
_PLANS_MAX = 4096
on_clear(_PLANS.clear)

# the switch's state: a stack of the contexts entered (innermost last) over the process setting
_STATE: dict[str, Any] = {"process": False, "stack": [], "original": None, "patched": []}


def dtensor_engine_stats() -> dict[str, Any]:
    """``{"taken": n, "fallback": n, "reasons": {reason: n}}``: the redistributions the
    engine ran and those it handed to DTensor's own path, cumulative for the process
    (counted when a call is made; under torch.compile, when it is traced)."""
    return {"taken": _STATS["taken"], "fallback": _STATS["fallback"], "reasons": dict(_STATS["reasons"])}


def use_dtensor_engine(enabled: bool = True) -> None:
    """Route every DTensor redistribution of this process through shardc (``False``: DTensor's
    own path again). A ``dtensor_engine(...)`` context inside it still decides within."""
    _STATE["process"] = bool(enabled)
    _apply()


@contextmanager
def dtensor_engine(enabled: bool = True) -> Iterator[None]:
    """Within the block, DTensor's redistributions run on shardc (``enabled=False``: on
    DTensor's own path); on leaving, the setting outside the block holds again. Nests."""
    stack: list[bool] = _STATE["stack"]
    stack.append(bool(enabled))
    _apply()
    try:
        yield
    finally:
        stack.pop()
        _apply()


def _on() -> bool:
    stack: list[bool] = _STATE["stack"]
    return stack[-1] if stack else bool(_STATE["process"])


def _apply() -> None:
    """Put ``_engine`` in every module that holds DTensor's function, or put it back."""
    from torch.distributed.tensor import _redistribute

    if _STATE["original"] is None:
        _STATE["original"] = getattr(_redistribute, _NAME)
    original = _STATE["original"]
    if _on():
        for module in list(sys.modules.values()):
            # DTensor's modules import the function by name at import time (_api, _dispatch,
            # experimental._tp_transform, the test helpers); the rest import it lazily from
            # _redistribute, which is patched too
            if getattr(module, _NAME, None) is original and module not in _STATE["patched"]:
                setattr(module, _NAME, _engine)
                _STATE["patched"].append(module)
        return
    # every module that holds the engine, also one that imported the name while it was on
    for module in [*_STATE["patched"], *list(sys.modules.values())]:
        if getattr(module, _NAME, None) is _engine:
            setattr(module, _NAME, original)
    _STATE["patched"] = []


def _engine(local_tensor: torch.Tensor, current_spec: Any, target_spec: Any, *, async_op: bool = False,
            use_graph_based_transform: bool | None = None, is_explicit: bool = False) -> torch.Tensor:
    """DTensor's ``redistribute_local_tensor``, planned and run by shardc where it can."""
    plan, reorderable = _plan(current_spec, target_spec)
    if reorderable and not torch.compiler.is_compiling():
        source = _true_source(current_spec)
        if source is not None:
            current_spec = source
            plan, _ = _plan(current_spec, target_spec)
    if type(plan) is str:
        _STATS["fallback"] += 1
        _STATS["reasons"][plan] += 1
        if torch.compiler.is_compiling():  # traced once: say so, rather than fall back silently
            warnings.warn(f"shardc's DTensor engine leaves {current_spec} -> {target_spec} to DTensor's own path: "
                          f"{REASONS[plan]} ({plan})", stacklevel=2)
        return _STATE["original"](local_tensor, current_spec, target_spec, async_op=async_op,
                                  use_graph_based_transform=use_graph_based_transform, is_explicit=is_explicit)
    _STATS["taken"] += 1
    if plan is _UNMOVED:
        return local_tensor
    bound: BoundCall = plan
    if async_op and local_tensor_mode() is None and not torch.compiler.is_compiling():
        return _in_flight(bound, local_tensor)
    return bound.run_one(local_tensor)


def _in_flight(bound: BoundCall, x: torch.Tensor) -> torch.Tensor:
    """``async_op=True`` as DTensor answers it: the program's last collective left on the
    wire (``BoundCall.start``), the result an ``AsyncCollectiveTensor`` that waits for it
    on first use (a view of it too: torch's registry of in-flight work keys the wait by
    storage). The waited result is copied into the buffer handed out now. Under
    LocalTensorMode and in a trace DTensor's own answer is synchronous, and so is this."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    if bound.last_collective() < 0:
        return bound.run_one(x)
    program, ctx = bound.program, bound.ctx
    out = torch.empty(local_shapes(program.dst, program.mesh)[ctx.rank], dtype=x.dtype, device=x.device)
    torch._C._distributed_c10d._register_work(out, _Landing(bound.start([x], one=True), out))
    return AsyncCollectiveTensor(out)


class _Landing(torch.distributed.Work):
    """The in-flight work of an async engine call: its wait (torch's ``wait_tensor`` on the
    result's first use) finishes the call and lands the result in ``out``, once."""

    def __init__(self, handle: Handle, out: torch.Tensor) -> None:
        super().__init__()
        self._handle: Handle | None = handle
        self._out = out

    def wait(self, timeout: Any = None) -> bool:
        if self._handle is not None:
            with torch.no_grad():
                self._out.copy_(self._handle.wait())
            self._handle = None
        return True


_UNMOVED: Any = object()  # the pair moves nothing: DTensor's own answer is its input


def _plan(src: Any, dst: Any) -> Any:
    """The bound program of ``src -> dst`` (or ``_UNMOVED``, or a fallback reason), from the
    cache where this world or mode made it before."""
    lm = local_tensor_mode()
    anchor = lm if lm is not None else torch.distributed.GroupMember.WORLD
    key = (src, dst)
    hit = anchored_get(_PLANS, key, anchor)
    if hit is not None:
        return hit
    from torch.utils._python_dispatch import _disable_current_modes

    if torch.compiler.is_compiling() or lm is None:
        # traced: DTensor calls this on fake tensors; the planning and the binding are
        # torch-free or made of real process groups, so they run outside the trace's modes
        with _disable_current_modes():
            plan = _made(src, dst, lm)
    else:
        plan = _made(src, dst, lm)
    entry = (plan, _reorderable(src))
    anchored_put(_PLANS, key, anchor, entry, _PLANS_MAX)
    return entry


def _reorderable(spec: Any) -> bool:
    """Whether some tensor dim of ``spec`` is split over several mesh dims in a shard_order
    of its own (none with _StridedShard placements, which carry their order)."""
    if spec.use_strided_shard_as_shard_order:
        return False
    dims = [p.dim for p in spec.placements if type(p).__name__ == "Shard"]
    return len(dims) != len(set(dims))


def _true_source(spec: Any) -> Any | None:
    """The source spec with the shard_order DTensor dropped, where it dropped one.

    With ``forward_dtype`` (``backward_dtype`` in the backward), DTensor casts the local
    tensor and rebuilds its spec from the placements alone, so a DTensor whose shard_order
    is not the default one reaches here described by the default order: its rows would be
    read in the wrong order. The DTensor itself is the caller's (``Redistribute.forward``'s
    ``input``, ``_redistribute_backward``'s ``grad_output``), and carries the order."""
    from torch.distributed.tensor import _redistribute

    frame = sys._getframe(2)
    code = frame.f_code
    if code is _redistribute.Redistribute.forward.__code__:
        dt = frame.f_locals.get("input")
    elif code is _redistribute._redistribute_backward.__code__:
        dt = frame.f_locals.get("grad_output")
    else:
        return None
    real = getattr(dt, "_spec", None)
    if real is None or real.shard_order == spec.shard_order or tuple(real.placements) != tuple(spec.placements):
        return None
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    return DTensorSpec(spec.mesh, tuple(spec.placements), tensor_meta=spec.tensor_meta, shard_order=real.shard_order)


def _made(src: Any, dst: Any, lm: Any) -> Any:
    pair = plan_pair(src, dst, lm)
    if isinstance(pair, str):
        return pair
    if pair.program.steps == ():
        return _UNMOVED
    try:
        return bind(pair.program, pair.ctx)
    except SpecError:  # e.g. a reduction of a dtype torch cannot add, refused when bound
        return "refused"
