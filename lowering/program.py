"""A Program: the flat, immutable list of Steps that turns src shards into dst shards.

A cross-mesh program (``lowering.compile(..., dst_mesh=)``) is a Program too: its steps
live on its source mesh but the last, which crosses to the destination mesh
(``Step.dst_mesh``; ``lowering.cross_mesh``).

Every Step is a typed transition ``src -> dst`` between two TensorTypes on the same
mesh, over a group of mesh axes: the ranks that share every other mesh coordinate,
ordered row-major over ``axes`` *as listed* (a flattened group when there are several).
Each rank's input and output block come from the layout algebra, so a step's kind
(``lowering.kinds``: all_gather, reduce_scatter, all_reduce, all_to_all, permute, slice,
zero_fill, zero_pad, reinterpret) and its two types say everything about it: its type
rule, its price, its per-rank pieces, its numpy semantics and its dual are defined
once, by the kind.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowering.checks import check_type_once, resolve
from lowering.cost import DEFAULT_COST_MODEL, CostModel
from lowering.layout import local_numel
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType
from spec_lang.parser import parse_mesh


@dataclass(frozen=True)
class Step:
    """One collective or local op of a kind in ``lowering.kinds``; build one with
    ``lowering.make_step``. The per-rank tuples are derived from the rest and the mesh,
    so they take no part in equality and hashing."""

    kind: str
    axes: tuple[str, ...]
    dims: tuple[int, ...]
    src: TensorType
    dst: TensorType
    op: str | None = None  # reduce op for reduce_scatter / all_reduce
    in_shapes: tuple[tuple[int, ...], ...] = field(default=(), repr=False, compare=False)
    out_shapes: tuple[tuple[int, ...], ...] = field(default=(), repr=False, compare=False)
    bytes_sent: tuple[int, ...] = field(default=(), repr=False, compare=False)  # per rank, ring model
    padded: bool = False  # reduce_scatter on uneven pieces: padded to equal chunks on the wire
    # the kind's flag, held here so that a Step is plain data, read without the kinds' registry
    collective: bool = field(kw_only=True, repr=False, compare=False)
    bytes_recv: tuple[int, ...] = field(default=(), kw_only=True, repr=False, compare=False)  # per rank
    # a step of several phases (a relay) costs a rank the larger direction of each phase,
    # summed: more than the larger of its totals; per rank, empty for a one-phase step
    bytes_phased: tuple[int, ...] = field(default=(), kw_only=True, repr=False, compare=False)
    launches: int = field(default=1, kw_only=True, repr=False, compare=False)  # collectives it runs
    # the mesh ``dst`` lives on, where it is not the program's: the step that crosses to
    # another mesh (``lowering.cross_mesh``; its ranks are global ranks, ``Mesh.ranks``, and
    # a rank off a mesh holds nothing of a type on it)
    dst_mesh: Mesh | None = field(default=None, kw_only=True, repr=False)

    @property
    def is_collective(self) -> bool:
        return self.collective

    @property
    def bytes_sent_max(self) -> int:
        return max(self.bytes_sent) if self.bytes_sent else 0

    @property
    def bytes_moved(self) -> tuple[int, ...]:
        """Per rank, the larger of the bytes it sends and receives: a link is full duplex, so
        a rank's share of the step takes as long as its busier direction (in each phase)."""
        if self.bytes_phased:
            return self.bytes_phased
        if not self.bytes_recv:
            return self.bytes_sent
        return tuple(map(max, self.bytes_sent, self.bytes_recv))

    @property
    def bytes_max(self) -> int:
        """The step's price: what its busiest rank sends or receives, whichever is more."""
        return max(self.bytes_moved, default=0)

    def describe(self) -> str:
        """``all_gather(tp) dim 0`` style label."""
        where = ",".join(self.axes)
        label = f"{self.kind}({where})" if where else self.kind
        if self.op and self.kind in ("reduce_scatter", "all_reduce"):
            label += f"[{self.op}]"
        if self.dims:
            label += " dim " + ",".join(str(d) for d in self.dims)
        return label

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "axes": list(self.axes),
            "dims": list(self.dims),
            "op": self.op,
            "src": str(self.src),
            "dst": str(self.dst),
            "in_shapes": [list(s) for s in self.in_shapes],
            "out_shapes": [list(s) for s in self.out_shapes],
            "bytes_max": self.bytes_max,
            "bytes_sent_max": self.bytes_sent_max,
            "padded": self.padded,
            **({} if self.dst_mesh is None else {"dst_mesh": str(self.dst_mesh)}),
        }


