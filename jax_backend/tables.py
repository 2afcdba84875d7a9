"""The exact exchange any step kind can run as: ``ppermute`` rounds over index tables.

Read off the kind's own numpy semantics (``lowering.kinds``' ``simulate``, the oracle), so
it needs nothing kind-specific: each rank's input elements are numbered, the step is
simulated on the numbers, and each output element says which rank's which element it is
(a reducing kind is simulated once per contributing rank, each output element then lists
its addends). The transfers between ranks are coloured into rounds in which every rank
sends to at most one peer and hears from at most one (one ``lax.ppermute`` each, over all
mesh axes: the world's row-major rank, shardc's rank); a rank picks its own row of each
table by ``lax.axis_index``. What a rank keeps it copies locally. Pieces are padded to the
round's largest, never the world's::

    round 1: 0 -> 1, 1 -> 2, 2 -> 0      (each rank one send, one receive)
    round 2: 0 -> 2, 2 -> 1

This runs on every backend XLA has (CPU included: XLA:CPU has no ``ragged_all_to_all``),
and is the lowering of the uneven kinds and the relay, and of a collective whose layout the
``lax`` collective cannot express. Its tables hold one entry per element of every rank's
block, so it is for small or uneven blocks, never the hot path of a large even step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from lowering.kinds import kind_of, simulate_step
from lowering.kinds.base import own_pieces
from lowering.kinds.copies import Copy
from lowering.kinds.relay import RelayPieces
from lowering.kinds.uneven_exchange import apply_copies
from lowering.layout import group_ranks, local_shapes
from lowering.program import Step
from spec_lang.ir import Mesh

Block = jax.Array


@dataclass(frozen=True)
class Round:
    """One ``ppermute``: the (source, destination) rank pairs and, per rank, which of its
    flat input elements it sends (``send``, padded with 0) and where the received ones land
    in its flat output (``recv``, padded with the output's size: dropped)."""

    perm: tuple[tuple[int, int], ...]
    send: np.ndarray  # (world, width) int32; a dense round's (world, members, width)
    recv: np.ndarray  # the same shape


@dataclass(frozen=True)
class Tables:
    """A step as index tables (see the module docstring)."""

    world: int
    in_sizes: tuple[int, ...]
    out_shapes: tuple[tuple[int, ...], ...]
    op: str | None  # the reduction of a reducing kind, else None (a copy)
    group: int  # the reducing group's size (an average divides once by it)
    keep_src: np.ndarray  # (world, out_max) int32: own element that lands there, or -1
    rounds: tuple[Round, ...]
    # where every member of each group over the step's axes sends every other a piece: the
    # axes, and one dense round whose tables hold a row per member (``lax.all_to_all``)
    dense: tuple[tuple[str, ...], Round] | None = None
    # a relay's second phase (its owners fan out what the first brought): its ``send``
    # tables index this rank's input (flat, below ``max(in_sizes)``) then its output so far
    fan_out: tuple[Round, ...] = ()

    @property
    def out_max(self) -> int:
        return max((int(np.prod(s)) for s in self.out_shapes), default=0)


def _codes(sizes: Sequence[int], only: int | None) -> list[np.ndarray]:
    """Rank q's elements numbered from offset(q) + 1 (0 is "no element": a zero)."""
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    return [np.arange(offsets[q] + 1, offsets[q + 1] + 1, dtype=np.int64) if only in (None, q)
            else np.zeros(sizes[q], dtype=np.int64) for q in range(len(sizes))]


@lru_cache(maxsize=256)
def step_tables(step: Step, mesh: Mesh) -> Tables:
    """The tables of ``step`` on ``mesh`` (cached: a step is hashable IR)."""
    if step.kind == "relay":
        return relay_tables(step, mesh)
    world = mesh.size
    in_shapes = local_shapes(step.src, mesh)
    out_shapes = tuple(tuple(int(n) for n in s) for s in local_shapes(step.dst, mesh))
    in_sizes = tuple(int(np.prod(s)) for s in in_shapes)
    offsets = np.concatenate(([0], np.cumsum(in_sizes)))
    reduces = kind_of(step.kind).reduces
    # simulated on sums of numbers: the op is the runtime's, the table only says who adds
    sim = dataclasses.replace(step, op="sum") if reduces else step

    def run(only: int | None) -> list[np.ndarray]:
        xs = [c.reshape(s) for c, s in zip(_codes(in_sizes, only), in_shapes)]
        return [np.asarray(y).reshape(-1) for y in simulate_step(sim, mesh, xs)]

    layers = [run(q) for q in range(world)] if reduces else [run(None)]
    out_max = max((int(np.prod(s)) for s in out_shapes), default=0)
    keep = np.full((world, out_max), -1, dtype=np.int32)
    moves: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (src, dst) -> [(src elem, dst elem)]
    group = 1
    for layer in layers:
        for r, y in enumerate(layer):
            hit = np.nonzero(y)[0]
            code = y[hit] - 1
            src = np.searchsorted(offsets, code, side="right") - 1
            elem = code - offsets[src]
            own = src == r
            keep[r, hit[own]] = elem[own]
            for q in np.unique(src[~own]).tolist():
                at = src == q
                moves.setdefault((q, r), []).extend(zip(elem[at].tolist(), hit[at].tolist()))
    if reduces:
        group = max(1, mesh.group_size(step.axes))
    return Tables(world, in_sizes, out_shapes, step.op if reduces else None, group, keep,
                  _rounds(moves, world, out_max), _dense(moves, mesh, step.axes, out_max))


def relay_tables(step: Step, mesh: Mesh) -> Tables:
    """The relay in its two phases, as planned and priced (``lowering.kinds.relay``): each
    piece once to its owner, then each owner fans it out. Read off the kind's own per-rank
    pieces (its pack and unpack copies, expanded on numbered elements), so the rounds send
    what the plan prices, never a holder's piece to every needer::

        phase 1: holder -> owner          (x -> y)
        phase 2: owner  -> other needers  ([x, y] -> y)
    """
    world = mesh.size
    kind = kind_of(step.kind)
    pieces = own_pieces(RelayPieces, [kind.pieces(step, mesh, r, group_ranks(mesh, step.axes, r)) for r in range(world)])
    in_shapes = local_shapes(step.src, mesh)
    out_shapes = tuple(tuple(int(n) for n in s) for s in local_shapes(step.dst, mesh))
    in_sizes = tuple(int(np.prod(s)) for s in in_shapes)
    out_max = max((int(np.prod(s)) for s in out_shapes), default=0)
    in_max = max(in_sizes, default=0)

    def expand(copies: Sequence[Copy], n_src: int, n_dst: int, base: int = 0) -> np.ndarray:
        """Each destination element's source element + 1 (0: none) under ``copies``."""
        out = np.zeros(n_dst, dtype=np.int64)
        apply_copies(copies, np.arange(base + 1, base + n_src + 1, dtype=np.int64), out, None)
        return out

    keep = np.full((world, out_max), -1, dtype=np.int32)
    phases: list[dict[tuple[int, int], list[tuple[int, int]]]] = [{}, {}]
    for r, p in enumerate(pieces):
        n_out = int(np.prod(p.out_shape))
        kept = expand(p.keep, in_sizes[r], n_out)
        keep[r, np.nonzero(kept)[0]] = kept[kept > 0] - 1
    for phase in (1, 2):
        for r, p in enumerate(pieces):
            sends = p.send1 if phase == 1 else p.send2
            n_buf = sum(sends)
            if phase == 1:
                buf = expand(p.pack1, in_sizes[r], n_buf)
            else:  # from the input, or from what phase 1 brought (the output, after the input)
                buf = expand(p.pack2_in, in_sizes[r], n_buf)
                buf += expand(p.pack2_out, out_max, n_buf, base=in_max)
            off = 0
            for q, k in zip(p.members, sends):
                if k:
                    phases[phase - 1].setdefault((r, q), []).extend(
                        (int(buf[off + j]) - 1, -1) for j in range(k))
                off += k
        for r, p in enumerate(pieces):  # where each received element lands, peer by peer
            recvs = p.recv1 if phase == 1 else p.recv2
            n_buf = sum(recvs)
            landing = np.zeros(n_buf, dtype=np.int64)
            inv = expand(p.unpack1 if phase == 1 else p.unpack2, n_buf, out_max)
            landing[inv[inv > 0] - 1] = np.nonzero(inv)[0]
            off = 0
            for q, k in zip(p.members, recvs):
                if k:
                    sent = phases[phase - 1][(q, r)]
                    phases[phase - 1][(q, r)] = [(a, int(landing[off + j])) for j, (a, _) in enumerate(sent)]
                off += k
    return Tables(world, in_sizes, out_shapes, None, 1, keep, _rounds(phases[0], world, out_max),
                  fan_out=_rounds(phases[1], world, out_max))


def _dense(moves: dict[tuple[int, int], list[tuple[int, int]]], mesh: Mesh, axes: tuple[str, ...],
           out_max: int) -> tuple[tuple[str, ...], Round] | None:
    """One ``lax.all_to_all`` over ``axes`` where the transfers are exactly every ordered pair
    of distinct members of each group: row m of a rank's tables is its piece for (from)
    the m-th member, row-major over ``axes`` as listed (the collective's member order)."""
    if not axes or not moves:
        return None
    n = mesh.group_size(axes)
    groups = {r: group_ranks(mesh, axes, r) for r in range(mesh.size)}
    want = {(q, r) for q in range(mesh.size) for r in groups[q] if r != q}
    if n < 3 or set(moves) != want:  # two members: one ppermute is the same exchange
        return None
    width = max(len(v) for v in moves.values())
    send = np.zeros((mesh.size, n, width), dtype=np.int32)
    recv = np.full((mesh.size, n, width), out_max, dtype=np.int32)
    for (q, r), pairs in moves.items():
        got = np.asarray(pairs, dtype=np.int64)
        send[q, groups[q].index(r), : len(got)] = got[:, 0]
        recv[r, groups[r].index(q), : len(got)] = got[:, 1]
    return axes, Round((), send, recv)


def _rounds(moves: dict[tuple[int, int], list[tuple[int, int]]], world: int, out_max: int) -> tuple[Round, ...]:
    """Colour the transfers greedily, largest first, into rounds of one send and one receive
    per rank."""
    pending = sorted(moves, key=lambda k: -len(moves[k]))
    rounds: list[list[tuple[int, int]]] = []
    for pair in pending:
        for rd in rounds:
            if all(pair[0] != a and pair[1] != b for a, b in rd):
                rd.append(pair)
                break
        else:
            rounds.append([pair])
    out = []
    for rd in rounds:
        width = max(len(moves[p]) for p in rd)
        send = np.zeros((world, width), dtype=np.int32)
        recv = np.full((world, width), out_max, dtype=np.int32)
        for q, r in rd:
            pairs = np.asarray(moves[(q, r)], dtype=np.int64)
            send[q, : len(pairs)] = pairs[:, 0]
            recv[r, : len(pairs)] = pairs[:, 1]
        out.append(Round(tuple(sorted(rd)), send, recv))
    return tuple(out)


def _identity(op: str | None, dtype: jnp.dtype) -> jax.Array:
    if op == "max":
        return jnp.array(jnp.finfo(dtype).min if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min, dtype)
    if op == "min":
        return jnp.array(jnp.finfo(dtype).max if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).max, dtype)
    return jnp.zeros((), dtype)


