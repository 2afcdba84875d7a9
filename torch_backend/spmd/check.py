"""``typecheck()``: the SPMD type system's rules applied to ordinary torch ops (opt-in;
docs/spmd_types.md): a TorchFunctionMode typing each op's output by
``lowering.spmd.propagate``, or refusing the op before it runs. shardc's own calls run
unchecked: they type their results themselves.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from lowering.layout import group_ranks
from lowering.spmd.propagate import AFFINE, einsum_types, in_place_rule, propagate
from lowering.spmd.rules import RAW_COLLECTIVES, check_loss, raw_collective_types, raw_destination
from spec_lang.errors import SpecError
from torch_backend.spmd.mesh import mesh_context
from torch_backend.spmd.tags import type_grad, typed_number
from torch_backend.type_tags import TYPES, UNCHECKED, unchecked

# ops that read metadata, drive autograd or make a new tensor of the argument's shape only
# (``empty_like``: no value of it flows in): no type flows through them, their results are
# untyped (matched on the function's own name, dunders included)
_SKIP = frozenset({"__set__", "size", "dim", "numel", "item", "tolist", "__repr__", "__format__",
                   "__len__", "__bool__", "__hash__", "__iter__", "data_ptr", "is_contiguous", "stride",
                   "__reduce_ex__", "__deepcopy__", "__setstate__", "element_size", "storage_offset",
                   "untyped_storage", "register_hook", "_is_view", "requires_grad_",
                   "is_floating_point", "is_complex", "get_device", "nelement", "ndimension", "__contains__",
                   "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
                   "randint_like", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"})
# attributes whose value is the tensor's data seen another way: typed like the op of that name
# (``x.T`` is ``transpose``); every other attribute (shape, dtype, grad_fn, ...) is metadata,
# and ``x.grad`` has the gradient's type
STRUCTURAL_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real", "imag"})

# the autograd entry points, and where their gradient seed is: positional index, keywords.
# Without one, the seed is ones, sound only for a loss that is I or P on each axis.
_SEEDED = {"backward": (1, ("gradient", "grad_tensors")), "grad": (2, ("grad_outputs",))}


def op_name(func: Any) -> str:
    name = getattr(func, "__name__", None) or str(func)
    if name == "__get__":  # the attribute it reads (a getset descriptor's name, or a property's)
        owner = getattr(func, "__self__", None)
        return getattr(owner, "__name__", None) or getattr(getattr(owner, "fget", None), "__name__", "") or ""
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]
        if name.startswith(("r", "i")) and name[1:] in ("add", "sub", "mul", "truediv", "matmul"):
            name = name[1:]
    return {"truediv": "div"}.get(name, name)


# whether the innermost typecheck() is strict (spmd.einsum/linear read it too)
STRICT: ContextVar[bool] = ContextVar("spmd_strict", default=False)


def _tensors(args: Any, out: list, numbers: list) -> bool:
    """Collect the tensors of (nested) args and typed numbers' types; True for an untyped number."""
    scalar = False
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            scalar |= _tensors(a, out, numbers)
        elif isinstance(a, (int, float)) and not isinstance(a, bool):
            t = None if type(a) in (int, float) else getattr(a, TYPES, None)  # only a subclass carries types
            if t:
                numbers.append(t)
            else:
                scalar = True
    return scalar


# the in-place operators (``x += y``): they write their first argument, as ``add_`` does
_INPLACE_DUNDERS = frozenset(f"__i{n}__" for n in ("add", "sub", "mul", "truediv", "floordiv", "div", "matmul",
                                                      "pow", "mod", "and", "or", "xor", "lshift", "rshift"))


def check_written(op: str, raw: str, args: tuple, kwargs: dict, out_types: dict) -> None:
    """A typed tensor the op writes (``out=``, or in place) keeps its type: the result must agree."""
    if "out" in kwargs:
        where, dest = "its out= tensor", kwargs["out"]
    elif args and isinstance(args[0], torch.Tensor) and (
            raw in _INPLACE_DUNDERS or raw == "__setitem__" or (raw.endswith("_") and not raw.startswith("_"))):
        where, dest = "the tensor it writes in place", args[0]
    else:  # the op makes a new tensor
        return
    have = getattr(dest, TYPES, None) if isinstance(dest, torch.Tensor) else None
    for a, t in (have or {}).items():
        want = out_types.get(a)
        if want is not None and not t.agrees(want):
            raise SpecError(f"{op}: the result is {want!r} on mesh axis {a!r}, but {where} is {t!r}: a tensor's "
                            "type does not change in place (every other reference to it still reads it as "
                            f"{t!r})", hint="use the out-of-place op (y = x + v, no out=) for a result of the new "
                            f"type, or give the operands types whose result is {t!r} on {a!r}")


