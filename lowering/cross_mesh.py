"""Cross-mesh programs: a tensor laid out on one mesh moved to a layout on another.

The two meshes name their global ranks (``Mesh.ranks``); the program runs over the
*world* ``0 .. max rank`` of their union (ranks in neither do nothing). It is a
``Program``: pending sums on the source are finished on the source mesh first by its
ordinary steps (``finish``); then its last step, a ``CrossStep`` of a crossing kind
(``lowering.kinds.across``), crosses in one or two rounds of exact point-to-point messages
over the world::

    send_across  each piece a destination rank lacks, from one holder of it; the holders
                 of a replicated source take turns (each receiver pulls from a different
                 replica), and a rank that holds a piece on both meshes copies it locally
    fan_out      (where it is cheaper) a piece wanted by k ranks crosses once, cut in k
                 parts, one to each; then each of them sends its part to the other k-1:
                 the scatter across the boundary, then the all_gather among replicas

This module plans the crossing (``cross_program``, ``cross_best``) and rebuilds one rank's
messages (``rank_part``); ``CrossProgram`` views such a Program in the crossing's terms.
Every element is a global box; a rank's data is the boxes it holds, so the numpy
semantics need no layout beyond the two sides' ``boxes``. The price counts every rank
of the world; ``cross_bound`` is the bytes no program can undercut: what the neediest
destination rank lacks, and per class of source ranks holding the same values (the same
block, and the same addends of a pending sum), what must leave the class at least once,
shared by its members.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from lowering.cost import CostModel
from lowering.layout import boxes as even_boxes
from lowering.layout import local_shapes, mesh_coords, rank_layout
from lowering.program import Cost, Program, Step
from spec_lang.errors import SpecError, locate
from spec_lang.ir import Dim, Mesh, TensorType

Box = tuple[tuple[int, int], ...]


class Transfer(NamedTuple):
    """The global box ``box`` sent from world rank ``sender`` to world rank ``receiver``."""

    sender: int
    receiver: int
    box: Box


@dataclass(frozen=True, eq=False)
class CrossRound:
    """One round of a crossing's point-to-point messages over the world (batched sends and receives):
    message i sends the global box ``boxes[i]`` from ``senders[i]`` to ``receivers[i]``
    (read-only arrays: a 1,024-rank all-to-all is a million of them)."""

    kind: str  # "send_across" or "fan_out"
    senders: np.ndarray  # (n,) world ranks
    receivers: np.ndarray  # (n,)
    boxes: np.ndarray  # (n, ndim, 2) global [start, stop)
    bytes_sent: tuple[int, ...]  # per world rank
    bytes_recv: tuple[int, ...]

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        return tuple(Transfer(s, r, as_box(b))
                     for s, r, b in zip(self.senders.tolist(), self.receivers.tolist(), self.boxes, strict=True))

    @property
    def bytes_moved(self) -> tuple[int, ...]:
        return tuple(map(max, self.bytes_sent, self.bytes_recv))

    @property
    def bytes_max(self) -> int:
        return max(self.bytes_moved, default=0)

    def messages(self) -> int:
        """Point-to-point messages: one per (sender, receiver) pair, its pieces packed."""
        return len(np.unique(self.senders.astype(np.int64) * (1 << 21) + self.receivers))

    def describe(self) -> str:
        return f"{self.kind} ({self.messages()} point-to-point message(s))"

    def rank_transfers(self, rank: int) -> tuple[tuple[Transfer, ...], tuple[Transfer, ...]]:
        """(what ``rank`` sends, what it receives) in this round."""
        out = []
        for mask in (self.senders == rank, self.receivers == rank):
            out.append(tuple(Transfer(s, r, as_box(b)) for s, r, b in
                             zip(self.senders[mask].tolist(), self.receivers[mask].tolist(), self.boxes[mask],
                                 strict=True)))
        return out[0], out[1]


@dataclass(frozen=True, kw_only=True)
class CrossStep(Step):
    """The step of a cross-mesh Program that crosses from its mesh to ``dst_mesh``: a
    ``send_across`` (one round of messages, or none) or a ``fan_out`` (two: across, then
    among the ranks that want the same piece), priced over the world ``0 .. world-1``.
    ``rounds`` are every message of the world (the simulator's and the price's); a rank
    rebuilds its own from the plan chosen (``split``, ``fanned``: ``rank_part``)."""

    rounds: tuple[CrossRound, ...] = field(compare=False)
    split: bool = False  # pieces cut among their holders
    fanned: tuple[int, ...] = ()  # the source classes (of ``src``'s distinct boxes, sorted) whose shared pieces fan out
    bound: int = field(compare=False)  # bytes: no program moving the program's src to dst costs less
    finish: Program | None = field(compare=False)  # the source mesh's steps before this one, as their own Program


def crossing_of(program: Program) -> CrossStep | None:
    """The step of ``program`` that crosses to another mesh (its last), None for a program
    on one mesh."""
    last = program.steps[-1] if program.steps else None
    return last if isinstance(last, CrossStep) else None


@dataclass(frozen=True)
class CrossProgram:
    """A view of a cross-mesh ``Program`` (``lowering.compile(..., dst_mesh=)``) in the
    crossing's terms: ``src`` on ``src_mesh`` -> ``dst`` on ``dst_mesh``, ``finish`` (pending
    sums finished on the source mesh, or None) then the crossing's rounds (``steps``) over
    the world ``0 .. world-1``."""

    program: Program

    def __post_init__(self) -> None:
        if not isinstance(self.program, Program) or not isinstance(crossing_of(self.program), CrossStep):
            raise SpecError(f"expected a cross-mesh Program, got {type(self.program).__name__}",
                            hint="compile one with lowering.compile(src, dst, mesh, dst_mesh=...)")

    @property
    def crossing(self) -> CrossStep:
        step = crossing_of(self.program)
        assert step is not None
        return step

    src_mesh = property(lambda self: self.program.mesh)
    dst_mesh = property(lambda self: self.program.dst_mesh)
    src = property(lambda self: self.program.src)
    dst = property(lambda self: self.program.dst)
    cost = property(lambda self: self.program.cost)

    @property
    def finish(self) -> Program | None:
        return self.crossing.finish

    @property
    def steps(self) -> tuple[CrossRound, ...]:
        return self.crossing.rounds

    @property
    def bound(self) -> int:
        return self.crossing.bound

    @property
    def world(self) -> int:
        return world_of(self.src_mesh, self.dst_mesh)

    @property
    def split(self) -> bool:
        return self.crossing.split

    @property
    def fanned(self) -> tuple[int, ...]:
        return self.crossing.fanned

    def rank_part(self, rank: int) -> tuple[tuple[tuple[Transfer, ...], tuple[Transfer, ...]], ...]:
        """Per round, (what ``rank`` sends, what it receives), from the pieces of its own
        blocks alone: work linear in the world, not in the program's messages."""
        return rank_part(self.crossing, self.src_mesh, rank)

    @property
    def sent(self) -> TensorType:
        """What the crossing starts from on the source mesh: ``src`` with its sums finished."""
        return self.crossing.src

    @property
    def optimal(self) -> bool:
        return self.cost.bytes_max == self.bound

    def __str__(self) -> str:
        lines = [f"program from mesh {self.src_mesh} to mesh {self.dst_mesh} (world of {self.world} ranks): "
                 f"{self.src}  ->  {self.dst}"]
        n = 0
        for s in self.finish.steps if self.finish else ():
            n += 1
            moved = f"{s.bytes_max} B/rank" if s.is_collective else "local"
            lines.append(f"  {n}. {s.describe()} on the source mesh  -> {s.dst}   [{moved}]")
        for c in self.steps:
            n += 1
            lines.append(f"  {n}. {c.describe()}   [{c.bytes_max} B/rank]")
        if not n:
            lines.append("  (no steps: every rank already holds its destination block)")
        cost = self.cost
        lines.append(f"  cost: {cost.bytes_max} B (busiest rank, sent or received), {cost.bytes_sent_max} B sent "
                     f"(max rank), {cost.collectives} round(s)")
        lines.append(f"  cross-mesh lower bound: {self.bound} B" + (" (met)" if self.optimal else ""))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "src_mesh": str(self.src_mesh), "dst_mesh": str(self.dst_mesh),
            "src": str(self.src), "dst": str(self.dst), "world": self.world,
            "finish": None if self.finish is None else self.finish.to_json(),
            "steps": [{"kind": s.kind, "bytes_max": s.bytes_max,
                       "transfers": [[t.sender, t.receiver, [list(b) for b in t.box]] for t in s.transfers]}
                      for s in self.steps],
            "cost": self.cost.to_json(), "bound": self.bound,
        }


