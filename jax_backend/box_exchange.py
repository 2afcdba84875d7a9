"""An even exchange of boxes: ``lax.all_to_all`` or ``ppermute`` rounds of ``dynamic_slice``d pieces.

For an all_to_all or permute between even layouts (every rank's block one box of one
shape), the piece rank q sends rank r is one box: q's source box cut by r's destination
box, q and r in one group over the step's axes (whose source boxes are disjoint). Each
rank finds its own piece's corner in a (world, ndim) table by ``lax.axis_index``, so the
tables are as small as the mesh, whatever the blocks' size::

    dense  (every member sends every member a piece of one shape, cells of one grid)
           pieces = take(cells(x), send[me])          # the piece for member m at row m
           got = lax.all_to_all(pieces, axes, 0, 0, tiled=True)
           y = uncells(take(got, place[me]))          # each received piece to its cell
    rounds (else: each round one send and one receive a rank, pieces of one shape)
           got_i = ppermute(take(cells(x), send[i, me]))  # pieces on one grid of both blocks
           y = uncells(take(stack(got), place[me]))      # one transpose, no per-piece writes
      or   y = dynamic_update_slice(y, ppermute(dynamic_slice(x, at[me], shape)), to[me])

In the second form a rank with nothing to receive in a round writes where a later round
overwrites, else past the end of its block (one spare slab on dim 0, cut off at the end).
What a rank keeps is copied without a collective; a round that moves whole blocks is ``ppermute(x)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from jax_backend.fits import call_alpha, fitted_model
from jax_backend.rank_index import cut, own_row, pick, put
from lowering.layout import boxes, group_arrays, group_ranks, local_shapes
from lowering.program import Step
from spec_lang.ir import Mesh

Block = jax.Array
Move = tuple[int, int, tuple[int, ...], np.ndarray, np.ndarray]  # sender, receiver, shape, corners
Edge = TypeVar("Edge", bound=tuple[Any, ...])  # (sender, receiver, ...): a move, or a bare pair


@dataclass(frozen=True)
class BoxRound:
    pairs: tuple[tuple[int, int], ...]  # (sender, receiver), self pairs included
    shape: tuple[int, ...]
    send_at: np.ndarray  # (world, ndim) int32: the piece's corner in the sender's block
    recv_at: np.ndarray  # (world, ndim) int32: its corner in the receiver's (the spare slab: none)
    whole: bool  # every rank sends its whole block and receives a whole block
    local: bool = False  # every pair is a rank and itself: a copy, no collective
    # the round as one all_to_all within these pairs of ranks (every rank in one), where each
    # rank sends and receives within one pair: XLA:CPU's 2-member all_to_all costs ~0.07 ms
    # against a ppermute's ~0.19 (a ppermute meets every device whatever its pairs)
    groups: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True)
class Dense:
    """One ``lax.all_to_all``: the pieces are cells of a grid of ``shape`` on both blocks;
    ``send[r, m]`` is the cell of r's block it sends its m-th member, ``place[r, k]`` the
    member whose piece fills cell k of r's output (row-major cells)."""

    axes: tuple[str, ...]
    shape: tuple[int, ...]
    send: np.ndarray  # (world, members) int32
    place: np.ndarray  # (world, cells) int32


@dataclass(frozen=True)
class Packed:
    """The rounds' pieces (one shape) in one ``lax.all_to_all`` over the step's axes, row m
    of a rank's tables its piece for (from) the m-th member; a member it has nothing for
    gets an unread piece (the spare slab)."""

    axes: tuple[str, ...]
    shape: tuple[int, ...]
    send_at: np.ndarray  # (world, members, ndim) int32
    recv_at: np.ndarray  # (world, members, ndim) int32


