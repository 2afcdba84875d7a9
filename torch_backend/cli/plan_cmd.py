"""``shardc plan``: compile a redistribution and print its program, cost and lower bound."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from spec_lang.errors import SpecError, locate
from torch_backend.cli.output import json_text, time_text

if TYPE_CHECKING:
    from lowering import CrossProgram, Program


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="source type, e.g. 'f32[8@(dp,tp),16]'")
    p.add_argument("dst", help="destination type, e.g. 'f32[8@(tp,dp),16]'")
    p.add_argument("--mesh", required=True, help="mesh, e.g. dp=2,tp=4 (over named global ranks: dp=2,tp=2@[8-11])")
    p.add_argument("--to-mesh", default=None, metavar="MESH",
                   help="lay DST out on this mesh instead (cross-mesh: the program runs over both meshes' ranks), "
                   "e.g. --mesh fsdp=4 --to-mesh rep=2,tp=2@[4-7]")
    p.add_argument("--json", action="store_true", help="print the program as JSON")
    p.add_argument("--engine", choices=("torch", "jax"), default="torch",
                   help="jax: plan with the JAX engine's measured cost model (unless one is given) and show "
                   "the program lowered to one jax.shard_map (its lax calls)")
    p.add_argument("--alpha", default=None,
                   help="latency per collective in seconds: one number for every axis, or dp=5e-6,tp=1e-6")
    p.add_argument("--beta", default=None,
                   help="seconds per byte: one number for every axis, or dp=1e-10,tp=2e-11")
    p.add_argument("--cost-model", default=None, metavar="PATH",
                   help="a cost model JSON file (what shardc calibrate --out writes) instead of --alpha/--beta")
    p.add_argument("--spare-axis-bytes", type=int, default=None, metavar="B",
                   help="bytes-first model: the charge for a collective over an axis both types "
                   "replicate (splitting a pending reduction pays only above it; default 64 KiB); "
                   "0 = pure bytes")
    p.add_argument("--budget", default=None, metavar="SECONDS",
                   help="the planner's search budget (default 0.05): past it, the best program found "
                   "comes back marked not proven optimal; more buys proofs and, on large meshes, "
                   "sometimes a cheaper program")
    p.add_argument("--gap-bytes", default=None, metavar="B",
                   help="bytes-first model: the search sets aside plans that could save at most B bytes "
                   "with as many collectives (default: 1/64 of --spare-axis-bytes, 1 KiB); 0 proves the "
                   "cheapest outright")


def _per_axis(text: str | None, flag: str, default: float) -> tuple[dict[str, float], float]:
    """``5e-6`` (every axis) or ``dp=5e-6,tp=1e-6``; the CostModel judges the values."""
    if text is None:
        return {}, default
    from lowering import CostModel

    hint = f"write {flag} 5e-6 or {flag} dp=5e-6,tp=1e-6"
    out: dict[str, float] = {}
    pos = 0
    try:
        if "=" not in text:
            value = float(text)
        else:
            for part in text.split(","):
                name, raw = part.split("=")
                if name.strip() in out:
                    raise SpecError(f"{flag} gives mesh axis {name.strip()!r} twice", text=text,
                                    pos=pos + part.index(name.strip()), hint=f"give each mesh axis one {flag} value")
                out[name.strip()] = float(raw)
                pos += len(part) + 1
            value = default
        given: dict[str, float] | float = out or value
        if flag == "--alpha":
            CostModel.make(alpha=given)
        else:
            CostModel.make(beta=given)
    except ValueError as e:  # float() or split(), or the CostModel's SpecError
        if isinstance(e, SpecError) and e.text is not None:
            raise
        message = f"bad {flag} value" + (f": {e.message}" if isinstance(e, SpecError) else "")
        at = locate(text, e.subject) if isinstance(e, SpecError) and e.subject else None
        raise SpecError(message, text=text, pos=at or 0, hint=hint) from None
    return out, value


def _budget(text: str | None) -> float:
    """``--budget`` in seconds, judged by the planner's own check."""
    from lowering.checks import check_budget
    from lowering.planner import DEFAULT_BUDGET_S

    if text is None:
        return DEFAULT_BUDGET_S
    hint = f"give seconds, e.g. --budget 0.5 (the default is {DEFAULT_BUDGET_S})"
    try:
        return check_budget(float(text), DEFAULT_BUDGET_S)
    except ValueError as e:  # float(), or check_budget's SpecError
        why = "not a number" if not isinstance(e, SpecError) else "it must be a positive, finite number of seconds"
        raise SpecError(f"bad --budget value: {why}", text=text, pos=0, hint=hint) from None