def check_cross_types(src: TensorType, dst: TensorType, src_text: str | None = None,
                      dst_text: str | None = None) -> None:
    """What a cross-mesh program takes: values the same on every holder (R, I, or P pending
    on the source), laid out by the chunk rule or an uneven split with one block a rank.
    The caret points into the type as written, where given."""
    for side, t, text in (("source", src, src_text), ("destination", dst, dst_text)):
        for axis, at in t.axis_types:
            if at.kind == "V" or (at.kind == "P" and side == "destination"):
                found = None if text is None else locate(text, axis, text.find("{") + 1)
                raise SpecError(f"a cross-mesh program's {side} type {t} has {at.code} on {axis!r}",
                                text=text if found is not None else None, pos=found, subject=axis,
                                hint="across meshes the source may be sharded, replicated (R, I) or "
                                "pending a sum, the destination sharded or replicated")


def one_block_each(t: TensorType, mesh: Mesh) -> np.ndarray:
    """Each rank's one global box (world, ndim, 2); an uneven split where a rank holds
    several blocks (a PartitionedShard, a ragged split over several dims) is refused."""
    if not t.is_uneven:
        return even_boxes(t, mesh)
    out = np.empty((mesh.size, t.ndim, 2), dtype=np.int64)
    for r in range(mesh.size):
        lay = rank_layout(t, mesh, r)
        if len(lay.blocks) != 1 or lay.cat is None and t.ndim > 1:
            raise SpecError(f"{t} gives a rank several blocks: a cross-mesh program moves one block a rank",
                            hint="split the dim by sizes (<3,5>) rather than parts or ragged runs across meshes")
        out[r] = lay.blocks[0]
    return out