@dataclass(frozen=True)
class Grid:
    """Every round's piece is a cell of one grid of ``shape`` on both blocks: round i sends
    cell ``send[i, r]`` of r's source block, and cell k of r's output comes from round
    ``place[r, k]``. The output is then the received pieces stacked, taken in cell order
    and laid out by one transpose, not written piece by piece at per-rank offsets (XLA:CPU's
    ``dynamic_update_slice`` chain at 4 MiB pieces: big-transpose 1.3-1.6x XLA's time).
    ``place`` indexes the received pieces in order, a round run within pairs giving two
    (``BoxRound.groups``: what each member of the pair sent; ``place`` names the partner's)."""

    shape: tuple[int, ...]
    send: np.ndarray  # (rounds, world) int32
    place: np.ndarray  # (world, cells) int32


@dataclass(frozen=True)
class BoxPlan:
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    rounds: tuple[BoxRound, ...]  # with ``packed``: only what ranks keep
    dense: Dense | None
    spare: int  # rows of the spare slab on dim 0 (0: every rank receives in every round)
    packed: Packed | None = None
    grid: Grid | None = None


def _uniform(shapes: tuple[tuple[int, ...], ...]) -> bool:
    return len(set(shapes)) == 1


@lru_cache(maxsize=4096)  # the JAX cost model asks for every exchange a search prices
def box_moves(step: Step, mesh: Mesh) -> tuple[list[Move], tuple[int, ...], tuple[int, ...]] | None:
    """The step's box pieces (sender, receiver, shape, corner in the sender's block, corner
    in the receiver's) and the two block shapes, or None where it is no even box exchange."""
    src, dst = step.src, step.dst
    if src.is_uneven or dst.is_uneven or not src.dims:
        return None
    ins, outs = local_shapes(src, mesh), local_shapes(dst, mesh)
    if not (_uniform(ins) and _uniform(outs)):
        return None
    sb, db = boxes(src, mesh), boxes(dst, mesh)
    world = mesh.size
    # members with one source box hold the same values unless the type says they differ
    # (a pending sum's addends, V): then one of them sends, the receiver itself where it is
    # one, else the least loaded so far (the planner prices the exchange as one sender per piece)
    copies = not src.partial_axes and not src.axes_of_kind("V")
    # every rank's members whose source box meets its destination box, all at once (the JAX
    # cost model asks for the moves of every exchange a search prices: rank by rank, a
    # 16-rank exchange took about 1 ms), in order: rank by rank, each group's members in order
    group_of, groups = group_arrays(mesh, step.axes)
    members = groups[group_of]  # (world, n)
    lo_all = np.maximum(sb[members, :, 0], db[:, None, :, 0])
    hi_all = np.minimum(sb[members, :, 1], db[:, None, :, 1])
    rs, js = np.nonzero((hi_all > lo_all).all(axis=2))
    qs = members[rs, js]
    # a source box by its corner (every source box has one shape): a piece's holders share it
    held = np.ravel_multi_index(tuple(sb[qs, :, 0].T), tuple(d + 1 for d in src.shape)) if copies else qs
    lo = lo_all[rs, js]
    shapes = hi_all[rs, js] - lo
    at, to = lo - sb[qs, :, 0], lo - db[rs, :, 0]
    pieces: dict[tuple[int, int], list[int]] = {}  # (receiver, source box) -> its holders' hits
    for i, piece in enumerate(zip(rs.tolist(), held.tolist())):
        pieces.setdefault(piece, []).append(i)
    senders, sizes, shape_of = qs.tolist(), shapes.prod(axis=1).tolist(), shapes.tolist()
    load, covered = [0] * world, [0] * world
    moves: list[tuple[int, int, tuple[int, ...], np.ndarray, np.ndarray]] = []
    for (r, _), hits in pieces.items():
        i = hits[0]
        if len(hits) > 1:
            same = [senders[h] for h in hits]
            i = hits[same.index(r if r in same else min(same, key=lambda h: (load[h], h)))]
        q = senders[i]
        if q != r:
            load[q] += sizes[i]
        moves.append((q, r, tuple(shape_of[i]), at[i], to[i]))
        covered[r] += sizes[i]
    if any(c != math.prod(outs[0]) for c in covered):  # members' source boxes overlap or leave a gap
        return None
    return moves, ins[0], outs[0]


def _whole_blocks(moves: list[Move], in_shape: tuple[int, ...], out_shape: tuple[int, ...], world: int) -> bool:
    return len(moves) == world and all(mv[2] == in_shape == out_shape for mv in moves)


