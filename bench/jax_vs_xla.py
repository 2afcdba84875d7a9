"""shardc's programs in JAX against XLA's own resharding, on 8 CPU devices in one run.

Cases: every case of ``cases/redistribute.jsonl`` that JAX can express on 8 devices (even
types, a pending sum only a sum), plus large ones (>= 4 MiB per device). For each, in the
same process:

* shardc (``jax_backend.redistributor``: one ``shard_map`` of ``lax`` collectives) against
  ``jax.jit(jax.sharding.reshard)`` and ``jax.device_put`` to the destination sharding;
* bytes: the collectives of both compiled HLOs, priced by one formula
  (``bench.xla_anchor.hlo_collectives``: the bytes each sends, busiest rank), each
  against the lower bound (``lowering.lower_bound``);
* wall: the median of repeated calls of each compiled function, ``block_until_ready``,
  XLA's and shardc's calls interleaved, for ``--budget`` seconds at least;
* first call: shardc's plan, trace, compile and first run of a new pair against XLA's
  jit compile and first run of ``reshard``, the median of ``--first-reps`` tries of each
  (interleaved; shardc's caches emptied before each, XLA's jit a new function each time);
* outputs: equal to ``reshard``'s, block by block (a pending-sum destination: its sum);
  to ``device_put``'s where the source has no pending sum.

The recorded cases on 16-device meshes run after them in a second process with 16 host
devices (XLA fixes the device count when it loads, once a process): ``--devices 16`` runs
only those, ``--no-wide`` leaves them out.

Run from the repo root: ``python bench/jax_vs_xla.py`` (``--small`` for the recorded
cases only, ``--reps N``, ``--tiny-reps N`` for cases under 1 MiB, ``--budget S``: more
reps while a case's calls took under S seconds, ``--json out.json``).
"""

from __future__ import annotations

import os
import re
import sys


def _devices(argv: list[str]) -> int:
    """``--devices N`` from the command line, read before jax loads (it fixes the count)."""
    for i, a in enumerate(argv):
        if a.startswith("--devices"):
            return int(a.split("=", 1)[1] if "=" in a else argv[i + 1])
    return 8


DEVICES = _devices(sys.argv[1:]) if __name__ == "__main__" else 8
_FLAGS = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _FLAGS:  # before jax is imported anywhere
    os.environ["XLA_FLAGS"] = (_FLAGS + f" --xla_force_host_platform_device_count={DEVICES}").strip()

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

import jax_backend  # noqa: E402
import lowering  # noqa: E402
from bench.xla_anchor import hlo_collectives  # noqa: E402
from lowering.caching import clear_caches  # noqa: E402
from spec_lang import parse, parse_mesh, to_jax  # noqa: E402
from spec_lang.jax_interop import jax_refusal  # noqa: E402

CASES = Path(__file__).resolve().parent / "cases" / "redistribute.jsonl"
LARGE = [  # (id, mesh, src, dst): >= 4 MiB per device
    ("big-a2a-merged", "dp=4,tp=2", "f32[2048@(tp,dp),2048]", "f32[2048,2048@dp]"),
    ("big-psum-scatter", "dp=2,tp=4", "f32[2048,1024]{U:tp}", "f32[2048@tp,1024]"),
    ("big-psum-scatter-2", "dp=2,tp=4", "f32[2048,1024]{U:(dp,tp)}", "f32[2048@(dp,tp),1024]"),
    ("big-transpose", "dp=2,tp=4", "f32[4096@dp,4096@tp]", "f32[4096@tp,4096@dp]"),
    ("big-dim-move", "x=8", "f32[4096@x,2048]", "f32[4096,2048@x]"),
    ("big-gather", "dp=4,tp=2", "f32[2048@(dp,tp),2048]", "f32[2048@dp,2048]"),
]