def full_type(t: TensorType) -> TensorType:
    """``t`` with its pending sums finished (P axes replicated)."""
    return replace(t, axis_types=tuple((a, at) for a, at in t.axis_types if at.kind != "P"))


def finished_types(t: TensorType) -> list[TensorType]:
    """Where the source mesh may finish ``t``'s pending sums before the crossing: replicated
    over the P axes (an all_reduce), or sharding one more dim over them (a reduce_scatter,
    so the replicas send disjoint halves)."""
    full = full_type(t)
    partial = tuple(a for a, at in t.axis_types if at.kind == "P")
    out = [full]
    for i, d in enumerate(full.dims):
        if d.split is None:
            try:
                out.append(replace(full, dims=full.dims[:i] + (Dim(d.size, d.axes + partial),) + full.dims[i + 1:]))
            except SpecError:  # e.g. more shards than the dim has room for the planner's rules
                continue
    return out


class _Classes(NamedTuple):
    """Ranks grouped by the box they hold: the distinct boxes (k, ndim, 2), and each
    class's world ranks (mesh order) as ``members[start[c]:start[c] + sizes[c]]``."""

    boxes: np.ndarray
    members: np.ndarray
    start: np.ndarray
    sizes: np.ndarray
    of_rank: np.ndarray  # (world,) each world rank's class, -1 off the mesh


