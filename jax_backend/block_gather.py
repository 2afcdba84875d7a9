"""A program whose every destination block is whole source blocks side by side: one
``ppermute`` of whole blocks, then one ``lax.all_gather`` within groups of ranks.

``f32[8@dp] -> f32[8@tp]`` on ``dp=4,tp=2`` (rd-pub-035): rank (d, t) holds source block d
(2 elements) and needs destination block t, which is source blocks 2t and 2t+1. The
planner, whose groups are mesh axes, sends each rank one element and gathers over dp
(4 members). XLA gathers over 2: each rank gets one of its destination's source blocks
whole (a ``ppermute``; a rank holding one already keeps it), and the ranks that share a
destination block gather in groups of as many as it has source blocks
(``axis_index_groups``)::

    rank  (0,0) (0,1) (1,0) (1,1) (2,0) (2,1) (3,0) (3,1)     holds block d, needs t
    hold    0     0     1     1     2     2     3     3
    after   0     2     1     3     0     2     1     3       ppermute: 4 ranks keep theirs (self pairs)
    gather  [0 1] within {(0,0),(1,0)}, {(2,0),(3,0)}; [2 3] within {(0,1),(1,1)}, ...

Same bytes where it applies (a block, then k-1 blocks: 16 B on rd-pub-035, as the planner's
program), but a group collective over k members instead of the planner's group, which on
XLA:CPU is the cheaper latency (``fits.call_alpha``): rd-pub-035 ran at 1.17x XLA's
time as planned and 1.00-1.04x in this form. The engine takes it for the whole program
where the JAX cost model prices it below the program's steps and it sends no more bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from jax_backend.fits import call_alpha, fitted_model
from jax_backend.lowerings import lowered_collectives
from lowering.layout import boxes, local_shapes
from lowering.program import Program
from spec_lang.ir import TensorType

Block = jax.Array


@dataclass(frozen=True)
class BlockGather:
    """``perm``: (sender, receiver) of whole blocks, every rank a receiver once, no rank
    twice a sender (a self pair: the rank holds its piece); ``groups``: the ranks of each
    gather group in the order of their pieces on ``dim``."""

    dim: int
    perm: tuple[tuple[int, int], ...]
    groups: tuple[tuple[int, ...], ...]

    @property
    def moves(self) -> bool:
        """Some rank gets its piece from another (else the gather alone)."""
        return any(q != r for q, r in self.perm)

    def calls(self, names: tuple[str, ...]) -> tuple[str, ...]:
        text = repr(names[0] if len(names) == 1 else names)
        send = (f"lax.ppermute(x, {text}, perm={list(self.perm)})  # whole blocks",) if self.moves else ()
        return send + (f"lax.all_gather(x, {text}, axis={self.dim}, tiled=True, "
                       f"axis_index_groups={[list(g) for g in self.groups]})",)


def _plain_values(t: TensorType) -> bool:
    """Every rank with one box of ``t`` holds the same values there (no pending sum, no V)."""
    return not t.is_uneven and not t.partial_axes and not t.axes_of_kind("V")


@lru_cache(maxsize=1024)
def block_gather(program: Program) -> BlockGather | None:
    """The program as a ``BlockGather`` where every destination block is k >= 2 whole source
    blocks side by side on one dim, and the JAX cost model prices that below the program's
    own steps (strictly: a program that is that gather already keeps its form) at no more
    bytes; else None."""
    mesh, src, dst = program.mesh, program.src, program.dst
    if not program.steps or not (_plain_values(src) and _plain_values(dst)) or len(src.dims) != len(dst.dims):
        return None
    ins, outs = local_shapes(src, mesh), local_shapes(dst, mesh)
    if len(set(ins)) != 1 or len(set(outs)) != 1:
        return None
    shape_in, shape_out = ins[0], outs[0]
    grown = [k for k, (a, b) in enumerate(zip(shape_in, shape_out)) if a != b]
    if len(grown) != 1 or shape_in[grown[0]] == 0 or shape_out[grown[0]] % shape_in[grown[0]]:
        return None
    g = grown[0]
    k = shape_out[g] // shape_in[g]
    if k < 2:
        return None
    plan = _assign(boxes(src, mesh), boxes(dst, mesh), g, shape_in[g], k)
    if plan is None:
        return None
    found = BlockGather(g, *plan)
    return found if _pays(found, program, k, math.prod(shape_in) * src.itemsize) else None


def _assign(sb: np.ndarray, db: np.ndarray, g: int, width: int, k: int
            ) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, ...], ...]] | None:
    """Who sends each rank which source block (self pairs where it holds it already), and the
    gather groups; None where some destination block is no k whole source blocks, the ranks
    sharing a destination block are not a multiple of k, or some block is needed by more
    ranks than hold it (each sends its block once)."""
    world = len(sb)
    holders: dict[bytes, list[int]] = {}
    for q in range(world):
        holders.setdefault(sb[q].tobytes(), []).append(q)
    classes: dict[bytes, list[int]] = {}
    for r in range(world):
        classes.setdefault(db[r].tobytes(), []).append(r)
    slots: list[tuple[list[int], list[bytes], int]] = []  # (members, their pieces, ranks per piece)
    for members in classes.values():
        if len(members) % k:
            return None
        box = db[members[0]]
        pieces = []
        for j in range(k):
            piece = box.copy()
            piece[g] = (box[g, 0] + j * width, box[g, 0] + (j + 1) * width)
            pieces.append(piece.tobytes())
        slots.append((members, pieces, len(members) // k))
    free = {b: list(qs) for b, qs in holders.items()}
    place: list[list[list[int]]] = []  # per class, per piece: the ranks that get it
    sender: dict[int, int] = {}
    for members, pieces, per in slots:  # first every rank that holds a piece of its own block keeps it
        got: list[list[int]] = [[] for _ in range(len(pieces))]
        inside = set(members)
        for j, b in enumerate(pieces):
            for q in [q for q in free.get(b, []) if q in inside][:per]:
                free[b].remove(q)
                got[j].append(q)
                sender[q] = q
        place.append(got)
    for (members, pieces, per), got in zip(slots, place):  # then the others from holders elsewhere
        rest = iter(r for r in members if r not in sender)
        for j, b in enumerate(pieces):
            while len(got[j]) < per:
                if not free.get(b):
                    return None
                r = next(rest)
                sender[r] = free[b].pop(0)
                got[j].append(r)
    groups = tuple(sorted(tuple(got[j][i] for j in range(len(got))) for got in place for i in range(len(got[0]))))
    return tuple(sorted((q, r) for r, q in sender.items())), groups


def _pays(found: BlockGather, program: Program, k: int, block: int) -> bool:
    """The gather's bytes (a block, where any rank receives one, then k-1 blocks) at most
    the program's, and its collectives' latencies (``fits.call_alpha``) strictly below those
    the program's steps lower to (``lowerings.lowered_collectives``): a program that is this
    gather already keeps its form, and one with a table exchange (no such count) too."""
    mesh = program.mesh
    model = fitted_model(mesh)
    if (block if found.moves else 0) + (k - 1) * block > sum(s.bytes_sent_max for s in program.steps if s.is_collective):
        return False
    mine = (call_alpha(model, mesh.names, "ppermute", mesh.size, mesh.size) if found.moves else 0.0) \
        + call_alpha(model, mesh.names, "all_gather", k, mesh.size)
    theirs = 0.0
    for step in program.steps:
        if not step.is_collective:
            continue
        got = lowered_collectives(step, mesh)
        if got is None:
            return False
        theirs += sum(call_alpha(model, step.axes, c, n, mesh.size) for c, n in got[0])
    return mine < theirs


def run_block_gather(found: BlockGather, names: tuple[str, ...]) -> Callable[[Block], Block]:
    """The gather inside ``shard_map`` over every mesh axis ``names``, on natural blocks."""

    def run(x: Block) -> Block:
        if found.moves:  # self pairs included: every rank receives, no select by its index
            x = jax.lax.ppermute(x, names, perm=list(found.perm))
        groups = [list(g) for g in found.groups]
        if found.dim == 0:
            return jax.lax.all_gather(x, names, axis=0, tiled=True, axis_index_groups=groups)
        got = jax.lax.all_gather(x, names, axis=0, axis_index_groups=groups)  # (k, *x.shape)
        shape = list(x.shape)
        shape[found.dim] *= got.shape[0]
        return jnp.moveaxis(got, 0, found.dim).reshape(shape)  # a leading gather, then a transpose (as gather_dim)

    return run
