"""Each typed collective as a Program of step kinds, and its backward from the kinds' duals.

A call ``op(x, axes, src=..., dst=...)`` on a block of local shape ``shape`` becomes the
types of one mesh-axis group (every other mesh axis unannotated) and a short program:
one collective at most, plus local steps. V is S(0) of a new dim of the group's size
(the ``stack`` kind), so ``all_gather(V, R)`` is ``stack`` then ``all_gather``::

    A                  [A]                   [A, B, C]
    B  =stack=>  [B]   (dim 0 split)  =all_gather=>  [A, B, C]
    C                  [C]                   [A, B, C]

The backward program is the forward's steps reversed, each replaced by its dual steps
(``lowering.planner.dual_steps``: the kind's ``duals``); ``tests/test_spmd_rules.py``
checks it equals the forward/backward table.
"""

from __future__ import annotations

from lowering.caching import MIB, cached
from lowering.kinds import kind_of, make_step
from lowering.planner import dual_steps
from lowering.program import Program, Step, make_program
from lowering.spmd.rules import check_pair
from spec_lang.dual import check_differentiable, dual_type
from spec_lang.errors import SpecError
from spec_lang.ir import Dim, Mesh, TensorType, canonical_dtype
from spec_lang.local_type import I, LocalType, R

Shape = tuple[int, ...]


def typed(shape: Shape, t: LocalType, group: tuple[str, ...], dtype: str,
          sizes: dict[int, int] | None = None) -> TensorType:
    """The type of a block of ``shape`` that is ``t`` on the group; ``sizes``: global sizes of
    the dims the group splits (S(i) gets ``sizes[i]``)."""
    dims = [Dim(int(s)) for s in shape]
    for d, n in (sizes or {}).items():
        dims[d] = Dim(n, group)
    ann = tuple((a, t) for a in group) if t.kind in ("R", "V", "P") else ()  # I is unannotated, S a dim
    return TensorType(canonical_dtype(dtype) or dtype, tuple(dims), ann)


def _need_dim(op: str, t: LocalType, shape: Shape) -> int:
    if t.dim is not None and t.dim >= len(shape):
        raise SpecError(f"{op}: {t!r} names dim {t.dim}, but the tensor has {len(shape)} dims",
                        hint=f"use S(i) with i < {len(shape)}")
    return 0 if t.dim is None else t.dim


def _need_size(op: str, t: LocalType, size: int | None) -> int:
    """The global length of the source's S(i) dim, which its blocks alone do not give."""
    if size is None:
        raise SpecError(f"{op}: {t!r} needs the global length of the dim its blocks concatenate on",
                        hint="pass size=, the sum of every rank's length of that dim")
    return size


def _need_leading(op: str, shape: Shape, n: int, why: str, dim: int = 0) -> None:
    if len(shape) <= dim or shape[dim] != n:
        raise SpecError(f"{op}: the local tensor has shape {list(shape)}, but {why} needs dim {dim} of the "
                        f"group's size {n}", hint=f"give dim {dim} size {n}, or use S(i) for concat semantics")


def step_types(op: str, src: LocalType, dst: LocalType, group: tuple[str, ...], shape: Shape, dtype: str,
               mesh: Mesh, size: int | None, at: int = 0) -> list[tuple[str, TensorType, TensorType]]:
    """(kind, src type, dst type) of each step; ``size``: the global length of src's S(i) dim;
    ``at``: the dim V's blocks stack on (all_gather's gather_dim, reduce_scatter's scatter_dim)."""
    n = mesh.group_size(group)

    def t(sh: Shape, lt: LocalType, sizes: dict[int, int] | None = None) -> TensorType:
        return typed(sh, lt, group, dtype, sizes)

    def stack0(sh: Shape) -> TensorType:  # V blocks of shape sh, stacked on a new dim 0
        return t((n, *sh), I, {0: n})

    def stack_at(sh: Shape) -> TensorType:  # ... on a new dim ``at``
        return t((*sh[:at], n, *sh[at:]), I, {at: n})

    a, b = src.base, dst.base
    if op == "all_gather":
        if src.kind == "S":
            i, length = _need_dim(op, src, shape), _need_size(op, src, size)
            full = shape[:i] + (length,) + shape[i + 1:]
            return [("all_gather", t(full, src, {i: length}), t(full, dst))]
        return [("stack", t(shape, src), stack_at(shape)),
                ("all_gather", stack_at(shape), t((*shape[:at], n, *shape[at:]), dst))]
    if op == "all_reduce":
        return [("all_reduce", t(shape, src), t(shape, dst))]
    if op == "reduce_scatter":
        if dst.kind == "S":
            i = _need_dim(op, dst, shape)
            return [("reduce_scatter", t(shape, src), t(shape, dst, {i: shape[i]}))]
        _need_leading(op, shape, n, "reduce_scatter(P, V)", at)
        rest = shape[:at] + shape[at + 1:]
        return [("reduce_scatter", t(shape, src), stack_at(rest)), ("stack", stack_at(rest), t(rest, dst))]
    if op == "all_to_all":
        if src.kind == "S":
            i, j, length = _need_dim(op, src, shape), _need_dim(op, dst, shape), _need_size(op, src, size)
            full = shape[:i] + (length,) + shape[i + 1:]
            return [("all_to_all", t(full, src, {i: length}), t(full, dst, {j: full[j]}))]
        _need_leading(op, shape, n, "all_to_all(V, V)")
        mid = TensorType(canonical_dtype(dtype) or dtype, (Dim(n), Dim(n, group)) + tuple(Dim(s) for s in shape[1:]))
        return [("stack", t(shape, src), stack0(shape)), ("all_to_all", stack0(shape), mid), ("stack", mid, t(shape, dst))]
    if (a, b) in (("R", "I"), ("I", "R")):
        return [("reinterpret", t(shape, src), t(shape, dst))]
    if op == "reinterpret":
        kind = "pcast" if dst.op == "sum" else "reinterpret"
        if a == "I":
            return [("reinterpret", t(shape, src), t(shape, R)), (kind, t(shape, R), t(shape, dst))]
        return [(kind, t(shape, src), t(shape, dst))]
    # convert
    if b == "P" and a in ("R", "I"):
        return [("zero_fill", t(shape, src), t(shape, dst))]
    if dst.kind == "S":
        i = _need_dim(op, dst, shape)
        return [("slice", t(shape, src), t(shape, dst, {i: shape[i]}))]
    if b == "V":
        _need_leading(op, shape, n, f"convert({src!r}, V)")
        return [("slice", t(shape, src), stack0(shape[1:])), ("stack", stack0(shape[1:]), t(shape[1:], dst))]
    if src.kind == "S":
        i, length = _need_dim(op, src, shape), _need_size(op, src, size)
        full = shape[:i] + (length,) + shape[i + 1:]
        return [("zero_pad", t(shape, src, {i: length}), t(full, dst))]
    return [("stack", t(shape, src), stack0(shape)), ("zero_pad", stack0(shape), t((n, *shape), dst))]


