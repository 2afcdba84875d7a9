"""``redistribute_many``: many tensors redistributed at once, their collectives packed.

    ys = torch_backend.redistribute_many(params, ["f32[1024@dp,64]", ...], ["f32[1024,64]", ...], mesh)

The set is compiled jointly (``lowering.compile_many``): in each round, the steps of one
kind over one axis set, reduce op and dtype run as one collective on one packed buffer
(``torch_backend.packed``); the tensors may differ in shape and dtype (one collective per
dtype). Every check runs before the first collective; differentiable, with the joint
program of the gradients' programs as the backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from lowering.checks import check_flag
from lowering.joint import check_type_lists
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType
from torch_backend import traced
from torch_backend.api import agreed_bound, agreeing, bound_for, check_agree, hot_bound, text_key
from torch_backend.bound import BoundCall
from torch_backend.tensor_checks import check_all


def redistribute_many(xs: Sequence[torch.Tensor], srcs: Sequence[TensorType | str],
                      dsts: Sequence[TensorType | str], mesh: Mesh | str | Any, *,
                      timeout: timedelta | float | None = None, agree: bool | None = None,
                      async_op: bool = False, dst_mesh: Mesh | str | Any | None = None) -> Any:
    """Redistribute ``xs[i]`` from ``srcs[i]`` to ``dsts[i]``, all on ``mesh``, jointly.

    Returns the new blocks in order; the inputs are never modified. See the module docstring.
    ``async_op=True`` returns a handle at once, the last round's collectives on the wire;
    ``handle.wait()`` gives the list (do not modify the inputs before it).

    ``dst_mesh=``: every ``dsts[i]`` on another mesh, one joint cross-mesh program
    (``torch_backend.mesh_transfer``; None for the tensors off ``mesh``).
    """
    if type(async_op) is not bool:  # its truthiness would decide silently
        check_flag(async_op, "async_op", "async_op=True returns a handle whose wait() gives the result")
    if dst_mesh is not None:
        if async_op:
            raise SpecError("async_op=True is not supported with dst_mesh=", hint="drop async_op")
        from torch_backend import mesh_transfer

        return mesh_transfer.redistribute_many(xs, srcs, dsts, mesh, dst_mesh=dst_mesh, timeout=timeout)
    if torch.compiler.is_dynamo_compiling() and isinstance(xs, (list, tuple)):
        from torch_backend import trace_marks

        return trace_marks.call("redistribute_many", list(xs), list(srcs), list(dsts), mesh, async_op=async_op,
                                timeout=timeout, agree=agree)
    if type(mesh) is str and timeout is None and not async_op and type(xs) in (list, tuple):
        try:
            hot = hot_bound(*text_key(tuple(srcs), tuple(dsts), mesh)) if xs else None
        except Exception:  # not lists of types (unhashable, a DTensor, ...): refused below
            hot = None
        if (hot is not None and len(xs) == len(hot.programs) and all(hot.fits(x, j) for j, x in enumerate(xs))
                and not agreeing(check_agree(agree))):
            return hot.call(xs)
    if isinstance(xs, torch.Tensor) or not isinstance(xs, Sequence):
        raise SpecError("redistribute_many takes a sequence of tensors",
                        hint="pass a list, e.g. redistribute_many([x, y], [src_x, src_y], [dst_x, dst_y], mesh)")
    check_agree(agree)
    check_type_lists("redistribute_many", srcs, dsts,
                     "redistribute_many([x], ['f32[8@dp]'], ['f32[8]'], 'dp=2'); for one tensor, redistribute")
    if not (len(xs) == len(srcs) == len(dsts)) or not xs:
        raise SpecError(f"got {len(xs)} tensors, {len(srcs)} source types and {len(dsts)} destination types",
                        hint="pass one source and one destination type per tensor (at least one)")
    if agreeing(agree):
        bound, checked = agreed_bound(xs, tuple(srcs), tuple(dsts), mesh, timeout)
    else:
        bound = prepare_many(srcs, dsts, mesh, timeout=timeout)
        checked = check_all(xs, [p.src for p in bound.programs], bound.ctx, bound.expect)
    if async_op:
        return bound.start(checked, one=False)
    return bound.call(checked)


traced.entry("redistribute_many")(redistribute_many)


# async_op=True inside torch.compile, in two regions around the user's wait (trace_marks.Waiting)
@traced.entry("redistribute_many.splits")
def _async_splits(srcs: Sequence[TensorType | str], dsts: Sequence[TensorType | str], mesh: Any, **_: Any) -> bool:
    return prepare_many(srcs, dsts, mesh).issues()


@traced.entry("redistribute_many.start")
def _async_start(xs: Sequence[Any], srcs: Sequence[TensorType | str], dsts: Sequence[TensorType | str], mesh: Any,
                 **_: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return prepare_many(srcs, dsts, mesh).issue_all(xs)


@traced.entry("redistribute_many.finish")
def _async_finish(xs: Sequence[Any], got: tuple[list[torch.Tensor], list[torch.Tensor]],
                  srcs: Sequence[TensorType | str], dsts: Sequence[TensorType | str], mesh: Any,
                  **_: Any) -> list[torch.Tensor]:
    return prepare_many(srcs, dsts, mesh).land_all(xs, got)


def prepare_many(srcs: Sequence[TensorType | str], dsts: Sequence[TensorType | str], mesh: Mesh | str | Any, *,
                 timeout: timedelta | float | None = None) -> BoundCall:
    """The tensor-independent part of ``redistribute_many``: checked, compiled and bound."""
    return bound_for(tuple(srcs), tuple(dsts), mesh, timeout)
