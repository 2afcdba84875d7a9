"""``relay``: an exact exchange in two phases, for layouts where few ranks hold what many need.

A one-phase exchange (``all_to_all``, ``all_to_allv``) makes every holder send each piece
to each rank that needs it, so a sole holder of a piece that n ranks need sends it n times.
A relay sends each piece once, to one of the ranks that need it (its *owner*), and in a
second phase every owner fans its pieces out to the other ranks that need them (the
classic scatter, then all_gather among the needers). The intermediate, where each rank
holds the pieces it owns, is a layout that no standard type expresses (each group of
needers may split its block differently), so the two phases are one step::

    f32[4@(tp,dp),4] -> f32[4,4@tp] on dp=4,tp=2: rows 0,1 on dp=0,1 of tp=0, rows 2,3 on
    dp=0,1 of tp=1, dp=2,3 empty. Phase 1: each holder sends the half-row the other tp
    needs to an empty rank (8 B). Phase 2: each tp group all_gathers its four half-rows,
    in its own order (24 B). 32 B at every rank, the bound; one-phase plans send 40 B.

The data is cut into *atoms* (the cells of every source and destination box edge in the
group) and each atom into as many parts as it has needers, where that evens the fan-out.
Owners are chosen greedily, deterministically (so every rank computes the same routes):
a part that some needer already holds first, each part to the candidate (a needer, or a
holder that fans out itself) whose busiest-direction bytes, summed over both phases, stay
lowest. Each phase is one ``all_to_all_single`` with exact splits (never padded); a rank
costs the larger of what it sends and receives in each phase, summed over the two
(``moved``), which can exceed the larger of its totals.

Plain layouts only (no pending or new reduction, no uneven split): a relay moves values,
and the planner offers it on the exchanges of even states.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from lowering.caching import MIB, cached
from lowering.kinds.base import (
    RankPieces,
    Signature,
    StepKind,
    erase,
    own_pieces,
    refuse,
    register,
    same_except,
)
from lowering.kinds.copies import Copy, View, plan_copies, row_major, run_view
from lowering.kinds.uneven_exchange import apply_copies, group_axes
from lowering.layout import boxes, group_arrays
from spec_lang.ir import Mesh, TensorType

if TYPE_CHECKING:
    from lowering.program import Step

# a group's parts (atoms cut for their fan-out) times its members beyond which the planner
# does not offer a relay: routes are chosen by a loop over the parts, per group pattern
MAX_PARTS = 1024


@dataclass(frozen=True)
class Routes:
    """One group's two phases, per part (members by index in sorted mesh-rank order): its
    box, who holds it, who needs it (and lacks it), its owner and, where the owner does not
    hold it, the holder that sends it to the owner in phase 1 (-1: none). In phase 2 the
    owner sends it to every other rank that needs it."""

    boxes: np.ndarray  # (parts, ndim, 2), relative to the group's corner
    held: np.ndarray  # (parts, members) bool
    need: np.ndarray  # (parts, members) bool
    owner: np.ndarray  # (parts,)
    sigma: np.ndarray  # (parts,)
    keep: np.ndarray  # (atoms, ndim, 2) boxes some member holds and needs
    keep_by: np.ndarray  # (atoms,) that member

    def loads(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(s1, r1, s2, r2): elements each member sends and receives per phase."""
        n = self.held.shape[1]
        size = np.prod(self.boxes[:, :, 1] - self.boxes[:, :, 0], axis=1) if len(self.boxes) else np.zeros(0, np.int64)
        hop = self.sigma >= 0
        s1 = np.bincount(self.sigma[hop], weights=size[hop], minlength=n)
        r1 = np.bincount(self.owner[hop], weights=size[hop], minlength=n)
        others = self.need & (np.arange(n)[None, :] != self.owner[:, None])
        s2 = np.bincount(self.owner, weights=size * others.sum(axis=1), minlength=n)
        r2 = (others * size[:, None]).sum(axis=0)
        return tuple(np.asarray(a, dtype=np.int64) for a in (s1, r1, s2, r2))  # type: ignore[return-value]


