"""Which (src, dst) pairs each typed collective takes, and its backward (torch-free).

The SPMD type system's tables, as data: ``ALLOWED`` per collective (S(i) written ``S``),
``BACKWARD`` (the forward/backward table, row by row) and ``TRANSITIONS`` (the
operators from one local type to another, used to suggest the fix for a refused pair).
``check_pair`` refuses a pair before anything is built or sent.
"""

from __future__ import annotations

from spec_lang.errors import SpecError
from spec_lang.ir import INTEGER_DTYPES, Mesh
from spec_lang.local_type import LocalType

COLLECTIVES = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "reinterpret", "convert", "redistribute")

ALLOWED: dict[str, frozenset[tuple[str, str]]] = {
    "all_gather": frozenset({("V", "R"), ("V", "I"), ("S", "R"), ("S", "I")}),
    "all_reduce": frozenset({("P", "R"), ("P", "I")}),
    "reduce_scatter": frozenset({("P", "V"), ("P", "S")}),
    "all_to_all": frozenset({("V", "V"), ("S", "S")}),
    "reinterpret": frozenset({("R", "I"), ("I", "R"), ("R", "V"), ("I", "V"), ("V", "P"), ("R", "P"), ("I", "P")}),
    "convert": frozenset({("R", "I"), ("I", "R"), ("R", "V"), ("I", "V"), ("R", "S"), ("I", "S"),
                          ("R", "P"), ("I", "P"), ("V", "P"), ("S", "P")}),
    "redistribute": frozenset({("S", "R"), ("S", "I"), ("V", "R"), ("V", "I"), ("P", "R"), ("P", "I"), ("P", "S"),
                               ("P", "V"), ("S", "S"), ("R", "I"), ("I", "R"), ("R", "V"), ("I", "V"), ("R", "S"),
                               ("I", "S"), ("R", "P"), ("I", "P"), ("V", "P"), ("S", "P")}),
}

# redistribute(src, dst) runs this collective (semantics preserving, with communication),
# or, where the value is kept with none, the convert (R or I to anything, V or S(i) to P:
# they move no data)
REDISTRIBUTE = {("S", "R"): "all_gather", ("S", "I"): "all_gather", ("V", "R"): "all_gather", ("V", "I"): "all_gather",
                ("P", "R"): "all_reduce", ("P", "I"): "all_reduce", ("P", "S"): "reduce_scatter",
                ("P", "V"): "reduce_scatter", ("S", "S"): "all_to_all",
                **{pair: "convert" for pair in ALLOWED["convert"]}}

# forward (op, src, dst) -> backward (op, src, dst); S stands for S(i) on both sides
BACKWARD: dict[tuple[str, str, str], tuple[str, str, str]] = {
    ("all_gather", "V", "R"): ("reduce_scatter", "P", "V"),
    ("all_gather", "V", "I"): ("convert", "I", "V"),
    ("all_gather", "S", "R"): ("reduce_scatter", "P", "S"),
    ("all_gather", "S", "I"): ("convert", "I", "S"),
    ("all_reduce", "P", "R"): ("all_reduce", "P", "R"),
    ("all_reduce", "P", "I"): ("reinterpret", "I", "R"),
    ("reduce_scatter", "P", "V"): ("all_gather", "V", "R"),
    ("reduce_scatter", "P", "S"): ("all_gather", "S", "R"),
    ("all_to_all", "V", "V"): ("all_to_all", "V", "V"),
    ("all_to_all", "S", "S"): ("all_to_all", "S", "S"),  # with i and j swapped
    ("reinterpret", "R", "I"): ("convert", "I", "P"),
    ("reinterpret", "I", "R"): ("all_reduce", "P", "I"),
    ("reinterpret", "R", "V"): ("reinterpret", "V", "P"),
    ("reinterpret", "V", "P"): ("reinterpret", "R", "V"),
    ("reinterpret", "R", "P"): ("reinterpret", "R", "P"),
    ("convert", "R", "I"): ("convert", "I", "P"),
    ("convert", "I", "R"): ("all_reduce", "P", "I"),
    ("convert", "R", "V"): ("convert", "V", "P"),
    ("convert", "R", "S"): ("convert", "S", "P"),
    ("convert", "I", "V"): ("all_gather", "V", "I"),
    ("convert", "I", "S"): ("all_gather", "S", "I"),
    ("convert", "R", "P"): ("convert", "R", "P"),
    ("convert", "I", "P"): ("reinterpret", "R", "I"),
    ("convert", "V", "P"): ("convert", "R", "V"),
    ("convert", "S", "P"): ("convert", "R", "S"),
}

