"""A Program: the flat, immutable list of Steps that turns src shards into dst shards.

Every Step is a typed transition ``src -> dst`` between two TensorTypes on the same
mesh, so each rank's input and output block come from the layout algebra
(``lowering.layout.boxes``). The executor and the simulator read a step's data
movement off those boxes; nothing else is needed to run it.

A step over ``axes`` runs on groups: the ranks that share every other mesh coordinate,
ordered row-major over ``axes`` *as listed* (a flattened group when there are several).

Kinds (rank diagrams on 3 ranks, ``+A`` is a pending sum):

``all_gather``   dims=(d,): concat the group's blocks along d, in group order::

                [A]
                [B]  =>  [A, B, C]
                [C]

                 Several dims (axes minor on each): every member's block lands at its
                 place in the gathered block, which the members' blocks tile.

``reduce_scatter``  dims=(d,): reduce (``op``) the group's equal blocks, keep this
                 rank's piece along d (src P on ``axes``, dst shards d by them, minor)::

                +[A0, A1, A2]      [A0+B0+C0]
                +[B0, B1, B2]  =>  [A1+B1+C1]
                +[C0, C1, C2]      [A2+B2+C2]

                 Several dims: each member keeps its (multi-dim) piece of the block.

``all_reduce``   reduce (``op``) over the group; P on ``axes`` becomes R::

                +A
                +B  =>  A + B + C
                +C

``all_to_all``   exact box exchange: each rank's dst block is assembled from the
                 pieces (src block of q) ∩ (dst block of r) of its group members q,
                 whose src blocks are disjoint. Covers S(i)->S(j) and any reordering
                 of axes inside a dim::

                [A0, A1, A2]      [A0, B0, C0]
                [B0, B1, B2]  =>  [A1, B1, C1]
                [C0, C1, C2]      [A2, B2, C2]

``permute``      an all_to_all in which every rank receives from at most one peer
                 (point-to-point exchange, e.g. ``8@(dp,tp)`` -> ``8@(tp,dp)``).

Local steps (no bytes on the wire):

``slice``        keep this rank's dst block of its src block (shard a replicated dim).
``zero_fill``    convert(R,P(sum)): ranks off coordinate 0 on ``axes`` become zeros::

                        +[A]
                [A]  => +[0]
                        +[0]

``zero_pad``     convert(S(d),P(sum)): the block is placed in a zero block of the
                 size of its parent (``axes`` no longer shard d, they are P)::

                [A]      +[A, 0, 0]
                [B]  =>  +[0, B, 0]
                [C]      +[0, 0, C]

``reinterpret``  no change to any local tensor (R<->I, R->P(avg/max/min)).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from spec_lang.ir import Mesh, TensorType

COLLECTIVE_KINDS = frozenset({"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "permute"})
LOCAL_KINDS = frozenset({"slice", "zero_fill", "zero_pad", "reinterpret"})


@dataclass(frozen=True)
class Step:
    """One collective or local op; see the module docstring for each kind's meaning."""

    kind: str
    axes: tuple[str, ...]
    dims: tuple[int, ...]
    src: TensorType
    dst: TensorType
    op: str | None = None  # reduce op for reduce_scatter / all_reduce
    in_shapes: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    out_shapes: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    bytes_sent: tuple[int, ...] = field(default=(), repr=False)  # per rank, under the ring model
    padded: bool = False  # reduce_scatter on uneven pieces: padded to equal chunks on the wire

    @property
    def is_collective(self) -> bool:
        return self.kind in COLLECTIVE_KINDS

    @property
    def bytes_sent_max(self) -> int:
        return max(self.bytes_sent) if self.bytes_sent else 0

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
            "bytes_sent_max": self.bytes_sent_max,
            "padded": self.padded,
        }


@dataclass(frozen=True)
class Cost:
    """What a program costs: bytes (max over ranks, summed over steps), calls, memory, time."""

    bytes_sent_max: int
    collectives: int
    peak_bytes_max: int
    time_s: float

    def to_json(self) -> dict[str, Any]:
        return {
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
    # search ran out of its budget and this is the best program found within it
    optimal: bool = True

    def __iter__(self):  # noqa: ANN204
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __str__(self) -> str:
        lines = [f"program on mesh {self.mesh}: {self.src}  ->  {self.dst}"]
        if not self.steps:
            lines.append("  (no steps: every rank already holds its destination block)")
        width = max((len(s.describe()) for s in self.steps), default=0)
        for i, s in enumerate(self.steps, 1):
            moved = f"{s.bytes_sent_max} B/rank" if s.is_collective else "local"
            lines.append(f"  {i}. {s.describe():<{width}}  -> {s.dst}   [{moved}]")
        c = self.cost
        lines.append(
            f"  cost: {c.bytes_sent_max} B sent (max rank), {c.collectives} collective(s), "
            f"peak {c.peak_bytes_max} B"
        )
        if not self.optimal:
            lines.append("  (the best program found within the planner's budget; not proven optimal)")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "mesh": str(self.mesh),
            "src": str(self.src),
            "dst": str(self.dst),
            "steps": [s.to_json() for s in self.steps],
            "cost": self.cost.to_json(),
            "optimal": self.optimal,
        }

    def to_json_str(self) -> str:
        return json.dumps(self.to_json(), indent=2)