def _cuts(sb: np.ndarray, db: np.ndarray, d: int) -> np.ndarray:
    return np.unique(np.concatenate([sb[:, d, :].ravel(), db[:, d, :].ravel()]))


def _atoms(sb: np.ndarray, db: np.ndarray) -> np.ndarray:
    """(atoms, ndim, 2): the cells of every box edge, each inside or outside every box."""
    per_dim = []
    for d in range(sb.shape[1]):
        c = _cuts(sb, db, d)
        per_dim.append(np.stack([c[:-1], c[1:]], axis=-1) if len(c) > 1 else np.zeros((0, 2), np.int64))
    if any(len(p) == 0 for p in per_dim):
        return np.zeros((0, sb.shape[1], 2), dtype=np.int64)
    grid = np.meshgrid(*[np.arange(len(p)) for p in per_dim], indexing="ij")
    idx = np.stack([g.ravel() for g in grid], axis=-1)
    return np.stack([per_dim[d][idx[:, d]] for d in range(sb.shape[1])], axis=1)


def _inside(atoms: np.ndarray, bx: np.ndarray) -> np.ndarray:
    """(atoms, members): atom inside member's box (atoms never straddle an edge)."""
    if not len(atoms):
        return np.zeros((0, len(bx)), dtype=bool)
    inside = (atoms[:, None, :, 0] >= bx[None, :, :, 0]) & (atoms[:, None, :, 1] <= bx[None, :, :, 1])
    return np.asarray(inside.all(axis=-1))


def _split(box: np.ndarray, parts: int) -> list[np.ndarray]:
    """``box`` cut along its longest dim into up to ``parts`` near-equal boxes."""
    ext = box[:, 1] - box[:, 0]
    d = int(np.argmax(ext))
    k = max(1, min(parts, int(ext[d])))
    edges = box[d, 0] + (np.arange(k + 1) * int(ext[d])) // k
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        b = box.copy()
        b[d] = (lo, hi)
        out.append(b)
    return out


def _rows(m: np.ndarray) -> list[list[int]]:
    """Each row's true columns, as lists (the greedy below runs on plain ints: its groups
    are small, and numpy's per-call cost would dominate)."""
    rows, cols = np.nonzero(m)
    cuts = np.searchsorted(rows, np.arange(1, m.shape[0]))
    return [c.tolist() for c in np.split(cols, cuts)]