def stack_dim(op: str, src: LocalType, dst: LocalType, ndim: int, at: int | None) -> int:
    """The dim V's blocks stack on: ``at`` (all_gather's ``gather_dim``, a new dim of the
    result; reduce_scatter's ``scatter_dim``, a dim of the input; negative counts from the
    end), 0 by default; refused where no V side stacks."""
    if at is None:
        return 0
    name = "gather_dim" if op == "all_gather" else "scatter_dim"
    stacks = (op == "all_gather" and src.kind == "V") or (op == "reduce_scatter" and dst.kind == "V")
    if not stacks:
        raise SpecError(f"{op}(src={src!r}, dst={dst!r}) takes no {name}: only V's blocks stack on a dim "
                        "(an S(i) side names its dim itself)",
                        hint=f"drop {name}=, or write the dim in the type: S({at})")
    bound = ndim + 1 if op == "all_gather" else ndim
    if isinstance(at, bool) or not isinstance(at, int) or not -bound <= at < bound:
        raise SpecError(f"{op}: {name}={at!r} is out of range for a {'result' if op == 'all_gather' else 'tensor'} "
                        f"of {bound} dims", hint=f"use {-bound} <= {name} < {bound}")
    return at % bound


def program_for(op: str, src: LocalType, dst: LocalType, group: tuple[str, ...], shape: Shape, dtype: str,
                mesh: Mesh, size: int | None = None, at: int = 0) -> Program:
    """The checked Program of ``op(src, dst)`` over ``group`` for a block of ``shape``
    (``at``: the dim V stacks on, ``stack_dim``'s).

    The pair is checked first (a SpecError names the rule and the fix); the steps then go
    through ``make_step``, so each kind's type rule checks them too.
    """
    return routed_program(check_pair(op, src, dst) or op, src, dst, group, shape, dtype, mesh, size, at)


@cached(maxsize=4096, max_bytes=16 * MIB)
def routed_program(routed: str, src: LocalType, dst: LocalType, group: tuple[str, ...], shape: Shape, dtype: str,
                   mesh: Mesh, size: int | None = None, at: int = 0) -> Program:
    """``program_for`` of a pair its caller checked already: ``routed`` is ``check_pair``'s
    answer (a typed collective checks the pair first, before anything else, once)."""
    for a in group:
        if a not in mesh:
            raise SpecError(f"mesh axis {a!r} is not on the mesh {mesh}", hint=f"use one of {', '.join(mesh.names)}")
    if len(set(group)) != len(group) or not group:
        raise SpecError(f"axes {list(group)} must name each mesh axis once", hint="e.g. 'tp' or ('dp', 'tp')")
    if routed == "identity":  # src == dst: nothing to do
        split = {src.dim: size} if src.dim is not None and size is not None else None
        return make_program([], mesh, src=typed(shape, src, group, dtype, split))
    steps = [make_step(k, s, d, mesh, axes=group if kind_of(k).collective else None)
             for k, s, d in step_types(routed, src, dst, group, shape, dtype, mesh, size, at)]
    return make_program(steps, mesh)


@cached(maxsize=4096, max_bytes=16 * MIB)
def backward_program(program: Program) -> Program:
    """The gradient's program: the steps reversed, each replaced by its dual steps."""
    steps: list[Step] = []
    for st in reversed(program.steps):
        steps.extend(dual_steps(st, program.mesh))
    return make_program(steps, program.mesh, src=dual_type(program.dst))


def gradient_program(program: Program) -> Program:
    """``backward_program`` of a collective that has a gradient (a SpecError for a pending
    max/min, whose gradient needs the arg-max no type carries): what a bound typed
    collective's dual binds."""
    check_differentiable(program.src, program.dst)
    return backward_program(program)
