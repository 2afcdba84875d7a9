"""The uneven kinds: ``all_to_allv`` and ``reduce_scatterv``, exact per-peer exchanges between
any two layouts; ``all_gatherv``, the same gather around a ring; ``slicev``, one that moves nothing.

The uneven placements (explicit sizes, ragged runs, partitions) hold *blocks* in a local
order (``lowering.layout.rank_layout``), so their redistributions are exchanges of exactly the
elements a rank needs, at exactly the split each peer has: never padded. One definition
covers every pair of layouts, uneven or plain, on the mesh axes whose role changes (the
*group*); a receiver hears from the *candidates* that hold what it needs::

    sizes 3,1,4 -> sizes 2,4,2 (all_to_allv)        replicate a skewed split (all_to_allv)
    r0 [a a a]      [a a]                          r0 [a a a]      [a a a b c c c c]
    r1 [b]      =>  [a b c c]                      r1 [b]      =>  [a a a b c c c c]
    r2 [c c c c]    [c c]                          r2 [c c c c]    [a a a b c c c c]

``reduce_scatterv`` finishes a pending reduction the same way: each rank sends its
contribution to each element straight to the rank that will hold the sum::

    +A +A +A       (sizes 1,2,1)      r0 [A0]   r1 [A1 A2]   r2 [A3]   (each the sum)

Who sends what, per mesh axis ``a`` of the group (the rule that makes each element
arrive once per contribution, from a rank chosen without coordination):

* the source shards a dim on ``a``: any coordinate (each holds other elements);
* the source has a pending reduction on ``a`` the destination finishes: every
  coordinate (each holds one contribution);
* the source replicates on ``a``: the receiver itself where it holds the data (nothing
  moves that is already there); else one replica, chosen per receiver and per class of
  senders (the coordinates that say which data a rank holds) by a rotation, so that the
  replicas split the sending (*balanced sources*); but with a pending sum in the source,
  the receiver's own coordinate (replicas may split the sum differently)::

      i32[6,1@z] -> i32[6@z,1@y] on y=4,z=8: the four replicas (y, z=0) serve the five
      receivers (y=0, z=1..5) in turn (y = 1, 2, 3, 0, 1): 2 elements each at most,
      where replica y=0 alone sent all 5
* the destination has a *new* pending sum on ``a``: the value stays on one coordinate
  (the one that holds it, or coordinate 0 of a replicated source) and the others hold 0.

Bytes on the wire are exactly the elements sent. A sole holder of an element others need
sends it to each of them (no relay through other ranks); only a gather (the group's axes
shard the source and replicate the destination) goes around a ring, each rank forwarding
what it received, so that it sends every piece but its successor's once, whatever the
skew (the byte bound)::

    r0 [a a a]        round 1: r0->r1 a, r1->r2 b, r2->r0 c     [a a a b c c c c]
    r1 [b]        =>  round 2: r0->r1 c, r1->r2 a, r2->r0 b  => [a a a b c c c c]
    r2 [c c c c]                                                 [a a a b c c c c]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lowering.caching import MIB, cached
from lowering.kinds.base import (
    Piece,
    RankPieces,
    Signature,
    StepKind,
    check_whole_average,
    divide_sum,
    erase,
    own_pieces,
    refuse,
    register,
    same_except,
)
from lowering.kinds.copies import Copy, View, as_run, plan_copies, row_major, run_view
from lowering.layout import (
    LocalLayout,
    boxes,
    group_arrays,
    meet_numel,
    mesh_coords,
    overlap_numel,
    rank_layout,
    stacked_blocks,
)
from spec_lang.ir import Mesh, TensorType

if TYPE_CHECKING:
    from lowering.program import Step


def _role(t: TensorType, a: str) -> tuple:
    d = t.dim_of(a)
    if d is not None:
        # which chunk a coordinate picks depends on the axes up to it (and a split among
        # them): axes of a common major prefix keep their chunks, so data never crosses them
        dim = t.dims[d]
        i = dim.axes.index(a)
        split = (dim.split, dim.split_at) if dim.split is not None and dim.split_at <= i else None
        return ("S", d, dim.axes[:i + 1], split)
    at = t.axis_type(a)
    return (at.kind if at.kind in ("P", "V") else "R",)


def group_axes(src: TensorType, dst: TensorType, mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes whose role changes (mesh order): data moves only across these."""
    return tuple(a for a in mesh.names if _role(src, a) != _role(dst, a))


