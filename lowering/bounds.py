"""The byte lower bound of a redistribution, from the two layouts alone.

``lower_bound = max(recv_max, sent_avg) * itemsize`` where

* ``recv_max``: the most dst-local elements any rank lacks in its src block (all of
  its dst-local elements when a reduction is pending, since it must hear the other
  contributions);
* ``sent_avg``: the element transfers any plan needs, over the world size: a dst
  element needed by a rank that lacks it costs one transfer; a k-way pending
  reduction costs (k-1) + (needers-1) per element (gather the k contributions in
  one place, then hand the sum to the other ranks that need it).

Where dst is partial on an axis src is not, a convert into it is local, and any member
of the sum may hold the values: the ranks that differ only on those axes (a *group*)
must between them receive what none of them holds (``new_partial_needs``), so
``recv_max`` is the largest group's need over its size, rounded up, and ``sent_avg``
those transfers over the world.

No plan can beat it: a program's price (``Cost.bytes_max``) counts, per rank and step,
the larger of what it sends and what it receives, so a rank's total covers all it must
receive, and the busiest rank's covers the mean of the world's sends. The planner
reports its ratio to it. ``receive_need`` is the per-rank count behind ``recv_max``: the
search (``lowering.labels``) floors each rank's final bytes with its bytes so far plus it.
"""

from __future__ import annotations

import numpy as np

from lowering.caching import cached
from lowering.kinds.base import replicated_axes
from lowering.layout import boxes, group_arrays, local_numel, overlap_numel, own_overlap_numel
from spec_lang.ir import Mesh, TensorType


