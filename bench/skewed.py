"""The skewed family: random S/R pairs where few ranks hold the data and many need it.

Batch-1 inference, a vocabulary dim smaller than the TP degree and MoE experts with few
tokens shard a small dim over many ranks, so most of them hold nothing; a replicated source
over a few axes leaves the rest of the mesh to be served by those replicas. Each case: a
mesh of 2-4 axes (1-8 ranks each, at most 64 in all), 1-3 dims of 1-32 elements, a source
that replicates 1-3 axes and shards each dim over up to 4 of the others, a destination
drawn freely (S/R, no pending reductions).

The bound is independent of ``lowering``: the chunk rule (torch.chunk, major axis first)
written out here, each element's holders and needers from it, and the larger of

* what the neediest rank lacks (it must receive all of it);
* for the elements held by one set H of ranks (a sole holder: |H| = 1) and needed outside
  it, ceil(count / |H|): every one must leave H once, so H's busiest member sends that.

A program's price (``Cost.bytes_max``: per rank and step the larger of sent and received)
can never be below it. ``baseline_programs`` compiles the same cases with the code of
another git revision (``main`` by default) in a subprocess, and reprices its steps with
this tree's step kinds, so both plans are measured alike.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("x", "y", "z", "w")
DTYPES = (("f32", 4), ("bf16", 2), ("i64", 8), ("i32", 4))


# ---- the family ----------------------------------------------------------------------------


def skewed_case(rng: np.random.Generator) -> tuple[str, str, str]:
    """One (mesh, src, dst) as text, from ``rng`` alone."""
    while True:
        n = int(rng.integers(2, 5))
        sizes = [int(rng.choice((1, 2, 2, 3, 4, 4, 5, 8))) for _ in range(n)]
        if math.prod(sizes) <= 64 and math.prod(sizes) > 1:
            break
    names = list(NAMES[:n])
    ndim = int(rng.integers(1, 4))
    shape = [int(round(2 ** rng.uniform(0, 5))) for _ in range(ndim)]  # log-uniform 1-32: small dims often
    order = [str(a) for a in rng.permutation(names)]
    rep = int(rng.integers(1, min(3, n - 1) + 1)) if n > 1 else 0
    src_dims: list[list[str]] = [[] for _ in shape]
    for a in order[rep:]:
        k = int(rng.integers(0, ndim))
        if len(src_dims[k]) < 4:
            src_dims[k].append(a)
    dst_dims: list[list[str]] = [[] for _ in shape]
    for a in (str(x) for x in rng.permutation(names)):
        k = int(rng.integers(-1, ndim))
        if k >= 0 and len(dst_dims[k]) < 4:
            dst_dims[k].append(a)
    dtype = DTYPES[int(rng.integers(0, len(DTYPES)))][0]
    mesh = ",".join(f"{a}={s}" for a, s in zip(names, sizes))
    return mesh, _text(dtype, shape, src_dims), _text(dtype, shape, dst_dims)


def _text(dtype: str, shape: Sequence[int], dims: Sequence[Sequence[str]]) -> str:
    def one(size: int, axes: Sequence[str]) -> str:
        if not axes:
            return str(size)
        return f"{size}@{axes[0]}" if len(axes) == 1 else f"{size}@({','.join(axes)})"

    return f"{dtype}[{','.join(one(s, a) for s, a in zip(shape, dims))}]"


def skewed_cases(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(seed)
    return [skewed_case(rng) for _ in range(n)]


# ---- the independent bound -----------------------------------------------------------------


def _parse(mesh: str, t: str) -> tuple[list[str], list[int], int, list[int], list[list[str]]]:
    """(mesh names, sizes, itemsize, shape, axes per dim) of this family's text forms."""
    names = [p.split("=")[0] for p in mesh.split(",")]
    sizes = [int(p.split("=")[1]) for p in mesh.split(",")]
    dtype, body = t.split("[", 1)
    item = dict(DTYPES)[dtype]
    shape, dims = [], []
    for part in _split_dims(body.rstrip("]")):
        size, _, axes = part.partition("@")
        shape.append(int(size))
        dims.append([a for a in axes.strip("()").split(",") if a] if axes else [])
    return names, sizes, item, shape, dims