def _gap(text: str | None) -> int | None:
    """``--gap-bytes`` as an int (None: the planner's default), judged by the planner's own check."""
    from lowering.checks import check_gap_bytes
    from lowering.planner import DEFAULT_GAP_BYTES

    if text is None:
        return None
    try:
        return check_gap_bytes(int(text), DEFAULT_GAP_BYTES)
    except ValueError:  # int(), or check_gap_bytes's SpecError
        raise SpecError("bad --gap-bytes value: it must be a whole number of bytes >= 0", text=text, pos=0,
                        hint=f"give bytes, e.g. --gap-bytes 0 (the default is {DEFAULT_GAP_BYTES})") from None


def run(args: argparse.Namespace) -> int:
    from lowering import CostModel, CrossProgram, compile, lower_bound
    from lowering.cost import SPARE_AXIS_BYTES
    from spec_lang import parse_mesh

    mesh = parse_mesh(args.mesh)
    alpha, a0 = _per_axis(args.alpha, "--alpha", 0.0)
    beta, b0 = _per_axis(args.beta, "--beta", 1e-10)
    spare = SPARE_AXIS_BYTES if args.spare_axis_bytes is None else args.spare_axis_bytes
    if spare < 0:
        raise SpecError("--spare-axis-bytes must be >= 0", text=str(spare), pos=0,
                        hint="give a byte count, e.g. --spare-axis-bytes 0 for a pure bytes-first plan")
    model = CostModel.make(alpha, beta, a0, b0, spare)
    given = args.cost_model is not None or args.alpha is not None or args.beta is not None
    if args.engine == "jax" and not given and args.spare_axis_bytes is None:
        from jax_backend import default_cost_model

        model = default_cost_model(mesh)
    if args.cost_model is not None:
        if args.alpha is not None or args.beta is not None or args.spare_axis_bytes is not None:
            raise SpecError("--cost-model replaces --alpha, --beta and --spare-axis-bytes", text=args.cost_model,
                            pos=0, hint="give either a --cost-model file or the per-axis flags, not both")
        model = CostModel.load(args.cost_model)
    budget, gap = _budget(args.budget), _gap(args.gap_bytes)
    if args.to_mesh is not None and args.engine == "jax":
        raise SpecError("--engine jax plans on one mesh", text=args.to_mesh, pos=0,
                        hint="leave out --to-mesh, or plan the cross-mesh program with --engine torch")
    dst_mesh = None if args.to_mesh is None else parse_mesh(args.to_mesh)
    program = compile(args.src, args.dst, mesh, cost_model=model, budget_s=budget, gap_bytes=gap, dst_mesh=dst_mesh)
    prog: Program | CrossProgram = program
    if dst_mesh is None:
        lb = lower_bound(args.src, args.dst, mesh)
    else:  # the cross-mesh view: its text, JSON and the cross-mesh lower bound
        prog = CrossProgram(program)
        lb = prog.bound
    # the ratio compares like with like: the price and the bound both count, per rank, the
    # larger of what it sends and receives. A zero bound under a plan that moves bytes has no
    # finite ratio: JSON has no Infinity, so it says null there, and the text says why
    ratio = (prog.cost.bytes_max / lb) if lb else (1.0 if prog.cost.bytes_max == 0 else None)
    lowered: list[str] = []
    if args.engine == "jax":
        from jax_backend import describe

        lowered = describe(program)
    if args.json:
        print(json_text({"ok": True, **prog.to_json(), "lower_bound": lb, "ratio_to_lower_bound": ratio,
                         **({"jax": lowered} if args.engine == "jax" else {})}))
        return 0
    shown = f"{ratio:.2f}x" if ratio is not None else "none (the bound is 0 B)"
    print(prog)
    if dst_mesh is not None:
        print(f"  ratio to the bound: {shown}")
        return 0
    if lowered:
        print("\n".join(["  lowered to one jax.shard_map:", *("  " + line for line in lowered)]))
    print(f"  lower bound: {lb} B   ratio: {shown}")
    if given or args.engine == "jax":
        where = (f"the cost model {args.cost_model}" if args.cost_model is not None else "--alpha/--beta" if given
                 else "the JAX engine's measured cost model")
        print(f"  predicted time: {time_text(prog.cost.time_s).strip()} ({where})")
    if program.gap_bytes is None:
        print(f"  (a larger --budget than {budget:g} s searches further: it may prove this "
              "program cheapest or find a cheaper one)")
    elif not program.optimal:
        print("  (--gap-bytes 0 searches on until it proves the cheapest, within the same --budget)")
    return 0
