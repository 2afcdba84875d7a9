"""What a search path has cost so far (its *label*) and the search key built on it.

A label holds the bytes each rank has moved (per step, the larger of what it sent and
what it received: a step takes as long as its busiest link direction), the time, the
collectives, the peak and the spare-axis charge of a path from the start; the key adds the floors of what any
completion must still cost (``lowering.bounds``), so it never overshoots the final
program's key: the best-first search of ``lowering.planner`` can stop, proving its
incumbent cheapest, once the frontier's best key reaches it.

Everything here runs once per priced move, so the hot paths keep a label's max and
sum over ranks, compute the bound before the frontier's order (a state the bound
prunes never pays for the order) and share the holder classes between both floors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple, overload

import numpy as np

from lowering.bounds import bound_bytes, receive_needs
from lowering.caching import MIB, cached
from lowering.cost import CostModel
from lowering.kinds import LAUNCHES, kind_of
from lowering.layout import local_numel
from lowering.moves import Move
from lowering.program import Program, Step
from spec_lang.ir import Mesh, TensorType


class Label(NamedTuple):
    """What a path to a state has cost so far."""

    moved: np.ndarray  # (world,) bytes moved per rank: per step the larger of sent and received
    time: float
    colls: int
    peak: int
    charge: int  # spare-axis charge due (bytes-first model)
    spare_colls: int
    spare_sliced: bool
    moved_max: int  # int(moved.max()), int(moved.sum()): read by every key
    moved_sum: int


class SearchContext:
    """What every label update of one search shares."""

    def __init__(self, start: TensorType, goal: TensorType, mesh: Mesh, model: CostModel) -> None:
        self.goal, self.mesh, self.model = goal, mesh, model
        self.bytes_first = model.bytes_first  # a property that walks the model's tables
        self.item = start.itemsize  # every state of a search has the start's dtype
        self.spare = set(spare_axes(start, goal, mesh))
        self.charge = model.spare_axis_bytes if self.bytes_first else 0
        # spare-axis collectives so far, and whether a spare axis was sliced: a sliced spare axis
        # must be gathered back (the goal replicates it), so its charge is due from the slice on,
        # which keeps the search from exploring split plans the charge will rule out
        self.first = Label(np.zeros(mesh.size, dtype=np.int64), 0.0, 0,
                            int((local_numel(start, mesh) * start.itemsize).max()), 0, 0, False, 0, 0)
        self._prefixes: dict[tuple, Label] = {}
        # per state, what its keys read: the floors of what is still due (one hash a lookup)
        self._future_of: dict[TensorType, float] = {}
        # a rank's bytes so far plus what it must still receive floor its final bytes (it
        # receives at least that, and a step costs it at least what it receives): per state
        self._need_of: dict[TensorType, tuple[np.ndarray | None, np.ndarray]] | None = (
            {} if self.bytes_first or model.bytes_cap else None)
        self._classes_of: dict[TensorType, tuple[np.ndarray | None, np.ndarray] | None] = {}
        # a timed model that limits the bytes it trades for latency (``CostModel.bytes_cap``:
        # a pending sum's reduction up to that multiple of the bound, anything else the bound):
        # the key leads with a path's bytes above the cap (0 within it), so time decides
        # among the plans within the cap, and only the fewest bytes above it
        self.cap = int((model.bytes_cap if start.partial_axes else 1.0) * bound_bytes(start, goal, mesh)) \
            if model.bytes_cap and not self.bytes_first else None
        self._beta: dict[tuple[str, ...], float] = {}  # per group of axes: the model walks its tables
        # a timed model: the least a collective that moves bytes costs beside them (the
        # engine's floor, ``CostModel.engine_floor``, else the lowest alpha), which a path
        # that still owes a transfer owes once more: its key's bound adds it
        self.coll_floor = 0.0 if self.bytes_first else model.engine_floor if model.engine_time is not None else min(
            [model.alpha_of((a,)) for a in mesh.names] + [g[1] for g in model.groups])

    def extend(self, lab: Label, state: TensorType, mv: Move, bound: tuple | None = None) -> Label | None:
        """``lab`` after ``mv``; None where ``bound`` is given and the bytes and collectives
        so far alone already put the key above it (the bounds and the peak, the costlier
        terms, are then never computed)."""
        mesh = self.mesh
        step = move_bytes(state, mv, mesh)
        item = self.item
        moved = lab.moved + step * item
        moved_max = int(moved.max())
        coll = LAUNCHES[mv.kind]
        charge, n_spare, sliced = self._charge_after(lab, mv, coll)
        colls = lab.colls + coll
        if self.bytes_first:
            if bound is not None and (moved_max + charge, colls) > bound[:2]:
                return None  # every term of the key is at least its counterpart here
            time = lab.time  # time is a multiple of bytes, which the label already holds
        else:
            bytes_max = int(step.max(initial=0)) * item
            if bound is not None and self._lead_above(lab, mv, moved_max, bytes_max, coll, bound):
                return None
            time = lab.time + self._step_time(state, mv, bytes_max, coll)
        return Label(moved, time, colls, max(lab.peak, _live_max(state, mv.dst, mesh)), charge, n_spare, sliced,
                      moved_max, lab.moved_sum + int(step.sum()) * item)

    def _lead_above(self, lab: Label, mv: Move, moved_max: int, bytes_max: int, coll: int, bound: tuple) -> bool:
        """Whether a timed key's leading terms (the bytes above the cap, then the time) are
        already above ``bound``'s before ``mv``'s time is priced: its time is at least the
        time so far plus, for a collective, its busiest rank's bytes at the model's beta and,
        where it moves any, the collective floor (an engine's price, ``CostModel.engine_time``,
        never charges less: ``engine_floor``), and one floor more where a transfer is still
        due after it. The engine's price of a step is the costliest term a search computes;
        most moves out of a state that a cheaper plan already beats never need it."""
        # summed as the price sums them (floor and bytes, then the time so far): never above it
        if coll:
            beta = self._beta.get(mv.axes)
            if beta is None:
                beta = self._beta[mv.axes] = self.model.beta_of(mv.axes)
            step = (self.coll_floor if bytes_max else 0.0) + beta * bytes_max
        else:
            step = 0.0
        excess = () if self.cap is None else (max(0, moved_max - self.cap),)
        lead = (*excess, lab.time + step)
        if lead > bound[:len(lead)]:
            return True
        if not self.coll_floor or mv.dst == self.goal or not self.future(mv.dst) > 0:
            return False
        return (*excess, lab.time + step + self.coll_floor) > bound[:len(lead)]

    def _step_time(self, state: TensorType, mv: Move, bytes_max: int, coll: int) -> float:
        """``mv``'s time under a timed model: a collective at the engine's price where the
        model has one (``CostModel.engine_time``), else alpha per launch and beta per byte."""
        model = self.model
        if coll and model.engine_time is not None:
            step = Step(mv.kind, mv.axes, mv.dims, state, mv.dst, state.partial_op, collective=True, launches=coll)
            return model.collective_time(step, self.mesh, bytes_max)
        return model.step_time(mv.axes, bytes_max, coll > 0, coll,
                               0 if coll or not model.local_beta else int(local_numel(mv.dst, self.mesh).max()) * self.item)

    def _charge_after(self, lab: Label, mv: Move, coll: int) -> tuple[int, int, bool]:
        """The spare-axis charge due after ``mv`` (which runs ``coll`` collectives), its spare
        collectives, and whether a spare axis was sliced."""
        on_spare = not self.spare.isdisjoint(mv.axes)
        # a relay's group holds the axes whose role changes, so its first phase is the
        # exchange the data needs anyway: only its second is the collective a spare axis adds
        n_spare = lab.spare_colls + (min(coll, max(1, coll - 1)) if on_spare else 0)
        sliced = lab.spare_sliced or (on_spare and not coll)
        return self.charge * max(n_spare, int(sliced)), n_spare, sliced

    def floor_before(self, lab: Label, mv: Move) -> int:
        """A floor of the key's bytes term (bytes-first) on every path through ``mv`` after
        ``lab``, without pricing ``mv``: the busiest rank's bytes so far, or the mean over
        ranks of those and what is still due from ``mv.dst`` (``_future``), plus the
        spare-axis charge due after it."""
        charge = self._charge_after(lab, mv, LAUNCHES[mv.kind])[0]
        return max(lab.moved_max, -(-int(lab.moved_sum + self.future(mv.dst)) // self.mesh.size)) + charge

    @overload
    def path_key(self, path: list[tuple[TensorType, Move]], cutoff: None = None) -> tuple: ...
    @overload
    def path_key(self, path: list[tuple[TensorType, Move]], cutoff: tuple) -> tuple | None: ...

    def path_key(self, path: list[tuple[TensorType, Move]], cutoff: tuple | None = None) -> tuple | None:
        """The search key of a complete path from the start (its final label's); None where
        ``cutoff`` is given and a prefix already costs more in bytes or collectives."""
        lab = self.first
        prefix: tuple[tuple[TensorType, Move], ...] = ()
        for state, mv in path:
            # the constructive routes share their first steps: each prefix is priced once
            prefix = (*prefix, (state, mv))
            held = self._prefixes.get(prefix)
            if held is None:
                held = self.extend(lab, state, mv, cutoff)
                if held is None:
                    return None
                self._prefixes[prefix] = held
            lab = held
        key = self.key(lab, self.goal)
        return None if cutoff is not None and key >= cutoff else key

    def future(self, state: TensorType) -> float:
        """Bytes every rank together must still move from ``state`` (``_future``), held per state."""
        future = self._future_of.get(state)
        if future is None:
            future = self._future_of[state] = _future(state, self.goal, self.mesh)
        return future

    def key(self, lab: Label, state: TensorType) -> tuple:
        """The search key: a lower bound on the key of every complete path through here."""
        out = self.keys(lab, state)
        assert out is not None  # no cutoff given
        return out[1]

    @overload
    def keys(self, lab: Label, state: TensorType, cutoff: None = None) -> tuple[tuple, tuple]: ...
    @overload
    def keys(self, lab: Label, state: TensorType, cutoff: tuple) -> tuple[tuple, tuple] | None: ...

    def keys(self, lab: Label, state: TensorType, cutoff: tuple | None = None) -> tuple[tuple, tuple] | None:
        """(order, bound): the frontier's order, and the key that prunes and proves; None
        where ``cutoff`` is given and the bound reaches it (the order is then never built).

        The bound counts whole elements (every step sends whole ones), which is tighter
        on tiny tensors; the order keeps the byte floors, because the rounding changes
        which states a budgeted search reaches first, and not always for the better
        (on the cases of bench/plan_budget.py it found 2 worse plans and no better one).

        Bytes-first, each is (bytes estimate, collectives estimate, peak), every term a
        lower bound on the final program's, so the first goal popped is the cheapest and
        the search stops once the frontier's best key reaches a complete program's. The
        bytes estimate is the largest of: the busiest rank's bytes so far plus what it must
        still receive (``lowering.bounds.receive_needs``: the floor that proves an exchange
        at ``recv_max`` cheapest, which the mean below cannot); the mean over ranks of what
        was moved plus the transfers still needed (``_future``), in whole elements for the
        bound; and the per-class floor (``class_floor``), what the busiest member of a class
        of ranks holding the same values must have sent by the end, which the world mean
        can hide. The spare-axis charge is added (it only grows
        along a path). Where transfers are still needed one more collective is too: that
        term lets a search whose incumbent is at the byte bound stop once no path with
        fewer collectives is left. Other models: the order (time, bytes, collectives,
        peak), after the bytes above ``cap`` where the model has one; the bound adds one
        collective's floor (``coll_floor``) and one collective where transfers are still
        needed, and, with a cap, the bytes above it that the floors above say any completion
        moves (``_moved_floor``).
        """
        if not self.bytes_first:
            k: tuple = (lab.time, lab.moved_max, lab.colls, lab.peak)
            bound = k
            if self.coll_floor and state != self.goal and self.future(state) > 0:  # a collective is still due
                bound = (lab.time + self.coll_floor, lab.moved_max, lab.colls + 1, lab.peak)
            if self.cap is not None:
                excess = max(0, lab.moved_max - self.cap)
                k, bound = (excess, *k), (excess, *bound)
                if cutoff is not None and bound >= cutoff:
                    return None
                # the bytes above the cap that any completion moves at least (a path within it
                # no longer searches those that cannot end within it)
                bound = (max(excess, self._moved_floor(lab, state) - self.cap), *bound[1:])
            return None if cutoff is not None and bound >= cutoff else (k, bound)
        goal, mesh = self.goal, self.mesh
        future = self.future(state)
        item = self.item
        colls = lab.colls + int(future > 0)
        elements = lab.moved_sum // item + math.ceil(future / item - 1e-6)
        world = mesh.size
        # the busiest rank's bytes, raised by what receivers must still receive
        recv_bytes = recv_whole = lab.moved_max
        if self._need_of is not None:
            needs = self._need_of.get(state)
            if needs is None:
                needs = self._need_of[state] = _in_bytes(receive_needs(state, goal, mesh), item)
            got_bytes, got_whole = _floors(lab.moved, needs, item)
            recv_bytes, recv_whole = max(recv_bytes, got_bytes), max(recv_whole, got_whole)
        base = max(recv_whole, item * -(-elements // world))
        if cutoff is not None and (base + lab.charge, colls, lab.peak) >= cutoff:
            return None  # the world alone prunes it: the class floors only raise the bound
        if state in self._classes_of:
            classes = self._classes_of[state]
        else:
            classes = self._classes_of[state] = _classes_in_bytes(state, goal, mesh)
        floor_bytes, floor_whole = _floors(lab.moved, classes, item)
        bound = (max(base, floor_whole) + lab.charge, colls, lab.peak)
        if cutoff is not None and bound >= cutoff:
            return None
        order = (max(recv_bytes, floor_bytes, -(-int(lab.moved_sum + future) // world)) + lab.charge, colls, lab.peak)
        return order, bound

    def _moved_floor(self, lab: Label, state: TensorType) -> int:
        """Bytes the busiest rank moves at least on every completion of ``lab`` at ``state``,
        in whole elements: the bytes-first bound's bytes term (``keys``) without its charge."""
        goal, mesh, item = self.goal, self.mesh, self.item
        if state == goal:
            return lab.moved_max
        future = self.future(state)
        elements = lab.moved_sum // item + math.ceil(future / item - 1e-6)
        needs = self._need_of.get(state) if self._need_of is not None else None
        if needs is None:
            needs = _in_bytes(receive_needs(state, goal, mesh), item)
            if self._need_of is not None:
                self._need_of[state] = needs
        if state in self._classes_of:
            classes = self._classes_of[state]
        else:
            classes = self._classes_of[state] = _classes_in_bytes(state, goal, mesh)
        return max(lab.moved_max, _floors(lab.moved, needs, item)[1], item * -(-elements // mesh.size),
                   _floors(lab.moved, classes, item)[1])


@cached(maxsize=65536)
def _live_max(state: TensorType, nxt: TensorType, mesh: Mesh) -> int:
    """Bytes live on the busiest rank during a step (its input and output)."""
    return int((local_numel(state, mesh) + local_numel(nxt, mesh)).max()) * state.itemsize


def dominated(labels: Sequence[Label], lab: Label) -> bool:
    """Whether some label is no worse than ``lab`` in every term (so ``lab`` can be dropped)."""
    return any(
        u.time <= lab.time and u.colls <= lab.colls and u.peak <= lab.peak and u.charge <= lab.charge
        and u.moved_max <= lab.moved_max and bool((u.moved <= lab.moved).all())
        for u in labels
    )


def _classes_in_bytes(state: TensorType, goal: TensorType, mesh: Mesh) -> tuple[np.ndarray | None, np.ndarray] | None:
    """``lowering.bounds.holder_classes`` with what each class must still send in bytes."""
    from lowering.bounds import holder_classes

    classes = holder_classes(state, goal, mesh)
    return None if classes is None else _in_bytes(classes, state.itemsize)


def _in_bytes(groups: tuple[np.ndarray | None, np.ndarray], item: int) -> tuple[np.ndarray | None, np.ndarray]:
    """``(ranks, elements)`` per class or receiver as ``(ranks, bytes)``: what ``_floors`` reads."""
    return groups[0], groups[1] * item


def _floors(moved: np.ndarray, classes: tuple[np.ndarray | None, np.ndarray] | None, item: int) -> tuple[int, int]:
    """``class_floor`` in bytes and in whole elements, from ``_classes_in_bytes``."""
    if classes is None:
        return 0, 0
    ranks, need = classes
    if ranks is None:  # one rank a class, in rank order
        f = int((moved + need).max())
        return f, f
    members = ranks.shape[1]
    most = int((moved[ranks].sum(axis=1) + need).max())
    # every step sends whole elements, so the busiest member sends a whole number of them;
    # ``need`` is whole elements, so the class's whole elements are ``most // item``
    return -(-most // members), item * -(-(most // item) // members)


def class_floor(moved: np.ndarray, state: TensorType, goal: TensorType, mesh: Mesh, whole: bool = True) -> int:
    """Bytes the busiest rank will have moved at least, per holder class (``lowering.bounds.
    holder_classes``): its members' bytes so far plus what the class must still send, over
    its size, at the class where that is largest; in whole elements unless ``whole`` is False."""
    return _floors(moved, _classes_in_bytes(state, goal, mesh), state.itemsize)[1 if whole else 0]


def receive_floor(moved: np.ndarray, state: TensorType, goal: TensorType, mesh: Mesh, whole: bool = True) -> int:
    """Bytes the busiest rank will have moved at least, per receiver (``lowering.bounds.
    receive_needs``): its bytes so far plus what it must still receive, over its members;
    in whole elements unless ``whole`` is False."""
    return _floors(moved, _in_bytes(receive_needs(state, goal, mesh), state.itemsize), state.itemsize)[1 if whole else 0]


def spare_axes(src: TensorType, dst: TensorType, mesh: Mesh) -> tuple[str, ...]:
    """Mesh axes that both types replicate (not sharded, not P, not V): no data must cross them."""
    used = set(src.sharded_axes) | set(dst.sharded_axes)
    used |= {a for t in (src, dst) for a, at in t.axis_types if at.kind in ("P", "V")}
    return tuple(a for a in mesh.names if a not in used)


def spare_collectives(program: Program) -> int:
    """How many of ``program``'s collectives run over a spare axis of its two end types."""
    spare = set(spare_axes(program.src, program.dst, program.mesh))
    return sum(1 for s in program.steps if s.is_collective and spare.intersection(s.axes))


@cached(maxsize=16384)  # keys hold search states: keep their count modest
def _future(state: TensorType, goal: TensorType, mesh: Mesh) -> float:
    """Bytes every rank together must still send to reach ``goal`` (a lower bound, and so
    one on what they move): the lower bound's transfers, those into new partial axes too."""
    from lowering.bounds import sent_avg_bytes

    return float(sent_avg_bytes(state, goal, mesh)) * mesh.size


@cached(maxsize=65536, max_bytes=24 * MIB)
def move_bytes(state: TensorType, mv: Move, mesh: Mesh) -> np.ndarray:
    """(world,) elements each rank moves in this move, the larger of what it sends and what
    it receives, as ``Step.bytes_moved`` counts them (read-only; cached, since a state
    expanded under a second label prices the same moves again)."""
    out = kind_of(mv.kind).moved(state, mv.dst, mesh, mv.axes)  # padded where the kind pads, as priced_step
    out.setflags(write=False)
    return out
