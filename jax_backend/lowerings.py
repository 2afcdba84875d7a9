"""The JAX lowering of each step kind, registered under the kind's name.

A kind's type rule, pieces, numpy semantics and dual live in ``lowering.kinds``; its JAX
lowering is a function ``fn(step, mesh) -> Lowered`` registered here with ``@lowers("kind")``
(as ``torch_backend.runners``' ``@runs`` registers the torch runners). ``Lowered.run`` is
the step as a function of this rank's block inside ``jax.shard_map`` over every mesh axis
(a rank's coordinates come from ``lax.axis_index``); ``Lowered.calls`` names the ``lax``
calls it makes, for ``shardc plan --engine jax``.

An even step becomes the ``lax`` collective of its kind::

    all_gather      lax.all_gather(x, axes, axis=d, tiled=True)     a tuple: a merged group
    reduce_scatter  lax.psum_scatter(x, axes, scatter_dimension=d, tiled=True)
    all_reduce      lax.psum / pmax / pmin (avg: psum, divided once)
    all_to_all      lax.all_to_all(x, axes, split_axis, concat_axis, tiled=True)
    permute         lax.ppermute
    slice           lax.dynamic_slice_in_dim at lax.axis_index
    zero_fill       zeros off coordinate 0 (lax.axis_index)
    zero_pad        lax.dynamic_update_slice_in_dim into zeros
    divide          x / n (n: the group's size)
    reinterpret     nothing

Everything else (the uneven kinds, the relay, an all_to_all whose members talk to one or
two peers, a layout a ``lax`` collective cannot express) is an exact exchange in
``ppermute`` rounds over index tables read off the kind's numpy semantics
(``jax_backend.tables``). Those work on the flat block, padded to the largest rank's, since
inside ``shard_map`` every rank's block has one shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from jax_backend.box_exchange import as_bits, box_calls, box_exchange, box_plan
from jax_backend.tables import step_tables, table_exchange
from lowering.program import Step
from spec_lang.ir import Mesh, TensorType

Block = jax.Array


@dataclass(frozen=True)
class Lowered:
    """One step inside ``shard_map``: ``run`` maps this rank's block to its output block,
    both in their natural shape, or both flat and padded where ``flat`` (the ranks' blocks
    differ in shape); ``calls`` the ``lax`` calls, as text."""

    run: Callable[[Block], Block]
    calls: tuple[str, ...]
    flat: bool = False


Lowering = Callable[[Step, Mesh], Lowered]
LOWERINGS: dict[str, Lowering] = {}


def lowers(*kinds: str) -> Callable[[Lowering], Lowering]:
    """Register ``fn`` as the JAX lowering of ``kinds``."""

    def add(fn: Lowering) -> Lowering:
        for k in kinds:
            LOWERINGS[k] = fn
        return fn

    return add


def lower_step(step: Step, mesh: Mesh) -> Lowered:
    """The registered lowering of ``step``'s kind (every kind has one: the table exchange
    at least)."""
    return LOWERINGS.get(step.kind, exchange)(step, mesh)


def even(t: TensorType, mesh: Mesh) -> bool:
    """Every rank's block of ``t`` has one shape, cut as JAX cuts it (no uneven dim)."""
    return not t.is_uneven and all(d.size % mesh.group_size(d.axes) == 0 for d in t.dims)


def _name(axes: tuple[str, ...]) -> str | tuple[str, ...]:
    return axes[0] if len(axes) == 1 else axes


def _text(axes: tuple[str, ...]) -> str:
    return repr(_name(axes))


def _grown(src: TensorType, dst: TensorType) -> list[tuple[int, tuple[str, ...]]]:
    """(dim, axes) for each dim whose axis list ``dst`` extends at the minor end."""
    return [(k, b.axes[len(a.axes):]) for k, (a, b) in enumerate(zip(src.dims, dst.dims))
            if len(b.axes) > len(a.axes) and b.axes[: len(a.axes)] == a.axes]


def _world(mesh: Mesh) -> tuple[str, ...]:
    return mesh.names