def finished_axes(src: TensorType, dst: TensorType, axes: tuple[str, ...]) -> tuple[str, ...]:
    """The axes of ``axes`` on which ``src -> dst`` finishes a pending reduction."""
    dp = set(dst.partial_axes)
    return tuple(a for a in axes if a in src.partial_axes and a not in dp)


@dataclass(frozen=True)
class _Rule:
    """Per group axis (by mesh index): must the sender share the receiver's coordinate
    (``same``), must the receiver sit on coordinate 0 to receive at all (``zero``), does the
    sender's coordinate say which data it holds (``held``: a sharded source, or a
    contribution to a sum the step finishes), or is it one replica among others (``spread``)."""

    same: tuple[int, ...]
    zero: tuple[int, ...]
    held: tuple[int, ...]
    spread: tuple[int, ...]
    group: tuple[int, ...]
    sizes: tuple[int, ...]  # the mesh's

    def picks(self, cq: np.ndarray, cr: np.ndarray) -> np.ndarray:
        """Whether sender ``cq`` is the one its class sends to receiver ``cr`` from
        (coordinates, broadcast): the receiver itself where it holds that class's data, else
        the replica the rotation picks: the sum of the receiver's group coordinates and the
        class's, modulo the replicas (a step along any axis turns to the next replica)."""
        same_class = (cq[..., list(self.held)] == cr[..., list(self.held)]).all(axis=-1)
        itself = (cq[..., list(self.spread)] == cr[..., list(self.spread)]).all(axis=-1)
        replica = np.zeros(cq.shape[:-1], dtype=np.int64)
        for i in self.spread:  # row-major over the replicated axes
            replica = replica * self.sizes[i] + cq[..., i]
        replicas = int(np.prod([self.sizes[i] for i in self.spread]))
        turn = (cr[..., list(self.group)].sum(axis=-1) + cq[..., list(self.held)].sum(axis=-1)) % replicas
        return np.where(same_class, itself, replica == turn)


