"""Regenerate ``bench/cases/{redistribute,layouts}.jsonl`` from the live anchors.

The case definitions (mesh, types, DTensor placements, JAX PartitionSpecs, notes) live in
``bench/cases/*_inputs.jsonl``. Everything else in the output files is measured here,
now, by the anchors themselves:

* **DTensor** (torch's ``_redistribute`` planners on the fake process group, through
  ``bench.dtensor_planners``): the default and the min-cost plan, priced per rank, and
  whether running that plan under ``LocalTensorMode`` gives every rank its dst block.
* **JAX/XLA** (16 CPU devices, as many as the largest mesh): each rank's slices from
  ``devices_indices_map``; the collectives in the compiled HLO of a jitted reshard
  (``jax.sharding.reshard`` for even types, a ``with_sharding_constraint`` chain for
  uneven ones), priced with the cost model below, and whether the executable's output is
  right. Cases XLA cannot express get ``xla: null`` and an ``xla_reason``.
* **The byte lower bound**, counted element by element (on the cells that the src and
  dst boxes cut the tensor into), from the chunk rule written out here once more,
  independently of ``lowering``.

Cost model (bytes *sent* per rank, summed over steps, max over ranks; b: a rank's
input block, B: the whole operand of the collective on one rank)::

    all_gather (n-1)*b    reduce_scatter (n-1)/n*B    all_reduce 2(n-1)/n*B
    all_to_all (n-1)/n*B  collective-permute: the operand, when the rank moves data

Run from the repo root (about 2 minutes for all 140 cases on a busy 2-core machine)::

    python bench/regen_cases.py                      # everything
    python bench/regen_cases.py --only rd-pub-001    # some cases (the rest of the file is kept)
    python bench/regen_cases.py --what layouts --limit 5
"""

from __future__ import annotations

import os

_FLAGS = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _FLAGS:  # before jax is imported anywhere
    os.environ["XLA_FLAGS"] = (_FLAGS + " --xla_force_host_platform_device_count=16").strip()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chunk_rule import chunk_boxes, lower_bound, norm_boxes  # noqa: E402
from bench.xla_anchor import EXECUTE_MAX_NUMEL, jax_slices, xla_anchor  # noqa: E402
from spec_lang.ir import Mesh, TensorType  # noqa: E402
from spec_lang.parser import parse, parse_mesh  # noqa: E402

CASES_DIR = Path(__file__).resolve().parent / "cases"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- DTensor ----------------------------------------------------------------------------


def _src_blocks(src: TensorType, mesh: Mesh, full: np.ndarray) -> list[np.ndarray]:
    """Every rank's src block; a pending reduction holds the value on coordinate 0 (sum)
    or everywhere (avg, max, min), so that it reduces to ``full``."""
    part = [mesh.index(a) for a in src.partial_axes]
    out = []
    for r, box in enumerate(chunk_boxes(src, mesh)):
        b = full[tuple(slice(lo, hi) for lo, hi in box)].copy()
        if part and src.partial_op == "sum" and any(mesh.coords(r)[i] for i in part):
            b[...] = 0
        out.append(b)
    return out


def _reduced(dst: TensorType, mesh: Mesh, got: list[np.ndarray], r: int) -> np.ndarray:
    """What rank r's dst block stands for: its pending reduction carried out."""
    part = [mesh.index(a) for a in dst.partial_axes]
    if not part:
        return got[r]
    c = mesh.coords(r)
    peers = [q for q in range(mesh.size)
             if all(mesh.coords(q)[i] == c[i] for i in range(mesh.ndim) if i not in part)]
    s = np.stack([got[q] for q in peers])
    op = dst.partial_op
    return s.sum(0) if op == "sum" else s.mean(0) if op == "avg" else s.max(0) if op == "max" else s.min(0)


def dtensor_runs_right(planners: Any, case: dict[str, Any], planner: str) -> dict[str, Any]:
    """Run DTensor's plan under LocalTensorMode; check every rank's (reduced) dst block."""
    import torch
    import torch.distributed.tensor._redistribute as R
    from torch.distributed._local_tensor import LocalTensor, LocalTensorMode

    src_spec, dst_spec, s, m = planners.case_specs(case)
    d = parse(case["dst"])
    full = np.arange(s.numel, dtype=np.float64).reshape(s.shape) % 251
    blocks = _src_blocks(s, m, full)
    with LocalTensorMode(m.size) as lm:
        with lm.disable():
            x = LocalTensor({r: torch.tensor(b) for r, b in enumerate(blocks)})
        # DTensor's plan cache is not keyed by the planner: clear it, so the plan that runs
        # is the one priced
        R.clear_redistribute_planner_cache()
        R._gen_transform_infos.cache_clear()
        with R.use_min_cost_redistribution_plan(planner == "min_cost"):
            y = R.redistribute_local_tensor(x, src_spec, dst_spec)
        with lm.disable():
            got = [y._local_tensors[r].numpy() for r in range(m.size)]
    wrong = []
    for r, box in enumerate(chunk_boxes(d, m)):
        want = full[tuple(slice(lo, hi) for lo, hi in box)]
        have = _reduced(d, m, got, r)
        if have.shape != want.shape or not np.allclose(have, want):
            wrong.append(r)
    return {"correct": not wrong, **({"wrong_ranks": wrong} if wrong else {})}


