"""Global SPMD: ``einsum``/``linear`` with explicit partial outputs, and ``local_map``.

``spmd.linear(h, w, out_partial_axes="tp")`` is the row-parallel matmul of Megatron-style
tensor parallelism: ``h`` is S(1) and ``w`` S(1) on tp, the contracted label is sharded,
and the result is declared P on tp in one step (never implicitly)::

    h[:, A] @ w[:, A]^T      +y_A
    h[:, B] @ w[:, B]^T  =>  +y_B      (y = y_A + y_B + y_C)
    h[:, C] @ w[:, C]^T      +y_C
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from lowering.spmd.propagate import einsum_types, propagate
from spec_lang.errors import SpecError
from spec_lang.local_type import LocalType
from torch_backend.spmd.check import STRICT, linear_equation, refuse_untyped
from torch_backend.spmd.tags import is_jax_spec, local_form, spec_types, typeof
from torch_backend.tensor_checks import is_dtensor
from torch_backend.type_tags import TYPES, attach, unchecked


def _axes(out_partial_axes: str | Sequence[str] | None) -> tuple[str, ...]:
    if out_partial_axes is None:
        return ()
    if isinstance(out_partial_axes, str):
        return (out_partial_axes,)
    if isinstance(out_partial_axes, (list, tuple)) and all(isinstance(a, str) for a in out_partial_axes):
        return tuple(out_partial_axes)
    raise SpecError(f"out_partial_axes must be a mesh axis name or a list of names, got "
                    f"{type(out_partial_axes).__name__}", hint="e.g. out_partial_axes='tp' or ['dp', 'tp']")


def _operands(op: str, xs: Sequence[Any], names: Sequence[str] = (), shown: str | None = None) -> None:
    """The operands are local tensors (not DTensors); under ``typecheck(strict=True)`` an
    untyped one beside typed ones is refused (outside it, one is read as R)."""
    for i, x in enumerate(xs):
        if not isinstance(x, torch.Tensor) or is_dtensor(x):
            raise SpecError(f"spmd.{op}: {names[i] if i < len(names) else f'operand {i}'} must be "
                            f"a local torch.Tensor, got {type(x).__name__}",
                            hint="pass this rank's local tensors (for a DTensor, dt.to_local())")
    typed = [typeof(x) for x in xs if typeof(x)]
    if STRICT.get() and typed:
        refuse_untyped(shown or f"spmd.{op}", tuple(xs), {}, typed)


def _local_op(what: str, fn: Callable[..., torch.Tensor], *xs: Any) -> torch.Tensor:
    """``fn(*xs)`` untyped; torch's refusal of the blocks (the types passed) as a SpecError."""
    try:
        with unchecked():
            return fn(*xs)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as e:
        shapes = ", ".join(str(list(x.shape)) for x in xs if isinstance(x, torch.Tensor))
        raise SpecError(f"{what} cannot run on this rank's blocks of shapes {shapes}: {e}",
                        hint="every label (or the contracted dim) must have one size across the "
                        "operands' local blocks: check the shapes each rank holds") from None


