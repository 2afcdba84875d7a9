"""How local SPMD types flow through ordinary (non-collective) ops, per mesh axis (torch-free).

The SPMD type system's rules: no op communicates, so an op may only combine types whose
gradients need no communication either::

    op(R..) -> R      op(I..) -> I      op(V..) -> V      op(R, V) -> V
    linear_op(P) -> P      P + P -> P      P * R -> P      (P * P, P + R, f(P): refused)
    I never mixes with R, V or P.

Global SPMD (S(i) operands of einsum/matmul/linear) adds the partition-spec rule:

1. no contracted label is sharded (unless the axis is named in ``out_partial_axes``,
   which makes the output P on it: explicit, never implicit);
2. a label the output keeps, sharded on an axis, is sharded on that axis in every operand
   that uses it, and no operand that lacks it is sharded on that axis;
3. a mesh axis shards at most one dim of a spec (one type per axis guarantees it).
"""

from __future__ import annotations

from collections.abc import Sequence

from spec_lang.errors import SpecError
from spec_lang.local_type import I, LocalType, P, R, S, V

Types = dict[str, LocalType]

# the affine ops: a bias plus a product (addmm(b, m1, m2) = b + m1 @ m2), typed as the
# addition of the bias and the product's type (the product typed as mm, mv, outer or bmm)
AFFINE = {"addmm": "mm", "addmv": "mv", "addr": "outer", "baddbmm": "bmm", "addbmm": "bmm"}
# linear jointly in every tensor argument: P + P -> P
ADDITIVE = frozenset({"add", "sub", "subtract", "cat", "concat", "concatenate", "stack", "hstack", "vstack",
                      "add_", "sub_", "sum_to_size", "setitem", *AFFINE})
# linear in each tensor argument separately: one P, the rest R
MULTILINEAR = frozenset({"mul", "multiply", "matmul", "mm", "bmm", "einsum", "linear", "outer", "dot", "tensordot",
                         "div", "true_divide", "mv", "inner", "kron"})
# linear in their one tensor argument (shape ops, reductions over dims, copies)
UNARY_LINEAR = frozenset({
    "view", "reshape", "transpose", "permute", "t", "contiguous", "flatten", "unflatten", "squeeze", "unsqueeze",
    "getitem", "expand", "expand_as", "clone", "detach", "to", "chunk", "split", "narrow", "select", "neg",
    "negative", "sum", "mean", "cumsum", "flip", "roll", "repeat", "float", "double", "half", "bfloat16", "type_as",
    "movedim", "swapaxes", "unbind", "tile", "view_as", "reshape_as", "diagonal", "trace", "positive", "conj",
    "real", "imag", "data", "zero_", "mT", "T", "H", "mH", "requires_grad_", "retain_grad", "cpu", "cuda", "index_select", "gather",
})
# keep S(i) when every varying operand is that same S(i)
ELEMENTWISE = frozenset({"add", "sub", "mul", "div", "neg", "relu", "gelu", "silu", "tanh", "sigmoid", "exp", "log",
                         "sqrt", "rsqrt", "pow", "abs", "clone", "detach", "to", "contiguous", "where", "maximum",
                         "minimum", "clamp", "float", "double", "softplus", "square", "sin", "cos", "dropout",
                         "true_divide", "multiply", "subtract", "negative", "data", "real", "imag"})


def in_place_rule(op: str) -> str:
    """The rule of an in-place op is its out-of-place op's (``mul_`` is ``mul``): the value
    written is the same; whether its type may replace the destination's is checked apart."""
    if op.endswith("_") and not op.startswith("_"):
        base = op[:-1]
        if base in ADDITIVE or base in MULTILINEAR or base in UNARY_LINEAR or base in ELEMENTWISE:
            return base
    return op