# the ways from one local type to another (the "comms by state transition" table)
TRANSITIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("R", "I"): ("reinterpret(R,I)",), ("R", "V"): ("reinterpret(R,V)", "convert(R,V)"),
    ("R", "P"): ("reinterpret(R,P)", "convert(R,P)"), ("I", "R"): ("reinterpret(I,R)",),
    ("I", "V"): ("reinterpret(I,V)", "convert(I,V)"), ("I", "P"): ("convert(I,P)",),
    ("V", "R"): ("all_gather(V,R)",), ("V", "I"): ("all_gather(V,I)",), ("V", "V"): ("all_to_all(V,V)",),
    ("V", "P"): ("reinterpret(V,P)", "convert(V,P)"), ("P", "R"): ("all_reduce(P,R)",),
    ("P", "I"): ("all_reduce(P,I)",), ("P", "V"): ("reduce_scatter(P,V)",),
}

_WHY = {
    "all_gather": "an all_gather collects varying blocks (V or S(i)) into a replicated (R) or invariant (I) value",
    "all_reduce": "an all_reduce finishes a pending reduction: its source is P and its result R or I",
    "reduce_scatter": "a reduce_scatter finishes a pending reduction (source P) into blocks (V or S(i))",
    "all_to_all": "an all_to_all trades a mesh axis for a tensor dim: V to V, or S(i) to S(j)",
    "reinterpret": "reinterpret keeps every local tensor: R <-> I, and R, I or V into V or P only",
    "convert": "convert keeps the value without communication: from R or I to anything, from V or S(i) "
               "to P; nothing leaves P without a collective",
    "redistribute": "redistribute keeps the value: with one collective V or S(i) to R or I, S(i) to S(j), and P "
                    "to R, I, V or S(i); with none (a convert) R or I to anything, V or S(i) to P",
}


def fix_for(src: LocalType, dst: LocalType) -> str:
    """The suggestion for a refused pair: the operators that go from src to dst."""
    a, b = src.base, dst.base
    if a == b:
        return "the types are the same" + ("; all_to_all moves the split to another dim" if a == "V" else "")
    ways = TRANSITIONS.get((a, b), ())
    if "S" in (src.kind, dst.kind):  # reinterpret takes no S(i)
        ways = tuple(w for w in ways if not w.startswith("reinterpret"))
    if not ways:
        return "no operator does this"
    calls = [f"spmd.{w.split('(')[0]}(x, axis, src={src!r}, dst={dst!r})" for w in ways]
    return f"from {src!r} to {dst!r} use " + " or ".join(calls)


# the ops whose tables put "-" on the diagonal: src == dst is nothing to do (the input is
# returned as it is), so a generic wrapper may pass src and dst through unchanged
IDENTITY_ON_DIAGONAL = ("reinterpret", "convert", "redistribute")


def check_pair(op: str, src: LocalType, dst: LocalType) -> str | None:
    """Refuse (SpecError) a pair ``op`` does not take; returns the routed collective for
    redistribute, and ``"identity"`` for ``src == dst`` where the op's table says nothing to do."""
    if op not in ALLOWED:
        raise SpecError(f"unknown typed collective {op!r}", hint=f"use one of {', '.join(COLLECTIVES)}")
    pair = (src.kind, dst.kind)
    if op in ("reinterpret",) and "S" in pair:
        raise SpecError(f"reinterpret(src={src!r}, dst={dst!r}) is not a valid pair: reinterpret does not take "
                        "S(i) (it keeps the local tensor, so S(i) would mean the same as V)",
                        hint=f"write V for the varying side, or use convert(src={src!r}, dst={dst!r})")
    if src == dst and op in IDENTITY_ON_DIAGONAL:
        return "identity"
    if op == "all_to_all" and pair == ("S", "S") and src == dst:
        raise SpecError(f"{op}(src={src!r}, dst={dst!r}) is not a valid pair: source and destination are equal",
                        hint="nothing to do; an all_to_all moves the split from one dim to another")
    if pair not in ALLOWED[op]:
        if op in ("all_reduce", "reduce_scatter") and src.base != "P":
            if src.base == "V":
                hint = "if each rank holds an addend, spmd.reinterpret(x, axis, src=V, dst=P) first"
            else:
                hint = f"{src!r} is the same on every rank: there is nothing to reduce"
                if src.base != dst.base:
                    hint += f"; {fix_for(src, dst)}"
            raise SpecError(f"{op}(src={src!r}, dst={dst!r}) is not a valid pair: {_WHY[op]}", hint=hint)
        if op == "convert" and src.base == "P":
            raise SpecError(f"convert(src={src!r}, dst={dst!r}) is not a valid pair: you cannot convert out of P, "
                            "only a collective finishes a pending reduction",
                            hint=f"use all_reduce(x, axis, src={src!r}, dst=R|I) or reduce_scatter(x, axis, "
                            f"src={src!r}, dst=S(i))")
        raise SpecError(f"{op}(src={src!r}, dst={dst!r}) is not a valid pair: {_WHY[op]}", hint=fix_for(src, dst))
    if src.kind == "P" and src.op != "sum" and op not in ("all_reduce", "reduce_scatter", "redistribute"):
        raise SpecError(f"{op}(src={src!r}, dst={dst!r}): only a collective takes P({src.op!r})",
                        hint="reduce it with all_reduce or reduce_scatter")
    if dst.kind == "P" and dst.op != "sum" and not (op == "reinterpret" and src.base in ("R", "I")):
        raise SpecError(f"{op}(src={src!r}, dst={dst!r}): only a pending sum is made this way",
                        hint="reinterpret R or I as P('avg'|'max'|'min') (equal copies reduce to the copy)")
    return REDISTRIBUTE.get(pair) if op == "redistribute" else op


