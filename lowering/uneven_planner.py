"""Planning a redistribution where either side splits a dim unevenly.

Every such pair is one exact exchange (``all_to_allv``, or ``reduce_scatterv`` when a
pending reduction finishes), since the exchange sends each rank exactly the elements it
lacks, at their real sizes. One case pays to split in two: finishing a reduction onto
ranks that all need the sum (``{U:tp} -> R on tp``). Sent directly, each contribution
goes to every rank; reduced first onto an even split of the reduced axes and then
gathered, each element crosses the wire 2(k-1)/k times per rank instead of k-1, the
reduce-scatter-then-all-gather form of an all_reduce::

    +A +A +A  --reduce_scatterv-->  [A0] [A1] [A2]  --all_to_allv-->  [A] [A] [A]

The cheapest candidate (by the cost model) wins; never a detour through Replicate unless
that is the cheapest.
"""

from __future__ import annotations

from lowering.cost import CostModel
from lowering.kinds import kind_of, priced_step
from lowering.kinds.base import erase
from lowering.kinds.uneven_exchange import finished_axes, group_axes
from lowering.program import Step, program_cost
from spec_lang.errors import SpecError
from spec_lang.ir import Dim, Mesh, TensorType


def _step(src: TensorType, dst: TensorType, mesh: Mesh) -> Step | None:
    """The one exchange from ``src`` to ``dst`` (None when no axis changes role)."""
    axes = group_axes(erase(src), erase(dst), mesh)
    if not axes:
        return None
    kind = "reduce_scatterv" if finished_axes(src, dst, axes) else "all_to_allv"  # refined when priced: slicev, all_gatherv
    sig = kind_of(kind).infer(src, dst, mesh, None)
    return priced_step(kind, src, dst, mesh, sig.axes, sig.dims, sig.op)


def _midpoints(src: TensorType, dst: TensorType, mesh: Mesh) -> list[TensorType]:
    """Where to finish a reduction first: the destination with the reduced axes that it
    replicates sharding one more dim evenly (each dim in turn)."""
    red_r = tuple(a for a in mesh.names if a in src.partial_axes and a not in dst.partial_axes
                  and dst.dim_of(a) is None and mesh.axis_size(a) > 1)
    if not red_r:
        return []
    keep = tuple((a, at) for a, at in erase(dst).axis_types if a not in red_r)
    out = []
    for k, dim in enumerate(dst.dims):
        dims = list(dst.dims)
        if dim.split is None:
            dims[k] = Dim(dim.size, dim.axes + red_r)
        else:  # a split dim takes no second axis: shard it evenly by the reduced axes instead
            dims[k] = Dim(dim.size, red_r)
        try:
            mid = TensorType(dst.dtype, tuple(dims), keep)
        except SpecError:  # e.g. a dim inside a ragged prefix takes no axis: no midpoint there
            continue
        if mid.partial_axes == tuple(a for a in dst.partial_axes if a not in red_r) and mid != dst:
            out.append(mid)
    return out


def plan_uneven(src: TensorType, dst: TensorType, mesh: Mesh, model: CostModel) -> list[Step]:
    """The steps of the cheapest of the direct exchange and the reduce-then-gather routes
    (the planner assembles them into the Program, the user's R/I annotations restored)."""
    routes: list[list[Step]] = []
    direct = _step(src, dst, mesh)
    routes.append([direct] if direct is not None else [])
    for mid in _midpoints(src, dst, mesh):
        first, second = _step(src, mid, mesh), _step(mid, dst, mesh)
        routes.append([s for s in (first, second) if s is not None])

    def key(steps: list[Step]) -> tuple:
        c = program_cost(steps, src, mesh, model)
        return (c.bytes_max, c.time_s, c.collectives, len(steps))

    return min(routes, key=key)
