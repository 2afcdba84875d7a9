"""Run DTensor's own redistribute planners in-process and price their plans.

DTensor (torch 2.13) plans a redistribution in ``torch.distributed.tensor._redistribute``:

* ``_gen_transform_infos_non_cached(src_spec, dst_spec, use_graph_based_transform)``
  returns the per-mesh-dim ``_TransformInfo`` list. The *default* planner is the greedy
  one, except that a non-default shard order (or ``_StridedShard``) always switches to
  the graph (Dijkstra) planner. The *min-cost* planner is the graph planner, forced by
  ``use_min_cost_redistribution_plan(True)`` (``_FORCE_MIN_COST_REDISTRIBUTION_PLAN``).
* ``_optimize_transform_infos`` then merges consecutive same-type collectives into one
  collective on a flattened mesh, when such a mesh was created with ``_flatten()``.
  ``redistribute_local_tensor`` runs exactly these two calls, so we do too.

Everything runs on the fake process group (rank 0), as the recorded anchors did:
flattened meshes exist for every contiguous axis group, and the min-cost planner uses
DTensor's CPU topology default. Each transform is priced with the cost model of ``bench/regen_cases.py`` on
the *padded* local buffers DTensor hands to the collective, per rank, from the exact
per-rank layouts of shardc's layout algebra (``lowering.layout.boxes``):

=================  ====================================================================
all_gather         (n-1) * ceil(L/n) * (other local dims)   L: gathered dim after the step
reduce_scatter     (n-1) * ceil(L/n) * (other local dims)   L: scattered dim before the step
all_reduce         2(n-1)/n * B
all_to_all         (n-1) * ceil(L_old/n) * ceil(L_new/n) * (other local dims)
local (chunk, ...)  0
=================  ====================================================================

The unpadded figures use the true local sizes: (n-1)*b, (n-1)/n*B_in, 2(n-1)/n*B,
(n-1)/n*B_local. Run ``python bench/dtensor_planners.py`` to print both live planners
beside the figures recorded in ``bench/cases/redistribute.jsonl`` (a disagreement is flagged, never hidden).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lowering.layout import boxes
from lowering.placements import from_placements, parse_placements
from spec_lang.ir import Mesh, TensorType
from spec_lang.parser import parse, parse_mesh

REPO_ROOT = Path(__file__).resolve().parents[1]
CASES_PATH = REPO_ROOT / "bench" / "cases" / "redistribute.jsonl"
PLANNERS = ("default", "min_cost")
RECORDED_KEY = {"default": "dtensor_default", "min_cost": "dtensor_min_cost"}
_TORCH_DTYPES = {
    "float32": "float32", "float64": "float64", "float16": "float16", "bfloat16": "bfloat16",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8", "bool": "bool",
}


def load_cases(path: Path = CASES_PATH) -> list[dict[str, Any]]:
    """The redistribute cases, one dict per jsonl line."""
    if not path.is_file():
        raise FileNotFoundError(f"cases not found at {path} (run bench/regen_cases.py)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- results --------------------------------------------------------------------------


@dataclass(frozen=True)
class DTStep:
    """One transform of a DTensor plan, priced per rank (max over ranks)."""

    op: str  # all_gather | reduce_scatter | all_reduce | all_to_all | local
    axes: tuple[str, ...]
    n: int
    src: str
    dst: str
    flattened: bool
    bytes_max: int
    bytes_max_unpadded: int
    state_after: str


@dataclass(frozen=True)
class DTPlan:
    """A live DTensor plan for one case and planner, priced with the cost model of ``bench/regen_cases.py``."""

    planner: str  # "default" or "min_cost"
    algorithm: str  # "greedy" or "graph" (what DTensor really ran)
    steps: tuple[DTStep, ...] = ()
    bytes_sent_max: int = 0
    bytes_sent_max_unpadded: int = 0
    collectives: int = 0
    peak_bytes_max: int = 0
    reaches_dst: bool = True  # the final (symbolic) state lays out like dst
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Comparison:
    """Live figures beside the recorded ones for one planner."""

    planner: str
    live: DTPlan
    recorded: dict[str, Any] | None
    mismatches: list[str] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return not self.mismatches


# ---- the fake world -----------------------------------------------------------------


class DTensorPlanners:
    """DTensor's planners on the fake process group, one world size at a time.

    A new world size tears the previous fake group down (and every mesh and planner
    cache built on it) before it starts a fresh one. A fake group of the right size that
    someone else initialized is reused; one of another size is replaced and re-created
    (same size) on ``close``, so a caller's fake world survives a benchmark run.
    """

    def __init__(self) -> None:
        import torch  # noqa: F401 - fail early, with a clear error, when torch is absent

        self._owns_pg = False
        self._restore_size: int | None = None  # a fake world we replaced, re-created on close
        self._meshes: dict[Mesh, Any] = {}
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)

    # context manager -----------------------------------------------------------------
    def __enter__(self) -> DTensorPlanners:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Destroy the fake group this object created; re-create one it replaced."""
        import torch.distributed as dist

        self._forget_meshes()
        if self._owns_pg:
            if dist.is_initialized():
                dist.destroy_process_group()
            self._owns_pg = False
        if self._restore_size is not None and not dist.is_initialized():
            from torch.testing._internal.distributed.fake_pg import FakeStore

            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=self._restore_size)
        self._restore_size = None

    def _forget_meshes(self) -> None:
        import torch.distributed.tensor._redistribute as R
        from torch.distributed.tensor._collective_utils import MeshTopoInfo

        self._meshes.clear()
        R.clear_redistribute_planner_cache()
        R._gen_transform_infos.cache_clear()
        MeshTopoInfo.build_from_mesh.cache_clear()

    def _ensure_world(self, size: int) -> None:
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        if dist.is_initialized():
            if dist.get_world_size() == size and dist.get_backend() == "fake":
                return
            if dist.get_backend() != "fake":
                raise RuntimeError(
                    f"a {dist.get_backend()} process group is already initialized; "
                    "DTensor's planners run here on a fake one only"
                )
            if not self._owns_pg and self._restore_size is None:
                self._restore_size = dist.get_world_size()
            self._forget_meshes()
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
        self._owns_pg = True

    def device_mesh(self, mesh: Mesh | str) -> Any:
        """The named DeviceMesh, with a flattened mesh for every contiguous axis group."""
        m = parse_mesh(mesh)
        if m in self._meshes:
            return self._meshes[m]
        self._ensure_world(m.size)
        from torch.distributed.device_mesh import init_device_mesh

        dm = init_device_mesh("cpu", m.sizes, mesh_dim_names=m.names)
        for i in range(m.ndim):
            for j in range(i + 2, m.ndim + 1):
                dm[m.names[i:j]]._flatten()
        self._meshes[m] = dm
        return dm

    # specs ---------------------------------------------------------------------------
    def spec(self, mesh: Mesh | str, t: TensorType, placements: str,
             order: dict[str, Sequence[str]] | None = None) -> Any:
        """A DTensorSpec for ``placements`` (text such as ``S(0),R``) and an optional shard_order."""
        import torch
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry, TensorMeta
        from torch.distributed.tensor.placement_types import Partial, Replicate, Shard, _StridedShard

        m = parse_mesh(mesh)
        dm = self.device_mesh(m)
        specs = parse_placements(placements)
        pl: list[Any] = []
        for s in specs:
            if s.kind == "S":
                pl.append(Shard(s.dim))
            elif s.kind == "_S":
                pl.append(_StridedShard(s.dim, split_factor=s.split_factor))
            elif s.kind == "P":
                pl.append(Partial(s.op))
            else:
                pl.append(Replicate())
        stride = tuple(math.prod(t.shape[i + 1:]) for i in range(t.ndim))
        meta = TensorMeta(torch.Size(t.shape), stride, getattr(torch, _TORCH_DTYPES[t.dtype]))
        if any(s.kind == "_S" for s in specs):
            return DTensorSpec(dm, tuple(pl), tensor_meta=meta)
        explicit = {int(k): [m.index(a) if isinstance(a, str) else int(a) for a in v]
                    for k, v in (order or {}).items()}
        entries = []
        for d in range(t.ndim):
            mdims = explicit.get(d) or [i for i, s in enumerate(specs) if s.kind == "S" and s.dim == d]
            if mdims:
                entries.append(ShardOrderEntry(tensor_dim=d, mesh_dims=tuple(mdims)))
        return DTensorSpec(dm, tuple(pl), tensor_meta=meta, shard_order=tuple(entries))

    def case_specs(self, case: dict[str, Any]) -> tuple[Any, Any, TensorType, Mesh]:
        """(src spec, dst spec, src type, mesh) from a case's ``anchor_inputs.dtensor``."""
        m = parse_mesh(case["mesh"])
        t = parse(case["src"])
        inp = case["anchor_inputs"]["dtensor"]
        src = self.spec(m, t, inp["src"], inp.get("src_order"))
        dst = self.spec(m, t, inp["dst"], inp.get("dst_order"))
        return src, dst, t, m

    # planning ------------------------------------------------------------------------
    @staticmethod
    def transform_infos(src: Any, dst: Any, planner: str, *, cached: bool = False) -> list[Any]:
        """What ``redistribute_local_tensor`` plans: the transforms, merged onto flattened meshes."""
        import torch.distributed.tensor._redistribute as R

        graph = planner == "min_cost"
        with R.use_min_cost_redistribution_plan(graph):
            gen = R._gen_transform_infos if cached else R._gen_transform_infos_non_cached
            infos = gen(src, dst, graph)
        return R._optimize_transform_infos(infos, src.mesh, src.placements, dst.placements)

    @staticmethod
    def algorithm(src: Any, dst: Any, planner: str) -> str:
        """Which algorithm DTensor runs for this pair under ``planner``."""
        from torch.distributed.tensor._dtensor_spec import DTensorSpec
        from torch.distributed.tensor.placement_types import _StridedShard

        forced = not all(DTensorSpec.is_default_device_order(o) for o in (src.shard_order, dst.shard_order))
        forced |= any(isinstance(p, _StridedShard) for p in (*src.placements, *dst.placements))
        return "graph" if forced or planner == "min_cost" else "greedy"

    def plan(self, case: dict[str, Any], planner: str) -> DTPlan:
        """The live plan of ``planner`` ("default" or "min_cost") for a case, priced."""
        try:
            src, dst, t, m = self.case_specs(case)
            infos = self.transform_infos(src, dst, planner)
            return price_plan(infos, src, parse(case["dst"]), t, m, planner, self.algorithm(src, dst, planner))
        except Exception as e:
            return DTPlan(planner=planner, algorithm="?", error=f"{type(e).__name__}: {e}")

    def compare(self, case: dict[str, Any]) -> dict[str, Comparison]:
        """Both live planners beside the recorded figures."""
        return {p: compare_recorded(p, self.plan(case, p), case.get(RECORDED_KEY[p])) for p in PLANNERS}