@lru_cache(maxsize=4096)
def box_calls(step: Step, mesh: Mesh) -> tuple[str, int, int] | None:
    """What ``box_plan``'s lowering runs, without building its tables (the JAX cost model
    prices every exchange a search meets): ``("all_to_all", members, bytes the busiest rank
    sends, padding included)`` for a dense or a padded one, ``("ppermute", rounds, pair
    rounds)`` for rounds, ``pair rounds`` of them each one all_to_all within pairs of ranks
    (``pair_groups``; 0 rounds: only copies); None where ``box_plan`` is None."""
    got = box_moves(step, mesh)
    if got is None:
        return None
    moves, in_shape, out_shape = got
    n = mesh.group_size(step.axes) if step.axes else 1
    if _dense_fits(moves, mesh, step.axes, in_shape, out_shape):
        return "all_to_all", n, (n - 1) * int(np.prod(moves[0][2])) * step.src.itemsize
    whole = _whole_blocks(moves, in_shape, out_shape, mesh.size)
    sent = [mv for mv in moves if whole or mv[0] != mv[1]]
    rounds, busiest = 0, 0
    for shape in {mv[2] for mv in sent}:
        ends = Counter(e for mv in sent if mv[2] == shape for e in ((0, mv[0]), (1, mv[1])))
        rounds += max(ends.values())  # Konig: as many rounds as the busiest end's moves
        busiest = max(ends.values())
    shapes = {mv[2] for mv in sent}
    if len(shapes) == 1 and _packs(step, mesh, rounds, int(np.prod(next(iter(shapes)))), busiest):
        return "all_to_all", n, (n - 1) * int(np.prod(next(iter(shapes)))) * step.src.itemsize
    pairs = sum(pair_groups(tuple((q, r) for q, r, *_ in rd), mesh.size, math.prod(shape) * step.src.itemsize) is not None
                for shape in shapes if math.prod(shape) * step.src.itemsize <= PAIR_MAX
                for rd in colour_rounds(sorted((mv for mv in sent if mv[2] == shape), key=lambda mv: mv[:2])))
    return "ppermute", rounds, pairs


@lru_cache(maxsize=1024)
def box_plan(step: Step, mesh: Mesh) -> BoxPlan | None:
    """The step as box pieces, or None where it is no even box exchange."""
    got = box_moves(step, mesh)
    if got is None:
        return None
    moves, in_shape, out_shape = got
    ins, outs, world = (in_shape,), (out_shape,), mesh.size
    dense = _dense(moves, mesh, step.axes, ins[0], outs[0])
    rounds: list[list[tuple[int, int, tuple[int, ...], np.ndarray, np.ndarray]]] = []
    whole_blocks = _whole_blocks(moves, in_shape, out_shape, world)
    if dense is None:
        # what a rank keeps is copied locally (a round of its own, no collective), unless
        # every rank's block is one whole block: then one ppermute, self pairs included
        kept = [] if whole_blocks else [mv for mv in moves if mv[0] == mv[1]]
        sent = [mv for mv in moves if whole_blocks or mv[0] != mv[1]]
        for shape in sorted({mv[2] for mv in sent}):
            rounds.extend(colour_rounds(sorted((mv for mv in sent if mv[2] == shape), key=lambda mv: mv[:2])))
        for shape in sorted({mv[2] for mv in kept}):
            rounds.append([mv for mv in kept if mv[2] == shape])
    out_rows = outs[0][0]
    spare = 0
    built = []
    for i, rd in enumerate(rounds):
        send_at = np.zeros((world, len(ins[0])), dtype=np.int32)
        recv_at = np.zeros((world, len(ins[0])), dtype=np.int32)
        recv_at[:, 0] = out_rows  # the spare slab
        shape = rd[0][2]
        for q, r, _, at, to in rd:
            send_at[q] = at
            recv_at[r] = to
        # a rank with nothing to receive writes where a later round of its puts a piece of
        # this shape (overwritten there); only where none does, into the spare slab, which
        # costs a copy of the whole block at the end
        receivers = {r for _, r, *_ in rd}
        for r in set(range(world)) - receivers:
            later = next((mv[4] for nxt in rounds[i + 1:] for mv in nxt if mv[1] == r and mv[2] == shape), None)
            if later is None:
                spare = max(spare, shape[0])
            else:
                recv_at[r] = later
        whole = len(rd) == world and shape == ins[0] == outs[0]
        local = all(q == r for q, r, *_ in rd)
        pairs = tuple((q, r) for q, r, *_ in rd)
        groups = None if local else pair_groups(pairs, world, math.prod(shape) * step.src.itemsize)
        built.append(BoxRound(pairs, shape, send_at, recv_at, whole, local, groups))
    plan = BoxPlan(ins[0], outs[0], tuple(built), dense, spare)
    packed = _packed(plan, step, mesh)
    if packed is not None:
        return packed
    grid = _grid(rounds, [rd.groups for rd in built], ins[0], outs[0], world)
    return plan if grid is None else dataclasses.replace(plan, grid=grid, spare=0)