def _assign(boxes_: np.ndarray, held: np.ndarray, need: np.ndarray, wanted: np.ndarray,
            holders_fan: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """Greedy owners, part by part in the given order: (owner, sigma, the busiest member's
    elements). ``holders_fan``: a holder that does not need a part may fan it out itself
    (else only ranks that need it own it: where holders are few, what they keep sending
    decides, which a greedy choice one part at a time does not see)."""
    parts, n = held.shape
    s1, r1, s2, r2 = [0] * n, [0] * n, [0] * n, [0] * n
    owner = [0] * parts
    sigma = [-1] * parts
    sizes = np.prod(boxes_[:, :, 1] - boxes_[:, :, 0], axis=1).tolist()
    holders_of, needers_of = _rows(held), _rows(need)
    keepers_of = holders_of if holders_fan else _rows(held & wanted)
    for p in range(parts):
        size, hs, ws = sizes[p], holders_of[p], needers_of[p]
        k = len(ws)
        sg = min(hs, key=s1.__getitem__)  # the least loaded holder, then the first
        after_s = max(s1[sg] + size, r1[sg]) + max(s2[sg], r2[sg])
        best: tuple[int, int, int] | None = None
        for o in ws:  # a needer: it receives the part in phase 1, then fans it out
            out2 = max(s2[o] + size * (k - 1), r2[o])
            key = (max(max(s1[o], r1[o] + size) + out2, after_s), 1, o)
            if best is None or key < best:
                best = key
        for o in keepers_of[p]:  # a holder: it fans the part out itself
            key = (max(s1[o], r1[o]) + max(s2[o] + size * k, r2[o]), 0, o)
            if best is None or key < best:
                best = key
        assert best is not None
        o = best[2]
        owner[p] = o
        if best[1]:
            sigma[p] = sg
            s1[sg] += size
            r1[o] += size
        for w in ws:
            if w != o:
                r2[w] += size
        s2[o] += size * (k - (1 if best[1] else 0))
    worst = max((max(a, b) + max(c, d) for a, b, c, d in zip(s1, r1, s2, r2)), default=0)
    return np.array(owner, dtype=np.int64), np.array(sigma, dtype=np.int64), worst


def _route(atoms: np.ndarray, held: np.ndarray, wanted: np.ndarray, split: bool,
           holders_fan: bool) -> tuple[Routes, int]:
    ndim = atoms.shape[1]
    need = wanted & ~held
    kept = np.nonzero(wanted & held)
    rows = np.flatnonzero(need.any(axis=1))
    if split:
        parts = [(b, a) for a in rows for b in _split(atoms[a], int(need[a].sum()))]
    else:
        parts = [(atoms[a], a) for a in rows]
    boxes_ = np.array([b for b, _ in parts], dtype=np.int64).reshape(len(parts), ndim, 2)
    src_atom = np.array([a for _, a in parts], dtype=np.int64)
    # parts that a rank which needs them already holds first (it fans them out with no
    # phase 1), then the larger fan-outs; ties in atom order: the same routes on every rank
    first = (held & wanted).any(axis=1)[src_atom]
    weight = np.prod(boxes_[:, :, 1] - boxes_[:, :, 0], axis=1) * need.sum(axis=1)[src_atom]
    order = np.lexsort((np.arange(len(parts)), -weight, ~first))
    boxes_, src_atom = boxes_[order], src_atom[order]
    owner, sigma, worst = _assign(boxes_, held[src_atom], need[src_atom], wanted[src_atom], holders_fan)
    return Routes(boxes_, held[src_atom], need[src_atom], owner, sigma, atoms[kept[0]], kept[1]), worst


@dataclass(frozen=True)
class RelayPlan:
    """Every group's routes, held once per distinct group pattern (boxes relative to the
    group's corner), and each rank's elements per phase."""

    groups: np.ndarray  # (groups, n) members, sorted
    group_of: np.ndarray  # (world,) group index of each rank
    pattern_of: tuple[int, ...]  # group -> index into patterns
    patterns: tuple[Routes, ...]  # boxes relative to the group's corner
    corner: np.ndarray  # (groups, ndim) each group's corner
    sent: np.ndarray  # (world,) both phases
    received: np.ndarray
    moved: np.ndarray  # per phase the larger of sent and received, summed


@cached(maxsize=256, max_bytes=8 * MIB)
def relay_plan(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> RelayPlan:
    """The relay's routes over ``axes`` (computed once per distinct group pattern, with and
    without cutting atoms into parts, with and without holders fanning out: the cheapest
    by the busiest rank, ties to the first)."""
    sb, db = boxes(src, mesh), boxes(dst, mesh)
    groups = np.sort(group_arrays(mesh, axes)[1], axis=1)
    group_of = np.empty(mesh.size, dtype=np.int64)
    group_of[groups] = np.arange(len(groups))[:, None]
    sent, got, moved = (np.zeros(mesh.size, dtype=np.int64) for _ in range(3))
    seen: dict[tuple[bytes, bytes], int] = {}
    patterns: list[Routes] = []
    loads: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    pattern_of: list[int] = []
    corners = np.zeros((len(groups), src.ndim), dtype=np.int64)
    for g, members in enumerate(groups):
        gs, gd = sb[members], db[members]
        corner = np.minimum(gs[:, :, 0].min(axis=0), gd[:, :, 0].min(axis=0))
        corners[g] = corner
        rs, rd = gs - corner[None, :, None], gd - corner[None, :, None]
        key = (rs.tobytes(), rd.tobytes())
        if key not in seen:
            best: tuple[Routes, int] | None = None
            floor = _receive_floor(rs, rd)
            atoms = _atoms(rs, rd)
            held, wanted = _inside(atoms, rs), _inside(atoms, rd)
            need = wanted & ~held
            needed = need.any(axis=1)
            # cutting changes nothing where no needed atom has 2+ needers and 2+ elements, and
            # holders fanning out changes nothing where every holder of a needed atom needs it
            ext = (atoms[:, :, 1] - atoms[:, :, 0]).max(axis=1, initial=0)
            cuts = (True,) if ((need.sum(axis=1) > 1) & (ext > 1)).any() else ()
            fans = (False,) if (held & ~wanted & needed[:, None]).any() else ()
            for split, fan in [(False, True), *((c, True) for c in cuts), *((False, f) for f in fans),
                               *((c, f) for c in cuts for f in fans)]:
                r, worst = _route(atoms, held, wanted, split, fan)
                if best is None or worst < best[1]:
                    best = (r, worst)
                if best[1] <= floor:
                    break  # no route moves less than the neediest member receives
            assert best is not None
            s1, r1, s2, r2 = best[0].loads()
            seen[key] = len(patterns)
            patterns.append(best[0])
            loads.append((s1 + s2, r1 + r2, np.maximum(s1, r1) + np.maximum(s2, r2)))
        i = seen[key]
        pattern_of.append(i)
        sent[members], got[members], moved[members] = loads[i]
    for a in (groups, group_of, corners, sent, got, moved):
        a.setflags(write=False)
    return RelayPlan(groups, group_of, tuple(pattern_of), tuple(patterns), corners, sent, got, moved)


def _receive_floor(sb: np.ndarray, db: np.ndarray) -> int:
    """The most elements a member lacks of its destination block: no route costs less."""
    own = np.prod(np.clip(np.minimum(sb[:, :, 1], db[:, :, 1]) - np.maximum(sb[:, :, 0], db[:, :, 0]), 0, None),
                  axis=1)
    return int((np.prod(db[:, :, 1] - db[:, :, 0], axis=1) - own).max(initial=0))


def relay_parts(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> int:
    """An upper bound on the work of one group's routes (its atoms times its members): the
    planner offers a relay only up to ``MAX_PARTS``."""
    sb, db = boxes(src, mesh), boxes(dst, mesh)
    members = np.sort(group_arrays(mesh, axes)[1][0])
    n = len(members)
    atoms = 1
    for d in range(src.ndim):
        atoms *= max(1, len(_cuts(sb[members], db[members], d)) - 1)
    return atoms * n


# ---- one rank's pieces ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RelayPieces(RankPieces):
    """One rank's share of both phases: split sizes per member (process-group order), and the
    strided copies that keep, pack and unpack them."""

    keep: tuple[Copy, ...]  # input -> output
    send1: tuple[int, ...]
    recv1: tuple[int, ...]
    pack1: tuple[Copy, ...]  # input -> phase 1 send buffer
    unpack1: tuple[Copy, ...]  # phase 1 receive buffer -> output
    send2: tuple[int, ...]
    recv2: tuple[int, ...]
    pack2_in: tuple[Copy, ...]  # input -> phase 2 send buffer
    pack2_out: tuple[Copy, ...]  # output (what phase 1 brought) -> phase 2 send buffer
    unpack2: tuple[Copy, ...]  # phase 2 receive buffer -> output
    # whether each phase moves anything in this rank's group (the same on every member:
    # a phase that moves nothing is skipped by the whole group)
    active: tuple[bool, bool]


def _view(box: np.ndarray, block: np.ndarray) -> View:
    """Global ``box`` as a strided view of a contiguous tensor holding global box ``block``."""
    shape = tuple(int(hi - lo) for lo, hi in block)
    strides = row_major(shape)
    off = sum(int(lo - b[0]) * st for (lo, _), b, st in zip(box, block, strides))
    return View(off, tuple(int(hi - lo) for lo, hi in box), strides)


def _shape(box: np.ndarray) -> tuple[int, ...]:
    return tuple(int(hi - lo) for lo, hi in box)


def _pieces(step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RelayPieces:
    plan = relay_plan(erase(step.src), erase(step.dst), mesh, step.axes)
    g = int(plan.group_of[rank])
    rt = plan.patterns[plan.pattern_of[g]]
    corner = plan.corner[g]
    order = plan.groups[g].tolist()  # the routes' member indices: sorted mesh ranks
    me = order.index(rank)
    pg = [order.index(q) for q in members]  # process-group order -> route index
    sbox, dbox = boxes(step.src, mesh)[rank], boxes(step.dst, mesh)[rank]
    shift = np.stack([corner, corner], axis=-1)
    gb = rt.boxes + shift[None]
    keep = plan_copies((_view(b + shift, sbox), _view(b + shift, dbox)) for b in rt.keep[rt.keep_by == me])

    # (sender, receiver, part) of each phase, in part order
    hop1 = np.flatnonzero(rt.sigma >= 0)
    p1 = [(int(rt.sigma[p]), int(rt.owner[p]), int(p)) for p in hop1]
    p2_parts, p2_to = np.nonzero(rt.need & (np.arange(rt.need.shape[1])[None, :] != rt.owner[:, None]))
    p2 = [(int(rt.owner[p]), int(w), int(p)) for p, w in zip(p2_parts, p2_to)]

    def phase(hops: list[tuple[int, int, int]]) -> tuple[tuple[int, ...], tuple[int, ...], list, list, list]:
        sends, recvs = [0] * len(pg), [0] * len(pg)
        pack_in: list[tuple[View, View]] = []
        pack_out: list[tuple[View, View]] = []
        unpack: list[tuple[View, View]] = []
        out_to: dict[int, list[int]] = {}
        in_from: dict[int, list[int]] = {}
        for a, b, p in hops:
            if a == me:
                out_to.setdefault(b, []).append(p)
            if b == me:
                in_from.setdefault(a, []).append(p)
        off = 0
        for j, q in enumerate(pg):  # what I send, peer by peer in process-group order
            for p in out_to.get(q, ()):
                mine = bool(rt.held[p, me])
                pack = pack_in if mine else pack_out
                pack.append((_view(gb[p], sbox if mine else dbox), run_view(off, _shape(gb[p]))))
                k = int(np.prod(_shape(gb[p])))
                off += k
                sends[j] += k
        off = 0
        for j, q in enumerate(pg):
            for p in in_from.get(q, ()):
                unpack.append((run_view(off, _shape(gb[p])), _view(gb[p], dbox)))
                k = int(np.prod(_shape(gb[p])))
                off += k
                recvs[j] += k
        return tuple(sends), tuple(recvs), pack_in, pack_out, unpack

    s1, r1, pk1, pk1_out, u1 = phase(p1)
    s2, r2, pk2_in, pk2_out, u2 = phase(p2)
    assert not pk1_out  # phase 1 sends only what the sender holds
    return RelayPieces(
        kind=step.kind, rank=rank, in_shape=_shape(sbox), out_shape=_shape(dbox), members=members,
        wire_elems=sum(s1) + sum(s2), wire_in_elems=sum(r1) + sum(r2), keep=keep,
        send1=s1, recv1=r1, pack1=plan_copies(pk1), unpack1=plan_copies(u1),
        send2=s2, recv2=r2, pack2_in=plan_copies(pk2_in), pack2_out=plan_copies(pk2_out), unpack2=plan_copies(u2),
        active=(bool(p1), bool(p2)),
    )


def _exchange(pieces: Sequence[RelayPieces], bufs: dict[int, np.ndarray], phase: int) -> dict[int, np.ndarray]:
    """Each rank's flat receive buffer of one phase (process-group order of its peers)."""
    segs: dict[tuple[int, int], np.ndarray] = {}
    for p in pieces:
        off = 0
        for q, k in zip(p.members, p.send1 if phase == 1 else p.send2):
            segs[p.rank, q] = bufs[p.rank][off:off + k]
            off += k
    out = {}
    for p in pieces:
        parts = [segs[q, p.rank] for q in p.members if (q, p.rank) in segs]
        out[p.rank] = np.concatenate(parts) if parts else bufs[p.rank][:0]
    return out


@register
class Relay(StepKind):
    """Exact exchange in two phases: each piece sent once to an owner that needs it, then
    fanned out by its owner (see the module docstring)."""

    name = "relay"
    collective = True
    launches: ClassVar[int] = 2
    # the gradient of moving values is moving them back, whose routes the planner picks
    duals: ClassVar[dict[tuple[str, str], str]] = {}

    def infer(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...] | None) -> Signature:
        same_except(self.name, src, dst, "a relay never changes V axes")
        if src.partial_axes or dst.partial_axes:
            raise refuse(self.name, src, dst, "a relay moves values; it neither finishes nor starts a reduction",
                         "finish the reduction first (reduce_scatter, all_reduce), or use all_to_allv")
        if src.is_uneven or dst.is_uneven:
            raise refuse(self.name, src, dst, "a relay takes plain layouts (no uneven split)", "use all_to_allv")
        group = group_axes(erase(src), erase(dst), mesh)
        if axes is not None:
            if not set(group) <= set(axes):
                raise refuse(self.name, src, dst, f"the types change the roles of axes {list(group)}, "
                             f"which {list(axes)} does not hold", f"pass axes that include {list(group)}")
            varying = [a for a in axes if a in src.axes_of_kind("V")]
            if varying:
                raise refuse(self.name, src, dst, f"axes {varying} are varying (V): their ranks hold different "
                             "values, so one cannot stand in for another", "leave them out of axes")
            group = tuple(axes)
        if not group:
            raise refuse(self.name, src, dst, "the two types hold the same data on every rank",
                         "no step is needed")
        dims = tuple(k for k, (a, b) in enumerate(zip(src.dims, dst.dims)) if a != b)
        return Signature(group, dims)

    def price(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        return relay_plan(erase(src), erase(dst), mesh, axes).sent

    def received(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
                 padded: bool = True) -> np.ndarray:
        return relay_plan(erase(src), erase(dst), mesh, axes).received

    def moved(self, src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...],
              padded: bool = True) -> np.ndarray:
        return relay_plan(erase(src), erase(dst), mesh, axes).moved

    def pieces(self, step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RankPieces:
        return _pieces(step, mesh, rank, members)

    def simulate(self, step: Step, pieces: Sequence[RankPieces], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        ps = own_pieces(RelayPieces, pieces)
        flat_in = {p.rank: np.ascontiguousarray(xs[p.rank]).reshape(-1) for p in ps}
        ys = {p.rank: np.zeros(int(np.prod(p.out_shape)), dtype=flat_in[p.rank].dtype) for p in ps}
        bufs = {}
        for p in ps:
            apply_copies(p.keep, flat_in[p.rank], ys[p.rank], None)
            bufs[p.rank] = np.zeros(sum(p.send1), dtype=ys[p.rank].dtype)
            apply_copies(p.pack1, flat_in[p.rank], bufs[p.rank], None)
        got = _exchange(ps, bufs, 1)
        for p in ps:
            apply_copies(p.unpack1, got[p.rank], ys[p.rank], None)
            bufs[p.rank] = np.zeros(sum(p.send2), dtype=ys[p.rank].dtype)
            apply_copies(p.pack2_in, flat_in[p.rank], bufs[p.rank], None)
            apply_copies(p.pack2_out, ys[p.rank], bufs[p.rank], None)
        got = _exchange(ps, bufs, 2)
        for p in ps:
            apply_copies(p.unpack2, got[p.rank], ys[p.rank], None)
        return [ys[p.rank].reshape(p.out_shape) for p in ps]
