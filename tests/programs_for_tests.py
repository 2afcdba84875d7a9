"""Hand-built Programs for executor tests: steps the planner may never emit (unpadded
uneven reduce_scatter, groups of one rank, listed group orders), priced like the planner."""

from __future__ import annotations

from lowering.cost import all_gather_bytes, all_reduce_bytes, exchange_bytes, reduce_scatter_bytes
from lowering.layout import local_shapes
from lowering.program import Cost, Program, Step
from spec_lang.ir import Mesh, TensorType
from spec_lang.parser import parse, parse_mesh


def make_step(kind: str, axes: tuple[str, ...] | str, dims: tuple[int, ...] | int, src: str | TensorType,
              dst: str | TensorType, mesh: str | Mesh, op: str | None = None,
              padded: bool | None = None) -> Step:
    """A Step with exact shapes and the cost model's bytes (``padded`` defaults to the planner's)."""
    m = parse_mesh(mesh)
    s, d = parse(src), parse(dst)
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    elems = None
    pad = False
    if kind == "all_gather":
        elems = all_gather_bytes(s, m, axes)
    elif kind in ("all_to_all", "permute"):
        elems = exchange_bytes(s, d, m, axes)
    elif kind == "reduce_scatter":
        elems, pad = reduce_scatter_bytes(s, d, m, axes)
    elif kind == "all_reduce":
        elems = all_reduce_bytes(s, m, axes)
    if padded is not None:
        pad = padded
    sent = tuple(int(e) * s.itemsize for e in elems) if elems is not None else tuple(0 for _ in range(m.size))
    if kind in ("reduce_scatter", "all_reduce") and op is None:
        op = s.partial_op or "sum"
    return Step(kind, axes, dims, s, d, op, local_shapes(s, m), local_shapes(d, m), sent, pad)


def make_program(mesh: str | Mesh, steps: list[Step]) -> Program:
    m = parse_mesh(mesh)
    sent = [sum(s.bytes_sent[r] for s in steps) for r in range(m.size)]
    cost = Cost(max(sent) if steps else 0, sum(s.is_collective for s in steps), 0, 0.0)
    return Program(m, steps[0].src, steps[-1].dst, tuple(steps), cost)


def one_step(kind: str, axes: tuple[str, ...] | str, dims: tuple[int, ...] | int, src: str, dst: str, mesh: str,
             op: str | None = None, padded: bool | None = None) -> Program:
    return make_program(mesh, [make_step(kind, axes, dims, src, dst, mesh, op, padded)])
