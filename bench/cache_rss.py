"""Cache memory: resident set size after many distinct compiles on 4,096-rank meshes.

Every ``lowering.compile`` caches world-sized arrays (layout boxes, per-rank bytes of each
priced move, per-rank shapes of each step). This bench compiles ``--count`` distinct,
seeded random redistributions on 4,096-rank meshes of six axes and prints the process's
RSS before and after, its peak, the compiles that raised the peak most (a search's own
working set, freed when it ends but kept by the allocator), the RSS after glibc's
``malloc_trim`` (what is live), and the bytes the caches say they hold; then
``lowering.clear_caches()`` and the RSS once more. The target is an RSS under 300 MiB
after 400 compiles.

    PYTHONPATH=. .venv/bin/python bench/cache_rss.py                 # 400 compiles
    PYTHONPATH=. .venv/bin/python bench/cache_rss.py --count 40      # quick
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lowering.planner import compile as shardc_compile
from spec_lang import format_type
from spec_lang.ir import Dim, Mesh, TensorType, U

MIB = 1 << 20
# 4,096 ranks each, six axes (the orders differ, so boxes and groups do too)
MESHES = (
    "dp=16,fsdp=4,cp=2,tp=8,ep=2,pp=2",
    "pp=2,dp=8,fsdp=8,cp=2,ep=2,tp=8",
    "dp=4,fsdp=16,ep=4,cp=2,tp=4,pp=2",
)


def rss_mib() -> tuple[float, float]:
    """(current, peak) resident set size of this process, MiB."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(rest.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def trim_rss() -> float | None:
    """RSS after glibc's ``malloc_trim(0)`` (None elsewhere): what is live, not what the
    allocator kept from a compile's transient peak."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        return None
    return rss_mib()[0]


def random_type(rng: random.Random, mesh: Mesh, shape: tuple[int, ...], partial_ok: bool) -> str:
    """A random layout of ``shape``: each mesh axis shards a dim, stays replicated, or
    (on the source) holds a pending sum."""
    per_dim: list[list[str]] = [[] for _ in shape]
    partial: list[str] = []
    for name in rng.sample(mesh.names, len(mesh.names)):
        r = rng.random()
        if r < 0.45:
            per_dim[rng.randrange(len(shape))].append(name)
        elif partial_ok and not partial and r < 0.5:
            partial.append(name)
    dims = tuple(Dim(size, tuple(axes)) for size, axes in zip(shape, per_dim, strict=True))
    return format_type(TensorType("f32", dims, tuple((a, U) for a in partial)), short_dtype=True)


def cases(count: int, seed: int) -> list[tuple[str, str, str]]:
    """``count`` distinct (src, dst, mesh) triples."""
    rng = random.Random(seed)
    meshes = [Mesh(tuple(a.split("=")[0] for a in m.split(",")), tuple(int(a.split("=")[1]) for a in m.split(",")))
              for m in MESHES]
    seen: set[tuple[str, str, str]] = set()
    out = []
    while len(out) < count:
        i = rng.randrange(len(MESHES))
        ndim = rng.choice((2, 3))
        shape = tuple(rng.choice((4096, 8192, 16384)) for _ in range(ndim))
        src = random_type(rng, meshes[i], shape, partial_ok=rng.random() < 0.1)
        dst = random_type(rng, meshes[i], shape, partial_ok=False)
        key = (src, dst, MESHES[i])
        if src != dst and key not in seen:
            seen.add(key)
            out.append(key)
    return out


def cache_bytes() -> int | None:
    """Bytes the lowering caches hold by their own estimate (None before they can say)."""
    try:
        from lowering.caching import cache_stats
    except ImportError:
        return None
    return sum(s.bytes for s in cache_stats())


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=400, help="distinct compiles (default 400)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    todo = cases(args.count, args.seed)
    gc.collect()
    before, _ = rss_mib()
    print(f"RSS before: {before:.0f} MiB  ({args.count} distinct compiles on 4,096 ranks)", flush=True)
    t0 = time.perf_counter()
    jumps: list[tuple[float, str]] = []  # (peak RSS growth during one compile, which)
    for k, (src, dst, mesh) in enumerate(todo, 1):
        peak0 = rss_mib()[1]
        shardc_compile(src, dst, mesh)
        jumps.append((rss_mib()[1] - peak0, f"{src} -> {dst} on {mesh}"))
        if k % 50 == 0 or k == len(todo):
            rss, peak = rss_mib()
            held = cache_bytes()
            extra = f", caches hold {held / MIB:.0f} MiB" if held is not None else ""
            print(f"  {k:4d} compiles  {time.perf_counter() - t0:6.1f} s  RSS {rss:.0f} MiB  "
                  f"(peak {peak:.0f}){extra}", flush=True)
    gc.collect()
    after, peak = rss_mib()
    held = cache_bytes()
    print(f"RSS after:  {after:.0f} MiB  peak {peak:.0f} MiB  ({time.perf_counter() - t0:.1f} s)")
    for grew, which in sorted(jumps, reverse=True)[:3]:
        print(f"  peak grew {grew:5.0f} MiB during one compile: {which}")
    trimmed = trim_rss()
    if trimmed is not None:
        print(f"RSS after malloc_trim (freed heap handed back): {trimmed:.0f} MiB")
    result = {"rss_before_mib": before, "rss_after_mib": after, "rss_peak_mib": peak}
    if trimmed is not None:
        result["rss_trimmed_mib"] = trimmed
    if held is not None:
        print(f"caches hold (their estimate): {held / MIB:.1f} MiB")
        result["cache_mib"] = held / MIB
        import lowering

        lowering.clear_caches()
        gc.collect()
        cleared, _ = rss_mib()
        print(f"RSS after lowering.clear_caches(): {cleared:.0f} MiB")
        result["rss_cleared_mib"] = cleared
    return result


if __name__ == "__main__":
    main()