def einsum(eq: str, *xs: torch.Tensor, out_partial_axes: str | Sequence[str] | None = None) -> torch.Tensor:
    """``torch.einsum`` whose result type follows the SPMD type system (global SPMD where an
    operand is S(i)); a contracted sharded label needs its axis in ``out_partial_axes``,
    which makes the result P there."""
    if not isinstance(eq, str):
        raise SpecError(f"spmd.einsum takes the equation first, a str, got {type(eq).__name__}",
                        hint="e.g. spmd.einsum('ij,jk->ik', x, w)")
    _operands("einsum", xs, shown=f"spmd.einsum({eq!r})")
    types = einsum_types("einsum", eq, [typeof(x) for x in xs], _axes(out_partial_axes))
    return attach(_local_op(f"einsum({eq!r})", lambda *a: torch.einsum(eq, *a), *xs), types)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *,
           out_partial_axes: str | Sequence[str] | None = None) -> torch.Tensor:
    """``x @ w.T (+ b)`` typed like ``einsum``. With a partial result, the bias must be added
    after the reduction (a replicated bias added to every rank's partial sum counts n times)."""
    _operands("linear", (x, w) if b is None else (x, w, b), ("x", "w", "b"))
    if x.ndim < 1 or w.ndim != 2:
        raise SpecError(f"linear takes x[..., in] and w[out, in], got {list(x.shape)} and {list(w.shape)}")
    types = einsum_types("linear", linear_equation(x.ndim), [typeof(x), typeof(w)], _axes(out_partial_axes))
    if b is not None:  # the bias' dim 0 is the output's last dim
        last = x.ndim - 1
        bias = {a: LocalType("S", dim=last) if t.kind == "S" and t.dim == 0 else t for a, t in typeof(b).items()}
        types = propagate("add", [types, bias])  # P + R is refused with the fix
    return attach(_local_op("linear", torch.nn.functional.linear, x, w, b), types)


def _view(x: torch.Tensor, types: dict[str, LocalType]) -> torch.Tensor:
    with unchecked():
        return attach(x.view_as(x), types)


def _is_spec(spec: Any) -> bool:
    """A leaf of in_types/out_types (a dict, a type string or a jax PartitionSpec), not a nest."""
    if isinstance(spec, (dict, str)):
        return True
    return not (spec is None or isinstance(spec, (list, tuple))) and is_jax_spec(spec)


def _check_specs(spec: Any, what: str) -> None:
    if spec is None or _is_spec(spec):
        return
    if isinstance(spec, (list, tuple)):
        for k, s in enumerate(spec):
            _check_specs(s, f"{what}[{k}]")
        return
    raise SpecError(f"local_map {what} is a {type(spec).__name__}: a slot holds a tensor's types (a dict "
                    "{axis: type}, a type string or a PartitionSpec), None for a non-tensor, or a list/tuple of "
                    "slots for a list/tuple argument", hint="e.g. in_types=({'tp': spmd.S(1)}, ({'tp': spmd.R}, None))")


# what differs between an argument entering local_map's region and an output leaving it:
# what a tensor given None would keep, an example, how the nest was given, whose shape the
# slots follow, what to do with a tensor
_SIDES = {
    "in_types": ("enter the region with its outer types", "{'tp': spmd.R} ({} for an untyped tensor)", "it is",
                 "the argument", "pass"),
    "out_types": ("leave the region with its inside types", "{'tp': spmd.S(0)}", "fn returned", "fn's result",
                  "return"),
}


def _slots(x: Any, spec: Any, where: str, key: str, leaf: Callable[[torch.Tensor, Any, str], Any]) -> Any:
    """``x`` matched against its ``key`` slot, nests slot by slot, each tensor through ``leaf``."""
    keeps, example, given, like, do = _SIDES[key]
    if spec is None:
        if isinstance(x, torch.Tensor):
            raise SpecError(f"local_map: {where} is a tensor, but {key} gives it None (for non-tensors): it "
                            f"would {keeps}", hint=f"give {where} its types, e.g. {example}")
        return x
    if not _is_spec(spec):  # a nest: x must be a list or tuple of as many
        if not isinstance(x, (list, tuple)) or len(x) != len(spec):
            got = f"a {type(x).__name__}" + (f" of {len(x)}" if isinstance(x, (list, tuple)) else "")
            raise SpecError(f"local_map: {key} gives {where} {len(spec)} slots, but {given} {got}",
                            hint=f"nest {key} like {like}: one slot per element")
        return type(x)(_slots(v, s, f"{where}[{k}]", key, leaf) for k, (v, s) in enumerate(zip(x, spec)))
    if not isinstance(x, torch.Tensor):
        raise SpecError(f"local_map: {where} is a {type(x).__name__}, but {key} gives it the types {spec!r}",
                        hint=f"{do} a tensor there, or put None in {key} for a non-tensor")
    return leaf(x, spec, where)