def _grid(rounds: list[list[Move]], groups: list[tuple[tuple[int, int], ...] | None], in_shape: tuple[int, ...],
          out_shape: tuple[int, ...], world: int) -> Grid | None:
    """The rounds as cells of one grid (``Grid``), where their pieces have one shape that
    tiles both blocks at corners on the grid; None otherwise (or for one round of whole blocks)."""
    if not rounds or len({mv[2] for rd in rounds for mv in rd}) != 1:
        return None
    shape = rounds[0][0][2]
    if shape == in_shape == out_shape and len(rounds) == 1:
        return None  # one ppermute of the block itself
    if any(a % s or b % s for a, b, s in zip(in_shape, out_shape, shape)):
        return None
    if any((mv[3] % shape).any() or (mv[4] % shape).any() for rd in rounds for mv in rd):
        return None
    grid_in = tuple(int(a // s) for a, s in zip(in_shape, shape))
    grid_out = tuple(int(a // s) for a, s in zip(out_shape, shape))
    send = np.zeros((len(rounds), world), dtype=np.int32)
    place = np.zeros((world, int(np.prod(grid_out))), dtype=np.int32)
    slot = 0
    for i, rd in enumerate(rounds):
        for q, r, _, at, to in rd:
            send[i, q] = np.ravel_multi_index(tuple(at // shape), grid_in)
            place[r, np.ravel_multi_index(tuple(to // shape), grid_out)] = slot + _sender_slot(groups[i], q, r)
        slot += 1 if groups[i] is None else 2
    return Grid(shape, send, place)


PAIR_MAX = 1 << 16  # bytes: a round runs within pairs only for pieces up to this (it sends a stack of two)


def pair_groups(pairs: tuple[tuple[int, int], ...], world: int, piece_bytes: int) -> tuple[tuple[int, int], ...] | None:
    """The ranks in pairs such that every move of the round (sender, receiver) is within one,
    the ranks that move nothing paired among themselves; None where some rank moves pieces
    with two others (or the world is odd, or the piece is over ``PAIR_MAX``)."""
    if world % 2 or piece_bytes > PAIR_MAX:
        return None
    partner: dict[int, int] = {}
    for q, r in pairs:
        if q == r:
            continue
        if partner.get(q, r) != r or partner.get(r, q) != q:
            return None
        partner[q], partner[r] = r, q
    idle = [v for v in range(world) if v not in partner]
    found = {(min(q, r), max(q, r)) for q, r in partner.items()}
    return tuple(sorted(found)) + tuple(zip(idle[::2], idle[1::2]))


def _sender_slot(groups: tuple[tuple[int, int], ...] | None, q: int, r: int) -> int:
    """Which of the round's received pieces at ``r`` is ``q``'s: 0 for a ppermute (one), else
    q's place in the pair (an all_to_all's row m comes from the pair's m-th member)."""
    if groups is None:
        return 0
    return next(g.index(q) for g in groups if r in g)


def within_pairs(piece: Block, names: tuple[str, ...], groups: tuple[tuple[int, int], ...]) -> Block:
    """(2, *piece.shape): row m is what the m-th member of this rank's pair sent (one of them
    this rank's own piece): one ``lax.all_to_all`` over groups of two."""
    return jax.lax.all_to_all(jnp.stack([piece, piece]), names, 0, 0, axis_index_groups=[list(g) for g in groups])



def colour_rounds(moves: list[Edge]) -> list[list[Edge]]:
    """The moves (sender, receiver, ...) in as few rounds of one send and one receive a rank
    as there can be: the most moves any rank sends or receives (Konig's edge colouring of a
    bipartite graph: where the free colours at the two ends differ, the alternating path
    from the receiver is swapped first). Greedy first-fit took 5 rounds where 4 do."""
    at_send: dict[tuple[int, int], int] = {}  # (sender, colour) -> move index
    at_recv: dict[tuple[int, int], int] = {}  # (receiver, colour) -> move index
    colour: dict[int, int] = {}

    def free(table: dict[tuple[int, int], int], v: int) -> int:
        c = 0
        while (v, c) in table:
            c += 1
        return c

    for i, (q, r, *_) in enumerate(moves):
        a, b = free(at_send, q), free(at_recv, r)
        if (r, a) in at_recv:  # a is taken at r: swap a and b along the path from r
            path, v, c, recv_side = [], r, a, True
            while (v, c) in (at_recv if recv_side else at_send):
                j = (at_recv if recv_side else at_send)[(v, c)]
                path.append(j)
                v = moves[j][0] if recv_side else moves[j][1]
                recv_side, c = not recv_side, b if c == a else a
            for j in path:
                del at_send[(moves[j][0], colour[j])], at_recv[(moves[j][1], colour[j])]
            for j in path:
                colour[j] = b if colour[j] == a else a
                at_send[(moves[j][0], colour[j])] = at_recv[(moves[j][1], colour[j])] = j
        colour[i] = a
        at_send[(q, a)] = at_recv[(r, a)] = i
    rounds: dict[int, list[Edge]] = {}
    for i, mv in enumerate(moves):
        rounds.setdefault(colour[i], []).append(mv)
    return [rounds[c] for c in sorted(rounds)]


PAD_CAP = 1.5  # a padded all_to_all sends at most this many times the rounds' bytes (busiest rank)


def _packs(step: Step, mesh: Mesh, rounds: int, piece: int, busiest: int) -> bool:
    """Whether ``rounds`` ppermute rounds of ``piece`` elements, the busiest rank in
    ``busiest`` of them, run as one padded all_to_all over the step's axes (``_packed``)."""
    n = mesh.group_size(step.axes) if step.axes else 1
    if rounds < 2 or n < 3 or n - 1 > PAD_CAP * busiest:
        return False
    model = fitted_model(mesh)
    piece *= step.src.itemsize
    beta = model.beta_of(step.axes)
    padded = call_alpha(model, step.axes, "all_to_all", n, mesh.size) + beta * (n - 1) * piece
    return padded < rounds * (call_alpha(model, step.axes, "ppermute", n, mesh.size) + beta * piece)


def _packed(plan: BoxPlan, step: Step, mesh: Mesh) -> BoxPlan | None:
    """The plan's rounds as one padded ``lax.all_to_all`` over the step's axes, where the JAX
    cost model prices that below the rounds: each ``ppermute`` round pays a collective's
    latency (~0.15 ms on XLA:CPU, against ~1-2 ns a byte), so for small pieces one
    collective that also sends the unused members a piece beats several rounds (priced by
    ``call_alpha``, as the planner prices the step), within ``PAD_CAP``."""
    sent = [rd for rd in plan.rounds if not rd.local]
    if plan.dense is not None or len(sent) < 2 or len({rd.shape for rd in sent}) != 1 or not step.axes:
        return None
    ends = Counter(e for rd in sent for q, r in rd.pairs if q != r for e in ((0, q), (1, r)))
    if not _packs(step, mesh, len(sent), int(np.prod(sent[0].shape)), max(ends.values(), default=0)):
        return None
    n = mesh.group_size(step.axes)
    world, nd = mesh.size, len(plan.in_shape)
    send_at = np.zeros((world, n, nd), dtype=np.int32)
    recv_at = np.zeros((world, n, nd), dtype=np.int32)
    recv_at[:, :, 0] = plan.out_shape[0]  # the spare slab
    for rd in sent:
        for q, r in rd.pairs:
            send_at[q, group_ranks(mesh, step.axes, q).index(r)] = rd.send_at[q]
            recv_at[r, group_ranks(mesh, step.axes, r).index(q)] = rd.recv_at[r]
    spare = max(plan.spare, sent[0].shape[0])
    return dataclasses.replace(plan, rounds=tuple(rd for rd in plan.rounds if rd.local), spare=spare,
                               packed=Packed(step.axes, sent[0].shape, send_at, recv_at))


def _dense_fits(moves: list[Move], mesh: Mesh, axes: tuple[str, ...], in_shape: tuple[int, ...],
                out_shape: tuple[int, ...]) -> bool:
    """Every member sends every member a piece of one shape, cells of one grid on both blocks."""
    # two members too: XLA:CPU's all_to_all of a pair ran ~1.3x faster than the ppermute
    # swap, its kept half and its update (rd-pub-054, rd-pub-065: 1.31x XLA's time, then 1.0x)
    if not axes or mesh.group_size(axes) < 2 or len({mv[2] for mv in moves}) != 1:
        return False
    n = mesh.group_size(axes)
    shape = moves[0][2]
    if len(moves) != mesh.size * n:  # some member sends some other nothing: rounds send less
        return False
    if any(a % s or b % s for a, b, s in zip(in_shape, out_shape, shape)):
        return False
    if int(np.prod(np.asarray(out_shape) // shape)) != n:
        return False
    return not (np.array([np.concatenate([mv[3], mv[4]]) for mv in moves]) % np.tile(shape, 2)).any()


def _dense(moves: list[Move], mesh: Mesh, axes: tuple[str, ...], in_shape: tuple[int, ...],
           out_shape: tuple[int, ...]) -> Dense | None:
    if not _dense_fits(moves, mesh, axes, in_shape, out_shape):
        return None
    n = mesh.group_size(axes)
    shape = moves[0][2]
    grid_in = np.asarray(in_shape) // shape
    grid_out = np.asarray(out_shape) // shape
    cells = int(np.prod(grid_out))
    send = np.zeros((mesh.size, n), dtype=np.int32)
    place = np.zeros((mesh.size, cells), dtype=np.int32)
    for q, r, _, at, to in moves:
        send[q, group_ranks(mesh, axes, q).index(r)] = np.ravel_multi_index(tuple(at // shape), tuple(grid_in))
        place[r, np.ravel_multi_index(tuple(to // shape), tuple(grid_out))] = group_ranks(mesh, axes, r).index(q)
    return Dense(axes, shape, send, place)


def to_cells(x: Block, shape: tuple[int, ...]) -> Block:
    """(cells, *shape): ``x`` cut into a row-major grid of ``shape`` boxes."""
    grid = [a // s for a, s in zip(x.shape, shape)]
    nd = len(shape)
    split = x.reshape([v for g, s in zip(grid, shape) for v in (g, s)])
    return split.transpose([2 * i for i in range(nd)] + [2 * i + 1 for i in range(nd)]).reshape(-1, *shape)


def from_cells(c: Block, out_shape: tuple[int, ...]) -> Block:
    """``to_cells`` undone: the grid of boxes ``c`` (cells, *shape) as one ``out_shape`` block."""
    shape = c.shape[1:]
    grid = [a // s for a, s in zip(out_shape, shape)]
    nd = len(shape)
    order = [v for i in range(nd) for v in (i, nd + i)]
    return c.reshape(*grid, *shape).transpose(order).reshape(out_shape)


def box_exchange(plan: BoxPlan, names: tuple[str, ...]) -> Callable[[Block], Block]:
    """The plan inside ``shard_map`` over every mesh axis ``names``, on natural blocks.
    The pieces move as unsigned integers of their width: nothing is added, and XLA:CPU
    moves bf16 through its transposes and gathers several times slower than uint16."""

    def run(x: Block) -> Block:
        return as_bits(x, lambda bits: move(bits))

    def move(x: Block) -> Block:
        me = jax.lax.axis_index(names)
        if plan.dense is not None:
            d = plan.dense
            parts = pick(to_cells(x, d.shape), own_row(d.send, me))
            got = jax.lax.all_to_all(parts, d.axes if len(d.axes) > 1 else d.axes[0], 0, 0, tiled=True)
            return from_cells(pick(got, own_row(d.place, me)), plan.out_shape)
        if len(plan.rounds) == 1 and plan.rounds[0].whole:
            rd = plan.rounds[0]
            if rd.groups is None:
                return jax.lax.ppermute(x, names, perm=list(rd.pairs))
            return pick(within_pairs(x, names, rd.groups), own_row(_from_slots(rd, len(rd.send_at)), me))
        if plan.grid is not None:
            g = plan.grid
            cells = to_cells(x, g.shape)
            got = []
            for i, rd in enumerate(plan.rounds):
                piece = pick(cells, own_row(g.send[i], me))
                if rd.groups is not None:
                    got.extend(within_pairs(piece, names, rd.groups))
                else:
                    got.append(piece if rd.local else jax.lax.ppermute(piece, names, perm=list(rd.pairs)))
            return from_cells(pick(jnp.stack(got), own_row(g.place, me)), plan.out_shape)
        rows = plan.out_shape[0] + plan.spare
        y = jnp.zeros((rows, *plan.out_shape[1:]), x.dtype)
        if plan.packed is not None:
            p = plan.packed
            send_at, recv_at = own_row(p.send_at, me), own_row(p.recv_at, me)
            parts = jnp.stack([cut(x, at, p.shape) for at in send_at]) if isinstance(send_at, np.ndarray) else \
                jax.vmap(lambda at: cut(x, at, p.shape))(send_at)  # one gather
            got = jax.lax.all_to_all(parts, p.axes if len(p.axes) > 1 else p.axes[0], 0, 0, tiled=True)
            for m in range(len(p.recv_at[0])):
                y = put(y, got[m], recv_at[m])
        for rd in plan.rounds:
            piece = x if rd.shape == plan.in_shape else cut(x, own_row(rd.send_at, me), rd.shape)
            if rd.groups is not None:
                got = pick(within_pairs(piece, names, rd.groups), own_row(_from_slots(rd, len(rd.send_at)), me))
            else:
                got = piece if rd.local else jax.lax.ppermute(piece, names, perm=list(rd.pairs))
            y = put(y, got, own_row(rd.recv_at, me))
        return y[: plan.out_shape[0]] if plan.spare else y

    return run


def _from_slots(rd: BoxRound, world: int) -> np.ndarray:
    assert rd.groups is not None
    return pair_slots(rd.pairs, rd.groups, world)


def pair_slots(pairs: tuple[tuple[int, int], ...], groups: tuple[tuple[int, int], ...], world: int) -> np.ndarray:
    """(world,) int32: which row of ``within_pairs``' result holds the piece a rank receives
    in a round of ``pairs`` (a rank that receives none: any, what it gets is not read)."""
    slots = np.zeros(world, dtype=np.int32)
    for q, r in pairs:
        slots[r] = _sender_slot(groups, q, r)
    return slots


_BITS = {1: jnp.uint8, 2: jnp.uint16}


def as_bits(x: Block, fn: Callable[[Block], Block]) -> Block:
    """``fn`` (pure data movement) run on ``x``'s bits as unsigned integers of its width,
    for the floats narrower than 4 bytes only (bf16, f16: XLA:CPU widens them in its copies);
    a 4-byte float moves as fast as its bits, and each bitcast is a kernel more for XLA to
    compile (a tiny exchange's first call: 2-5x less compile time without them)."""
    carrier = _BITS.get(x.dtype.itemsize)
    if carrier is None or not jnp.issubdtype(x.dtype, jnp.floating):
        return fn(x)
    return jax.lax.bitcast_convert_type(fn(jax.lax.bitcast_convert_type(x, carrier)), x.dtype)
