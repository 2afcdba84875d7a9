"""Cross-mesh planning speed: programs between two meshes of ``--ranks`` ranks each (1,024 by default).

    python bench/cross_mesh_plan.py [--ranks 1024] [--runs 3] [--parts 3]

For each case of a fixed family it times

* ``compile``: ``lowering.compile(src, dst, mesh, dst_mesh=...)`` with every cache cleared
  first (``lowering.clear_caches()``), the median of ``--runs`` compiles;
* ``rank_part``: one rank's sends and receives (``CrossProgram.rank_part``), caches cleared
  first too, the median over ``--parts`` ranks (a source rank, a destination rank, a middle one);

and prints the program's point-to-point messages, the most a timed rank sends and receives
(``its msgs``: what its part's time follows), and the program's busiest rank's bytes against the
cross-mesh lower bound (``lowering.cross_mesh.cross_bound``). The cases, for ``n`` ranks a mesh
(``n`` a power of 4; the source on ranks ``0..n-1``, the destination on ``n..2n-1`` unless
stated):

* ``disjoint 2->4 axes``: ``f32[4n@a,4n@b]`` on ``a,b`` -> ``f32[4n@(p,q),4n@(r,s)]`` on ``p,q,r,s``;
* ``disjoint 4->2 axes``: ``f32[4n@(p,r),4n@(q,s)]`` -> ``f32[4n@b,4n@a]`` (transposed);
* ``reshape fsdp->dp,tp``: ``fsdp=n`` -> ``dp=8,tp=n/8`` over the same ranks;
* ``all-to-all``: ``f32[n@a,n]`` -> ``f32[n,n@b]``: every source rank sends to every
  destination rank (``n**2`` messages);
* ``replicated source``: ``f32[4n,4n@tp]`` on ``dp=8,tp=n/8`` -> ``f32[4n@x,4n]``;
* ``uneven dim``: ``f32[4n-3@x,256]`` -> ``f32[4n-3@b,256@c]``;
* ``pending sum``: ``f32[4n@dp,4n]{U:tp}`` on ``dp=8,tp=n/8`` -> ``f32[4n,4n@x]``.

Target (issue 29): every case compiles in under 100 ms at 1,024 ranks a mesh, and one
rank's part does not grow with the world (compare ``--ranks 1024`` and ``--ranks 4096``).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lowering
from lowering.cross_mesh import cross_bound
from spec_lang import parse, parse_mesh


def _axes(n: int, k: int) -> list[int]:
    """``n`` (a power of 2) as ``k`` axis sizes, as even as can be, larger first."""
    e = n.bit_length() - 1
    if n != 1 << e or e < k:
        raise SystemExit(f"--ranks must be a power of 2 of at least {1 << k}, got {n}")
    return [1 << (e // k + (i < e % k)) for i in range(k)]


def _mesh(names: str, sizes: Sequence[int], first: int | None = None) -> str:
    body = ",".join(f"{a}={s}" for a, s in zip(names, sizes, strict=True))
    if first is None:
        return body
    total = 1
    for s in sizes:
        total *= s
    return f"{body}@[{first}-{first + total - 1}]"


def cases(n: int) -> list[tuple[str, str, str, str, str]]:
    """(name, src, dst, mesh, dst_mesh) for meshes of ``n`` ranks each."""
    m = 4 * n
    a, b = _axes(n, 2)
    p4 = _axes(n, 4)
    tp = n // 8
    return [
        ("disjoint 2->4 axes", f"f32[{m}@a,{m}@b]", f"f32[{m}@(p,q),{m}@(r,s)]",
         _mesh("ab", (a, b)), _mesh("pqrs", p4, n)),
        ("disjoint 4->2 axes", f"f32[{m}@(p,r),{m}@(q,s)]", f"f32[{m}@b,{m}@a]",
         _mesh("pqrs", p4), _mesh("ab", (a, b), n)),
        ("reshape fsdp->dp,tp", f"f32[{m}@fsdp,{m}]", f"f32[{m}@dp,{m}@tp]",
         f"fsdp={n}", f"dp=8,tp={tp}"),
        ("all-to-all", f"f32[{n}@a,{n}]", f"f32[{n},{n}@b]", f"a={n}", _mesh("b", (n,), n)),
        ("replicated source", f"f32[{m},{m}@tp]", f"f32[{m}@x,{m}]", f"dp=8,tp={tp}", _mesh("x", (n,), n)),
        ("uneven dim", f"f32[{m - 3}@x,256]", f"f32[{m - 3}@b,256@c]", f"x={n}", _mesh("bc", (a, b), n)),
        ("pending sum", f"f32[{m}@dp,{m}]{{U:tp}}", f"f32[{m},{m}@x]", f"dp=8,tp={tp}", _mesh("x", (n,), n)),
    ]


def _ms(f: Callable[[], Any]) -> tuple[float, Any]:
    """Milliseconds of one cold call (caches cleared first), the garbage collector off."""
    lowering.clear_caches()
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter()
        out = f()
        return (time.perf_counter() - t) * 1e3, out
    finally:
        gc.enable()


def run(n: int, runs: int, parts: int, only: Sequence[str] = ()) -> list[dict[str, Any]]:
    rows = []
    for name, src, dst, mesh, dst_mesh in cases(n):
        if only and not any(o in name for o in only):
            continue
        compiles = []
        lowering.compile(src, dst, mesh, dst_mesh=dst_mesh)  # imports and first-call set-up, untimed
        for _ in range(runs):
            ms, prog = _ms(lambda: lowering.compile(src, dst, mesh, dst_mesh=dst_mesh))  # noqa: B023
            compiles.append(ms)
        view = lowering.CrossProgram(prog)  # the crossing's terms: its world, one rank's messages
        world = view.world
        part_ms, part_msgs = [], []
        for rank in [0, world - 1, world // 2 + 1][:parts]:
            ms, part = _ms(lambda: view.rank_part(rank))  # noqa: B023
            part_ms.append(ms)
            part_msgs.append(sum(len(x) for step in part for x in step))
        bound = cross_bound(parse(src), parse(dst), parse_mesh(mesh), parse_mesh(dst_mesh))
        rows.append({
            "case": name, "ranks": n, "src": src, "dst": dst, "mesh": mesh, "dst_mesh": dst_mesh,
            "messages": sum(s.messages() for s in view.steps),
            "steps": [s.kind for s in view.finish.steps] if view.finish else [],
            "rounds": [s.kind for s in view.steps],
            "compile_ms": statistics.median(compiles), "compile_ms_all": compiles,
            "rank_part_ms": statistics.median(part_ms), "rank_part_ms_all": part_ms,
            "rank_part_messages": part_msgs,
            "bytes": prog.cost.bytes_max, "bound": bound,
        })
    return rows


def _table(rows: Sequence[dict[str, Any]]) -> str:
    head = f"{'case':<22}{'ranks':>6}{'messages':>10}{'compile ms':>12}{'rank_part ms':>14}{'its msgs':>10}{'bytes':>12}{'bound':>12}{'ratio':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = r["bytes"] / r["bound"] if r["bound"] else 1.0
        lines.append(f"{r['case']:<22}{r['ranks']:>6}{r['messages']:>10}{r['compile_ms']:>12.1f}"
                     f"{r['rank_part_ms']:>14.2f}{max(r['rank_part_messages']):>10}{r['bytes']:>12}{r['bound']:>12}{ratio:>6.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024], help="ranks a mesh (powers of 4 or 2)")
    ap.add_argument("--runs", type=int, default=3, help="cold compiles a case (median)")
    ap.add_argument("--parts", type=int, default=3, help="ranks whose part is timed (median), at most 3")
    ap.add_argument("--only", nargs="*", default=(), help="cases whose name contains one of these")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for n in args.ranks:
        rows += run(n, args.runs, args.parts, args.only)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"cold compile and one rank's part, median ({os.cpu_count()} cores, load {load:.1f}):")
    print(_table(rows), flush=True)
    return rows


if __name__ == "__main__":
    main()