# ---- pricing -----------------------------------------------------------------------------


def _placement_text(p: Any) -> str:
    from lowering.placements import as_spec

    s = str(as_spec(p))
    return "P" if s == "P(sum)" else s


def _state_type(placements: Sequence[Any], order: dict[int, list[int]], m: Mesh, t: TensorType) -> TensorType:
    """The shardc type of a DTensor state (placements + shard_order)."""
    named = {d: [m.names[i] for i in mdims] for d, mdims in order.items() if mdims}
    return from_placements(list(placements), m, t.shape, t.dtype, shard_order=named or None)


def _lengths(t: TensorType, m: Mesh) -> np.ndarray:
    b = boxes(t, m)
    return (b[:, :, 1] - b[:, :, 0]).astype(np.int64)


def _others(lengths: np.ndarray, skip: Sequence[int]) -> np.ndarray:
    keep = [d for d in range(lengths.shape[1]) if d not in skip]
    return np.prod(lengths[:, keep], axis=1) if keep else np.ones(lengths.shape[0], dtype=np.int64)


def _ceil_div(a: np.ndarray | int, b: int) -> np.ndarray:
    return -(-np.asarray(a, dtype=np.int64) // b)


def step_bytes(key: str | None, src_p: Any, dst_p: Any, pre: TensorType, post: TensorType,
               m: Mesh, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(padded, unpadded) bytes each rank sends in one DTensor transform."""
    item = pre.itemsize
    zero = np.zeros(m.size, dtype=np.int64)
    if key is None or n == 1:
        return zero, zero
    lpre, lpost = _lengths(pre, m), _lengths(post, m)
    numel = np.prod(lpre, axis=1)
    if key == "all_gather":
        d = src_p.dim
        padded = (n - 1) * _ceil_div(lpost[:, d], n) * _others(lpre, [d])
        return padded * item, (n - 1) * numel * item
    if key == "reduce_scatter":
        d = dst_p.dim
        padded = (n - 1) * _ceil_div(lpre[:, d], n) * _others(lpre, [d])
        return padded * item, _ceil_div((n - 1) * numel * item, n)
    if key == "all_reduce":
        b = _ceil_div(2 * (n - 1) * numel * item, n)
        return b, b
    if key == "all_to_all":
        a, b = src_p.dim, dst_p.dim
        padded = (n - 1) * _ceil_div(lpost[:, a], n) * _ceil_div(lpre[:, b], n) * _others(lpre, [a, b])
        return padded * item, _ceil_div((n - 1) * numel * item, n)
    raise ValueError(f"unknown collective {key!r}")


def price_plan(infos: Sequence[Any], src_spec: Any, dst: TensorType, t: TensorType, m: Mesh,
               planner: str, algorithm: str) -> DTPlan:
    """Walk DTensor's transforms, tracking placements + shard_order, and price each one."""
    import torch.distributed.tensor._redistribute as R
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    placements, order_t = src_spec.placements, src_spec.shard_order
    if src_spec.use_strided_shard_as_shard_order:
        placements, order_t = DTensorSpec._normalize_placements_into_shard_order(
            placements, src_spec.mesh, use_strided_shard_as_shard_order=True)
    cur = list(placements)
    order = R.DTensorRedistributePlanner._ShardOrder_to_dict(order_t)
    state = _state_type(cur, order, m, t)
    sent = np.zeros(m.size, dtype=np.int64)
    sent_unpadded = np.zeros(m.size, dtype=np.int64)
    peak = int(np.prod(_lengths(state, m), axis=1).max()) * t.itemsize
    steps: list[DTStep] = []
    collectives = 0
    for info in infos:
        flat = isinstance(info, R._FlattenedTransformInfo)
        mdims = tuple(info.original_mesh_dims) if flat else (info.mesh_dim,)
        n = math.prod(m.sizes[i] for i in mdims)
        src_p, dst_p = info.src_dst_placements
        R._update_shard_order_and_placements(info, cur, order)
        post = _state_type(cur, order, m, t)
        key = info._comm_type_key()
        padded, unpadded = step_bytes(key, src_p, dst_p, state, post, m, n)
        live = (np.prod(_lengths(state, m), axis=1) + np.prod(_lengths(post, m), axis=1)) * t.itemsize
        peak = max(peak, int(live.max()))
        is_coll = key is not None and n > 1
        collectives += int(is_coll)
        sent += padded
        sent_unpadded += unpadded
        steps.append(DTStep(
            op=key if is_coll else "local", axes=tuple(m.names[i] for i in mdims), n=n,
            src=_placement_text(src_p), dst=_placement_text(dst_p), flattened=flat,
            bytes_max=int(padded.max()), bytes_max_unpadded=int(unpadded.max()), state_after=str(post),
        ))
        state = post
    reaches = bool(np.array_equal(boxes(state, m), boxes(dst, m)))
    return DTPlan(
        planner=planner, algorithm=algorithm, steps=tuple(steps),
        bytes_sent_max=int(sent.max()) if steps else 0,
        bytes_sent_max_unpadded=int(sent_unpadded.max()) if steps else 0,
        collectives=collectives, peak_bytes_max=peak, reaches_dst=reaches,
    )


def compare_recorded(planner: str, live: DTPlan, recorded: dict[str, Any] | None) -> Comparison:
    """Flag every figure on which the live plan and the record disagree."""
    out = Comparison(planner, live, recorded)
    if live.error:
        out.mismatches.append(f"live planner failed: {live.error}")
        return out
    if recorded is None:
        out.mismatches.append("no recorded figures")
        return out
    for name, mine in (("bytes_sent_max", live.bytes_sent_max),
                       ("bytes_sent_max_unpadded", live.bytes_sent_max_unpadded),
                       ("collectives", live.collectives)):
        theirs = recorded.get(name)
        if theirs is not None and theirs != mine:
            out.mismatches.append(f"{name}: live {mine} vs recorded {theirs}")
    rec_ops = [s["op"] for s in recorded.get("steps", []) if s["op"] != "local"]
    live_ops = [s.op for s in live.steps if s.op != "local"]
    if rec_ops and rec_ops != live_ops:
        out.mismatches.append(f"collective sequence: live {live_ops} vs recorded {rec_ops}")
    return out


def plan_wall_time(planners: DTensorPlanners, src: Any, dst: Any, planner: str, *, cold: bool) -> float:
    """Seconds DTensor spends planning one redistribution (cold: planner caches cleared)."""
    import torch.distributed.tensor._redistribute as R

    if cold:
        R.clear_redistribute_planner_cache()
        R._gen_transform_infos.cache_clear()
    t0 = time.perf_counter()
    planners.transform_infos(src, dst, planner, cached=True)
    return time.perf_counter() - t0


# ---- CLI ------------------------------------------------------------------------------


def _fmt_plan(c: Comparison) -> str:
    if c.live.error:
        return "error"
    return f"{c.live.bytes_sent_max} / {c.live.collectives}"


def _fmt_recorded(c: Comparison) -> str:
    r = c.recorded
    return "—" if r is None else f"{r['bytes_sent_max']} / {r['collectives']}"


def iter_comparisons(cases: Sequence[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Comparison]]]:
    with DTensorPlanners() as planners:
        for case in cases:
            yield case, planners.compare(case)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Print live DTensor plans beside the recorded ones; return {case id: {planner: ...}}."""
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", nargs="*", help="only these case ids")
    ap.add_argument("--steps", action="store_true", help="print every live step")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON ('-' for stdout)")
    args = ap.parse_args(argv)
    cases = [c for c in load_cases() if not args.ids or c["id"] in args.ids]
    console = Console(width=None if sys.stdout.isatty() else 200, quiet=args.json == "-")
    table = Table(title="DTensor 2.13 planners, live vs recorded (bytes_sent_max / collectives)")
    for col in ("case", "mesh", "default live", "recorded", "min-cost live", "recorded", "agree"):
        table.add_column(col)
    results: dict[str, Any] = {}
    disagreements = 0
    for case, comp in iter_comparisons(cases):
        d, mc = comp["default"], comp["min_cost"]
        flags = [f"{p}: {m}" for p, c in comp.items() for m in c.mismatches]
        disagreements += bool(flags)
        table.add_row(case["id"], case["mesh"], _fmt_plan(d), _fmt_recorded(d), _fmt_plan(mc), _fmt_recorded(mc),
                      "yes" if not flags else "[red]NO[/red]: " + "; ".join(flags))
        results[case["id"]] = {p: {"live": c.live.to_json(), "mismatches": c.mismatches} for p, c in comp.items()}
        if args.steps:
            for p, c in comp.items():
                for s in c.live.steps:
                    console.print(f"  {case['id']} {p}: {s.op}({','.join(s.axes)}) {s.src}->{s.dst} "
                                  f"{s.bytes_max} B -> {s.state_after}")
    console.print(table)
    console.print(f"{len(cases)} cases, {disagreements} with a disagreement between live and recorded figures")
    if args.json:
        text = json.dumps(results, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)
    return results


if __name__ == "__main__":
    main()
    sys.exit(0)
