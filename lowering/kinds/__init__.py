"""Step kinds: one definition per kind of step, and the functions that use them.

Each kind (``lowering.kinds.base.StepKind``) holds its type rule, price, per-rank pieces,
numpy semantics and dual; this package builds priced Steps from them and runs the pieces:

* ``make_step(kind, src, dst, mesh)``: a checked, priced Step for one collective or local
  op between two given types (the public way to build a one-step Program by hand;
  ``make_program``, from ``lowering.program``, chains such steps);
* ``rank_pieces(step, mesh, rank)``: one rank's pieces (the executor computes only its own);
* ``simulate_step(step, mesh, xs)``: the numpy semantics over every rank's block.
"""

from __future__ import annotations

import gc
import operator
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from lowering.caching import MIB, cached
from lowering.kinds import (  # noqa: F401 - each registers its kinds
    across,
    exchange,
    gather,
    local,
    reduce,
    relay,
    retype,
    uneven_exchange,
)
from lowering.kinds.base import KINDS, Piece, RankPieces, StepKind, dual_kind, kind_of
from lowering.layout import group_ranks, local_shapes
from lowering.program import Step, make_program
from spec_lang.errors import SpecError, value_text
from spec_lang.ir import Mesh, TensorType

__all__ = [
    "COLLECTIVE_KINDS", "KINDS", "LAUNCHES", "Piece", "RankPieces", "StepKind", "dual_kind", "kind_of", "make_program",
    "make_step", "members_of", "priced_step", "rank_pieces", "simulate_step", "wire_bytes",
]

# the names of the kinds that communicate (the planner counts its collectives by name)
COLLECTIVE_KINDS = frozenset(name for name, k in KINDS.items() if k.collective)
# how many collectives each kind runs (0: a local kind), as the search and the cost count them
LAUNCHES = {name: k.launches if k.collective else 0 for name, k in KINDS.items()}


def priced_step(kind: str, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
                dims: tuple[int, ...], op: str | None = None, padded: bool | None = None) -> Step:
    """A Step whose type rule has already been met (the planner's moves), priced exactly.

    ``padded=None`` takes the kind's own choice (a reduce_scatter pads uneven pieces);
    ``padded=False`` on an uneven reduce_scatter exchanges the exact pieces instead.
    """
    spec = kind_of(kind)
    name = spec.refine(src, dst, mesh, axes)
    spec = kind_of(name)
    pad = spec.padded(src, dst, mesh, axes) if padded is None else padded
    sent = tuple((spec.price(src, dst, mesh, axes, padded=pad) * src.itemsize).tolist())
    got = tuple((spec.received(src, dst, mesh, axes, padded=pad) * src.itemsize).tolist())
    phased = tuple((spec.moved(src, dst, mesh, axes, padded=pad) * src.itemsize).tolist()) if spec.launches > 1 else ()
    return Step(name, axes, dims, src, dst, (op or "sum") if spec.reduces else None,
                local_shapes(src, mesh), local_shapes(dst, mesh), sent, pad, collective=spec.collective,
                bytes_recv=got, bytes_phased=phased, launches=spec.launches)


def make_step(kind: str, src: TensorType | str, dst: TensorType | str, mesh: Mesh | str, *,
              axes: tuple[str, ...] | str | None = None, padded: bool | None = None) -> Step:
    """One checked, priced step of ``kind`` from ``src`` to ``dst`` (types as IR or strings).

    The kind's type rule derives the group axes, the dims and the reduce op from the two
    types (``axes`` may be given to fix the group order of a flattened collective), and
    refuses a pair it does not take with a SpecError that names the rule::

        make_step("all_gather", "f32[8@tp,4]", "f32[8,4]", "dp=2,tp=4")
        make_step("reduce_scatter", "f32[8,4]{U:tp}", "f32[8@tp,4]", "dp=2,tp=4")
    """
    from lowering.checks import check_flag, resolve

    s, m = resolve(src, mesh)
    d, _ = resolve(dst, m)
    if isinstance(axes, str):
        axes = (axes,)
    spec = kind_of(kind)
    if spec.crosses:
        raise SpecError(f"a {kind} step crosses to another mesh: its messages depend on both meshes",
                        hint="plan it with lowering.compile(src, dst, mesh, dst_mesh=...)")
    if axes is not None:
        if not isinstance(axes, (tuple, list)) or not all(isinstance(a, str) for a in axes):
            raise SpecError(f"axes must be mesh axis names, got {value_text(axes)}",
                            hint=f"pass a tuple of mesh axis names, e.g. axes=({m.names[0]!r},)")
        for a in axes:
            if a not in m:
                raise SpecError(f"mesh axis {a!r} is not on the mesh {m}", hint=f"use one of {', '.join(m.names)}")
        if len(set(axes)) != len(axes):
            raise SpecError(f"axes {list(axes)} repeat a mesh axis", hint="name each mesh axis once")
    check_flag(padded, "padded", "leave it None to let the step kind choose (an even or padded collective)")
    sig = spec.infer(s, d, m, None if axes is None else tuple(axes))
    return priced_step(spec.name, s, d, m, sig.axes, sig.dims, sig.op, padded)


