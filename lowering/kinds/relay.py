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

# a group's atoms (parts included) beyond which the planner does not offer a relay: routes
# are chosen by a Python loop over them, once per distinct group pattern
MAX_PARTS = 1024


@dataclass(frozen=True)
class Hop:
    """One part sent in one phase: member indices in the group's process-group order, the
    global box, and whether the sender reads it from its input (else from its output,
    where phase 1 put it)."""

    sender: int
    receiver: int
    box: tuple[tuple[int, int], ...]
    from_input: bool


@dataclass(frozen=True)
class Routes:
    """One group's two phases (members in process-group order, sorted mesh ranks)."""

    members: tuple[int, ...]
    phase1: tuple[Hop, ...]
    phase2: tuple[Hop, ...]
    keep: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]  # (member, box) copied input -> output


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


def _assign(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], n: int,
            holders_fan: bool) -> tuple[list[Hop], list[Hop], np.ndarray]:
    """Greedy owners: (phase 1 hops, phase 2 hops, per-member moved elements). ``holders_fan``:
    a holder that does not need a part may fan it out itself (else only ranks that need it
    own it: where holders are few, what they keep sending decides, which a greedy choice
    one part at a time does not see)."""
    s1, r1, s2, r2 = (np.zeros(n, dtype=np.int64) for _ in range(4))

    def cost(i: int) -> int:
        return int(max(s1[i], r1[i]) + max(s2[i], r2[i]))

    hops1: list[Hop] = []
    hops2: list[Hop] = []
    for box, held, need, wanted in parts:
        size = int(np.prod(box[:, 1] - box[:, 0]))
        wants = np.flatnonzero(need)
        holders = np.flatnonzero(held)
        best: tuple[tuple[int, int, int], int, int] | None = None
        owners = holders if holders_fan else np.flatnonzero(held & wanted)
        for o in sorted(set(wants.tolist()) | set(owners.tolist())):
            fan = len(wants) - int(need[o])
            if held[o]:
                after = int(max(s1[o], r1[o]) + max(s2[o] + size * fan, r2[o]))
                key, sigma = (after, 0, o), -1
            else:
                sigma = int(holders[np.argmin(s1[holders] * n + holders)])  # least loaded, then first
                after_o = int(max(s1[o], r1[o] + size) + max(s2[o] + size * fan, r2[o]))
                after_s = int(max(s1[sigma] + size, r1[sigma]) + max(s2[sigma], r2[sigma]))
                key = (max(after_o, after_s), 1, o)
            if best is None or key < best[0]:
                best = (key, o, sigma)
        assert best is not None
        _, o, sigma = best
        t = tuple((int(lo), int(hi)) for lo, hi in box)
        if sigma >= 0:
            hops1.append(Hop(sigma, o, t, True))
            s1[sigma] += size
            r1[o] += size
        for w in wants.tolist():
            if w != o:
                hops2.append(Hop(o, w, t, bool(held[o])))
                s2[o] += size
                r2[w] += size
    moved = np.array([cost(i) for i in range(n)], dtype=np.int64)
    return hops1, hops2, moved


def _route(sb: np.ndarray, db: np.ndarray, members: tuple[int, ...], split: bool,
           holders_fan: bool) -> tuple[Routes, np.ndarray]:
    atoms = _atoms(sb, db)
    held, wanted = _inside(atoms, sb), _inside(atoms, db)
    need = wanted & ~held
    keep = tuple((int(i), tuple((int(lo), int(hi)) for lo, hi in atoms[a]))
                 for a, i in zip(*np.nonzero(wanted & held)))
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    first: list[bool] = []
    for a in np.flatnonzero(need.any(axis=1)):
        k = int(need[a].sum())
        for b in (_split(atoms[a], k) if split and k > 1 else [atoms[a]]):
            parts.append((b, held[a], need[a], wanted[a]))
            first.append(bool((held[a] & wanted[a]).any()))
    # parts that a rank which needs them already holds first (it fans them out with no
    # phase 1), then the larger fan-outs; ties in atom order: the same routes on every rank
    order = sorted(range(len(parts)), key=lambda i: (
        not first[i], -int(np.prod(parts[i][0][:, 1] - parts[i][0][:, 0])) * int(parts[i][2].sum()), i))
    hops1, hops2, moved = _assign([parts[i] for i in order], len(members), holders_fan)
    return Routes(members, tuple(hops1), tuple(hops2), keep), moved


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


