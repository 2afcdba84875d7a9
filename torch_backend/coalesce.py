"""``redistribute_many``: many tensors redistributed at once, their collectives packed.

    ys = torch_backend.redistribute_many(params, ["f32[1024@dp,64]", ...], ["f32[1024,64]", ...], mesh)
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import partial
from typing import Any

import torch

from spec_lang.ir import Mesh, TensorType
from torch_backend import mesh_transfer, traced
from torch_backend.api import Door, async_entries, bound_for, hot_bound, text_key, through_door
from torch_backend.bound import BoundCall


def redistribute_many(xs: Sequence[torch.Tensor], srcs: Sequence[TensorType | str],
                      dsts: Sequence[TensorType | str], mesh: Mesh | str | Any, *,
                      timeout: timedelta | float | None = None, agree: bool | None = None,
                      async_op: bool = False, dst_mesh: Mesh | str | Any | None = None) -> Any:
    """Redistribute ``xs[i]`` from ``srcs[i]`` to ``dsts[i]``, all on ``mesh``, jointly
    (``lowering.compile_many``: in each round, the steps of one kind over one axis set, reduce
    op and dtype run as one collective on one packed buffer; the tensors may differ in shape
    and dtype). Returns the new blocks in order, differentiable; the inputs are never modified.
    ``async_op=True`` returns a handle at once, the last round's collectives on the wire;
    ``handle.wait()`` gives the list (do not modify the inputs before it).

    ``dst_mesh=``: every ``dsts[i]`` on another mesh, one joint cross-mesh program
    (``torch_backend.mesh_transfer``; None for the tensors off ``mesh``).
    """
    return through_door(MANY, xs, srcs, dsts, mesh, timeout, agree, async_op, dst_mesh=dst_mesh)


def _compiled(xs: Any, srcs: Any, dsts: Any, mesh: Any, *, async_op: bool, timeout: Any, agree: Any) -> Any:
    if not isinstance(xs, (list, tuple)):
        return None  # refused eagerly
    from torch_backend import trace_marks

    return trace_marks.call("redistribute_many", list(xs), list(srcs), list(dsts), mesh, async_op=async_op,
                            timeout=timeout, agree=agree)


def _fast(xs: Any, srcs: Any, dsts: Any, mesh: Any, _: Any) -> Any:
    if type(mesh) is not str or type(xs) not in (list, tuple) or not xs:
        return None
    try:
        hot = hot_bound(*text_key(tuple(srcs), tuple(dsts), mesh))
    except Exception:  # not lists of types (unhashable, a DTensor, ...): refused by _resolve
        return None
    if hot is not None and len(xs) == len(hot.programs) and all(hot.fits(x, j) for j, x in enumerate(xs)):
        return hot.call(xs)
    return None


def _resolve(xs: Any, srcs: Any, dsts: Any, mesh: Any,
             _: Any) -> tuple[list[Any], tuple[Any, ...], tuple[Any, ...], Any]:
    mesh_transfer.check_lists(xs, srcs, dsts)
    return list(xs), tuple(srcs), tuple(dsts), mesh


# dst_mesh=: as api.ACROSS, the inputs as given, checked in the agreement (a wrong list fails everywhere)
MANY = Door(_compiled, _fast, _resolve, one=False,
            across=Door(None, None, lambda xs, srcs, dsts, meshes, _: (xs, srcs, dsts, meshes), one=False,
                        agreement=partial(mesh_transfer.agreed_across, one=False), out=mesh_transfer.outputs))


traced.entry("redistribute_many")(redistribute_many)


async_entries("redistribute_many", lambda srcs, dsts, mesh, **_: prepare_many(srcs, dsts, mesh))


def prepare_many(srcs: Sequence[TensorType | str], dsts: Sequence[TensorType | str], mesh: Mesh | str | Any, *,
                 timeout: timedelta | float | None = None) -> BoundCall:
    return bound_for(tuple(srcs), tuple(dsts), mesh, timeout)
