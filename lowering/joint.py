"""Joint programs: many redistributions on one mesh, their collectives merged.

``compile_many(srcs, dsts, mesh)`` compiles each pair, then runs the programs in lockstep:
in round i, the i-th steps of every program that has one. Within a round, collectives of
the same kind over the same axis set, reduce op and dtype become *one* collective on
one packed buffer (the parameters of a layer in an FSDP all_gather), where the kind can
pack (an all_gather of equal blocks, a reduce_scatter of equal or padded pieces, an
all_reduce, an exchange); every other step runs on its own. The joint cost is each
rank's bytes summed over all steps (packing adds none; a merged collective costs each rank
the larger of its packed sends and receives), with one collective, and one latency, per
merged group.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering.caching import cached
from lowering.cost import DEFAULT_COST_MODEL, CostModel, as_cost_model
from lowering.kinds.rows import group_rows
from lowering.program import Cost, Program, Step
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType

# kinds that can share one collective, and the name they share it under
_PACKABLE = {"all_gather": "all_gather", "reduce_scatter": "reduce_scatter", "all_reduce": "all_reduce",
             "all_to_all": "exchange", "permute": "exchange"}


@dataclass(frozen=True)
class Merged:
    """Steps that run as one collective: ``(program index, step index)`` pairs."""

    kind: str  # all_gather | reduce_scatter | all_reduce | exchange | a single step's own kind
    members: tuple[tuple[int, int], ...]

    @property
    def packed(self) -> bool:
        return len(self.members) > 1


@dataclass(frozen=True)
class JointProgram:
    mesh: Mesh
    programs: tuple[Program, ...]
    rounds: tuple[tuple[Merged, ...], ...]
    cost: Cost

    def step(self, ref: tuple[int, int]) -> Step:
        return self.programs[ref[0]].steps[ref[1]]

    def __str__(self) -> str:
        lines = [f"joint program of {len(self.programs)} redistributions on mesh {self.mesh}"]
        for i, rnd in enumerate(self.rounds, 1):
            for g in rnd:
                s = self.step(g.members[0])
                what = f"{len(g.members)} x " if g.packed else ""
                lines.append(f"  round {i}: {what}{s.describe() if not g.packed else g.kind + '(' + ','.join(s.axes) + ')'}")
        c = self.cost
        lines.append(f"  cost: {c.bytes_max} B (busiest rank, sent or received), {c.bytes_sent_max} B sent (max rank), "
                     f"{c.collectives} collective(s)")
        return "\n".join(lines)


@cached(maxsize=4096)
def _even_groups(step: Step, mesh: Mesh, of: str) -> bool:
    """Whether every group of ``step`` holds blocks of one size (``of``: src or dst side)."""
    shapes = step.in_shapes if of == "src" else step.out_shapes
    numel = np.asarray([int(np.prod(s)) for s in shapes], dtype=np.int64)
    rows = numel[group_rows(mesh, step.axes)]
    return bool((rows == rows[:, :1]).all())


def packing_key(step: Step, mesh: Mesh) -> tuple | None:
    """The key under which ``step`` may share a collective, or None when it runs alone."""
    kind = _PACKABLE.get(step.kind)
    if kind is None or mesh.group_size(step.axes) == 1 or step.bytes_sent_max == 0:
        return None
    if kind == "all_gather" and not _even_groups(step, mesh, "src"):
        return None
    if kind == "reduce_scatter" and not (step.padded or _even_groups(step, mesh, "dst")):
        return None
    axes = tuple(a for a in mesh.names if a in step.axes)
    return (kind, axes, step.op, step.src.dtype)


def plan_jointly(programs: Sequence[Program], cost_model: CostModel | None = None) -> JointProgram:
    """Merge ``programs`` (all on one mesh) into rounds of packed collectives."""
    if not programs:
        raise SpecError("a joint program needs at least one redistribution")
    mesh = programs[0].mesh
    if any(p.mesh != mesh for p in programs):
        raise SpecError("every redistribution of a joint program must be on the same mesh",
                        hint="call redistribute_many once per mesh")
    if programs[0].crosses_meshes:
        return _crossings_jointly(programs)
    model = cost_model or DEFAULT_COST_MODEL
    rounds = []
    sent = np.zeros(mesh.size, dtype=np.int64)
    moved = np.zeros(mesh.size, dtype=np.int64)
    time, colls = 0.0, 0
    for i in range(max(len(p.steps) for p in programs)):
        buckets: dict[tuple, list[tuple[int, int]]] = {}
        alone: list[Merged] = []
        for j, p in enumerate(programs):
            if i >= len(p.steps):
                continue
            s = p.steps[i]
            sent += np.asarray(s.bytes_sent, dtype=np.int64)
            key = packing_key(s, mesh)
            if key is None:
                moved += np.asarray(s.bytes_moved, dtype=np.int64)
                alone.append(Merged(s.kind, ((j, i),)))
                colls += int(s.is_collective)
                time += model.step_time(s.axes, s.bytes_max, s.is_collective, s.launches)
            else:
                buckets.setdefault(key, []).append((j, i))
        merged = []
        for key, refs in buckets.items():
            merged.append(Merged(key[0] if len(refs) > 1 else programs[refs[0][0]].steps[i].kind, tuple(refs)))
            # one collective: each rank's sends and receives of its members, the busier direction
            out = sum(np.asarray(programs[j].steps[k].bytes_sent, dtype=np.int64) for j, k in refs)
            into = sum(np.asarray(programs[j].steps[k].bytes_recv, dtype=np.int64) for j, k in refs)
            per_rank = np.maximum(out, into)
            moved += per_rank
            colls += 1
            time += model.step_time(key[1], int(np.max(per_rank)), True)
        rounds.append(tuple(merged) + tuple(alone))
    peak = max(p.cost.peak_bytes_max for p in programs)
    cost = Cost(int(sent.max()), colls, peak, time, int(moved.max()))
    return JointProgram(mesh, tuple(programs), tuple(rounds), cost)


def _crossings_jointly(programs: Sequence[Program]) -> JointProgram:
    """Cross-mesh programs (all between the same two meshes) run jointly: their steps on
    the source mesh in lockstep, each on its own, then every crossing in one last round as
    one group (each round of messages one per pair of ranks, every tensor's pieces packed:
    ``torch_backend.cross_rounds``). The cost is the programs' costs added: their busiest
    ranks may differ, so it bounds the joint cost from above."""
    finishes = max(len(p.steps) for p in programs) - 1  # every program ends in its crossing
    rounds = [tuple(Merged(p.steps[i].kind, ((j, i),)) for j, p in enumerate(programs) if i < len(p.steps) - 1)
              for i in range(finishes)]
    last = tuple((j, len(p.steps) - 1) for j, p in enumerate(programs))
    rounds.append((Merged("across" if len(last) > 1 else programs[0].steps[-1].kind, last),))
    costs = [p.cost for p in programs]
    cost = Cost(sum(c.bytes_sent_max for c in costs), sum(c.collectives for c in costs),
                max(c.peak_bytes_max for c in costs), sum(c.time_s for c in costs), sum(c.bytes_max for c in costs))
    return JointProgram(programs[0].mesh, tuple(programs), tuple(rounds), cost)


def check_type_lists(entry: str, srcs: object, dsts: object, example: str) -> None:
    """A joint entry's source and destination types are lists (a string is one type, not a
    list of its characters); ``example`` is a call that shows the fix."""
    for what, ts in (("source", srcs), ("destination", dsts)):
        if isinstance(ts, (str, bytes)) or not isinstance(ts, Sequence):
            raise SpecError(f"{entry} takes a list of {what} types, got {type(ts).__name__}",
                            hint=f"pass one type per tensor, e.g. {example}")


def compile_many(srcs: Sequence[TensorType | str], dsts: Sequence[TensorType | str], mesh: Mesh | str, *,
                 cost_model: CostModel | Mapping[str, Any] | str | os.PathLike[str] | None = None) -> JointProgram:
    """Compile every ``srcs[i] -> dsts[i]`` on ``mesh`` and merge them (see the module docstring).

    ``cost_model`` is what ``compile`` takes (a CostModel, its JSON dict or file path)."""
    from lowering.planner import compile

    check_type_lists("compile_many", srcs, dsts,
                     "compile_many(['f32[8@dp]'], ['f32[8]'], 'dp=2'); for one tensor, lowering.compile")
    cost_model = as_cost_model(cost_model, mesh)
    if len(srcs) != len(dsts):
        raise SpecError(f"{len(srcs)} source types but {len(dsts)} destination types",
                        hint="pass one destination type per source type")
    return plan_jointly([compile(s, d, mesh, cost_model=cost_model) for s, d in zip(srcs, dsts)], cost_model)