def _leaves(x: Any, where: str) -> Iterator[tuple[str, Any]]:
    if isinstance(x, (list, tuple)):
        for k, v in enumerate(x):
            yield from _leaves(v, f"{where}[{k}]")
    else:
        yield where, x


def _attach_all(out: Any, types: dict) -> Any:
    for _, o in _leaves(out, ""):
        if isinstance(o, torch.Tensor):
            setattr(o, TYPES, dict(types))
    return out


def refuse_untyped(op: str, args: tuple, kwargs: dict, typed: list[dict]) -> None:
    """Strict mode: refuse ``op`` if an argument (``out=`` aside) is an untyped tensor beside
    the ``typed`` ones, naming the first (``argument 0[2]``, ``argument 'weight'``)."""
    named = [(f"argument {k}", a) for k, a in enumerate(args)]
    named += [(f"argument {key!r}", a) for key, a in kwargs.items() if key != "out"]
    found = next(((where, x) for name, a in named for where, x in _leaves(a, name)
                  if isinstance(x, torch.Tensor) and not getattr(x, TYPES, None)), None)
    if found is None:
        return
    where, x = found
    axes = list(dict.fromkeys(a for t in typed for a in t))
    example = ", ".join(f"{a!r}: spmd.R" for a in axes)
    raise SpecError(f"strict typecheck: {op} takes an untyped tensor ({where}, shape {list(x.shape)}) beside typed "
                    f"ones (on mesh axes {', '.join(map(repr, axes))}): its SPMD types are unknown, so the op's "
                    "gradient cannot be checked (a parameter or buffer nobody typed?)",
                    hint=f"type it where it is made: spmd.assert_type(t, {{{example}}}) if every rank holds the "
                    "same value (V or S(i) if each holds its own block), or pass a Python number; "
                    "typecheck() without strict=True leaves untyped tensors unchecked")


class _TypeCheck(TorchFunctionMode):
    def __init__(self, strict: bool = False) -> None:
        super().__init__()
        self.strict = strict

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if UNCHECKED[0]:
            return func(*args, **kwargs)
        tensors: list = []
        numbers: list = []
        scalar = _tensors(args, tensors, numbers)
        if kwargs:  # tensors passed by keyword (weight=, other=) are operands too; out= is written
            _tensors([v for k, v in kwargs.items() if k != "out" and isinstance(v, torch.Tensor)], tensors, numbers)
        typed = [t for t in (getattr(x, TYPES, None) for x in tensors) if t]
        n_typed = len(typed)
        typed += numbers
        raw = getattr(func, "__name__", None)
        # a raw collective or a loss on untyped tensors: refused in strict mode (runs untouched outside it)
        if raw in RAW_COLLECTIVES:
            return _raw_collective(func, raw, args, kwargs, self.strict)
        if raw in _SEEDED:
            _check_seeds(raw, args, kwargs, self.strict)
            out = func(*args, **kwargs)
            if raw == "grad":  # each input's gradient has its gradient type, as x.grad does
                inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
                inputs = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs or ())
                for x, g in zip(inputs, out):
                    type_grad(x, g)
            return out
        if raw == "item" and typed:  # the number of a typed tensor keeps its types (V: it differs per rank)
            out = func(*args, **kwargs)
            return typed_number(out, typed[0]) if type(out) in (int, float) else out
        if not typed or raw in _SKIP:
            return func(*args, **kwargs)
        name = op_name(func)
        if raw == "__get__" and name not in STRUCTURAL_ATTRIBUTES:
            out = func(*args, **kwargs)
            if name == "grad":
                type_grad(args[0], out)
            return out
        if self.strict and n_typed < len(tensors):
            refuse_untyped(name, args, kwargs, typed)
        sharded = any(t.kind == "S" for d in typed for t in d.values())
        if name == "einsum" and sharded and args and isinstance(args[0], str):
            ops = args[1:] if not (len(args) == 2 and isinstance(args[1], (list, tuple))) else args[1]
            out_types = einsum_types(name, args[0], [getattr(x, TYPES, None) or {} for x in ops])
        elif name in ("matmul", "mm", "linear") and sharded:
            out_types = _matmul_types(name, tensors)
        elif name in AFFINE and len(tensors) == 3:  # bias + product: the product typed first
            ts = [getattr(x, TYPES, None) or {} for x in tensors]
            product = (_matmul_types("mm", tensors[1:]) if sharded and name == "addmm"
                       else propagate(AFFINE[name], [t for t in ts[1:] if t]))
            out_types = propagate(name, [t for t in (ts[0], product) if t])
        elif name == "linear" and len(tensors) > 2:  # x @ w.T + b: affine, the bias is an addition
            xw = propagate(name, [t for t in (getattr(x, TYPES, None) for x in tensors[:2]) if t])
            out_types = propagate("add", [xw, getattr(tensors[2], TYPES, None) or {}])
        elif name == "copy_" and len(tensors) == 2:  # the destination takes the source's value
            out_types = getattr(tensors[1], TYPES, None) or getattr(tensors[0], TYPES, None) or {}
        else:
            rule = in_place_rule(name) if name[-1] == "_" else name
            out_types = propagate(rule, typed, scalar and rule in ("add", "sub", "rsub", "setitem"))
        check_written(name, raw or "", args, kwargs, out_types)
        with unchecked():
            out = func(*args, **kwargs)
        if raw == "__setitem__":  # returns None: the types go on the tensor it wrote
            _attach_all(args[0], out_types)
            return out
        return _attach_all(out, out_types)