def exchange(step: Step, mesh: Mesh) -> Lowered:
    """The exact exchange in ``ppermute`` rounds (``jax_backend.tables``)."""
    tables = step_tables(step, mesh)
    if tables.dense is not None:
        axes, rd = tables.dense
        calls: tuple[str, ...] = (f"lax.all_to_all(packed, {_text(axes)}, 0, 0, tiled=True)  "
                                  f"# {rd.send.shape[1]} pieces of {rd.width}",)
    else:
        calls = tuple(f"lax.ppermute(x, {_text(_world(mesh))}, perm={list(rd.perm)})" for rd in tables.rounds)
        calls += tuple(f"lax.ppermute(fan out, {_text(_world(mesh))}, perm={list(rd.perm)})" for rd in tables.fan_out)
    return Lowered(table_exchange(tables, _world(mesh)), calls or ("(local gather)",), flat=True)


def _even_pair(step: Step, mesh: Mesh) -> bool:
    return even(step.src, mesh) and even(step.dst, mesh)


@lowers("all_gather")
def all_gather(step: Step, mesh: Mesh) -> Lowered:
    if not _even_pair(step, mesh):
        return exchange(step, mesh)
    lost = _grown(step.dst, step.src)  # the gathered axes: the minor suffix each dim loses

    def run(x: Block) -> Block:
        for k, axes in lost:
            x = gather_dim(x, axes, k)
        return x

    return Lowered(run, tuple(f"lax.all_gather(x, {_text(a)}, axis={k}, tiled=True)" for k, a in lost))


def gather_dim(x: Block, axes: tuple[str, ...], k: int) -> Block:
    """``lax.all_gather(x, axes, axis=k, tiled=True)``, gathered on the major dim: XLA:CPU's
    all-gather of a minor dim is several times slower than the gather of a leading one plus
    one transpose."""
    if k == 0:
        return jax.lax.all_gather(x, _name(axes), axis=0, tiled=True)
    g = jax.lax.all_gather(x, _name(axes), axis=0, tiled=False)  # (members, *x.shape)
    shape = list(x.shape)
    shape[k] *= g.shape[0]
    return jnp.moveaxis(g, 0, k).reshape(shape)