def _phase_load(hops: Sequence[Hop], n: int) -> tuple[np.ndarray, np.ndarray]:
    s, r = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for h in hops:
        k = int(np.prod([hi - lo for lo, hi in h.box]))
        s[h.sender] += k
        r[h.receiver] += k
    return s, r


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
            mem = tuple(range(len(members)))
            best: tuple[Routes, np.ndarray] | None = None
            for split, fan in ((False, True), (True, True), (False, False), (True, False)):
                r, m = _route(rs, rd, mem, split, fan)
                if best is None or int(m.max(initial=0)) < int(best[1].max(initial=0)):
                    best = (r, m)
            assert best is not None
            r, m = best
            s1, r1 = _phase_load(r.phase1, len(members))
            s2, r2 = _phase_load(r.phase2, len(members))
            seen[key] = len(patterns)
            patterns.append(r)
            loads.append((s1 + s2, r1 + r2, np.maximum(s1, r1) + np.maximum(s2, r2)))
        i = seen[key]
        pattern_of.append(i)
        sent[members], got[members], moved[members] = loads[i]
    for a in (groups, group_of, corners, sent, got, moved):
        a.setflags(write=False)
    return RelayPlan(groups, group_of, tuple(pattern_of), tuple(patterns), corners, sent, got, moved)


def relay_parts(src: TensorType, dst: TensorType, mesh: Mesh, axes: tuple[str, ...]) -> int:
    """An upper bound on the parts one group's routes weigh (atoms times the group size):
    the planner offers a relay only up to ``MAX_PARTS``."""
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


def _view(box: tuple[tuple[int, int], ...], block: np.ndarray) -> View:
    """Global ``box`` as a strided view of a contiguous tensor holding global box ``block``."""
    shape = tuple(int(hi - lo) for lo, hi in block)
    strides = row_major(shape)
    off = sum((lo - int(b[0])) * st for (lo, _), b, st in zip(box, block, strides))
    return View(off, tuple(hi - lo for lo, hi in box), strides)


def _shape(box: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in box)


def _pieces(step: Step, mesh: Mesh, rank: int, members: tuple[int, ...]) -> RelayPieces:
    plan = relay_plan(step.src, step.dst, mesh, step.axes)
    g = int(plan.group_of[rank])
    routes = plan.patterns[plan.pattern_of[g]]
    corner = plan.corner[g]
    order = plan.groups[g].tolist()  # the routes' member indices: sorted mesh ranks
    me = order.index(rank)
    pg = [order.index(q) for q in members]  # process-group order -> route index
    sbox, dbox = boxes(step.src, mesh)[rank], boxes(step.dst, mesh)[rank]

    def glob(box: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
        return tuple((lo + int(c), hi + int(c)) for (lo, hi), c in zip(box, corner))

    keep = plan_copies((_view(glob(b), sbox), _view(glob(b), dbox)) for i, b in routes.keep if i == me)

    def phase(hops: tuple[Hop, ...]) -> tuple[tuple[int, ...], tuple[int, ...], list, list, list]:
        sends, recvs = [0] * len(pg), [0] * len(pg)
        pack_in: list[tuple[View, View]] = []
        pack_out: list[tuple[View, View]] = []
        unpack: list[tuple[View, View]] = []
        off = 0
        for j, q in enumerate(pg):  # what I send, peer by peer in process-group order
            for h in hops:
                if h.sender == me and h.receiver == q:
                    b = glob(h.box)
                    (pack_in if h.from_input else pack_out).append(
                        (_view(b, sbox if h.from_input else dbox), run_view(off, _shape(b))))
                    k = int(np.prod(_shape(b)))
                    off += k
                    sends[j] += k
        off = 0
        for j, q in enumerate(pg):
            for h in hops:
                if h.receiver == me and h.sender == q:
                    b = glob(h.box)
                    unpack.append((run_view(off, _shape(b)), _view(b, dbox)))
                    k = int(np.prod(_shape(b)))
                    off += k
                    recvs[j] += k
        return tuple(sends), tuple(recvs), pack_in, pack_out, unpack

    s1, r1, p1, p1_out, u1 = phase(routes.phase1)
    s2, r2, p2_in, p2_out, u2 = phase(routes.phase2)
    assert not p1_out  # phase 1 sends only what the sender holds
    return RelayPieces(
        kind=step.kind, rank=rank, in_shape=tuple(int(hi - lo) for lo, hi in sbox),
        out_shape=tuple(int(hi - lo) for lo, hi in dbox), members=members,
        wire_elems=sum(s1) + sum(s2), wire_in_elems=sum(r1) + sum(r2), keep=keep,
        send1=s1, recv1=r1, pack1=plan_copies(p1), unpack1=plan_copies(u1),
        send2=s2, recv2=r2, pack2_in=plan_copies(p2_in), pack2_out=plan_copies(p2_out), unpack2=plan_copies(u2),
        active=(bool(routes.phase1), bool(routes.phase2)),
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