def cases(small: bool, devices: int = 8) -> list[tuple[str, str, str, str]]:
    """The recorded cases JAX can express on meshes of up to 8 devices (and the large ones
    unless ``small``), or with ``devices`` > 8 those on meshes of 9 to ``devices``."""
    out = []
    for line in CASES.read_text().splitlines():
        c = json.loads(line)
        m = parse_mesh(c["mesh"])
        s, d = parse(c["src"]), parse(c["dst"])
        if not (m.size <= 8 if devices <= 8 else 8 < m.size <= devices) or jax_refusal(s, m) or jax_refusal(d, m):
            continue
        out.append((c["id"], c["mesh"], c["src"], c["dst"]))
    return out if small or devices > 8 else out + LARGE


def make_input(src: str, mesh: str, rng: np.random.Generator) -> jax.Array:
    """An array of type ``src``: small integers (sums exact in any float dtype), a pending
    sum with a different addend for each coordinate of its summed axes (equal copies
    elsewhere, as the type says)."""
    t, m = lowering.resolve(src, mesh)
    dtype = jax.numpy.dtype(t.dtype)
    summed = [m.index(a) for a in t.partial_axes]
    addends: dict[tuple[int, ...], np.ndarray] = {}
    blocks = []
    for r, sl in enumerate(lowering.local_slices(t, m)):
        key = tuple(m.coords(r)[i] for i in summed)
        addends.setdefault(key, rng.integers(-4, 5, size=t.shape).astype(dtype))
        blocks.append(addends[key][sl])
    return jax_backend.from_blocks(blocks, t, to_jax(t, m).mesh)


def warm_up() -> None:
    """One reshard and one shard_map compiled and run before the cases, so the first case's
    first call times neither side's loading of XLA's backend."""
    mesh = jax.make_mesh((len(jax.devices()),), ("w",), axis_types=(jax.sharding.AxisType.Explicit,))
    x = jax.device_put(np.zeros(len(jax.devices()), np.float32), NamedSharding(mesh, PartitionSpec("w")))
    with jax.set_mesh(mesh):
        jax.jit(lambda v: jax.sharding.reshard(v, NamedSharding(mesh, PartitionSpec()))).lower(x).compile()(x)
        n = x.shape[0]
        jax_backend.redistributor(f"f32[{n}@w]", f"f32[{n}]", mesh)(x).block_until_ready()


def hlo_bytes(compiled: Any, itemsize: int) -> int:
    return int(sum(st["bytes_max"] for st in hlo_collectives(compiled.as_text(), itemsize)))


blocks = jax_backend.blocks_of


def wall(fn: Any, x: jax.Array, reps: int, budget_s: float = 0.0) -> float:
    return walls([fn], x, reps, budget_s)[0]


BUDGET_S = 0.5  # seconds of calls (all functions together) a case is timed for at least
MAX_REPS = 2000


def walls(fns: list[Any], x: jax.Array, reps: int, budget_s: float = 0.0) -> list[float]:
    """The median time of each function, their calls interleaved (one of each per rep), so
    the load of the shared machine falls on all of them alike: ``reps`` reps, and more while
    the calls have taken less than ``budget_s`` in all (at most ``MAX_REPS``). A fast large
    case (big-gather: ~2-3 ms a call, +-50% on the shared machine) read 1.22x XLA's time as
    the median of the 3 calls its ``reps // 4`` gave it, and 0.98-1.01x over 100."""
    times: list[list[float]] = [[] for _ in fns]
    spent, done = 0.0, 0
    while done < reps or (spent < budget_s and done < MAX_REPS):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn(x).block_until_ready()
            ts.append(time.perf_counter() - t0)
            spent += ts[-1]
        done += 1
    return [statistics.median(ts) for ts in times]


def denoted(y: jax.Array, dst: str, mesh: Any) -> list[np.ndarray]:
    """A pending-sum destination's sum (the addends may sit on different ranks), else its blocks."""
    t = parse(dst)
    if not t.partial_axes:
        return blocks(y)
    plain = NamedSharding(mesh, PartitionSpec(*y.sharding.spec.partitions))
    with jax.set_mesh(mesh):
        return blocks(jax.jit(lambda v: jax.sharding.reshard(v, plain))(y))