def scatter_dim(x: Block, axes: tuple[str, ...], k: int, n: int) -> Block:
    """``lax.psum_scatter(x, axes, scatter_dimension=k, tiled=True)``, scattered on the major
    dim (XLA:CPU's reduce-scatter of a minor dim is ~100x slower than a transpose and the
    scatter of a leading one)."""
    if k == 0:
        return jax.lax.psum_scatter(x, _name(axes), scatter_dimension=0, tiled=True)
    shape = list(x.shape)
    split = shape[:k] + [n, shape[k] // n] + shape[k + 1:]
    return jax.lax.psum_scatter(jnp.moveaxis(x.reshape(split), k, 0), _name(axes), scatter_dimension=0,
                                tiled=False)


def scatter_dims(x: Block, grown: list[tuple[int, tuple[str, ...]]], sizes: list[int]) -> Block:
    """``scatter_dim`` on several dims at once, as one ``lax.psum_scatter`` over all their axes:
    each dim split into (its group's size, the rest), the group parts moved to the front in
    dim order, one scatter of the leading dim (its index row-major over the dims' axes, in
    that order, as the tuple of axis names). XLA reduces onto ``f32[8@dp,16@(cp,tp)]`` with
    one all-reduce; one reduce-scatter per dim ran 1.10-1.15x its time, one in all 1.0x."""
    dims = dict(zip((k for k, _ in grown), sizes))
    split: list[int] = []
    at: dict[int, int] = {}
    for k, size in enumerate(x.shape):
        if k in dims:
            at[k] = len(split)
            split += [dims[k], size // dims[k]]
        else:
            split.append(size)
    front = [at[k] for k, _ in grown]
    rest = [i for i in range(len(split)) if i not in front]
    parts = x.reshape(split).transpose(front + rest).reshape(-1, *(split[i] for i in rest))
    axes = tuple(a for _, ax in grown for a in ax)
    return jax.lax.psum_scatter(parts, _name(axes), scatter_dimension=0, tiled=False)


def swap_dims(x: Block, axes: tuple[str, ...], split: int, concat: int, n: int) -> Block:
    """``lax.all_to_all(x, axes, split, concat, tiled=True)`` as an exchange of the leading
    dim: XLA:CPU's all-to-all of minor dims ran ~1.8x slower than a transpose into one of the
    leading dim and one out of it."""
    if split == 0 and concat == 0:
        return jax.lax.all_to_all(x, _name(axes), 0, 0, tiled=True)
    shape = list(x.shape)
    parts = jnp.moveaxis(x.reshape(shape[:split] + [n, shape[split] // n] + shape[split + 1:]), split, 0)
    got = jax.lax.all_to_all(parts, _name(axes), 0, 0, tiled=True)  # row m: member m's piece
    out = list(got.shape[1:])
    out[concat] *= n
    return jnp.moveaxis(got, 0, concat).reshape(out)


def _slice_mine(x: Block, k: int, axes: tuple[str, ...], n: int) -> Block:
    size = x.shape[k] // n
    at: list[Any] = [0] * x.ndim
    at[k] = jax.lax.axis_index(_name(axes)) * size  # in bounds: no negative-index fix-up to compile
    return jax.lax.dynamic_slice(x, at, (*x.shape[:k], size, *x.shape[k + 1:]), allow_negative_indices=False)


def _finish(op: str | None, x: Block, n: int) -> Block:
    if op != "avg" or n == 1:
        return x
    if jnp.issubdtype(x.dtype, jnp.integer):  # truncated toward zero, as lowering's average
        return jnp.sign(x) * (jnp.abs(x) // n)
    return x / jnp.asarray(n, x.dtype)


def _reduce(op: str | None, x: Block, axes: tuple[str, ...]) -> Block:
    if op == "max":
        return jax.lax.pmax(x, _name(axes))
    if op == "min":
        return jax.lax.pmin(x, _name(axes))
    return jax.lax.psum(x, _name(axes))


@lowers("reduce_scatter")
def reduce_scatter(step: Step, mesh: Mesh) -> Lowered:
    if not _even_pair(step, mesh) or step.dst.dtype == "bool":
        return exchange(step, mesh)
    grown = _grown(step.src, step.dst)
    op, n = step.op, mesh.group_size(step.axes)
    if op in ("max", "min"):  # no scatter of a max: reduce, then keep this rank's piece

        def run_full(x: Block) -> Block:
            x = _reduce(op, x, step.axes)
            for k, axes in grown:
                x = _slice_mine(x, k, axes, mesh.group_size(axes))
            return x

        return Lowered(run_full, (f"lax.p{op}(x, {_text(step.axes)})",
                                  *(f"lax.dynamic_slice_in_dim(x, axis_index({_text(a)}), axis={k})"
                                    for k, a in grown)))

    def run(x: Block) -> Block:
        if len(grown) > 1:  # one collective, not one a dim (XLA:CPU: a latency each)
            return _finish(op, scatter_dims(x, grown, [mesh.group_size(a) for _, a in grown]), n)
        for k, axes in grown:
            x = scatter_dim(x, axes, k, mesh.group_size(axes))
        return _finish(op, x, n)

    calls = tuple(f"lax.psum_scatter(x, {_text(a)}, scatter_dimension={k}, tiled=True)" for k, a in grown) \
        if len(grown) == 1 else (f"lax.psum_scatter(dims {[k for k, _ in grown]} in front, "
                                 f"{_text(tuple(a for _, ax in grown for a in ax))}, scatter_dimension=0)",)
    return Lowered(run, calls + ((f"x / {n}",) if op == "avg" else ()))


@lowers("all_reduce")
def all_reduce(step: Step, mesh: Mesh) -> Lowered:
    if not _even_pair(step, mesh) or step.dst.dtype == "bool":
        return exchange(step, mesh)
    op, n = step.op, mesh.group_size(step.axes)

    def run(x: Block) -> Block:
        return _finish(op, _reduce(op, x, step.axes), n)

    word = {"max": "pmax", "min": "pmin"}.get(op or "sum", "psum")
    return Lowered(run, (f"lax.{word}(x, {_text(step.axes)})",) + ((f"x / {n}",) if op == "avg" else ()))


def _dense_swap(step: Step) -> tuple[int, int, tuple[str, ...]] | None:
    """(split dim, concat dim, axes) where the step moves one suffix of axes from one dim's
    minor end to another's: every member sends every other a piece, ``lax.all_to_all``."""
    lost = _grown(step.dst, step.src)
    grown = _grown(step.src, step.dst)
    changed = [k for k, (a, b) in enumerate(zip(step.src.dims, step.dst.dims)) if a.axes != b.axes]
    if len(lost) != 1 or len(grown) != 1 or len(changed) != 2 or lost[0][1] != grown[0][1]:
        return None
    return grown[0][0], lost[0][0], lost[0][1]


def boxes_or_tables(step: Step, mesh: Mesh) -> Lowered:
    """An even exchange as box pieces (``jax_backend.box_exchange``), else the tables."""
    plan = box_plan(step, mesh)
    if plan is None:
        return exchange(step, mesh)
    names = _world(mesh)
    if plan.dense is not None:
        d = plan.dense
        calls: tuple[str, ...] = (f"lax.all_to_all(take(cells(x, {list(d.shape)}), send[me]), "
                                  f"{_text(d.axes)}, 0, 0, tiled=True)",)
    else:
        packed = plan.packed
        calls = (f"lax.all_to_all(stack(dynamic_slice(x, .., {list(packed.shape)}) per member), "
                 f"{_text(packed.axes)}, 0, 0, tiled=True)  # padded: one collective, not rounds",) if packed else ()
        piece = (lambda rd: f"take(cells(x, {list(rd.shape)}), send[me])") if plan.grid is not None else \
            (lambda rd: "x" if rd.whole else f"dynamic_slice(x, .., {list(rd.shape)})")
        calls += tuple(f"keep {piece(rd)}" if rd.local else
                       f"lax.ppermute({piece(rd)}, {_text(names)}, perm={[p for p in rd.pairs if p[0] != p[1]]})"
                       if rd.groups is None else
                       f"lax.all_to_all(stack([{piece(rd)}] * 2), {_text(names)}, 0, 0, axis_index_groups={list(rd.groups)})"
                       f"  # within pairs: {[p for p in rd.pairs if p[0] != p[1]]}"
                       for rd in plan.rounds)
        if plan.grid is not None:
            calls += ("uncells(take(stack(pieces), place[me]))",)
    return Lowered(box_exchange(plan, names), calls)


@lowers("all_to_all")
def all_to_all(step: Step, mesh: Mesh) -> Lowered:
    swap = _dense_swap(step) if _even_pair(step, mesh) else None
    if swap is None:  # a merged exchange: one all_to_all where every member talks to every
        return boxes_or_tables(step, mesh)  # other, else ppermute rounds (a dense one would send more)
    split, concat, axes = swap
    n = mesh.group_size(axes)

    def run(x: Block) -> Block:
        return as_bits(x, lambda bits: swap_dims(bits, axes, split, concat, n))

    return Lowered(run, (f"lax.all_to_all(x, {_text(axes)}, split_axis={split}, concat_axis={concat}, tiled=True)",))


@lowers("permute")
def permute(step: Step, mesh: Mesh) -> Lowered:
    """Each rank's block is one peer's whole block: one ``ppermute`` (else box rounds)."""
    return boxes_or_tables(step, mesh)


@lowers("slice")
def slice_(step: Step, mesh: Mesh) -> Lowered:
    if not _even_pair(step, mesh):
        return exchange(step, mesh)
    grown = _grown(step.src, step.dst)

    def run(x: Block) -> Block:
        for k, axes in grown:
            x = _slice_mine(x, k, axes, mesh.group_size(axes))
        return x

    return Lowered(run, tuple(f"lax.dynamic_slice_in_dim(x, axis_index({_text(a)}) * size, size, axis={k})"
                              for k, a in grown))


@lowers("zero_fill")
def zero_fill(step: Step, mesh: Mesh) -> Lowered:
    if not _even_pair(step, mesh):
        return exchange(step, mesh)
    names = step.axes

    def run(x: Block) -> Block:
        return jnp.where(jax.lax.axis_index(_name(names)) == 0, x, jnp.zeros_like(x))

    return Lowered(run, (f"where(axis_index({_text(names)}) == 0, x, 0)",))


@lowers("divide")
def divide(step: Step, mesh: Mesh) -> Lowered:
    n = mesh.group_size(step.axes)  # elementwise: a padded uneven block divides alike

    def run(x: Block) -> Block:
        return (x / n).astype(x.dtype)

    return Lowered(run, (f"x / {n}",))


@lowers("zero_pad")
def zero_pad(step: Step, mesh: Mesh) -> Lowered:
    if not _even_pair(step, mesh):
        return exchange(step, mesh)
    lost = _grown(step.dst, step.src)

    def run(x: Block) -> Block:
        for k, axes in lost:
            n = mesh.group_size(axes)
            shape = list(x.shape)
            shape[k] *= n
            at = jax.lax.axis_index(_name(axes)) * x.shape[k]
            x = jax.lax.dynamic_update_slice_in_dim(jnp.zeros(shape, x.dtype), x, at, axis=k)
        return x

    return Lowered(run, tuple(f"lax.dynamic_update_slice_in_dim(zeros, x, axis_index({_text(a)}), axis={k})"
                              for k, a in lost))


@lowers("reinterpret")
def reinterpret(step: Step, mesh: Mesh) -> Lowered:
    return Lowered(lambda x: x, ("(no data moves)",))


@lowers("all_to_allv")
def all_to_allv(step: Step, mesh: Mesh) -> Lowered:
    """Between even layouts (the planner takes it for a merged exchange there too), the box
    pieces of an even exchange; between uneven ones the exact exchange (below)."""
    return boxes_or_tables(step, mesh) if _even_pair(step, mesh) else exchange(step, mesh)


@lowers("slicev")
def slicev(step: Step, mesh: Mesh) -> Lowered:
    """Between even layouts a slice is ``slice``'s ``dynamic_slice`` at ``axis_index``
    (the planner may name it either kind); else the exact exchange (a local gather)."""
    return slice_(step, mesh) if _even_pair(step, mesh) else exchange(step, mesh)


@lowers("reduce_scatterv", "all_gatherv", "relay", "pcast", "stack")
def uneven(step: Step, mesh: Mesh) -> Lowered:
    """Uneven pieces and the relay: the exact exchange (``ppermute`` rounds on every
    backend; on GPU ``lax.ragged_all_to_all`` could take an all_to_allv in one call, but
    XLA:CPU has none, and one lowering for both keeps the outputs equal). The relay runs
    its two phases, as planned and priced (``jax_backend.tables.relay_tables``)."""
    return exchange(step, mesh)


Calls = tuple[tuple[str, int], ...]  # (lax collective, members of its group), in order


def lowered_collectives(step: Step, mesh: Mesh) -> tuple[Calls, int | None] | None:
    """The ``lax`` collectives ``lower_step`` runs for a collective step, each with its
    group's size (a ``ppermute`` over the whole mesh: it spans every device), and the bytes
    the busiest rank sends where the lowering sends more than the kind's price (a padded
    all_to_all), else None. None for the table exchanges (priced by their kind): this walks
    the same choices as the lowerings above, so the JAX cost model prices what runs."""
    kind = step.kind
    if kind in ("all_gather", "reduce_scatter", "all_reduce") and _even_pair(step, mesh) \
            and (kind == "all_gather" or step.dst.dtype != "bool"):
        if kind == "all_gather":
            return tuple(("all_gather", mesh.group_size(a)) for _, a in _grown(step.dst, step.src)), None
        if kind == "all_reduce" or step.op in ("max", "min"):
            return (("psum", mesh.group_size(step.axes)),), None
        grown = _grown(step.src, step.dst)  # several dims: one psum_scatter (scatter_dims)
        return (("psum_scatter", math.prod(mesh.group_size(a) for _, a in grown)),), None
    if kind not in ("all_to_all", "permute", "all_to_allv") or not _even_pair(step, mesh):
        return None
    if kind == "all_to_all" and _dense_swap(step) is not None:
        return (("all_to_all", mesh.group_size(step.axes)),), None
    calls = box_calls(step, mesh)
    if calls is None:
        return None
    call, count, sent = calls
    if call == "all_to_all":
        return (("all_to_all", count),), sent
    return tuple(("all_to_all", 2) if i < sent else ("ppermute", mesh.size) for i in range(count)), None