def check_whole_average(op: str, src: LocalType, group: tuple[str, ...], types: dict[str, LocalType],
                        dtype: str, mesh: Mesh) -> None:
    """Refuse ``op`` (a routed collective) where it finishes an integer P('avg') over
    ``group`` while ``types`` (the tensor's types on every axis) keep it pending on other
    axes of 2+ ranks: integer division truncates, so dividing by part of the group now and
    by the rest later is not the average (``lowering.kinds.base.splits_integer_average``)."""
    if op not in ("all_reduce", "reduce_scatter") or src != LocalType("P", "avg") or dtype not in INTEGER_DTYPES:
        return
    kept = tuple(a for a in mesh.names if a not in group and types.get(a) == src)
    if mesh.group_size(group) > 1 and mesh.group_size(kept) > 1:
        every = tuple(a for a in mesh.names if a in group or a in kept)
        raise SpecError(f"spmd.{op} over {list(group)} finishes an integer P('avg') that stays pending over "
                        f"{list(kept)}: dividing by part of the group and later by the rest truncates twice",
                        hint=f"finish the average over all of its axes in one call: spmd.{op}(x, {every!r}, "
                        "src=P('avg'), dst=...)")


def backward_of(op: str, src: LocalType, dst: LocalType) -> tuple[str, LocalType, LocalType]:
    """The forward/backward table: the typed collective that computes ``op(src, dst)``'s gradient."""
    b_op, b_src, b_dst = BACKWARD[(op, src.kind, dst.kind)]

    def typed(letter: str, like: tuple[LocalType, ...]) -> LocalType:
        if letter != "S":
            return LocalType(letter)
        shard = [t for t in like if t.kind == "S"]
        return shard[0]

    if op == "all_to_all" and src.kind == "S":
        return b_op, dst, src
    return b_op, typed(b_src, (dst, src)), typed(b_dst, (src, dst))


def check_loss(op: str, types: dict[str, LocalType]) -> None:
    """Refuse ``op`` (``backward``, ``grad``) seeding a loss of ``types`` with ones: only I
    (the one value, its gradient 1 everywhere) and P (a pending sum, its gradient R: 1 on
    every rank) take that seed. R's gradient is P, so n ranks' ones are n times the
    gradient; V (or S(i)) has no one value: its ones differentiate the ranks' sum."""
    for a, t in types.items():
        if t.base == "R":
            raise SpecError(f"{op}() of a loss that is R on mesh axis {a!r}: its implicit gradient (1 on every "
                            f"rank) is a pending sum of one 1 per rank, so every gradient comes out scaled by "
                            f"the size of {a!r}",
                            hint=f"spmd.reinterpret(loss, {a!r}, src=R, dst=I) first (the loss is the same on "
                            "every rank: count it once)")
        if t.base == "V":
            raise SpecError(f"{op}() of a loss that is {t!r} on mesh axis {a!r}: a varying loss has no one value, "
                            "and seeding every rank's with 1 differentiates their sum (a loss computed alike on "
                            "every rank counts once per rank)",
                            hint=f"say what the ranks' losses make: spmd.reinterpret(loss, {a!r}, src=V, dst=P) "
                            f"if they add up to the loss, or spmd.all_gather(loss, {a!r}, src=V, dst=I) and "
                            "reduce it yourself")


# torch.distributed's collectives as the SPMD type system reads them (they record no
# autograd, so only the forward value is typed): what each takes on the group's mesh
# axes, and what its output is there
RAW_COLLECTIVES = {"all_reduce": "all_reduce", "all_gather": "all_gather", "all_gather_single": "all_gather",
                   "all_gather_into_tensor": "all_gather", "reduce_scatter_single": "reduce_scatter",
                   "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all"}
_RAW_REDUCE = {"SUM": "sum", "AVG": "avg", "MAX": "max", "MIN": "min"}