def _classes(bx: np.ndarray, mesh: Mesh, world: int, values: np.ndarray | None = None) -> _Classes:
    """``values``: a row per rank that also tells holders apart (the coordinates of a
    pending sum's axes: ranks with the same box hold different addends)."""
    rows = bx.reshape(len(bx), -1)
    key = rows if values is None else np.concatenate([rows, values.reshape(len(bx), -1)], axis=1)
    # classes in the order of their keys, members in mesh order (lexsort is stable): a sort
    # of columns, several times faster than np.unique(axis=0)'s of rows
    order = np.lexsort(key.T[::-1]) if key.shape[1] else np.arange(len(key))
    ordered = key[order]
    new = np.ones(len(key), dtype=bool)
    new[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    inverse = np.empty(len(key), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    start = np.flatnonzero(new)
    count = np.diff(np.append(start, len(key)))
    ranks = np.asarray(mesh.global_ranks, dtype=np.int64)
    of_rank = np.full(world, -1, dtype=np.int64)
    of_rank[ranks] = inverse
    return _Classes(bx[order[start]], ranks[order], start, count, of_rank)


def _meets(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, box) for every non-empty intersection of box a[i] with box b[j], in order of
    (i, j): from the grid of ``b``'s blocks where they tile each dim (``_pairs_on_grid``:
    work in the pairs found), else by testing every pair."""
    found = _pairs_on_grid(a, b)
    if found is None:
        full_a: np.ndarray = np.all(a[:, :, 1] > a[:, :, 0], axis=1)  # an empty block (an uneven split's) meets nothing
        full_b: np.ndarray = np.all(b[:, :, 1] > b[:, :, 0], axis=1)
        ok = full_a[:, None] & full_b[None, :]
        for d in range(a.shape[1]):  # dim by dim on booleans: a million pairs are a million bytes
            ok &= a[:, None, d, 0] < b[None, :, d, 1]
            ok &= b[None, :, d, 0] < a[:, None, d, 1]
        found = np.divmod(np.flatnonzero(ok), len(b))
    i, j = found
    box = np.empty((len(i), a.shape[1], 2), dtype=np.int64)
    for d in range(a.shape[1]):  # gathers from contiguous columns (np.take): faster than a[i, d, 0]
        for e, pick in ((0, np.maximum), (1, np.minimum)):
            pick(np.take(np.ascontiguousarray(a[:, d, e]), i), np.take(np.ascontiguousarray(b[:, d, e]), j),
                 out=box[:, d, e])
    return i, j, box


def _pairs_on_grid(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``_meets``'s (i, j) where ``b``'s distinct blocks (a layout's classes, sorted by box)
    cut each dim into disjoint intervals and are every combination of them (the chunk rule's
    blocks are): a box of ``a`` meets a run of intervals per dim, and its pairs are their
    product, enumerated in order. None where ``b`` is not such a grid, or where most pairs
    meet (then testing every pair is faster)."""
    ndim = b.shape[1]
    if ndim == 0 or len(a) * len(b) <= 1 << 16 or (b[:, :, 1] <= b[:, :, 0]).any():
        return None  # (few pairs: testing them all is cheaper than finding the grid)
    index, count = [], []
    lo_run, n_run = [], []
    for d in range(ndim):
        iv, at = np.unique(b[:, d, :], axis=0, return_inverse=True)
        if (iv[1:, 0] < iv[:-1, 1]).any():  # overlapping intervals: not a tiling
            return None
        index.append(at.reshape(-1))
        count.append(len(iv))
        first = np.searchsorted(iv[:, 1], a[:, d, 0], side="right")  # the first interval ending after a's start
        stop = np.searchsorted(iv[:, 0], a[:, d, 1], side="left")  # those starting before a's end
        lo_run.append(first)
        n_run.append(np.where(a[:, d, 1] > a[:, d, 0], np.maximum(stop - first, 0), 0))
    if math.prod(count) != len(b):  # not every combination: not a grid
        return None
    cell = np.ravel_multi_index(tuple(index), tuple(count))
    if (cell != np.arange(len(b))).any():  # classes sorted by box are the grid's cells in row-major order
        return None
    per = np.ones(len(a), dtype=np.int64)
    for n in n_run:
        per *= n
    if int(per.sum()) * 8 > len(a) * len(b):  # dense: testing every pair on booleans is faster
        return None
    i, t = _expand(np.zeros(len(a), dtype=np.int64), per)
    j = np.zeros(len(i), dtype=np.int64)
    for d in range(ndim):  # t in mixed radix over the runs, the last dim fastest
        inner = np.ones(len(a), dtype=np.int64)
        for n in n_run[d + 1:]:
            inner *= n
        k = lo_run[d][i] + (t // inner[i]) % np.maximum(n_run[d][i], 1)
        j = j * count[d] + k
    return i, j


def _numel(bx: np.ndarray) -> np.ndarray:
    """Elements of each box (n, ndim, 2), a product dim by dim (np.prod over a short axis is
    several times slower on a million boxes)."""
    out = bx[:, 0, 1] - bx[:, 0, 0] if bx.shape[1] else np.ones(len(bx), dtype=np.int64)
    for d in range(1, bx.shape[1]):
        out = out * (bx[:, d, 1] - bx[:, d, 0])
    return out


def as_box(b: np.ndarray) -> Box:
    return tuple((int(lo), int(hi)) for lo, hi in b.tolist())


def _expand(start: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows with ``count`` entries from ``start``: each entry's row and index."""
    row = np.repeat(np.arange(len(count)), count)
    first = np.repeat(np.cumsum(count) - count, count)
    return row, np.repeat(start, count) + np.arange(len(row)) - first


class _Need(NamedTuple):
    """Per (piece, receiver that lacks it): the piece's box, holder class, receiver; and
    each piece's number of such receivers."""

    box: np.ndarray  # (n, ndim, 2)
    holder: np.ndarray  # (n,) source class
    receiver: np.ndarray  # (n,) world rank
    piece: np.ndarray  # (n,) piece index
    wanting: np.ndarray  # (pieces,) receivers lacking each piece
    piece_box: np.ndarray  # (pieces, ndim, 2)
    piece_holder: np.ndarray  # (pieces,)
    turn: np.ndarray  # (pieces,) messages out of its holder class before this piece's
    position: np.ndarray  # (n,) the receiver's place among the piece's wanting ranks
    numel: np.ndarray  # (n,) elements of ``box``
    piece_numel: np.ndarray  # (pieces,)


def _needs(src: _Classes, dst: _Classes,
           pieces: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None) -> _Need:
    """Every piece's receivers that lack it; ``pieces`` (dst class, src class, box, turn)
    where only some pieces are wanted (``_own_pieces``), else all."""
    given = pieces is not None
    i, j, pbox, turn = pieces if pieces is not None else (*_meets(dst.boxes, src.boxes), None)
    if (dst.sizes == 1).all():  # each destination rank a class of its own: a piece a receiver
        piece, receiver = np.arange(len(i)), dst.members[dst.start[i]]
        keep = src.of_rank[receiver] != j  # a rank holding the piece on the source keeps it
    else:
        piece, at = _expand(dst.start[i], dst.sizes[i])
        receiver = dst.members[at]
        keep = src.of_rank[receiver] != j[piece]
    whole = bool(keep.all())
    if not whole:
        piece, receiver = piece[keep], receiver[keep]
    if whole and len(piece) == len(i):  # every piece wanted by exactly one rank
        wanting, position = np.ones(len(i), dtype=np.int64), np.zeros(len(i), dtype=np.int64)
    else:
        wanting = np.bincount(piece, minlength=len(i))
        position = np.arange(len(piece)) - (np.cumsum(wanting) - wanting)[piece]  # entries come grouped by piece
    if not given and (src.sizes == 1).all():  # a sole holder sends whatever its turn
        turn = np.zeros(len(i), dtype=np.int64)
    elif not given:  # the messages out of each holder class before each piece (pieces in dst-class order)
        order = np.lexsort((i, j))
        before = np.cumsum(wanting[order]) - wanting[order]
        new = np.ones(len(order), dtype=bool)
        new[1:] = j[order][1:] != j[order][:-1]
        turn = np.empty(len(i), dtype=np.int64)
        turn[order] = before - np.maximum.accumulate(np.where(new, before, 0))
    assert turn is not None
    numel = _numel(pbox)
    if whole and len(piece) == len(i):  # every piece wanted by one rank: no gather
        return _Need(pbox, j, receiver, piece, wanting, pbox, j, turn, position, numel, numel)
    return _Need(pbox[piece], j[piece], receiver, piece, wanting, pbox, j, turn, position, numel[piece], numel)


def _wanting(src: _Classes, dst: _Classes) -> Any:
    """``wanting(i, j)``: the ranks of destination class ``i`` that lack the piece of source
    class ``j`` (the class's size less its ranks that hold ``j`` on the source)."""
    both = (dst.of_rank >= 0) & (src.of_rank >= 0)
    keys, counts = np.unique(dst.of_rank[both] * len(src.sizes) + src.of_rank[both], return_counts=True)

    def wanting(ii: np.ndarray, jj: np.ndarray) -> np.ndarray:
        if not len(keys):
            return dst.sizes[ii]
        k = ii * len(src.sizes) + jj
        at = np.minimum(np.searchsorted(keys, k), len(keys) - 1)
        return dst.sizes[ii] - np.where(keys[at] == k, counts[at], 0)

    return wanting


def _own_pieces(src: _Classes, dst: _Classes, i_r: int, j_r: int,
                ndim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of one rank's own blocks: its destination class ``i_r`` met with every
    source class, and its source class ``j_r`` met with every destination class (-1: not
    on that mesh), each with its turn (what ``_needs`` counts over every piece), counted
    here from the destination classes before it that meet its source class."""
    i, j = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if i_r >= 0:
        j = _meets(dst.boxes[i_r:i_r + 1], src.boxes)[1]
        i = np.full(len(j), i_r)
    if j_r >= 0:
        i2 = _meets(dst.boxes, src.boxes[j_r:j_r + 1])[0]
        other = i2 != i_r  # the piece (i_r, j_r) is listed once
        i, j = np.concatenate([i, i2[other]]), np.concatenate([j, np.full(int(other.sum()), j_r)])
    wanting = _wanting(src, dst)
    turn = np.zeros(len(i), dtype=np.int64)
    rows = np.nonzero(src.sizes[j] > 1)[0]  # a sole holder sends whatever its turn
    if len(rows):
        js, col = np.unique(j[rows], return_inverse=True)
        before = np.arange(int(i[rows].max()))
        w = np.zeros((len(before) + 1, len(js)), dtype=np.int64)  # row i' + 1: what class i' wants of each
        for at in range(0, len(js), 64):  # a few classes at a time: a table of (classes before) x 64
            part = js[at:at + 64]
            ok = np.ones((len(before), len(part)), dtype=bool)
            for d in range(ndim):
                ok &= np.maximum(dst.boxes[before, None, d, 0], src.boxes[None, part, d, 0]) \
                    < np.minimum(dst.boxes[before, None, d, 1], src.boxes[None, part, d, 1])
            w[1:, at:at + 64] = np.where(ok, wanting(before[:, None], part[None, :]), 0)
        turn[rows] = np.cumsum(w, axis=0)[i[rows], col.reshape(-1)]
    lo = np.maximum(dst.boxes[i, :, 0], src.boxes[j, :, 0])
    hi = np.minimum(dst.boxes[i, :, 1], src.boxes[j, :, 1])
    return i, j, np.stack([lo, hi], axis=-1).reshape(len(i), ndim, 2), turn


def _step(kind: str, senders: np.ndarray, receivers: np.ndarray, bx: np.ndarray, world: int,
          item: int, numel: np.ndarray | None = None) -> CrossRound:
    """``numel``: the boxes' elements, where the caller has them."""
    numel = (_numel(bx) if numel is None else numel) * item
    sent = np.bincount(senders, weights=numel, minlength=world).astype(np.int64)
    recv = np.bincount(receivers, weights=numel, minlength=world).astype(np.int64)
    for a in (senders, receivers, bx):
        a.setflags(write=False)
    return CrossRound(kind, senders, receivers, bx, tuple(sent.tolist()), tuple(recv.tolist()))


def _cut_rows(bx: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Box ``bx[i]`` cut along its longest dim into ``n[i]`` nearly equal parts (fewer where
    that dim is shorter): each part's row, its index within the row, and its box."""
    ext = bx[:, :, 1] - bx[:, :, 0]
    dim = np.argmax(ext, axis=1) if len(bx) else np.zeros(0, dtype=np.int64)
    length = ext[np.arange(len(bx)), dim]
    parts = np.maximum(np.minimum(n, length), 1)
    row, at = _expand(np.zeros(len(parts), dtype=np.int64), parts)
    d, lo = dim[row], bx[row, dim[row], 0]
    out = bx[row].copy()
    i = np.arange(len(row))
    out[i, d, 0] = lo + length[row] * at // parts[row]
    out[i, d, 1] = lo + length[row] * (at + 1) // parts[row]
    return row, at, out


def _from_holders(src: _Classes, holder: np.ndarray, receiver: np.ndarray, bx: np.ndarray, turn: np.ndarray,
                  split: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(senders, receivers, boxes) of pieces sent out of holder classes. The holders take
    turns: a message comes from member ``turn mod size`` of its class, ``turn`` being the
    receiver's place among the piece's wanting ranks plus the index of their class (so
    each receiver pulls from another replica, and a rank finds its own senders and
    receivers from its own pieces); or with ``split`` each piece is cut among all the
    holders of its class (balanced whatever the pieces' sizes)."""
    if not split and (src.sizes == 1).all():
        return src.members[src.start][holder], receiver, bx
    if not split:
        return src.members[src.start[holder] + turn % src.sizes[holder]], receiver, bx
    row, at, parts = _cut_rows(bx, src.sizes[holder])
    return src.members[src.start[holder[row]] + at], receiver[row], parts


def _plan(src: _Classes, need: _Need, fan: np.ndarray, split: bool, world: int, item: int) -> list[CrossRound]:
    """One round sending each piece to every rank that lacks it, except the pieces marked in
    ``fan``: those cross once, cut in one part per rank that wants them, and a second round
    sends each part on to the others (the scatter across, then the all_gather)."""
    if not fan.any():
        if not len(need.receiver):
            return []
        turn = need.position + need.turn[need.piece]
        return [_step("send_across", *_from_holders(src, need.holder, need.receiver, need.box, turn, split),
                      world, item, None if split else need.numel)]
    direct = ~fan[need.piece]
    turn = (need.position + need.turn[need.piece])[direct]
    s1, r1, b1 = _from_holders(src, need.holder[direct], need.receiver[direct], need.box[direct], turn, split)
    fanned = np.nonzero(fan)[0]
    order = np.argsort(need.piece, kind="stable")  # each piece's wanting ranks, together
    recv_sorted = need.receiver[order]
    first = np.concatenate([[0], np.cumsum(need.wanting)[:-1]])
    row, at, part_box = _cut_rows(need.piece_box[fanned], need.wanting[fanned])
    piece = fanned[row]
    owner = recv_sorted[first[piece] + at]
    s2, r2, b2 = _from_holders(src, need.piece_holder[piece], owner, part_box, at + need.turn[piece], split)
    steps = []
    if len(s1) + len(s2):
        steps.append(_step("send_across", np.concatenate([s1, s2]), np.concatenate([r1, r2]),
                           np.concatenate([b1, b2]), world, item))
    if len(piece):
        k_row, k_at = _expand(first[piece], need.wanting[piece])
        to = recv_sorted[k_at]
        keep = to != owner[k_row]
        steps.append(_step("fan_out", owner[k_row][keep], to[keep], part_box[k_row][keep], world, item))
    return steps


def _moved(steps: Sequence[CrossRound], finish: Program | None, src_mesh: Mesh, world: int) -> tuple[np.ndarray, np.ndarray]:
    moved = np.zeros(world, dtype=np.int64)
    sent = np.zeros(world, dtype=np.int64)
    at = np.asarray(src_mesh.global_ranks)
    for s in finish.steps if finish else ():
        np.add.at(moved, at, np.asarray(s.bytes_moved, dtype=np.int64))
        np.add.at(sent, at, np.asarray(s.bytes_sent, dtype=np.int64))
    for c in steps:
        moved += np.asarray(c.bytes_moved, dtype=np.int64)
        sent += np.asarray(c.bytes_sent, dtype=np.int64)
    return moved, sent


def _fan_mask(need: _Need, fanned: np.ndarray) -> np.ndarray:
    return (need.wanting > 1) & np.isin(need.piece_holder, fanned)


def _cheapest(src: _Classes, need: _Need, finish: Program | None, src_mesh: Mesh, world: int, item: int,
              bound: int) -> tuple[list[CrossRound], bool, tuple[int, ...]]:
    """The cheapest of a few plans, in order of fewer rounds and messages, the first at the
    bound taken at once (nothing is cheaper): every piece sent directly; the pieces of the
    holder classes that direct sending overloads fanned out; every shared piece fanned
    out; each with holders taking turns, then with pieces cut among the holders."""
    numel = need.numel
    load = np.bincount(need.holder, weights=numel, minlength=len(src.sizes)) * item / np.maximum(src.sizes, 1)
    classes = np.arange(len(src.sizes))
    choices = [classes[:0], classes[load > bound], classes]
    best: tuple[int, int, list[CrossRound], bool, tuple[int, ...]] | None = None
    for split in (False, True):
        for k, fanned in enumerate(choices):
            fan = _fan_mask(need, fanned)
            if k and (not fan.any() or (k == 2 and np.array_equal(fan, _fan_mask(need, choices[1])))):
                continue
            steps = _plan(src, need, fan, split, world, item)
            key = (int(_moved(steps, finish, src_mesh, world)[0].max()), len(steps))
            if best is None or key < best[:2]:
                best = (*key, steps, split, tuple(fanned.tolist()))
            if key[0] <= bound:
                return steps, split, tuple(fanned.tolist())
    assert best is not None
    return best[2], best[3], best[4]


def world_of(src_mesh: Mesh, dst_mesh: Mesh) -> int:
    return max(max(src_mesh.global_ranks), max(dst_mesh.global_ranks)) + 1


def cross_bound(src: TensorType, dst: TensorType, src_mesh: Mesh, dst_mesh: Mesh) -> int:
    """Bytes no cross-mesh program from ``src`` to ``dst`` can undercut (busiest rank)."""
    return _bound(src, dst, src_mesh, dst_mesh, None)


def _lack(full: TensorType, dst: TensorType, src_mesh: Mesh, dst_mesh: Mesh, world: int) -> np.ndarray:
    """Elements each world rank lacks of its destination block, ``full`` (no pending sum)
    held on the source mesh."""
    s_boxes, d_boxes = one_block_each(full, src_mesh), one_block_each(dst, dst_mesh)
    want = _numel(d_boxes)
    at = np.full(world, -1, dtype=np.int64)
    at[list(src_mesh.global_ranks)] = np.arange(src_mesh.size)
    mine = at[list(dst_mesh.global_ranks)]
    on = mine >= 0
    own = s_boxes[mine[on]]
    lo = np.maximum(d_boxes[on, :, 0], own[:, :, 0])
    hi = np.minimum(d_boxes[on, :, 1], own[:, :, 1])
    want[on] -= _numel(np.stack([lo, np.maximum(hi, lo)], axis=-1))
    out = np.zeros(world, dtype=np.int64)
    out[list(dst_mesh.global_ranks)] = want
    return out


def _bound(src: TensorType, dst: TensorType, src_mesh: Mesh, dst_mesh: Mesh,
           known: tuple[_Classes, _Need] | None) -> int:
    """``cross_bound``, reusing the classes and needs of ``src`` where the caller has them."""
    world = world_of(src_mesh, dst_mesh)
    full = full_type(src)
    pending = any(src_mesh.axis_size(a) > 1 for a in src.partial_axes)
    if pending:  # a partial value is not the value: it is no part of what a rank holds
        lack = int(_numel(one_block_each(dst, dst_mesh)).max())
    else:
        lack = int(_lack(full, dst, src_mesh, dst_mesh, world).max())
    # per class of ranks holding the same values (the same addends of a pending sum): what
    # a rank outside it wants of them leaves the class at least once, one element a value
    if known is not None and not pending:
        src_c, need = known
        wanted = need.wanting > 0
        if not wanted.any():
            return lack * src.itemsize
        per = np.bincount(need.piece_holder[wanted], weights=need.piece_numel[wanted],
                          minlength=len(src_c.sizes)).astype(np.int64)
    else:
        values = mesh_coords(src_mesh)[:, [src_mesh.index(a) for a in src.partial_axes]] if pending else None
        src_c = _classes(one_block_each(full, src_mesh), src_mesh, world, values)
        per = _wanted_of(src_c, _classes(one_block_each(dst, dst_mesh), dst_mesh, world))
    leave = int((-(-per // src_c.sizes)).max()) if len(per) else 0
    return max(lack, leave) * src.itemsize


def _wanted_of(src: _Classes, dst: _Classes) -> np.ndarray:
    """Elements of each source class that some destination rank lacks. Classes holding
    the same box (the addends of a pending sum) share their meets with the destination's
    classes; only the pairs where every rank of a destination class already holds the
    class on the source (ranks on both meshes: few) are taken off."""
    ndim = src.boxes.shape[1]
    flat, box_of = np.unique(src.boxes.reshape(len(src.boxes), -1), axis=0, return_inverse=True)
    _, u, piece_box = _meets(dst.boxes, flat.reshape(len(flat), ndim, 2))
    per = np.bincount(u, weights=_numel(piece_box), minlength=len(flat)).astype(np.int64)[box_of.reshape(-1)]
    both = (dst.of_rank >= 0) & (src.of_rank >= 0)
    pairs = np.unique(dst.of_rank[both] * len(src.sizes) + src.of_rank[both])
    pi, pj = pairs // len(src.sizes), pairs % len(src.sizes)
    held = _wanting(src, dst)(pi, pj) == 0
    pi, pj = pi[held], pj[held]
    lo = np.maximum(dst.boxes[pi, :, 0], src.boxes[pj, :, 0])
    hi = np.maximum(np.minimum(dst.boxes[pi, :, 1], src.boxes[pj, :, 1]), lo)
    np.subtract.at(per, pj, _numel(np.stack([lo, hi], axis=-1)))
    return per


def cross_best(src: TensorType, dst: TensorType, src_mesh: Mesh, dst_mesh: Mesh, finishes: Sequence[Program],
               model: CostModel) -> Program:
    """The cheapest program (bytes, then rounds, then the earlier finish) over the ways
    ``finishes`` of finishing ``src``'s pending sums. A finish whose floor (the bound, and
    per rank what the finish moves plus what the rank then lacks) cannot beat the best so
    far is not planned: the million-message crossings are the time of a compile."""
    world = world_of(src_mesh, dst_mesh)
    bound = cross_bound(src, dst, src_mesh, dst_mesh)
    floors = []
    for k, f in enumerate(finishes):
        moved = _moved((), f, src_mesh, world)[0]
        lack = _lack(f.dst, dst, src_mesh, dst_mesh, world)
        floors.append((max(bound, int((moved + lack * src.itemsize).max())),
                       f.cost.collectives + int(bool(lack.any())), k))
    best: tuple[int, int, int] | None = None
    chosen: Program | None = None
    for floor in sorted(floors):
        if best is not None and floor >= best:
            break
        p = cross_program(src, dst, src_mesh, dst_mesh, finishes[floor[2]], model, bound)
        key = (p.cost.bytes_max, p.cost.collectives, floor[2])
        if best is None or key < best:
            best, chosen = key, p
    assert chosen is not None
    return chosen


def cross_program(src: TensorType, dst: TensorType, src_mesh: Mesh, dst_mesh: Mesh, finish: Program | None,
                  model: CostModel, bound: int | None = None) -> Program:
    """The cheaper of the direct and the fan-out plan after ``finish`` (checked types);
    ``bound``: ``cross_bound`` where the caller has it."""
    full = src if finish is None else finish.dst
    world = world_of(src_mesh, dst_mesh)
    item = src.itemsize
    src_c = _classes(one_block_each(full, src_mesh), src_mesh, world)
    need = _needs(src_c, _classes(one_block_each(dst, dst_mesh), dst_mesh, world))
    if bound is None:
        bound = _bound(src, dst, src_mesh, dst_mesh, None if finish else (src_c, need))
    steps, split, fanned = _cheapest(src_c, need, finish, src_mesh, world, item, bound)
    moved, sent = _moved(steps, finish, src_mesh, world)
    peak = np.zeros(world, dtype=np.int64)
    peak[list(src_mesh.global_ranks)] += [math.prod(shape) * item for shape in local_shapes(full, src_mesh)]
    peak[list(dst_mesh.global_ranks)] += [math.prod(shape) * item for shape in local_shapes(dst, dst_mesh)]
    cost = Cost(
        bytes_sent_max=int(sent.max()), collectives=(finish.cost.collectives if finish else 0) + len(steps),
        peak_bytes_max=int(peak.max()),
        time_s=(finish.cost.time_s if finish else 0.0) + sum(model.step_time((), s.bytes_max, True) for s in steps),
        bytes_max=int(moved.max()),
    )
    kind = "fan_out" if len(steps) > 1 else "send_across"
    phased = tuple(sum(s.bytes_moved[r] for s in steps) for r in range(world)) if len(steps) > 1 else ()
    crossing = CrossStep(
        kind, (), (), full, dst, None, local_shapes(full, src_mesh), local_shapes(dst, dst_mesh),
        tuple(map(sum, zip(*(s.bytes_sent for s in steps)))) if steps else (0,) * world,
        collective=True, bytes_recv=tuple(map(sum, zip(*(s.bytes_recv for s in steps)))) if steps else (0,) * world,
        bytes_phased=phased, launches=len(steps), dst_mesh=dst_mesh,
        rounds=tuple(steps), split=split, fanned=fanned, bound=bound, finish=finish)
    gap = cost.bytes_max - bound  # what a cheaper crossing could save, at most
    return Program(src_mesh, src, dst, (*(finish.steps if finish else ()), crossing), cost, gap == 0, gap)


def rank_part(step: CrossStep, src_mesh: Mesh, rank: int) -> tuple[tuple[tuple[Transfer, ...], tuple[Transfer, ...]], ...]:
    """Per round of the crossing ``step`` from ``src_mesh``, (what ``rank`` sends, what it
    receives). The plan's rules (turns, cuts, fan-out) depend on each piece alone, so the
    pieces of ``rank``'s own blocks (its destination block met with every source class, its
    source block met with every destination class) rebuild exactly its messages."""
    dst_mesh = step.dst_mesh
    assert dst_mesh is not None
    world, item = world_of(src_mesh, dst_mesh), step.src.itemsize
    src_c = _classes(one_block_each(step.src, src_mesh), src_mesh, world)
    dst_c = _classes(one_block_each(step.dst, dst_mesh), dst_mesh, world)
    i_r, j_r = (int(c.of_rank[rank]) if 0 <= rank < world else -1 for c in (dst_c, src_c))
    need = _needs(src_c, dst_c, _own_pieces(src_c, dst_c, i_r, j_r, step.src.ndim))
    steps = {s.kind: s for s in _plan(src_c, need, _fan_mask(need, np.asarray(step.fanned, dtype=np.int64)),
                                      step.split, world, item)}
    return tuple(steps[s.kind].rank_transfers(rank) if s.kind in steps else ((), ()) for s in step.rounds)


def cut(held: Sequence[tuple[Box, Any]], box: Box) -> Any:
    """The part of global ``box`` of the first held block that covers it (a view: numpy
    arrays and torch tensors alike; the simulator and the torch rounds both cut here)."""
    for b, x in held:
        if all(blo <= lo and hi <= bhi for (lo, hi), (blo, bhi) in zip(box, b, strict=True)):
            return x[tuple(slice(lo - blo, hi - blo) for (lo, hi), (blo, _) in zip(box, b, strict=True))]
    raise AssertionError(f"a transfer of {box} from a rank that does not hold it")


def fill(out: Any, box: Box, held: Sequence[tuple[Box, Any]], skip: Collection[Box] = ()) -> list[tuple[slice, ...]]:
    """Copy into ``out``, the block of global ``box``, every part of the held blocks that
    falls in it, but the blocks in ``skip`` (landed there already); the slices of ``out``
    written. numpy arrays and torch tensors alike."""
    written = []
    for b, x in held:
        if b in skip:
            continue
        lo = [max(a[0], c[0]) for a, c in zip(box, b, strict=True)]
        hi = [min(a[1], c[1]) for a, c in zip(box, b, strict=True)]
        if any(h <= lo_ for lo_, h in zip(lo, hi, strict=True)):
            continue
        dst_sl = tuple(slice(l_ - a[0], h - a[0]) for l_, h, a in zip(lo, hi, box, strict=True))
        out[dst_sl] = x[tuple(slice(l_ - c[0], h - c[0]) for l_, h, c in zip(lo, hi, b, strict=True))]
        written.append(dst_sl)
    return written


def dst_block(held: list[tuple[Box, np.ndarray]], box: Box, shape: tuple[int, ...], dtype: str,
              np_dtype: Any) -> np.ndarray:
    out = np.zeros(shape, dtype=np_dtype)
    filled = np.zeros(shape, dtype=bool)
    for sl in fill(out, box, held):
        filled[sl] = True
    if not filled.all():
        raise AssertionError(f"a destination block {box} of {dtype} is not covered")
    return out