def _rule(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> _Rule:
    op = src.partial_op or dst.partial_op or "sum"
    same: list[int] = []
    zero: list[int] = []
    held: list[int] = []
    spread: list[int] = []
    for a in axes:
        i = mesh.index(a)
        new_sum = a in dst.partial_axes and a not in src.partial_axes and op == "sum"
        if src.dim_of(a) is not None:
            (same if new_sum else held).append(i)
        elif a in src.partial_axes:
            held.append(i)
        elif new_sum:  # replicated in the source: the value stays on coordinate 0
            same.append(i)
            zero.append(i)
        elif src.partial_axes:
            # replicas of a pending sum split it each their own way: a receiver takes every
            # contribution from one split, its own (the one it holds a part of)
            same.append(i)
        else:  # replicated in the source: any replica holds the same values
            spread.append(i)
    return _Rule(tuple(same), tuple(zero), tuple(held), tuple(spread), tuple(mesh.index(a) for a in axes),
                 tuple(mesh.sizes))


def _sends_to(rule: _Rule, coords: np.ndarray, q: int, r: int) -> bool:
    """Does ``q`` send to receiver ``r`` (each element ``r`` needs arrives once per
    contribution, from the one rank the rule picks)?"""
    cq, cr = coords[q], coords[r]
    return (all(cr[i] == 0 for i in rule.zero) and all(cq[i] == cr[i] for i in rule.same)
            and (not rule.spread or bool(rule.picks(cq, cr))))


def _view(lay: LocalLayout, i: int, box: np.ndarray) -> View:
    """Global ``box`` (inside block i) as a strided view of the contiguous local tensor."""
    blk = lay.blocks[i]
    if lay.cat is None:
        shape = tuple(int(hi - lo) for lo, hi in blk)
        strides = row_major(shape)
        off = lay.offsets[i] + sum(int(box[k, 0] - blk[k, 0]) * strides[k] for k in range(len(shape)))
        return View(off, tuple(int(hi - lo) for lo, hi in box), strides)
    strides = row_major(lay.shape)
    off = 0
    for k in range(len(lay.shape)):
        start = int(box[k, 0] - blk[k, 0]) + (lay.offsets[i] if k == lay.cat else 0)
        off += start * strides[k]
    return View(off, tuple(int(hi - lo) for lo, hi in box), strides)


def _meet(a: LocalLayout, b: LocalLayout) -> list[tuple[int, int, np.ndarray]]:
    """Non-empty intersections of a's blocks with b's, a's blocks outer (both sides list them
    in this one order)."""
    out: list[tuple[int, int, np.ndarray]] = []
    if not len(a.blocks) or not len(b.blocks):
        return out
    lo = np.maximum(a.blocks[:, None, :, 0], b.blocks[None, :, :, 0])
    hi = np.minimum(a.blocks[:, None, :, 1], b.blocks[None, :, :, 1])
    ok = (hi > lo).all(axis=-1)
    for i, j in zip(*np.nonzero(ok)):
        out.append((int(i), int(j), np.stack([lo[i, j], hi[i, j]], axis=-1)))
    return out


def _numel(box: np.ndarray) -> int:
    return int(np.prod(box[:, 1] - box[:, 0]))


@dataclass(frozen=True, kw_only=True)
class ExchangeVPieces(RankPieces):
    """One rank's share: per member the elements sent and received (process-group order,
    the own entry 0), and the strided copies that pack, unpack and keep them."""

    send: tuple[Piece, ...]
    recv: tuple[Piece, ...]
    pack_copies: tuple[Copy, ...]  # input -> flat send buffer
    unpack_copies: tuple[Copy, ...]  # flat receive buffer -> output (accumulated by reduce_scatterv)
    self_copies: tuple[Copy, ...]  # input -> output: what this rank keeps
    covered: int  # output elements written (or first reduced) by the copies
    send_elems: int
    recv_elems: int
    send_run: int | None
    recv_run: int | None
    divide: int  # an avg's contribution count: the reduced axes' group size

    @property
    def fills(self) -> bool:
        """Some output elements receive nothing: they start at the reduction's identity."""
        n = 1
        for s in self.out_shape:
            n *= s
        return self.covered < n


def _pieces(step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> ExchangeVPieces:
    src, dst = step.src, step.dst
    rule = _rule(src, dst, mesh, step.axes)
    coords = mesh_coords(mesh)
    me_in, me_out = rank_layout(src, mesh, rank), rank_layout(dst, mesh, rank)
    send: list[Piece] = []
    recv: list[Piece] = []
    pack: list[tuple[View, View]] = []
    unpack: list[tuple[View, View]] = []
    keep: list[tuple[View, View]] = []
    off_s = off_r = covered = 0
    for q in members:
        # what q sends to me (in q's block order), and what I send to q
        if q == rank:
            if _sends_to(rule, coords, rank, rank):
                for i, j, box in _meet(me_in, me_out):
                    keep.append((_view(me_in, i, box), _view(me_out, j, box)))
                    covered += _numel(box)
            send.append(Piece(q, (), (), (0,), 0))
            recv.append(Piece(q, (), (), (0,), 0))
            continue
        n_in = 0
        if _sends_to(rule, coords, q, rank):
            for _i, j, box in _meet(rank_layout(src, mesh, q), me_out):
                k = _numel(box)
                unpack.append((run_view(off_r + n_in, tuple(int(x) for x in box[:, 1] - box[:, 0])),
                               _view(me_out, j, box)))
                n_in += k
        off_r += n_in
        covered += n_in
        recv.append(Piece(q, (), (), (n_in,), n_in))
        n = 0
        if _sends_to(rule, coords, rank, q):
            for i, _j, box in _meet(me_in, rank_layout(dst, mesh, q)):
                pack.append((_view(me_in, i, box), run_view(off_s + n, tuple(int(x) for x in box[:, 1] - box[:, 0]))))
                n += _numel(box)
        off_s += n
        send.append(Piece(q, (), (), (n,), n))
    pack_c, unpack_c = plan_copies(pack), plan_copies(unpack)
    return ExchangeVPieces(
        kind=step.kind, rank=rank, in_shape=me_in.shape, out_shape=me_out.shape, members=members,
        wire_elems=off_s, wire_in_elems=off_r, send=tuple(send), recv=tuple(recv), pack_copies=pack_c, unpack_copies=unpack_c,
        self_copies=plan_copies(keep), covered=covered, send_elems=off_s, recv_elems=off_r,
        send_run=as_run(pack_c, off_s), recv_run=as_run(unpack_c, off_r, into=True),
        divide=mesh.group_size(finished_axes(src, dst, step.axes)),
    )


# ---- numpy semantics (the torch runner does the same with as_strided views) -----------------


def _strided(flat: np.ndarray, v: View) -> np.ndarray:
    item = flat.itemsize
    # as_strided rebuilds the array from its typestr, which numpy cannot read back for some
    # ml_dtypes (float8_e5m2 is '<f1'): stride raw bytes of the same size, then view them as the dtype
    raw = flat[v.offset:].view(np.dtype((np.void, item)))
    return np.lib.stride_tricks.as_strided(raw, shape=v.size, strides=tuple(s * item for s in v.stride),
                                           writeable=True).view(flat.dtype)


def identity(op: str, dtype: np.dtype) -> object:
    """The value a reduction starts from (what a rank holds where it receives nothing)."""
    if op in ("sum", "avg") or dtype == np.bool_:
        return 0 if op != "min" or dtype != np.bool_ else True
    if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
        return -np.inf if op == "max" else np.inf
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return info.min if op == "max" else info.max
    # ml_dtypes' bfloat16, float8s, int4 ... are no numpy subtypes: ask ml_dtypes (installed
    # wherever such an array exists) for their range
    import ml_dtypes

    extremes: ml_dtypes.iinfo | ml_dtypes.finfo
    try:
        extremes = ml_dtypes.iinfo(dtype)
    except ValueError:
        extremes = ml_dtypes.finfo(dtype)
        if np.isinf(np.array(np.inf).astype(dtype).astype(np.float32)):
            return -np.inf if op == "max" else np.inf
        # no infinity (float8_e4m3fn and kin): the finite extremes are the identities
    return extremes.min if op == "max" else extremes.max


def apply_copies(copies: Sequence[Copy], src: np.ndarray, dst: np.ndarray, op: str | None) -> None:
    for c in copies:
        a, b = _strided(src, c.src), _strided(dst, c.dst)
        if op is None:
            b[...] = a
        elif op in ("sum", "avg"):
            b += a
        elif op == "max":
            np.maximum(b, a, out=b)
        else:
            np.minimum(b, a, out=b)


def _simulate(step: Step, pieces: Sequence[ExchangeVPieces], xs: Sequence[np.ndarray], op: str | None,
              divide: int) -> list[np.ndarray]:
    sends = {}
    for p in pieces:
        flat_in = np.ascontiguousarray(xs[p.rank]).reshape(-1)
        buf = np.zeros(p.send_elems, dtype=flat_in.dtype)
        apply_copies(p.pack_copies, flat_in, buf, None)
        segs, off = {}, 0
        for pc in p.send:
            segs[pc.peer] = buf[off:off + pc.numel]
            off += pc.numel
        sends[p.rank] = segs
    out = []
    for p in pieces:
        x = np.ascontiguousarray(xs[p.rank]).reshape(-1)
        recv = np.concatenate([sends[pc.peer][p.rank] for pc in p.recv
                               if pc.peer != p.rank] or [np.zeros(0, dtype=x.dtype)])
        y = np.full(int(np.prod(p.out_shape)), identity(op or "sum", x.dtype), dtype=x.dtype)
        apply_copies(p.self_copies, x, y, op)
        apply_copies(p.unpack_copies, recv, y, op)
        if op == "avg":
            y = divide_sum(y, divide)
        out.append(y.reshape(p.out_shape))
    return out


# ---- the two exchanges -----------------------------------------------------------------------


def _check(kind: str, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None,
           reduces: bool) -> Signature:
    from lowering.checks import check_partial_conversion

    same_except(kind, src, dst, "an exchange never changes V axes")
    op = check_partial_conversion(src, dst)
    group = group_axes(erase(src), erase(dst), mesh)
    if axes is not None:
        if set(axes) != set(group):
            raise refuse(kind, src, dst, f"the types change the roles of axes {list(group)}, not {list(axes)}",
                         f"pass axes={group!r}, or leave axes out")
        group = tuple(axes)
    red = finished_axes(src, dst, group)
    if reduces and not red:
        raise refuse(kind, src, dst, "no pending reduction is finished", "use all_to_allv")
    if not reduces and red:
        raise refuse(kind, src, dst, f"it finishes the pending reduction over {list(red)}",
                     "use reduce_scatterv")
    check_whole_average(kind, src, dst, mesh)
    dims = tuple(k for k, (a, b) in enumerate(zip(src.dims, dst.dims)) if a != b)
    return Signature(group, dims, op if reduces else None)


@cached(maxsize=1024, max_bytes=8 * MIB)
def _traffic(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Elements each rank sends and receives: its exact pieces, for every rank at once
    (vectorised over each group's sender x receiver pairs; receivers in chunks to bound memory)."""
    rule = _rule(src, dst, mesh, axes)
    if rule.spread and not rule.same and not src.is_uneven and not dst.is_uneven:
        return _replica_traffic(src, dst, mesh, axes, rule)
    coords = mesh_coords(mesh)
    sb, db = stacked_blocks(src, mesh), stacked_blocks(dst, mesh)
    sent = np.zeros(mesh.size, dtype=np.int64)
    got = np.zeros(mesh.size, dtype=np.int64)
    same, zero = list(rule.same), list(rule.zero)
    groups = group_arrays(mesh, axes)[1] if axes else np.arange(mesh.size)[:, None]
    g, n = groups.shape
    if g * n * n * sb.shape[1] * db.shape[1] * max(1, src.ndim) <= _PAIR_BUDGET:  # every group at once
        c = coords[groups]  # (groups, members, mesh ndim)
        ok = (c[:, :, None, same] == c[:, None, :, same]).all(axis=-1) if same else np.ones((g, n, n), bool)
        if zero:
            ok &= (c[:, None, :, zero] == 0).all(axis=-1)
        if rule.spread:
            ok &= rule.picks(c[:, :, None], c[:, None, :])
        ok[:, np.arange(n), np.arange(n)] = False  # the own piece is copied locally
        pairs = meet_numel(sb[groups][:, :, None], db[groups][:, None, :]) * ok  # (groups, senders, receivers)
        sent[groups] = pairs.sum(axis=2)
        got[groups] = pairs.sum(axis=1)
        groups = groups[:0]
    for members in groups:
        c = coords[members]
        ok = (c[:, None, same] == c[None, :, same]).all(axis=-1) if same else np.ones((len(members),) * 2, bool)
        if zero:
            ok &= (c[None, :, zero] == 0).all(axis=-1)
        if rule.spread:
            ok &= rule.picks(c[:, None], c[None, :])
        np.fill_diagonal(ok, False)  # the own piece is copied locally
        per = max(1, _PAIR_BUDGET // max(1, len(members) * sb.shape[1] * db.shape[1] * max(1, src.ndim)))
        for lo in range(0, len(members), per):
            recv = members[lo:lo + per]
            n = meet_numel(sb[members][:, None], db[recv][None, :]) * ok[:, lo:lo + per]  # (senders, receivers)
            sent[members] += n.sum(axis=1)
            got[recv] += n.sum(axis=0)
    sent.setflags(write=False)
    got.setflags(write=False)
    return sent, got


def _replica_traffic(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
                     rule: _Rule) -> tuple[np.ndarray, np.ndarray]:
    """``_traffic`` of plain layouts where the group replicates the source (balanced
    sources, no new sums): the replicas of a class hold one box, so each receiver's overlap
    is computed once per class (classes x receivers, not senders x receivers) and credited
    to the replica the rotation picks."""
    coords = mesh_coords(mesh)
    sb, db = boxes(src, mesh), boxes(dst, mesh)
    sent = np.zeros(mesh.size, dtype=np.int64)
    got = np.zeros(mesh.size, dtype=np.int64)
    held, spread = list(rule.held), list(rule.spread)
    replicas = int(np.prod([mesh.sizes[i] for i in spread]))
    for members in group_arrays(mesh, axes)[1]:
        c = coords[members]
        cls = np.zeros(len(members), dtype=np.int64)
        for i in held:  # row-major over the held axes
            cls = cls * mesh.sizes[i] + c[:, i]
        rep = np.zeros(len(members), dtype=np.int64)
        for i in spread:
            rep = rep * mesh.sizes[i] + c[:, i]
        classes, first = np.unique(cls, return_index=True)
        sender = np.full((len(classes), replicas), -1, dtype=np.int64)  # (class, replica) -> member
        sender[np.searchsorted(classes, cls), rep] = np.arange(len(members))
        ov = overlap_numel(sb[members[first]][:, None], db[members][None, :])  # (classes, receivers)
        own = classes[:, None] == cls[None, :]  # a receiver of the class keeps its own copy
        ov = np.where(own, 0, ov)
        turn = (c[:, list(rule.group)].sum(axis=1)[None, :] + c[first][:, held].sum(axis=1)[:, None]) % replicas
        who = sender[np.arange(len(classes))[:, None], turn]  # (classes, receivers): the member that sends
        np.add.at(sent, members[who.reshape(-1)], ov.reshape(-1))
        got[members] += ov.sum(axis=0)
    sent.setflags(write=False)
    got.setflags(write=False)
    return sent, got


def _price(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """Elements each rank sends (``_traffic``)."""
    return _traffic(src, dst, mesh, axes)[0]


_PAIR_BUDGET = 1 << 22  # intersection entries per chunk (~64 MiB of int64 temporaries)


@register
class AllToAllV(StepKind):
    name = "all_to_allv"
    collective = True

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        return _check(self.name, src, dst, mesh, axes, reduces=self.reduces)

    def refine(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> str:
        return refine_exchange(src, dst, mesh, axes, _price(src, dst, mesh, axes))

    def price(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        return _price(src, dst, mesh, axes)

    def received(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
                 padded: bool = True) -> np.ndarray:
        return _traffic(src, dst, mesh, axes)[1]

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        return _pieces(step, mesh, rank, members)

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return _simulate(step, own_pieces(ExchangeVPieces, pieces), xs, None, 1)


@register
class ReduceScatterV(AllToAllV):
    name = "reduce_scatterv"
    reduces = True

    def refine(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> str:
        # Direct, not around a ring: a ring reduce-scatter sends fewer bytes on skewed pieces
        # but takes n-1 rounds, several times slower on gloo in bench/uneven.py
        return self.name

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        own = own_pieces(ExchangeVPieces, pieces)
        return _simulate(step, own, xs, step.op or "sum", own[0].divide)


# ---- the uneven gather around a ring, and the exchange that moves nothing ------------------


def is_gather(src: TensorType, dst: TensorType, axes: tuple[str, ...]) -> bool:
    """Every group axis shards the source and replicates the destination (no pending sums):
    every member then needs the same pieces, the group's whole share of the destination."""
    return bool(axes) and all(
        src.dim_of(a) is not None and dst.dim_of(a) is None
        and a not in src.partial_axes and a not in dst.partial_axes for a in axes
    )


@dataclass(frozen=True, kw_only=True)
class GatherVPieces(RankPieces):
    """One rank's ring: every member's segment size (process-group order), how to pack its
    own segment, and how to unpack the gathered buffer (all segments back to back)."""

    segments: tuple[int, ...]
    pack_copies: tuple[Copy, ...]  # input -> own segment (a flat run from 0)
    unpack_copies: tuple[Copy, ...]  # ring buffer -> output

    @property
    def send_elems(self) -> int:
        return self.wire_elems

    @property
    def recv_elems(self) -> int:
        """Every segment but its own: exactly what it lacks."""
        return sum(self.segments) - self.segments[self.position]

    @property
    def position(self) -> int:
        return self.members.index(self.rank)

    @property
    def offsets(self) -> tuple[int, ...]:
        out, o = [], 0
        for s in self.segments:
            out.append(o)
            o += s
        return tuple(out)


def _segment(step: Step, mesh: Mesh, q: int) -> list[tuple[int, int, np.ndarray]]:
    """Member q's segment: its source blocks met with the (shared) destination blocks."""
    return _meet(rank_layout(step.src, mesh, q), rank_layout(step.dst, mesh, q))


def _ring_price(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
                successor: bool = True) -> np.ndarray:
    """Per rank: every segment of its group but its successor's (sent), or but its own
    (received, ``successor=False``)."""
    seg = meet_numel(stacked_blocks(src, mesh), stacked_blocks(dst, mesh)).astype(np.int64)
    out = np.zeros(mesh.size, dtype=np.int64)
    for members in group_arrays(mesh, axes)[1]:
        ranks = np.sort(members)  # process-group order
        s = seg[ranks]
        out[ranks] = s.sum() - (np.roll(s, -1) if successor else s)
    return out


@register
class AllGatherV(AllToAllV):
    name = "all_gatherv"

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        sig = super().infer(src, dst, mesh, axes)
        if not is_gather(src, dst, sig.axes):
            raise refuse(self.name, src, dst, "the group's axes must shard the source and replicate the destination",
                         "use all_to_allv")
        return sig

    def refine(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> str:
        return self.name

    def price(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        return _ring_price(src, dst, mesh, axes)

    def received(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
                 padded: bool = True) -> np.ndarray:
        return _ring_price(src, dst, mesh, axes, successor=False)

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        out_lay = rank_layout(step.dst, mesh, rank)
        in_lay = rank_layout(step.src, mesh, rank)
        segments, unpack = [], []
        base = 0
        pack: list[tuple[View, View]] = []
        for q in members:
            n = 0
            src_q = rank_layout(step.src, mesh, q)
            for i, j, box in _meet(src_q, out_lay):
                shape = tuple(int(x) for x in box[:, 1] - box[:, 0])
                unpack.append((run_view(base + n, shape), _view(out_lay, j, box)))
                if q == rank:
                    pack.append((_view(in_lay, i, box), run_view(n, shape)))
                n += _numel(box)
            segments.append(n)
            base += n
        i = members.index(rank)
        wire = base - segments[(i + 1) % len(members)] if len(members) > 1 else 0
        return GatherVPieces(kind=step.kind, rank=rank, in_shape=in_lay.shape, out_shape=out_lay.shape,
                             members=members, wire_elems=wire, wire_in_elems=base - segments[i],
                             segments=tuple(segments),
                             pack_copies=plan_copies(pack), unpack_copies=plan_copies(unpack))

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        own = {}
        ring = own_pieces(GatherVPieces, pieces)
        for p in ring:
            x = np.ascontiguousarray(xs[p.rank]).reshape(-1)
            seg = np.zeros(p.segments[p.position], dtype=x.dtype)
            apply_copies(p.pack_copies, x, seg, None)
            own[p.rank] = seg
        out = []
        for p in ring:
            buf = np.concatenate([own[q] for q in p.members])
            y = np.zeros(int(np.prod(p.out_shape)), dtype=buf.dtype)
            apply_copies(p.unpack_copies, buf, y, None)
            out.append(y.reshape(p.out_shape))
        return out


@register
class SliceV(AllToAllV):
    """An exchange in which nothing leaves any rank: each keeps (or zero-fills) its part."""

    name = "slicev"
    collective = False

    def refine(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> str:
        return self.name

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        sig = super().infer(src, dst, mesh, axes)
        if AllToAllV.price(self, src, dst, mesh, sig.axes).any():
            raise refuse(self.name, src, dst, "some rank must receive data", "use all_to_allv")
        return sig

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return _simulate(step, own_pieces(ExchangeVPieces, pieces), xs, None, 1)


def refine_exchange(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...], sent: np.ndarray) -> str:
    """The kind an exchange runs as: local when nothing moves, a ring for a gather."""
    if not sent.any():
        return SliceV.name
    if is_gather(src, dst, axes):
        return AllGatherV.name
    return AllToAllV.name