def _enter(x: torch.Tensor, spec: Any, where: str) -> torch.Tensor:
    """An argument as the region sees it: checked against its types, in their local form (S(i) is V)."""
    want, _ = spec_types(spec, x, f"local_map in_types of {where}")
    have = typeof(x)
    for a, t in want.items():
        if a in have and not have[a].agrees(t):  # V where S(i) is stated: refined to S(i)
            raise SpecError(f"local_map: {where} is {have[a]!r} on axis {a!r}, in_types says {t!r}",
                            hint="redistribute it first, or fix in_types")
    return _view(x, {**have, **local_form(want)})


def _enter_inferred(x: Any) -> Any:
    """An argument as the region sees it without in_types: its own types in local form."""
    if isinstance(x, (list, tuple)):
        return type(x)(_enter_inferred(v) for v in x)
    if not isinstance(x, torch.Tensor) or not typeof(x):
        return x
    return _view(x, local_form(typeof(x)))


def _leave(y: torch.Tensor, spec: Any, where: str) -> torch.Tensor:
    """An output of the region with its out_types (the global types)."""
    want, _ = spec_types(spec, y, f"local_map out_types of {where}")
    have = getattr(y, TYPES, None) or {}
    inside, stated = local_form(have), local_form(want)
    for a, t in want.items():
        if a in have and not inside[a].agrees(stated[a]):
            raise SpecError(f"local_map: {where} is {have[a]!r} on axis {a!r} inside, out_types says {t!r}",
                            hint="add the collective or convert inside fn, or fix out_types")
    return _view(y, {**have, **want})


def local_map(fn: Callable[..., Any], *, in_types: Sequence[Any] | None = None, out_types: Any) -> Callable[..., Any]:
    """Run ``fn`` in local SPMD on the axes the types name (shard_map per mesh axis): each
    tensor argument must have its ``in_types`` (S(i) turns into V inside), and each output
    leaves with its ``out_types`` (the global type; always stated: it says how each output
    reassembles). Without ``in_types`` each argument enters with the types it carries.

    A slot is a dict ``{axis: type}`` (``S(-1)`` counts from the tensor's last dim), a type
    string or a jax ``PartitionSpec``; ``None`` for a non-tensor; a list or tuple of slots
    for an argument (or output) that is a list or tuple of them, nested as deep as it is.
    ``out_types`` that is a list or tuple means fn returns that many outputs.
    """
    if in_types is not None and not isinstance(in_types, (list, tuple)):
        raise SpecError(f"local_map in_types is one slot per argument (a list or tuple), got "
                        f"{type(in_types).__name__}", hint="e.g. in_types=({'tp': spmd.S(1)},), or leave it out "
                        "to take the arguments' own types")
    if in_types is not None:
        _check_specs(list(in_types), "in_types")
    _check_specs(out_types, "out_types")
    ins = None if in_types is None else list(in_types)
    multi = isinstance(out_types, (list, tuple))
    outs = list(out_types) if multi else [out_types]

    def wrapped(*args: Any) -> Any:
        if ins is None:
            local_args = [_enter_inferred(x) for x in args]
        elif len(args) != len(ins):
            raise SpecError(f"local_map: {len(args)} arguments but {len(ins)} in_types",
                            hint="give one in_types entry per argument (None for non-tensors)")
        else:
            local_args = [_slots(x, want, f"argument {k}", "in_types", _enter) for k, (x, want) in enumerate(zip(args, ins))]
        result = fn(*local_args)
        got = list(result) if multi and isinstance(result, (list, tuple)) else [result]
        if len(got) != len(outs):
            raise SpecError(f"local_map: fn returned {len(got)} outputs but out_types has {len(outs)}")
        final = [_slots(y, want, f"output {k}", "out_types", _leave) for k, (y, want) in enumerate(zip(got, outs))]
        return type(result)(final) if multi else final[0]

    return wrapped