def dtensor_anchor(planners: Any, case: dict[str, Any], planner: str) -> dict[str, Any]:
    plan = planners.plan(case, planner)
    if plan.error:
        return {"planner": planner, "error": plan.error, "correct": None}
    out: dict[str, Any] = {
        "planner": plan.algorithm, "bytes_sent_max": plan.bytes_sent_max,
        "bytes_sent_max_unpadded": plan.bytes_sent_max_unpadded, "collectives": plan.collectives,
        "steps": [{"op": st.op, "axes": list(st.axes), "n": st.n, "from": st.src, "to": st.dst,
                   "flattened": st.flattened, "bytes_max": st.bytes_max, "state_after": st.state_after}
                  for st in plan.steps],
        "correct": None,
    }
    if parse(case["src"]).numel <= EXECUTE_MAX_NUMEL:
        try:
            out.update(dtensor_runs_right(planners, case, planner))
        except Exception as e:
            out.update(correct=False, error=f"{type(e).__name__}: {e}")
    return out


# ---- drivers ------------------------------------------------------------------------------


def redistribute_case(planners: Any, case: dict[str, Any], with_xla: bool) -> dict[str, Any]:
    s, d, m = parse(case["src"]), parse(case["dst"]), parse_mesh(case["mesh"])
    out = {k: case[k] for k in ("id", "mesh", "src", "dst", "dtype_bytes", "note", "tags")}
    out["lower_bound"] = lower_bound(s, d, m)
    out["dtensor_default"] = dtensor_anchor(planners, case, "default")
    out["dtensor_min_cost"] = dtensor_anchor(planners, case, "min_cost")
    if with_xla:
        try:
            out["xla"], reason = xla_anchor(case)
        except Exception as e:
            out["xla"], reason = None, f"XLA run failed: {type(e).__name__}: {e}"
        if reason:
            out["xla_reason"] = reason
    out["anchor_inputs"] = case["anchor_inputs"]
    return out


def layout_case(planners: Any, case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    t, m = parse(case["type"]), parse_mesh(case["mesh"])
    chunk = norm_boxes(chunk_boxes(t, m))
    even = all(not d.axes or d.size % math.prod(m.axis_size(a) for a in d.axes) == 0 for d in t.dims)
    jax_boxes = jax_slices(t, m)
    out: dict[str, Any] = {"id": case["id"], "mesh": case["mesh"], "type": case["type"]}
    if even:
        if jax_boxes != chunk:
            raise AssertionError(f"{case['id']}: JAX and the chunk rule disagree on an even layout")
        out.update(slices=jax_boxes, source="jax.devices_indices_map")
    else:
        out.update(slices=[[list(x) for x in b] for b in chunk_boxes(t, m)], source="chunk-rule (uneven)",
                   xla_pad_rule_agrees=jax_boxes == chunk)
    inp = case["dtensor"]
    spec = planners.spec(m, t, inp["placements"], inp["shard_order"])
    strided = None
    if inp["shard_order"]:
        strided_pl = DTensorSpec._convert_shard_order_to_StridedShard(spec.shard_order, spec.placements, spec.mesh)
        strided = _placements_text(strided_pl)
    used = strided or inp["placements"]
    used_spec = planners.spec(m, t, used)
    full = torch.arange(float(t.numel)).reshape(t.shape)
    with LocalTensorMode(m.size) as lm:
        dt = distribute_tensor(full, used_spec.mesh, list(used_spec.placements), src_data_rank=None)
        with lm.disable():
            got = [dt.to_local()._local_tensors[r] for r in range(m.size)]
    matches = all(
        torch.equal(g, full[tuple(slice(lo, hi) for lo, hi in box)])
        for g, box in zip(got, chunk_boxes(t, m))
    )
    out["dtensor"] = {**inp, "strided_placements": strided, "placements_used": used, "matches": matches}
    return out


def _placements_text(placements: Sequence[Any]) -> str:
    from torch.distributed.tensor.placement_types import Partial, Shard, _StridedShard

    parts = []
    for p in placements:
        if isinstance(p, _StridedShard):
            parts.append(f"_S({p.dim},{p.split_factor})")
        elif isinstance(p, Shard):
            parts.append(f"S({p.dim})")
        elif isinstance(p, Partial):
            parts.append("P" if p.reduce_op == "sum" else f"P({p.reduce_op})")
        else:
            parts.append("R")
    return ",".join(parts)


def _merge(path: Path, fresh: list[dict[str, Any]], order: list[str]) -> None:
    """Write ``fresh`` over the matching ids of ``path``, in input order."""
    old = {c["id"]: c for c in read_jsonl(path)} if path.is_file() else {}
    old.update({c["id"]: c for c in fresh})
    path.write_text("".join(json.dumps(old[i]) + "\n" for i in order if i in old))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", choices=("all", "redistribute", "layouts"), default="all")
    ap.add_argument("--only", nargs="*", metavar="ID", help="only these case ids")
    ap.add_argument("--limit", type=int, help="only the first N cases of each file")
    ap.add_argument("--no-xla", action="store_true", help="keep XLA out (its fields are dropped)")
    ap.add_argument("--out", type=Path, default=CASES_DIR, help="where to write the jsonl files")
    args = ap.parse_args(argv)
    from bench.dtensor_planners import DTensorPlanners

    def pick(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
        chosen = [c for c in cases if not args.only or c["id"] in args.only]
        return chosen[:args.limit] if args.limit else chosen

    args.out.mkdir(parents=True, exist_ok=True)
    with DTensorPlanners() as planners:
        for what in ("redistribute", "layouts"):
            if args.what not in ("all", what):
                continue
            inputs = read_jsonl(CASES_DIR / f"{what}_inputs.jsonl")
            fresh = []
            for case in pick(inputs):
                t0 = time.monotonic()
                fresh.append(redistribute_case(planners, case, not args.no_xla) if what == "redistribute"
                             else layout_case(planners, case))
                print(f"{case['id']}: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
            _merge(args.out / f"{what}.jsonl", fresh, [c["id"] for c in inputs])
    return 0


if __name__ == "__main__":
    sys.exit(main())
