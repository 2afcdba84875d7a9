"""An even exchange of boxes: ``lax.all_to_all`` or ``ppermute`` rounds of ``dynamic_slice``d pieces.

For an all_to_all or permute between even layouts (every rank's block one box of one
shape), the piece rank q sends rank r is one box: q's source box cut by r's destination
box, q and r in one group over the step's axes (whose source boxes are disjoint). Each
rank finds its own piece's corner in a (world, ndim) table by ``lax.axis_index``, so the
tables are as small as the mesh, whatever the blocks' size::

    dense  (every member sends every member a piece of one shape)
           pieces = [dynamic_slice(x, at[me, m], shape) for m in members]
           got = lax.all_to_all(stack(pieces), axes, 0, 0, tiled=True)
           y = dynamic_update_slice(y, got[m], to[me, m]) for m in members
    rounds (else: each round one send and one receive a rank, pieces of one shape)
           y = dynamic_update_slice(y, ppermute(dynamic_slice(x, at[me], shape)), to[me])

A rank with nothing to receive in a round writes past the end of its block (one spare
slab on dim 0, cut off at the end). A round that moves whole blocks is ``ppermute(x)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from lowering.layout import boxes, group_ranks, local_shapes
from lowering.program import Step
from spec_lang.ir import Mesh

Block = jax.Array


@dataclass(frozen=True)
class BoxRound:
    pairs: tuple[tuple[int, int], ...]  # (sender, receiver), self pairs included
    shape: tuple[int, ...]
    send_at: np.ndarray  # (world, ndim) int32: the piece's corner in the sender's block
    recv_at: np.ndarray  # (world, ndim) int32: its corner in the receiver's (the spare slab: none)
    whole: bool  # every rank sends its whole block and receives a whole block


@dataclass(frozen=True)
class BoxPlan:
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    rounds: tuple[BoxRound, ...]
    dense: tuple[tuple[str, ...], tuple[int, ...], np.ndarray, np.ndarray] | None  # axes, shape, at, to
    spare: int  # rows of the spare slab on dim 0 (0: every rank receives in every round)


def _uniform(shapes: tuple[tuple[int, ...], ...]) -> bool:
    return len(set(shapes)) == 1


@lru_cache(maxsize=256)
def box_plan(step: Step, mesh: Mesh) -> BoxPlan | None:
    """The step as box pieces, or None where it is no even box exchange."""
    src, dst = step.src, step.dst
    if src.is_uneven or dst.is_uneven or not src.dims:
        return None
    ins, outs = local_shapes(src, mesh), local_shapes(dst, mesh)
    if not (_uniform(ins) and _uniform(outs)):
        return None
    sb, db = boxes(src, mesh), boxes(dst, mesh)
    world = mesh.size
    moves: list[tuple[int, int, tuple[int, ...], np.ndarray, np.ndarray]] = []
    covered = np.zeros(world, dtype=np.int64)
    for r in range(world):
        for q in group_ranks(mesh, step.axes, r):
            lo = np.maximum(sb[q, :, 0], db[r, :, 0])
            hi = np.minimum(sb[q, :, 1], db[r, :, 1])
            if (hi <= lo).any():
                continue
            moves.append((q, r, tuple(int(v) for v in hi - lo), lo - sb[q, :, 0], lo - db[r, :, 0]))
            covered[r] += int(np.prod(hi - lo))
    if (covered != np.prod(outs[0])).any():  # members' source boxes overlap or leave a gap
        return None
    dense = _dense(moves, mesh, step.axes)
    rounds: list[list[tuple[int, int, tuple[int, ...], np.ndarray, np.ndarray]]] = []
    if dense is None:
        for mv in sorted(moves, key=lambda mv: (mv[2], mv[0], mv[1])):
            for rd in rounds:
                if rd[0][2] == mv[2] and all(mv[0] != o[0] and mv[1] != o[1] for o in rd):
                    rd.append(mv)
                    break
            else:
                rounds.append([mv])
    out_rows = outs[0][0]
    spare = max((rd[0][2][0] for rd in rounds if len(rd) < world), default=0)
    built = []
    for rd in rounds:
        send_at = np.zeros((world, len(ins[0])), dtype=np.int32)
        recv_at = np.zeros((world, len(ins[0])), dtype=np.int32)
        recv_at[:, 0] = out_rows  # the spare slab
        for q, r, _, at, to in rd:
            send_at[q] = at
            recv_at[r] = to
        shape = rd[0][2]
        whole = len(rd) == world and shape == ins[0] == outs[0]
        built.append(BoxRound(tuple((q, r) for q, r, *_ in rd), shape, send_at, recv_at, whole))
    return BoxPlan(ins[0], outs[0], tuple(built), dense, spare)


def _dense(moves: list[tuple[int, int, tuple[int, ...], np.ndarray, np.ndarray]], mesh: Mesh,
           axes: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[int, ...], np.ndarray, np.ndarray] | None:
    if not axes or mesh.group_size(axes) < 3 or len({mv[2] for mv in moves}) != 1:
        return None
    n = mesh.group_size(axes)
    if len(moves) != mesh.size * n:  # some member sends some other nothing: rounds send less
        return None
    ndim = len(moves[0][2])
    at = np.zeros((mesh.size, n, ndim), dtype=np.int32)
    to = np.zeros((mesh.size, n, ndim), dtype=np.int32)
    for q, r, _, a, t in moves:
        at[q, group_ranks(mesh, axes, q).index(r)] = a
        to[r, group_ranks(mesh, axes, r).index(q)] = t
    return axes, moves[0][2], at, to


def box_exchange(plan: BoxPlan, names: tuple[str, ...]) -> Callable[[Block], Block]:
    """The plan inside ``shard_map`` over every mesh axis ``names``, on natural blocks."""

    def run(x: Block) -> Block:
        me = jax.lax.axis_index(names)
        if plan.dense is not None:
            axes, shape, at, to = plan.dense
            n = at.shape[1]
            at_me, to_me = jnp.asarray(at)[me], jnp.asarray(to)[me]
            parts = jnp.stack([jax.lax.dynamic_slice(x, tuple(at_me[m]), shape) for m in range(n)])
            got = jax.lax.all_to_all(parts, axes if len(axes) > 1 else axes[0], 0, 0, tiled=True)
            y = jnp.zeros(plan.out_shape, x.dtype)
            for m in range(n):
                y = jax.lax.dynamic_update_slice(y, got[m], tuple(to_me[m]))
            return y
        if len(plan.rounds) == 1 and plan.rounds[0].whole:
            return jax.lax.ppermute(x, names, perm=list(plan.rounds[0].pairs))
        rows = plan.out_shape[0] + plan.spare
        y = jnp.zeros((rows, *plan.out_shape[1:]), x.dtype)
        for rd in plan.rounds:
            piece = x if rd.shape == plan.in_shape else \
                jax.lax.dynamic_slice(x, tuple(jnp.asarray(rd.send_at)[me]), rd.shape)
            got = jax.lax.ppermute(piece, names, perm=list(rd.pairs))
            y = jax.lax.dynamic_update_slice(y, got, tuple(jnp.asarray(rd.recv_at)[me]))
        return y[: plan.out_shape[0]] if plan.spare else y

    return run