def members_of(step: Step, mesh: Mesh, rank: int) -> tuple[int, ...]:
    """``rank``'s group for ``step`` in process-group order (sorted mesh ranks, as torch's
    ``new_group`` orders them); just the rank itself for a local step or a group of one."""
    if not kind_of(step.kind).collective or mesh.group_size(step.axes) == 1:
        return (rank,)
    return tuple(sorted(group_ranks(mesh, step.axes, rank)))


def rank_pieces(step: Step, mesh: Mesh | str, rank: int, members: tuple[int, ...] | None = None) -> RankPieces:
    """``rank``'s pieces of ``step``: only this rank's, read off the layout algebra."""
    from spec_lang.parser import parse_mesh

    m = parse_mesh(mesh)
    r = _checked_rank(step, m, rank)
    if members is not None:
        group = members_of(step, m, r)
        try:
            listed = tuple(operator.index(q) for q in members)
        except (TypeError, RuntimeError):  # not ints, or the iteration raises (a DTensor)
            listed = ()
        if sorted(listed) != list(group):
            raise SpecError(
                f"members {value_text(members)} are not rank {r}'s group for {step.describe()}: "
                f"{list(group)} in some order",
                hint="pass the group's mesh ranks in process-group order, or leave members out (sorted order)")
        members = listed
    return _rank_pieces(step, m, r, members)


@cached(maxsize=4096, max_bytes=32 * MIB)
def _rank_pieces(step: Step, mesh: Mesh, rank: int, members: tuple[int, ...] | None) -> RankPieces:
    return kind_of(step.kind).pieces(step, mesh, rank, members if members is not None else
                                     members_of(step, mesh, rank))


def _checked_rank(step: Step, mesh: Mesh, rank: object) -> int:
    from lowering.checks import check_rank, check_type_once

    if not isinstance(step, Step):
        raise SpecError(f"expected a Step, got {type(step).__name__}",
                        hint="take a step from a compiled program, or build one with lowering.make_step")
    check_type_once(step.src, mesh)
    if step.dst_mesh is not None:  # a crossing: its ranks are the world's
        return check_rank(rank, Mesh(("world",), (across.world_ranks(step, mesh),)))
    return check_rank(rank, mesh)


def wire_bytes(step: Step, mesh: Mesh, received: bool = False) -> tuple[int, ...]:
    """Per rank, the bytes its pieces put on the wire, or take off it (``received``; computes
    every rank's pieces: for checks that the executor moves exactly the price, not for the hot
    path)."""
    ranks = mesh.size if step.dst_mesh is None else across.world_ranks(step, mesh)
    pieces = [rank_pieces(step, mesh, r) for r in range(ranks)]
    return tuple((p.wire_in_elems if received else p.wire_elems) * step.src.itemsize for p in pieces)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Every rank's pieces of a large group are millions of small tuples that live on (in
    the cache, in the caller's list) and form no cycles; the cyclic garbage collector would
    rescan them each time they age a generation, most of a 1,024-rank simulation's time.
    A collector already off stays off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def simulate_step(step: Step, mesh: Mesh, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run one step on every rank's numpy block (the step kind's numpy semantics); a
    crossing to another mesh on every world rank's (an empty block off a mesh)."""
    ranks = mesh.size if step.dst_mesh is None else across.world_ranks(step, mesh)
    with _collector_paused():
        pieces = [rank_pieces(step, mesh, r) for r in range(ranks)]
    return kind_of(step.kind).simulate(step, pieces, xs)

