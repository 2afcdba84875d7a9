"""One-step Programs for executor tests, built with the public ``lowering.make_step`` (steps the
planner may never emit: unpadded uneven reduce_scatter, groups of one rank, listed group orders).
The expected dims and op check the kinds' type rules on the way."""

from __future__ import annotations

from lowering import make_program, make_step
from lowering.program import Program


def one_step(kind: str, axes: tuple[str, ...] | str, dims: tuple[int, ...] | int, src: str, dst: str, mesh: str,
             op: str | None = None, padded: bool | None = None) -> Program:
    step = make_step(kind, src, dst, mesh, axes=axes, padded=padded)
    assert step.dims == ((dims,) if isinstance(dims, int) else tuple(dims)), (kind, step.dims)
    assert op is None or step.op == op
    return make_program([step], mesh)