def _split_dims(body: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    return out + [cur]


def chunk_boxes(names: Sequence[str], sizes: Sequence[int], shape: Sequence[int],
                dims: Sequence[Sequence[str]]) -> np.ndarray:
    """(world, ndim, 2) [start, stop) per rank: torch.chunk of each dim over its axes, major first."""
    world = math.prod(sizes)
    coords = np.array(np.unravel_index(np.arange(world), sizes)).T.reshape(world, len(sizes))
    out = np.zeros((world, len(shape), 2), dtype=np.int64)
    for r in range(world):
        for d, (size, axes) in enumerate(zip(shape, dims)):
            start, length = 0, size
            for a in axes:
                i = names.index(a)
                n, c = sizes[i], int(coords[r, i])
                chunk = -(-length // n)
                lo, hi = min(c * chunk, length), min((c + 1) * chunk, length)
                start, length = start + lo, hi - lo
            out[r, d] = (start, start + length)
    return out


def independent_bound(mesh: str, src: str, dst: str) -> int:
    """Bytes, at least, of the busiest rank's price in any program ``src -> dst`` (S/R)."""
    names, sizes, item, shape, sdims = _parse(mesh, src)
    _, _, _, _, ddims = _parse(mesh, dst)
    sb, db = chunk_boxes(names, sizes, shape, sdims), chunk_boxes(names, sizes, shape, ddims)
    cuts = [np.unique(np.concatenate([[0, n], sb[:, i].ravel(), db[:, i].ravel()])) for i, n in enumerate(shape)]
    cell = np.ones(tuple(len(c) - 1 for c in cuts), dtype=np.int64)
    for i, c in enumerate(cuts):
        view = [1] * len(cuts)
        view[i] = len(c) - 1
        cell = cell * np.diff(c).reshape(view)

    def covers(boxes: np.ndarray) -> np.ndarray:
        out = np.zeros((len(boxes),) + cell.shape, dtype=bool)
        for r, box in enumerate(boxes):
            idx = tuple(slice(int(np.searchsorted(c, lo)), int(np.searchsorted(c, hi))) for c, (lo, hi) in zip(cuts, box))
            out[(r,) + idx] = True
        return out

    held, need = covers(sb), covers(db)
    lacks = int(max(((need & ~held) * cell).reshape(len(sb), -1).sum(axis=1), default=0))
    holders = held.reshape(len(sb), -1).T  # (cells, world)
    needers = (need & ~held).reshape(len(sb), -1).T
    sizes_flat = cell.reshape(-1)
    by_set: dict[bytes, list[int]] = {}
    for k in range(holders.shape[0]):
        if needers[k].any():  # needed by a rank outside its holders (a holder never lacks it)
            key = np.packbits(holders[k]).tobytes()
            by_set.setdefault(key, [int(holders[k].sum()), 0])[1] += int(sizes_flat[k])
    leave = max((-(-count // h) for h, count in by_set.values()), default=0)
    return item * max(lacks, leave)


# ---- the baseline: another revision's programs, priced by this tree ------------------------

_BASELINE = r"""
import json, sys
from lowering import compile
cases, kw = json.load(sys.stdin)
out = []
for mesh, src, dst in cases:
    p = compile(src, dst, mesh, **kw)  # a cost model as its JSON dict
    out.append({"steps": [[s.kind, list(s.axes), list(s.dims), str(s.src), str(s.dst), s.op, s.padded]
                          for s in p.steps], "sent": p.cost.bytes_sent_max, "collectives": p.cost.collectives})
json.dump(out, sys.stdout)
"""


def baseline_programs(cases: Sequence[tuple[str, str, str]], rev: str = "main",
                      cost_model: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each case compiled by the code of git revision ``rev`` (in a subprocess, from a
    ``git archive`` of it), its steps repriced by this tree: ``bytes_max``, the revision's
    own ``sent`` figure and its ``collectives``."""
    from lowering.cost import DEFAULT_COST_MODEL
    from lowering.kinds import priced_step
    from lowering.program import program_cost
    from spec_lang.parser import parse, parse_mesh

    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        kw = {} if cost_model is None else {"cost_model": cost_model}
        res = subprocess.run([sys.executable, "-c", _BASELINE], input=json.dumps([list(cases), kw]), text=True,
                             capture_output=True, cwd=tmp, env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin"},
                             check=True)
    rows = json.loads(res.stdout)
    for (mesh, src, _), row in zip(cases, rows):
        m = parse_mesh(mesh)
        steps = [priced_step(k, parse(s), parse(d), m, tuple(ax), tuple(dims), op, padded)
                 for k, ax, dims, s, d, op, padded in row["steps"]]
        row["bytes_max"] = program_cost(steps, parse(src), m, DEFAULT_COST_MODEL).bytes_max
    return rows


# ---- one run ---------------------------------------------------------------------------------


def simulated_exact(mesh: str, src: str, dst: str, prog: Any) -> bool:
    """The program's simulation gives every rank its destination block (the chunk rule above)."""
    from lowering.simulator import simulate

    names, sizes, _, shape, sdims = _parse(mesh, src)
    ddims = _parse(mesh, dst)[4]
    full = np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
    cut = lambda box: full[tuple(slice(int(lo), int(hi)) for lo, hi in box)]  # noqa: E731
    xs = [cut(b) for b in chunk_boxes(names, sizes, shape, sdims)]
    want = [cut(b) for b in chunk_boxes(names, sizes, shape, ddims)]
    got = simulate(prog, xs) if prog.steps else xs
    return all(g.shape == w.shape and np.array_equal(g, w) for g, w in zip(got, want))


def run_skewed(n: int = 300, seed: int = 0, rev: str | None = "main",
               cost_model: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every case's bound, this tree's program (price, collectives, exact) and, unless ``rev``
    is None, the program of revision ``rev`` (both under ``cost_model``, a CostModel's JSON
    dict, None for the default); and the summary: geomean and worst ratio to the bound for
    each, cases over 2x, cases worse than the baseline, wrong programs."""
    from lowering import compile

    cases = skewed_cases(n, seed)
    base = baseline_programs(cases, rev, cost_model) if rev else None
    kw = {} if cost_model is None else {"cost_model": cost_model}
    rows = []
    for i, (mesh, src, dst) in enumerate(cases):
        prog = compile(src, dst, mesh, **kw)
        bound = independent_bound(mesh, src, dst)
        row = {"mesh": mesh, "src": src, "dst": dst, "bound": bound, "bytes": prog.cost.bytes_max,
               "sent": prog.cost.bytes_sent_max, "collectives": prog.cost.collectives,
               "exact": simulated_exact(mesh, src, dst, prog), "plan": [s.describe() for s in prog.steps]}
        if base is not None:
            row["base_bytes"], row["base_sent"] = base[i]["bytes_max"], base[i]["sent"]
            row["base_collectives"] = base[i]["collectives"]
        rows.append(row)
    return {"cases": rows, "summary": summarize_skewed(rows, rev)}


def _ratios(rows: Sequence[dict[str, Any]], key: str) -> np.ndarray:
    # a free plan over a zero bound is at the bound
    return np.array([r[key] / r["bound"] if r["bound"] else (1.0 if r[key] == 0 else math.inf) for r in rows])


def summarize_skewed(rows: Sequence[dict[str, Any]], rev: str | None) -> dict[str, Any]:
    def stats(key: str) -> dict[str, Any]:
        q = _ratios(rows, key)
        worst = int(np.argmax(q))
        return {"geomean": float(np.exp(np.log(q).mean())), "worst": float(q[worst]),
                "worst_case": [rows[worst][k] for k in ("mesh", "src", "dst")],
                "over_2x": int((q > 2).sum()), "at_bound": int((q == 1).sum()),
                "below_bound": int((q < 1).sum())}

    out: dict[str, Any] = {"cases": len(rows), "ours": stats("bytes"),
                           "wrong": [[r["mesh"], r["src"], r["dst"]] for r in rows if not r["exact"]]}
    if rev:
        out["baseline"] = {"rev": rev, **stats("base_bytes")}
        out["worse_than_baseline"] = [[r["mesh"], r["src"], r["dst"], r["base_bytes"], r["bytes"]]
                                      for r in rows if r["bytes"] > r["base_bytes"]]
        out["better_than_baseline"] = sum(r["bytes"] < r["base_bytes"] for r in rows)
    return out


def render_skewed(summary: dict[str, Any], console: Any) -> None:
    s = summary
    line = lambda who, x: (f"{who}: geomean {x['geomean']:.3f}x the bound, worst {x['worst']:.2f}x "  # noqa: E731
                           f"({' '.join(x['worst_case'])}), over 2x: {x['over_2x']}, at the bound: "
                           f"{x['at_bound']}/{s['cases']}, below it: {x['below_bound']}")
    console.print(f"skewed family: {s['cases']} random S/R pairs, few holders and many needers "
                  "(price: per rank and step the larger of sent and received)", highlight=False)
    if "baseline" in s:
        console.print("  " + line(f"{s['baseline']['rev']} (today)", s["baseline"]), highlight=False)
    console.print("  " + line("this tree", s["ours"]), highlight=False)
    if "baseline" in s:
        console.print(f"  better than {s['baseline']['rev']}: {s['better_than_baseline']}, worse: "
                      f"{len(s['worse_than_baseline'])} {s['worse_than_baseline'] or ''}", highlight=False)
    console.print(f"  wrong programs (simulated): {len(s['wrong'])} {s['wrong'] or ''}", highlight=False)