@dataclass(frozen=True)
class Cost:
    """What a program costs: bytes (max over ranks, summed over steps), calls, memory, time.

    ``bytes_max`` is the price the planner minimises and the lower bound bounds: per rank,
    the larger of what it sends and what it receives in each step, summed over the steps,
    at the busiest rank. ``bytes_sent_max`` counts the sends alone (the busiest sender)."""

    bytes_sent_max: int
    collectives: int
    peak_bytes_max: int
    time_s: float
    bytes_max: int

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes_max": self.bytes_max,
            "bytes_sent_max": self.bytes_sent_max,
            "collectives": self.collectives,
            "peak_bytes_max": self.peak_bytes_max,
            "time_s": self.time_s,
        }


@dataclass(frozen=True)
class Program:
    """A compiled redistribution: src -> steps -> dst on one mesh."""

    mesh: Mesh
    src: TensorType
    dst: TensorType
    steps: tuple[Step, ...]
    cost: Cost
    # True when the planner proved it the cheapest in its search space; False when the
    # search ran out of its budget and this is the best program found within it, or when
    # it proved it only within its ``gap_bytes``
    optimal: bool = True
    # how many fewer bytes (busiest rank) the cheapest program could send, at most: 0 when
    # proven cheapest; at most the compile's ``gap_bytes`` when the search set aside plans
    # that could save no more than that (and need as many collectives); None when the
    # budget ran out first
    gap_bytes: int | None = 0

    def __post_init__(self) -> None:
        if self.optimal and self.gap_bytes != 0:
            raise SpecError(f"a Program proven optimal cannot have gap_bytes={self.gap_bytes}",
                            hint="optimal means proven cheapest: gap_bytes 0")

    @property
    def dst_mesh(self) -> Mesh:
        """The mesh ``dst`` lives on: the program's own, or the one its last step crosses to
        (a cross-mesh program runs over the union of the two meshes' global ranks)."""
        last = self.steps[-1].dst_mesh if self.steps else None
        return self.mesh if last is None else last

    @property
    def crosses_meshes(self) -> bool:
        return bool(self.steps) and self.steps[-1].dst_mesh is not None

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __str__(self) -> str:
        where = f"from mesh {self.mesh} to mesh {self.dst_mesh}" if self.crosses_meshes else f"on mesh {self.mesh}"
        lines = [f"program {where}: {self.src}  ->  {self.dst}"]
        if not self.steps:
            lines.append("  (no steps: every rank already holds its destination block)")
        width = max((len(s.describe()) for s in self.steps), default=0)
        for i, s in enumerate(self.steps, 1):
            moved = f"{s.bytes_max} B/rank" if s.is_collective else "local"
            lines.append(f"  {i}. {s.describe():<{width}}  -> {s.dst}   [{moved}]")
        c = self.cost
        lines.append(
            f"  cost: {c.bytes_max} B (busiest rank, sent or received), {c.bytes_sent_max} B sent (max rank), "
            f"{c.collectives} collective(s), peak {c.peak_bytes_max} B"
        )
        if self.gap_bytes is None:
            lines.append("  (the best program found within the planner's budget; not proven optimal)")
        elif self.gap_bytes:
            lines.append(f"  (proven within {self.gap_bytes} B of the cheapest: no program costs more than "
                         f"{self.gap_bytes} B less)")
        elif not self.optimal:
            lines.append("  (no program costs fewer bytes; one may run fewer collectives or need less memory)")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "mesh": str(self.mesh),
            **({"dst_mesh": str(self.dst_mesh)} if self.crosses_meshes else {}),
            "src": str(self.src),
            "dst": str(self.dst),
            "steps": [s.to_json() for s in self.steps],
            "cost": self.cost.to_json(),
            "optimal": self.optimal,
            "gap_bytes": self.gap_bytes,
        }

    def to_json_str(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def check_program(program: object) -> Program:
    """``program`` itself where it is a Program; a SpecError for anything else (public
    entries that take a compiled program call this first)."""
    if not isinstance(program, Program):
        raise SpecError(f"expected a compiled Program, got {type(program).__name__}",
                        hint="compile one with lowering.compile(src, dst, mesh)")
    return program


def check_one_mesh(program: object) -> Program:
    """``check_program``, refusing a cross-mesh program: what an engine that runs a program
    on one mesh's ranks takes."""
    p = check_program(program)
    if p.crosses_meshes:
        raise SpecError(f"the program from mesh {p.mesh} to mesh {p.dst_mesh} runs across two meshes, not on one",
                        hint="run it with torch_backend.redistribute(x, src, dst, mesh, dst_mesh=...) on every rank "
                             "of the world, or simulate it with lowering.simulate")
    return p


def make_program(steps: Sequence[Step] | Step, mesh: Mesh | str, *, cost_model: CostModel | None = None,
                 src: TensorType | str | None = None) -> Program:
    """A Program of ``steps`` (each step's src is the previous step's dst), with its cost.

    ``src`` is the program's source type when ``steps`` is empty.
    """
    m = parse_mesh(mesh)
    steps = (steps,) if not isinstance(steps, Sequence) else tuple(steps)
    given = None if src is None else resolve(src, m)[0]
    for i, s in enumerate(steps):
        if not isinstance(s, Step):
            raise SpecError(f"step {i + 1} is a {type(s).__name__}, not a Step",
                            hint="build steps with lowering.make_step(kind, src, dst, mesh)")
        check_type_once(s.src, m)  # a step's types, checked when it was made: not again
        check_type_once(s.dst, m)
        if len(s.bytes_sent) != m.size:
            raise SpecError(f"step {i + 1} ({s.describe()}) was priced on a mesh of {len(s.bytes_sent)} ranks, "
                            f"not on {m} ({m.size} ranks)", hint="build every step on the program's mesh")
    if steps:
        first = steps[0].src
    elif given is not None:
        first = given
    else:
        raise SpecError("make_program needs at least one step, or src= for an empty program")
    prev = first
    for i, s in enumerate(steps):
        if s.src != prev:
            raise SpecError(f"step {i + 1} ({s.describe()}) starts at {s.src}, but the previous step ends at {prev}",
                            hint="chain steps so each starts where the last one ends")
        prev = s.dst
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise SpecError(f"make_program's cost_model must be a CostModel, got {type(cost_model).__name__}",
                        hint="pass a lowering.CostModel (CostModel.load(path) reads a calibrated one), or None")
    model = cost_model or DEFAULT_COST_MODEL
    return Program(m, first, prev, steps, program_cost(list(steps), first, m, model))


def program_cost(steps: list[Step], src: TensorType, mesh: Mesh, model: Any) -> Cost:
    """Bytes (max over ranks of the sum over steps: of the larger of sent and received per
    step, and of sent alone), collectives, peak live bytes, time (each step at its price)."""
    sent = np.zeros(mesh.size, dtype=np.int64)
    moved = np.zeros(mesh.size, dtype=np.int64)
    peak = int((local_numel(src, mesh) * src.itemsize).max())
    time = 0.0
    for s in steps:
        sent += np.asarray(s.bytes_sent, dtype=np.int64)
        moved += np.asarray(s.bytes_moved, dtype=np.int64)
        live = (local_numel(s.src, mesh) + local_numel(s.dst, mesh)) * src.itemsize
        peak = max(peak, int(live.max()))
        time += model.step_time(s.axes, s.bytes_max, s.is_collective, s.launches,
                                int(local_numel(s.dst, mesh).max()) * src.itemsize)
    return Cost(
        bytes_sent_max=int(sent.max()) if steps else 0,
        collectives=sum(s.launches for s in steps if s.is_collective),
        peak_bytes_max=peak,
        time_s=time,
        bytes_max=int(moved.max()) if steps else 0,
    )