def refuse_invariant_mix(op: str, axis: str, types: Sequence[LocalType]) -> None:
    """I mixes with no other type on an axis: its gradient stays I (never summed over the
    axis), where a use beside V, P or R data needs the sum. The fix names the ways out."""
    bases = {t.base for t in types}
    if "I" not in bases or len(bases) == 1:
        return
    other = next(t for t in types if t.base != "I")
    shown = ", ".join(repr(t) for t in types)
    to_i = {"R": f"spmd.reinterpret(y, {axis!r}, src=R, dst=I) the replicated one",
            "V": f"spmd.all_gather(y, {axis!r}, src=V, dst=I) the varying one",
            "P": f"spmd.all_reduce(y, {axis!r}, src=P, dst=I) the partial one"}[other.base]
    raise SpecError(f"{op} mixes I with {other!r} on mesh axis {axis!r} (arguments: {shown}): the invariant "
                    f"operand's gradient would not be summed over {axis!r}",
                    hint=f"make the invariant operand R: write {{R:{axis}}} in the type that made it (a type "
                    f"string leaves an unannotated axis I, e.g. torch_backend.redistribute's destination "
                    f"'f32[32@tp,16]' is I on {axis!r}; 'f32[32@tp,16]{{R:{axis}}}' is not), or "
                    f"spmd.reinterpret(x, {axis!r}, src=I, dst=R) it (its gradient is then all-reduced); "
                    f"or {to_i}")


def combine(op: str, axis: str, types: Sequence[LocalType], scalars: bool = False) -> LocalType:
    """The output type on ``axis`` of ``op`` applied to operands of ``types`` (typed tensors
    only); ``scalars``: the op also took a Python number (``x + 1`` is affine, not linear)."""
    bases = {t.base for t in types}
    if "I" in bases and len(bases) > 1:
        refuse_invariant_mix(op, axis, types)
    if "P" in bases:
        return _partial(op, axis, types, ", ".join(repr(t) for t in types), scalars)
    if bases == {"I"}:
        return I
    if "V" in bases:
        varying = {t for t in types if t.base == "V"}
        if len(varying) == 1 and op in ELEMENTWISE:
            return next(iter(varying))
        return V
    return R


def _partial(op: str, axis: str, types: Sequence[LocalType], shown: str, scalars: bool) -> LocalType:
    partial = [t for t in types if t.base == "P"]
    others = [t for t in types if t.base != "P"]
    reduce_first = f"spmd.all_reduce(x, {axis!r}, src=P, dst=R) first"
    if len({t.op for t in partial}) > 1 or (partial[0].op != "sum" and op not in UNARY_LINEAR):
        raise SpecError(f"{op} on mesh axis {axis!r} takes a pending {partial[0].op} (arguments: {shown}): only "
                        "shape ops keep a pending reduction other than a sum", hint=f"call {reduce_first}")
    if op in UNARY_LINEAR and len(types) == 1:
        return partial[0]
    if op in ADDITIVE:
        if others:
            raise SpecError(f"{op}(P, {others[0]!r}) on mesh axis {axis!r} (arguments: {shown}): adding to a "
                            "pending sum adds once per rank", hint=f"call {reduce_first}, or "
                            f"spmd.convert(y, {axis!r}, src={others[0]!r}, dst=P) the other operand")
        if scalars:
            raise SpecError(f"{op} of a pending sum and a number on mesh axis {axis!r}: the number would be "
                            "added once per rank", hint=f"call {reduce_first}")
        return P
    if op in MULTILINEAR:
        if len(partial) > 1:
            raise SpecError(f"{op}(P, P) on mesh axis {axis!r} (arguments: {shown}): a product of pending sums "
                            "is not the pending sum of the products", hint=f"call {reduce_first} on one operand")
        if others and any(t.base != "R" for t in others):
            bad = next(t for t in others if t.base != "R")
            raise SpecError(f"{op}(P, {bad!r}) on mesh axis {axis!r} (arguments: {shown}): a pending sum times a "
                            "varying value is not linear in the sum",
                            hint=f"call {reduce_first}, or spmd.all_gather the {bad!r} operand to R")
        if op in ("div", "true_divide") and types[0].base != "P":
            raise SpecError(f"{op} by a pending sum on mesh axis {axis!r} (arguments: {shown})",
                            hint=f"call {reduce_first} on the divisor")
        return P
    raise SpecError(f"{op} is not linear, so it cannot take a pending sum on mesh axis {axis!r} "
                    f"(arguments: {shown})", hint=f"call {reduce_first}")


