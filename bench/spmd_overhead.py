"""What the SPMD type system costs: the type checker per op, and collectives per typed call.

    python bench/spmd_overhead.py [--reps 200] [--json PATH|-]

(1) A 50-op model (elementwise ops, matmuls, a reduction, shape ops on small tensors,
mixing R, V and P operands as Megatron-style code does) timed three ways: plain tensors
with no typing, typed tensors under ``spmd.typecheck()``, and typed tensors with the
checker off (types attached, nothing reads them: erasure). The difference over 50 ops is
the checker's per-op overhead (target: under 20 us/op).

(2) The collectives each typed call issues, counted at ``torch_backend.comm`` under
LocalTensorMode on a fake 2x3 mesh: one per call, also over a tuple of axes (one
collective on the flattened group), where a per-axis design issues one per axis.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from torch_backend import spmd
from torch_backend.spmd import P, R, S, V

OPS = 50


def model(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Exactly 50 torch ops: x V[8,8], w V[8,8], r R[8], p P[8]."""
    for _ in range(5):  # 5 x 9 = 45 ops
        h = x @ w  # V
        h = h + r  # R, V -> V
        h = torch.relu(h)
        h = h * 0.5
        h = h.transpose(0, 1)
        h = h.contiguous()
        x = h - x
        q = p * r  # P * R -> P
        p = q + p  # P + P -> P
    s = x.sum(0)  # 46
    s = s.reshape(2, 4)  # 47
    s = s.flatten()  # 48
    t = p.neg()  # 49
    return s.mul(2.0), t  # 50


def _time(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def overhead(reps: int) -> dict:
    g = torch.Generator().manual_seed(0)
    plain = [torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g), torch.randn(8, generator=g),
             torch.randn(8, generator=g)]
    typed = [t.clone() for t in plain]
    for t, ty in zip(typed, (V, V, R, P)):
        spmd.assert_type(t, {"tp": ty, "dp": R})

    def checked() -> torch.Tensor:
        with spmd.typecheck():
            return model(*typed)

    t_plain = _time(lambda: model(*plain), reps)
    t_erased = _time(lambda: model(*typed), reps)
    t_checked = _time(checked, reps)
    return {"ops": OPS, "plain_us": t_plain * 1e6, "typed_off_us": t_erased * 1e6, "typecheck_us": t_checked * 1e6,
            "per_op_overhead_us": (t_checked - t_plain) * 1e6 / OPS, "target_us": 20.0}


def collective_counts() -> dict:
    import torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from torch_backend import comm

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=6)
    calls: list[str] = []
    originals = {n: getattr(comm, n) for n in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "p2p")}

    def spy(name):
        def f(*a, **k):
            calls.append(name)
            return originals[name](*a, **k)
        return f

    for n in originals:
        setattr(comm, n, spy(n))
    rows = []
    try:
        with LocalTensorMode(6) as lm, spmd.use_mesh("dp=2,tp=3"):
            def lt(shape):
                with lm.disable():
                    return LocalTensor({r: torch.ones(*shape) for r in range(6)})

            cases = [
                ("all_gather(S(0),R)", lambda a: spmd.all_gather(lt((2, 4)), a, src=S(0), dst=R)),
                ("all_reduce(P,R)", lambda a: spmd.all_reduce(lt((4,)), a, src=P, dst=R)),
                ("reduce_scatter(P,S(0))", lambda a: spmd.reduce_scatter(lt((12, 4)), a, src=P, dst=S(0))),
                ("all_to_all(S(0),S(1))", lambda a: spmd.all_to_all(lt((2, 12)), a, src=S(0), dst=S(1))),
                ("convert(R,S(0))", lambda a: spmd.convert(lt((12, 4)), a, src=R, dst=S(0))),
            ]
            for name, call in cases:
                for axes in ("tp", ("dp", "tp")):
                    calls.clear()
                    call(axes)
                    n_axes = len(axes) if isinstance(axes, tuple) else 1
                    per_axis = 0 if name.startswith("convert") else n_axes  # one collective per mesh axis
                    rows.append({"call": name, "axes": axes if isinstance(axes, str) else ",".join(axes),
                                 "collectives": len(calls), "per_axis_design": per_axis})
    finally:
        for n, f in originals.items():
            setattr(comm, n, f)
    return {"calls": rows}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    result = {"overhead": overhead(args.reps), **collective_counts()}
    if args.json == "-":
        print(json.dumps(result, indent=2))
        return result
    o = result["overhead"]
    print(f"{o['ops']}-op model, median of {args.reps}: plain {o['plain_us']:.1f} us, typed with typing off "
          f"{o['typed_off_us']:.1f} us, under typecheck() {o['typecheck_us']:.1f} us")
    print(f"typecheck() overhead: {o['per_op_overhead_us']:.2f} us/op (target < {o['target_us']:.0f} us/op)")
    print(f"{'typed call':<26}{'axes':<8}{'collectives':>12}{'per-axis design':>17}")
    for r in result["calls"]:
        print(f"{r['call']:<26}{r['axes']:<8}{r['collectives']:>12}{r['per_axis_design']:>17}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