def forget() -> None:
    """Empty shardc's caches (plans, tables, jitted programs: every ``cache_clear`` in
    ``lowering`` and ``jax_backend``, but the mesh's cost model, which a new pair on a known
    mesh finds loaded), so the next call of a pair is its first."""
    clear_caches()
    for name, module in list(sys.modules.items()):
        if name.startswith("jax_backend") and name != "jax_backend.default_model":
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()


def run_case(cid: str, mesh: str, src: str, dst: str, reps: int, rng: np.random.Generator,
             first_reps: int = 1, budget_s: float = 0.0) -> dict[str, Any]:
    x = make_input(src, mesh, rng)
    jm = x.sharding.mesh
    dst_sh = to_jax(dst, jm)
    s, _ = lowering.resolve(src, mesh)
    per_device = max(x.addressable_shards[0].data.nbytes, int(np.prod(lowering.local_shapes(dst, mesh)[0])) * s.itemsize)
    xla_firsts, mine_firsts = [], []
    with jax.set_mesh(jm):
        for i in range(first_reps):  # interleaved: the machine's load falls on both alike
            t0 = time.perf_counter()
            xla = jax.jit(lambda v: jax.sharding.reshard(v, dst_sh))
            xla_compiled = xla.lower(x).compile()
            ref = xla_compiled(x)
            ref.block_until_ready()
            xla_firsts.append(time.perf_counter() - t0)
            if i:
                forget()
            t0 = time.perf_counter()
            mine = jax_backend.redistributor(src, dst, jm)
            mine_compiled = mine.lower(x).compile()
            y = mine_compiled(x)
            y.block_until_ready()
            mine_firsts.append(time.perf_counter() - t0)
        xla_first, mine_first = statistics.median(xla_firsts), statistics.median(mine_firsts)
        equal = all(np.array_equal(a, b) for a, b in zip(denoted(y, dst, jm), denoted(ref, dst, jm)))
        equal = equal and y.sharding.is_equivalent_to(dst_sh, len(x.shape))
        put_equal = None
        t_put = None
        if not s.partial_axes:
            put = jax.device_put(x, dst_sh)
            put_equal = bool(np.array_equal(np.asarray(put), np.asarray(y))) if not parse(dst).partial_axes else None
            t_put = wall(lambda v: jax.device_put(v, dst_sh), x, reps, budget_s / 2)
        t_xla, t_mine = walls([xla_compiled, mine_compiled], x, reps, budget_s)
    program = lowering.compile(src, dst, mesh, cost_model=jax_backend.default_cost_model(lowering.resolve(src, mesh)[1]))
    return {
        "id": cid, "mesh": mesh, "src": src, "dst": dst, "per_device_bytes": per_device,
        "bound": lowering.lower_bound(src, dst, mesh),
        "xla_bytes": hlo_bytes(xla_compiled, s.itemsize), "shardc_bytes": hlo_bytes(mine_compiled, s.itemsize),
        "program": [st.describe() for st in program.steps],
        "xla_s": t_xla, "shardc_s": t_mine, "device_put_s": t_put,
        "xla_first_s": xla_first, "shardc_first_s": mine_first,
        "equal": bool(equal), "device_put_equal": put_equal,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="the recorded cases only")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tiny-reps", type=int, default=200, help="calls timed for a case under 1 MiB in all")
    ap.add_argument("--only", nargs="*", help="case ids")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--first-reps", type=int, default=3, help="first calls timed per case (the median)")
    ap.add_argument("--budget", type=float, default=BUDGET_S,
                    help="seconds of calls a case's wall times take at least (more reps where calls are fast)")
    ap.add_argument("--devices", type=int, default=8, help="16: only the recorded 16-device cases, on 16 host devices")
    ap.add_argument("--no-wide", action="store_true", help="leave out the 16-device cases (a second process)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices")
    warm_up()
    print(f"{'case':22} {'MiB/dev':>7} {'bound':>9} {'xla B':>9} {'shardc B':>9} {'xla ms':>8} {'shardc':>8} "
          f"{'ratio':>6} {'put ms':>8} {'1st x':>6} {'1st s':>6} eq")
    for cid, mesh, src, dst in cases(args.small, args.devices):
        if args.only and cid not in args.only:
            continue
        big = cid.startswith("big") or "4096" in src
        # a tiny case's call takes ~0.3 ms, where the shared machine's noise is +-30%: many
        # more calls, cheaply (--tiny-reps)
        t = lowering.resolve(src, mesh)[0]
        tiny = t.numel * t.itemsize < 2**20
        r = run_case(cid, mesh, src, dst, max(3, args.reps // 4) if big else
                     max(args.reps, args.tiny_reps) if tiny else args.reps, rng, 1 if big else args.first_reps,
                     args.budget)
        rows.append(r)
        put = f"{r['device_put_s'] * 1e3:8.3f}" if r["device_put_s"] is not None else f"{'-':>8}"
        print(f"{cid:22} {r['per_device_bytes'] / 2**20:7.2f} {r['bound']:9d} {r['xla_bytes']:9d} "
              f"{r['shardc_bytes']:9d} {r['xla_s'] * 1e3:8.3f} {r['shardc_s'] * 1e3:8.3f} "
              f"{r['shardc_s'] / r['xla_s']:6.2f} {put} {r['xla_first_s']:6.2f} {r['shardc_first_s']:6.2f} "
              f"{'ok' if r['equal'] and r['device_put_equal'] is not False else 'DIFF'}  {'; '.join(r['program'])}",
              flush=True)
    summary(rows)
    if args.devices <= 8 and not args.no_wide:
        rows += wide(args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def wide(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The 16-device cases, in a second process with 16 host devices; its rows."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "wide.json"
        cmd = [sys.executable, __file__, "--devices", "16", "--reps", str(args.reps), "--tiny-reps",
               str(args.tiny_reps), "--first-reps", str(args.first_reps), "--budget", str(args.budget),
               "--json", str(out)] + (["--only", *args.only] if args.only else [])
        flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", _FLAGS).strip()
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"XLA_FLAGS": flags}
        print("\nthe 16-device cases, in a second process:", flush=True)
        subprocess.run(cmd, check=True, env=env)
        return json.loads(out.read_text()) if out.exists() else []


def summary(rows: list[dict[str, Any]]) -> None:
    n = len(rows)
    print(f"\n{n} cases; outputs equal to reshard's: {sum(r['equal'] for r in rows)}/{n}; "
          f"to device_put's: {sum(r['device_put_equal'] is True for r in rows)}/"
          f"{sum(r['device_put_equal'] is not None for r in rows)}")
    print(f"bytes <= XLA's: {sum(r['shardc_bytes'] <= r['xla_bytes'] for r in rows)}/{n}; "
          f"XLA above the bound: {sum(r['xla_bytes'] > r['bound'] for r in rows)}, shardc fewer there: "
          f"{sum(r['shardc_bytes'] < r['xla_bytes'] for r in rows if r['xla_bytes'] > r['bound'])}; "
          f"shardc at the bound: {sum(r['shardc_bytes'] <= r['bound'] for r in rows)}/{n}")
    heavy = [r for r in rows if r["xla_bytes"] >= 1.5 * max(r["bound"], 1) and r["per_device_bytes"] >= 4 * 2**20]
    if heavy:
        print(f"wall, shardc / XLA reshard, median over the {len(heavy)} cases where XLA sends >= 1.5x the bound "
              f"at >= 4 MiB/device: {statistics.median(r['shardc_s'] / r['xla_s'] for r in heavy):.2f}")
    ratios = [r["shardc_s"] / r["xla_s"] for r in rows]
    worst = max(rows, key=lambda r: r["shardc_s"] / r["xla_s"])
    print(f"wall, shardc / XLA reshard: median {statistics.median(ratios):.2f} over all cases, "
          f"worst {max(ratios):.2f} ({worst['id']}); cases slower than 1.1x: {sum(x > 1.1 for x in ratios)}")
    firsts = [r["shardc_first_s"] / r["xla_first_s"] for r in rows]
    print(f"first call, shardc / XLA jit compile of reshard: median {statistics.median(firsts):.2f}, "
          f"worst {max(firsts):.2f}; over 2x: {sum(x > 2 for x in firsts)}")


if __name__ == "__main__":
    main()