def table_exchange(tables: Tables, names: tuple[str, ...]) -> Callable[[Block], Block]:
    """The step as a function of this rank's flat (padded) input inside ``shard_map`` over
    every mesh axis ``names``: returns its flat output, padded to the largest rank's."""
    op = tables.op

    def combine(acc: Block, vals: Block, at: Block) -> Block:
        # a receive past the output's end is padding: dropped
        if op is None or op in ("sum", "avg"):
            return acc.at[at].add(vals, mode="drop") if op else acc.at[at].set(vals, mode="drop")
        return acc.at[at].max(vals, mode="drop") if op == "max" else acc.at[at].min(vals, mode="drop")

    def run(x: Block) -> Block:
        me = jax.lax.axis_index(names)
        keep = jnp.asarray(tables.keep_src)[me]
        mine = jnp.take(x, jnp.maximum(keep, 0), mode="clip") if x.size else jnp.zeros(keep.shape, x.dtype)
        base = _identity(op, x.dtype) if op is not None else jnp.zeros((), x.dtype)
        acc = jnp.where(keep >= 0, mine, base)
        if tables.dense is not None:
            axes, rd = tables.dense
            sent = jnp.take(x, jnp.asarray(rd.send)[me], mode="clip")  # (members, width)
            got = jax.lax.all_to_all(sent, axes if len(axes) > 1 else axes[0], 0, 0, tiled=True)
            acc = combine(acc, got.reshape(-1), jnp.asarray(rd.recv)[me].reshape(-1))
            rounds: tuple[Round, ...] = ()
        else:
            rounds = tables.rounds
        for rd in rounds:
            sent = jnp.take(x, jnp.asarray(rd.send)[me], mode="clip")
            got = jax.lax.ppermute(sent, names, perm=list(rd.perm))
            acc = combine(acc, got, jnp.asarray(rd.recv)[me])
        if tables.fan_out:  # a relay's owners send on what the first phase brought
            both = jnp.concatenate([x[: max(tables.in_sizes)], acc])
            for rd in tables.fan_out:
                got = jax.lax.ppermute(jnp.take(both, jnp.asarray(rd.send)[me], mode="clip"), names, perm=list(rd.perm))
                acc = combine(acc, got, jnp.asarray(rd.recv)[me])
        if op == "avg":
            acc = _divide(acc, tables.group)
        return acc

    return run


def _divide(total: Block, n: int) -> Block:
    """An average's one division (integers truncate toward zero, as ``lowering``'s)."""
    if n == 1 or total.dtype == jnp.bool_:
        return total
    if jnp.issubdtype(total.dtype, jnp.integer):
        return jnp.sign(total) * (jnp.abs(total) // n)
    return total / jnp.asarray(n, total.dtype)