_signature = functools.cache(inspect.signature)


def _raw_collective(func: Any, name: str, args: tuple, kwargs: dict, strict: bool) -> Any:
    """A torch.distributed collective on a typed tensor: its output typed on the mesh axes its
    process group spans, or refused before it runs; a group that is no set of mesh axes, or
    an untyped input, is outside the checker (refused in strict mode)."""
    p = _signature(func).bind(*args, **kwargs).arguments
    inp = p.get("tensor", p.get("input", p.get("input_tensor")))
    if name == "all_gather":  # the list form: one output tensor per rank of the group
        outs = [(f"tensor_list[{k}]", o) for k, o in enumerate(p.get("tensor_list") or ())]
    else:  # an all_reduce writes its input
        outs = [] if name == "all_reduce" else [("output tensor", p.get("output", p.get("output_tensor")))]
    types = getattr(inp, TYPES, None) or {}
    if not types and not strict:  # an untyped input: outside the checker (its output too)
        return func(*args, **kwargs)
    axes = _group_axes(name, p.get("group"), strict)
    if axes is None:
        return func(*args, **kwargs)
    missing = [a for a in axes if a not in types]
    if strict and missing:
        refuse_untyped_collective(f"torch.distributed.{name}", inp, missing)
    if not types:
        return func(*args, **kwargs)
    op = p.get("op")
    reduce = None if op is None else getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
    if op is None and RAW_COLLECTIVES[name] in ("all_reduce", "reduce_scatter"):
        reduce = "SUM"
    new = raw_collective_types(name, reduce, axes, types)
    kept = [(o, raw_destination(name, axes, new, getattr(o, TYPES, None), where))
            for where, o in outs if isinstance(o, torch.Tensor)]
    result = func(*args, **kwargs)
    if name == "all_reduce":
        setattr(inp, TYPES, new)
    for o, t in kept:
        setattr(o, TYPES, t)
    return result


def refuse_untyped_collective(call: str, x: Any, axes: list[str]) -> None:
    shape = list(x.shape) if isinstance(x, torch.Tensor) else "?"
    example = ", ".join(f"{a!r}: spmd.P" for a in axes)
    raise SpecError(f"strict typecheck: {call} takes a tensor (shape {shape}) with no type on mesh axis "
                    f"{', '.join(map(repr, axes))}: its type there is unknown, so the collective's meaning (and "
                    "its gradient's) cannot be checked",
                    hint=f"type it where it is made, e.g. spmd.assert_type(x, {{{example}}}) for a pending sum "
                    "(R, I, V or S(i) as it is); typecheck() without strict=True leaves untyped tensors unchecked")