def propagate(op: str, args: Sequence[Types], scalars: bool = False) -> Types:
    """The output types of ``op`` over every axis its typed arguments mention."""
    axes: list[str] = []
    for t in args:
        axes.extend(a for a in t if a not in axes)
    return {a: combine(op, a, [t[a] for t in args if a in t], scalars) for a in axes}


def einsum_types(op: str, eq: str, args: Sequence[Types], out_partial_axes: Sequence[str] = ()) -> Types:
    """The output types of einsum ``eq`` over operands of types ``args`` (global SPMD where an
    operand is S(i) on an axis, local SPMD elsewhere); ``out_partial_axes`` become P."""
    ins, out = _parse_eq(op, eq, len(args))
    axes: list[str] = [a for t in args for a in t]
    axes = list(dict.fromkeys(axes + list(out_partial_axes)))
    result: Types = {}
    for a in axes:
        refuse_invariant_mix(op, a, [t[a] for t in args if a in t])
        types = [t.get(a, R) for t in args]
        partial = a in out_partial_axes
        if any(t.kind == "S" for t in types):
            result[a] = _global(op, a, ins, out, types, partial)
            continue
        t = combine(op, a, [t[a] for t in args if a in t]) if any(a in t for t in args) else R
        if partial:
            if t.base not in ("V", "R"):
                raise SpecError(f"{op}: out_partial_axes names {a!r}, where the result is {t!r}",
                                hint="only a varying local result can be declared a pending sum")
            t = P
        result[a] = t
    return result


def _parse_eq(op: str, eq: str, n: int) -> tuple[list[str], str]:
    lhs, _, rhs = eq.replace(" ", "").partition("->")
    ins = lhs.split(",")
    if not _ or len(ins) != n or "." in eq:
        raise SpecError(f"{op}: the equation {eq!r} must be explicit ('ij,jk->ik') with one term per operand",
                        hint="write the output after '->', without '...'")
    return ins, rhs


def _global(op: str, a: str, ins: list[str], out: str, types: list[LocalType], partial: bool) -> LocalType:
    shown = ", ".join(repr(t) for t in types)
    for t in types:
        if t.base in ("I", "P") or t.kind == "V":
            raise SpecError(f"{op}: global SPMD operands on mesh axis {a!r} are S(i) or R, got {shown}",
                            hint="drop to local SPMD with spmd.local_map, or redistribute the operand first")
    labels = {ins[k][t.dim] for k, t in enumerate(types) if t.kind == "S" and t.dim is not None and t.dim < len(ins[k])}
    if len(labels) != 1:
        raise SpecError(f"{op}: operands shard different labels {sorted(labels)} on mesh axis {a!r} ({shown})",
                        hint="all_to_all one operand so both shard the same label")
    label = labels.pop()
    for k, t in enumerate(types):
        uses = label in ins[k]
        if uses and (t.dim is None or ins[k][t.dim] != label):  # only S carries a dim
            raise SpecError(f"{op}: label {label!r} is sharded on mesh axis {a!r} in one operand but operand {k} "
                            f"({ins[k]}: {t!r}) does not shard it there",
                            hint=f"spmd.convert(w, {a!r}, src=R, dst=S({ins[k].index(label)})) that operand")
    if label in out:
        if partial:
            raise SpecError(f"{op}: out_partial_axes names {a!r}, but {a!r} shards the kept label {label!r}",
                            hint=f"leave {a!r} out of out_partial_axes")
        return S(out.index(label))
    if not partial:
        raise SpecError(f"{op} contracts label {label!r}, which is sharded on mesh axis {a!r}: the local result "
                        "is only a partial sum (the SPMD type system never makes P implicitly)",
                        hint=f"pass out_partial_axes={a!r} (then spmd.all_reduce(y, {a!r}, src=P, dst=R)), or "
                        "all_gather the operands first")
    return P