def raw_collective_types(name: str, reduce: str | None, group: tuple[str, ...],
                         types: dict[str, LocalType]) -> dict[str, LocalType]:
    """The output types of ``torch.distributed.<name>`` over the mesh axes ``group`` (its
    process group's) on an input of ``types``; SpecError where no typing is sound. ``reduce``:
    the ReduceOp's name (``SUM``, ...). Axes the input is untyped on stay untyped.

    all_reduce(P(op)) -> R and reduce_scatter(P(op)) -> S(0), with the ReduceOp of the
    pending reduction; all_gather_into_tensor(V or S(i)) -> R (blocks concatenated on dim 0,
    in group order), all_gather's list form alike (each element one rank's block);
    all_to_all_single(V or S(i)) -> V (R or I is refused, as ``spmd.all_to_all`` refuses it)."""
    kind = RAW_COLLECTIVES[name]
    call = f"torch.distributed.{name}"
    out = dict(types)
    for a in group:
        t = types.get(a)
        if t is None:
            continue
        if kind in ("all_reduce", "reduce_scatter"):
            op = _RAW_REDUCE.get(reduce or "")
            if op is None:
                raise SpecError(f"{call} with ReduceOp.{reduce} has no SPMD typing (on mesh axis {a!r}, the "
                                f"tensor is {t!r})", hint="use SUM, AVG, MAX or MIN on a matching P(op)")
            if t.base != "P":
                fix = (f"spmd.reinterpret(x, {a!r}, src=V, dst=P) first if each rank holds an addend"
                       if t.base == "V" else
                       f"there is nothing to reduce: the sum of its equal copies is n times it (spmd.reinterpret"
                       f"(x, {a!r}, src={t!r}, dst=P) first if that is what you mean)")
                raise SpecError(f"{call} of a tensor that is {t!r} on mesh axis {a!r}: a reduction finishes a "
                                "pending one (P)", hint=fix)
            if t.op != op:
                raise SpecError(f"{call} with ReduceOp.{reduce} of a tensor that is {t!r} on mesh axis {a!r}",
                                hint=f"reduce a P({t.op!r}) with ReduceOp.{t.op.upper()}")
            out[a] = LocalType("R") if kind == "all_reduce" else LocalType("S", dim=0)
        elif kind == "all_gather":
            if t.base != "V":
                raise SpecError(f"{call} of a tensor that is {t!r} on mesh axis {a!r}: a gather collects "
                                "varying blocks (V or S(i))",
                                hint=("reduce a pending sum with all_reduce or reduce_scatter" if t.base == "P"
                                      else f"it is the same on every rank already: nothing to gather over {a!r}"))
            out[a] = LocalType("R")
        else:
            if t.base == "P":
                raise SpecError(f"{call} of a tensor that is {t!r} on mesh axis {a!r}: exchanging the pieces "
                                "of a pending sum does not keep any sum",
                                hint=f"reduce it first (all_reduce or reduce_scatter over {a!r})")
            if t.base != "V":  # spmd.all_to_all(src=R|I) is refused alike
                raise SpecError(f"{call} of a tensor that is {t!r} on mesh axis {a!r}: an all_to_all exchanges "
                                "varying blocks (V or S(i)), as spmd.all_to_all does; every rank holds the same "
                                "value, so the pieces it sends are no rank's own",
                                hint=f"spmd.convert(x, {a!r}, src={t!r}, dst=S(d)) keeps this rank's block "
                                "without communication; or spmd.reinterpret(x, "
                                f"{a!r}, src={t!r}, dst=V) first if each rank's copy is to be sent as its own")
            out[a] = LocalType("V")
    return out


def raw_destination(name: str, group: tuple[str, ...], made: dict[str, LocalType],
                    declared: dict[str, LocalType] | None, label: str = "output tensor") -> dict[str, LocalType]:
    """The types of ``torch.distributed.<name>``'s output tensor after the call, whose input
    makes it ``made`` (``raw_collective_types``): a typed destination keeps its type, as an
    op's ``out=`` does, and a type that disagrees with ``made`` is refused (SpecError)
    before the call; its untyped axes take ``made``'s. A gather's result is equal on every
    rank, and a raw collective records no autograd, so its destination may say R or I
    on the group's axes."""
    out = dict(made)
    gather = RAW_COLLECTIVES[name] == "all_gather"
    for a, t in (declared or {}).items():
        want = made.get(a)
        if want is not None and not t.agrees(want) and not (gather and a in group and t.base in ("R", "I")):
            allowed = "R or I" if gather and a in group else repr(want)
            raise SpecError(f"torch.distributed.{name}: its {label} is {t!r} on mesh axis {a!r}, but the call "
                            f"makes it {allowed}: a typed destination keeps its type (every other reference to "
                            f"it still reads it as {t!r})",
                            hint=f"type the destination {allowed} on {a!r} (spmd.assert_type on a fresh tensor), "
                            "or leave it untyped: it then takes the call's types")
        out[a] = t
    return out