def _group_axes(name: str, group: Any, strict: bool) -> tuple[str, ...] | None:
    """The mesh axes whose group a process group is (``()``: one rank), else None (strict: a SpecError)."""
    try:
        ctx = mesh_context()
    except SpecError:
        raise SpecError(f"torch.distributed.{name} under typecheck(): the checker needs the "
                        "mesh to read its process group as mesh axes",
                        hint="wrap the code in `with spmd.use_mesh(mesh):`") from None
    ranks = set(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    names = ctx.mesh.names
    for k in range(len(names) + 1):
        for axes in itertools.combinations(names, k):
            if {ctx.global_rank(q) for q in group_ranks(ctx.mesh, axes, ctx.ranks[0])} == ranks:
                return axes
    if not strict:
        return None
    raise SpecError(f"strict typecheck: torch.distributed.{name}'s process group (ranks {sorted(ranks)}) is "
                    f"not the group of any set of axes of the mesh {ctx.mesh}, so its typing is unknown",
                    hint="use the group of mesh axes (a DeviceMesh's get_group(axis)), or the typed "
                    "spmd collectives; typecheck() without strict=True leaves such a call unchecked")


def _check_seeds(name: str, args: tuple, kwargs: dict, strict: bool) -> None:
    """``backward()``/``grad``: each output seeded with ones must be a loss they are the gradient
    of (strict: a typed one)."""
    at, keys = _SEEDED[name]
    seeds = args[at] if len(args) > at else next((kwargs[k] for k in keys if k in kwargs), None)
    outputs = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs or ())
    seeds = [seeds] if seeds is None or isinstance(seeds, torch.Tensor) else list(seeds)
    for k, out in enumerate(outputs):
        if (seeds[k] if k < len(seeds) else None) is None and isinstance(out, torch.Tensor):
            types = getattr(out, TYPES, None) or {}
            if strict and not types:
                raise SpecError(f"strict typecheck: {name}() of an untyped loss (shape {list(out.shape)}): its "
                                "implicit gradient (ones) is right only for a loss that is I or P on every "
                                "mesh axis, and its types are unknown",
                                hint="type the loss first, e.g. spmd.assert_type(loss, {'dp': spmd.P}) for "
                                "the ranks' pieces of a sum, or pass its gradient explicitly; typecheck() without "
                                "strict=True leaves an untyped loss unchecked")
            check_loss(name, types)


def linear_equation(ndim: int) -> str:
    batch = "abcdefgh"[: ndim - 1]
    return f"{batch}y,zy->{batch}z"


def _matmul_types(name: str, tensors: list) -> dict:
    a, b = tensors[0], tensors[1]
    ts = [getattr(t, TYPES, None) or {} for t in (a, b)]
    if name == "linear":
        out = einsum_types(name, linear_equation(a.ndim), ts)
        return propagate("add", [out, getattr(tensors[2], TYPES, None) or {}]) if len(tensors) > 2 else out
    if a.ndim < 2 or b.ndim < 2 or a.ndim != b.ndim:
        return propagate(name, [t for t in ts if t])
    batch = "abcdefgh"[: a.ndim - 2]
    return einsum_types(name, f"{batch}xy,{batch}yz->{batch}xz", ts)


def no_typecheck() -> AbstractContextManager[None]:
    """Run the scope's torch ops outside ``typecheck()`` (their results untyped)."""
    return unchecked()


@contextmanager
def typecheck(strict: bool = False) -> Iterator[None]:
    """Check every torch op in the scope against the SPMD type system's rules (opt-in; the
    same code runs, with the same numbers, without it). ``strict=True`` also refuses an op
    that takes typed and untyped tensors together (and ``spmd.einsum``/``linear`` an untyped
    operand): outside it, a parameter nobody typed passes silently."""
    if not isinstance(strict, bool):
        raise SpecError(f"typecheck(strict=...) takes a bool, got {type(strict).__name__}",
                        hint="spmd.typecheck(strict=True)")
    token = STRICT.set(strict)
    try:
        with _TypeCheck(strict):
            yield
    finally:
        STRICT.reset(token)