def lower_bound_detail(src: TensorType, dst: TensorType, mesh: Mesh) -> dict[str, float]:
    """``{"bytes", "recv_max_bytes", "sent_avg_bytes", "holder_set_bytes"}`` for ``src -> dst``."""
    item = src.itemsize
    recv, sent_avg = _recv_max_and_sent_avg(src, dst, mesh, True)
    leave = holder_set_need(src, dst, mesh)
    return {
        "bytes": int(max(recv * item, -(-int(sent_avg * item * 1000) // 1000), leave * item)),
        "recv_max_bytes": recv * item,
        "sent_avg_bytes": sent_avg * item,
        "holder_set_bytes": leave * item,
    }


# the (holder sets x distinct goal blocks) table beyond which the holder-set term is left out
# (it only ever raises the bound: leaving it out keeps the bound true)
_HOLDER_SET_CELLS = 1 << 22


def holder_set_need(src: TensorType, dst: TensorType, mesh: Mesh) -> int:
    """Elements the busiest member of some holder set must send, at least: the data held by
    a set H of ranks and needed by a rank outside it must leave H at least once, so one
    member of H sends ``ceil(count / |H|)`` of it (the few-holders, many-needers case, where
    what any one rank lacks is small)::

        i32[1@dp,9] -> i32[1,9@dp]{R:w} on dp=5,w=3: the row is held by the 3 ranks at
        dp=0 and needed by the 12 others, which each lack 2 elements or fewer; 9 - 2 = 7
        of its elements leave the holders: ceil(7 / 3) = 3 at least from one of them

    Plain layouts (no P or V axis, no uneven split), where each element's holders are
    exactly one *holder class* (the ranks that differ only on the source's replicated axes:
    distinct coordinates on a sharded axis hold disjoint blocks), and the goal's blocks
    are disjoint or equal; 0 elsewhere (the other terms bound those)."""
    plain = all(not t.partial_axes and not t.axes_of_kind("V") and not t.is_uneven for t in (src, dst))
    if not plain:
        return 0
    ranks = group_arrays(mesh, replicated_axes(src, mesh))[1]  # (classes, members)
    db = boxes(dst, mesh).reshape(mesh.size, -1)
    uniq, inv = np.unique(db, axis=0, return_inverse=True)
    if len(ranks) * len(uniq) > _HOLDER_SET_CELLS:
        return 0
    cls = np.empty(mesh.size, dtype=np.int64)
    cls[ranks] = np.arange(len(ranks))[:, None]
    inside = np.zeros((len(ranks), len(uniq)), dtype=np.int64)
    np.add.at(inside, (cls, inv.reshape(-1)), 1)
    outside = np.bincount(inv.reshape(-1), minlength=len(uniq))[None, :] > inside  # a needer outside the class
    sb = boxes(src, mesh)[ranks[:, 0]]
    ov = overlap_numel(sb[:, None], uniq.reshape(len(uniq), src.ndim, 2)[None, :])  # (classes, goal blocks)
    count = (ov * outside).sum(axis=1)
    return int((-(-count // ranks.shape[1])).max(initial=0))


def sent_avg_bytes(src: TensorType, dst: TensorType, mesh: Mesh) -> float:
    """``lower_bound_detail``'s ``sent_avg_bytes`` alone (the search asks for it per state)."""
    return _recv_max_and_sent_avg(src, dst, mesh, False)[1] * src.itemsize


def _recv_max_and_sent_avg(src: TensorType, dst: TensorType, mesh: Mesh, recv_too: bool) -> tuple[int, float]:
    """(``recv_max``, ``sent_avg``) in elements; ``recv_max`` is 0 unless ``recv_too``."""
    src_p = set(src.partial_axes)
    dst_p = set(dst.partial_axes)
    if dst_p - src_p:
        ranks, need = new_partial_needs(src, dst, mesh)  # type: ignore[misc]  # new partial axes: a group
        members = ranks.shape[1]
        recv = int((-(-need // members)).max()) if recv_too and need.size else 0
        return recv, float(need.sum()) / mesh.size
    lack = receive_need(src, dst, mesh)
    recv = int(lack.max()) if recv_too and lack.size else 0
    reduced = _reduced_axes(src, dst, mesh)
    if not reduced:
        return recv, float(lack.sum()) / mesh.size
    k = mesh.group_size(reduced)
    # per class of ranks (one per coordinate on the kept partial axes), every element is
    # needed (the class's dst blocks tile the tensor), so the sum over its cells of
    # (k-1) + (needers-1) is (k-2)*numel + the class's dst block sizes; over all classes:
    classes = mesh.size // mesh.group_size(tuple(a for a in mesh.names if a not in dst_p))
    total = float(classes * (k - 2) * src.numel + int(local_numel(dst, mesh).sum()))
    return recv, total / mesh.size


def _reduced_axes(src: TensorType, dst: TensorType, mesh: Mesh) -> tuple[str, ...]:
    """The pending partial axes ``src -> dst`` reduces (a reduction over axes of size 1 is
    already done: every contribution is local)."""
    dst_p = set(dst.partial_axes)
    return tuple(a for a in src.partial_axes if a not in dst_p and mesh.axis_size(a) > 1)


def receive_need(state: TensorType, goal: TensorType, mesh: Mesh) -> np.ndarray:
    """(world,) elements each rank must still receive to hold its ``goal`` block: the goal
    elements its ``state`` block lacks, or all of them while a reduction is pending (it
    must hear the other contributions); 0 where ``goal`` has partial axes ``state`` has
    not (a convert into them is local, and any member of the sum may hold the values)::

        state 8@x -> goal 8@y on x=2,y=2      rank (x=0,y=0) holds [0,4), needs [0,4): 0
                                              rank (x=0,y=1) holds [0,4), needs [4,8): 4
        state 8{U:x} -> goal 8@x               +[a0 a1]: rank x=0 needs a0+b0: 4 elements
                                               +[b0 b1]
    """
    if set(goal.partial_axes) - set(state.partial_axes):
        return np.zeros(mesh.size, dtype=np.int64)
    if _reduced_axes(state, goal, mesh):
        return local_numel(goal, mesh)
    return local_numel(goal, mesh) - own_overlap_numel(state, goal, mesh)


@cached(maxsize=4096)
def bound_bytes(src: TensorType, dst: TensorType, mesh: Mesh) -> int:
    """``lower_bound`` of IR, cached (the search asks it of the states it relays from)."""
    return int(lower_bound_detail(src, dst, mesh)["bytes"])


def lower_bound(src: TensorType | str, dst: TensorType | str, mesh: Mesh | str) -> int:
    """The max over ranks of the bytes a rank must receive (or the reduction bound)."""
    from lowering.checks import check_same_global, resolve

    s, m = resolve(src, mesh)
    d, _ = resolve(dst, m)
    check_same_global(s, d)
    return bound_bytes(s, d, m)


@cached(maxsize=16384)  # keys hold search states: keep their count modest
def holder_classes(state: TensorType, goal: TensorType, mesh: Mesh) -> tuple[np.ndarray | None, np.ndarray] | None:
    """Per class of ranks holding the same values, what it must still send: a floor on
    the busiest rank that is per class, not an average over the world.

    A *holder class* is the ranks that differ only on ``state``'s replicated axes: they
    hold one block with the same values (the same P and V coordinates), and no rank
    outside the class holds those values. So every element of the class's block that a
    rank outside the class needs (its own value, or a sum over the pending axes that
    includes the class's contribution) must be sent by some member at least once, and
    the busiest member sends at least the class's sends (so far and still due) over its
    size::

        state 4@x{U:p} -> goal 4@x      classes: (x=0,p=0) (x=0,p=1) (x=1,p=0) ...
        x=0,p=0: [a0+ a1+]    each class holds its block alone, and the other
        x=0,p=1: [a0+ a1+]    p-member needs the sum: every element leaves
                              every class once, 2 elements per rank at least

    Returns ``(ranks, need)``: (classes, members) rank indices and (classes,) elements
    each class must still send (``ranks`` is None where every class is one rank: ``need``
    is then in rank order), or None where the goal has partial axes the state has not
    and replicates no axis of size > 1 that the state does not (a free convert into new
    partial axes makes data appear without a send, and any rank of a sum's group may
    hold the values: the class may keep them). Where it does, the ranks at another
    coordinate of that axis need every element of the block, with the class's values,
    and none of their groups meets the class.
    """
    rep_t = replicated_axes(state, mesh)
    rep_g = replicated_axes(goal, mesh)
    inside_only = all(mesh.sizes[mesh.index(a)] == 1 or a in rep_t for a in rep_g)
    if set(goal.partial_axes) - set(state.partial_axes) and inside_only:
        return None
    # (with new partial axes, ranks differing on them share a need; but where the goal
    # replicates an axis of size > 1 that the state does not, the ranks at another
    # coordinate of it lie outside every class and need all of its block, as below)
    ranks = group_arrays(mesh, tuple(rep_t))[1]
    need = local_numel(state, mesh)[ranks[:, 0]]
    if inside_only:
        sb = boxes(state, mesh)[ranks[:, 0]]
        # every needer of an element some member needs is in the class (they differ on
        # goal-replicated axes, which the class spans): those elements may stay inside;
        # each goal block is counted once per rank needing it, hence the division
        db = boxes(goal, mesh)[ranks]
        inside = overlap_numel(sb[:, None], db).sum(axis=1) // mesh.group_size(tuple(rep_g))
        need = need - inside
    need.setflags(write=False)
    return (ranks if ranks.shape[1] > 1 else None), need


@cached(maxsize=16384)  # keys hold search states: keep their count modest
def new_partial_transfers(state: TensorType, goal: TensorType, mesh: Mesh) -> int:
    """Element transfers any plan still needs where ``goal`` has partial axes ``state`` has
    not (``lower_bound_detail`` says 0 there, since a convert into them is free): a floor
    on the sends of the whole world.

    The ranks that differ only on the new partial axes (a *group*) hold one goal block
    between them, as a sum: one member may hold the values and the others zeros (or
    other parts of the sum), but every element of the block must reach some member.
    Without a pending reduction, what no member holds (the block less the members'
    overlaps with it, a copy held by several members counted once) needs one transfer
    into the group each::

        state 4@x -> goal 4{U:x}      group (x=0, x=1): x=0 holds [0,2), x=1 holds [2,4),
                                      the block is [0,4): nothing to send (zero_pad)
        state 4@x -> goal 4{U:y}      group (y=0, y=1) on x=0 holds [0,2) only:
                                      2 elements to bring in, per x coordinate

    With a reduction pending over axes of size > 1, the goal replicates them, so a group
    sits at one coordinate of them and holds none of the other contributions: every
    element of its block needs a transfer in (of a partial sum, at the least).
    """
    groups = new_partial_needs(state, goal, mesh)
    return 0 if groups is None else int(groups[1].sum())


@cached(maxsize=16384)  # keys hold search states: keep their count modest
def new_partial_needs(state: TensorType, goal: TensorType, mesh: Mesh) -> tuple[np.ndarray, np.ndarray] | None:
    """``new_partial_transfers`` per group: ``(ranks, need)``, the (groups, members) rank
    indices of the ranks that differ only on the goal's new partial axes, and the
    elements each group must still bring in (its goal block less what its members hold of
    it); None where the goal has no new partial axes."""
    new = set(goal.partial_axes) - set(state.partial_axes)
    if not new:
        return None
    # the goal with its new partial axes replicated: every member's box is the group's block
    held = goal.derive(goal.dims, tuple((a, t) for a, t in goal.axis_types if a not in new))  # fewer types: valid
    ranks = group_arrays(mesh, tuple(a for a in mesh.names if a in new))[1]
    block = local_numel(held, mesh)[ranks[:, 0]]
    if _reduced_axes(state, goal, mesh):
        return ranks, block
    ov = own_overlap_numel(state, held, mesh)[ranks].sum(axis=1)
    # a new axis is sharded or replicated in the state (V axes never change): members that
    # differ on a replicated one hold the same elements, the others disjoint ones
    copies = mesh.group_size(tuple(a for a in replicated_axes(state, mesh) if a in new))
    need = np.maximum(block - ov // copies, 0)
    need.setflags(write=False)
    return ranks, need


def receive_needs(state: TensorType, goal: TensorType, mesh: Mesh) -> tuple[np.ndarray | None, np.ndarray]:
    """What each receiver must still receive, as ``(ranks, need)`` in the holder classes'
    form (``ranks`` None: one rank a receiver, ``need`` in rank order): ``receive_need``
    per rank; or, where the goal has partial axes the state has not (any member of the
    sum may hold the values), ``new_partial_needs`` per group of ranks differing only on
    them. A receiver's bytes so far plus its need, over its members, floor its busiest
    member's final bytes (a step costs a rank at least what it receives)."""
    groups = new_partial_needs(state, goal, mesh)
    return (None, receive_need(state, goal, mesh)) if groups is None else groups
