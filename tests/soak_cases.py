"""The soak: many fuzzed strings and random redistributions, no escape, no hang, no wrong result.

Shared by the CI-sized slice (``tests/test_soak.py``) and the full run (``bench/soak.py``):
each function takes a count and a seed, draws its cases without hypothesis (so every
rank of a multi-process run draws the same ones), and returns what went wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from spec_lang import SpecError, parse, parse_mesh, parse_shard_order

TYPE_SEEDS = [
    "float32[8@dp,16]{U:tp}", "f32[8@(dp,tp),16]", "f32[8,16@(tp,dp)]", "f32[8@dp,tp]",
    "f32[8]{U:cp, R:tp}", "f32[8]{U:(cp,tp)}", "f32[8]{V:(dp,tp)}", "bf16[4]{P(avg):x}",
    "i8[]", "f32[8@dp,tp,4]{P(max):(a,b), R:c}", "u8[3@x]", "f64[0@a,7]{I:b}",
]
MESH_SEEDS = ["dp=2,tp=4", "a=2,b=2,c=2,d=2", "x=8", "dp = 2 , tp = 4", "a=1"]
ORDER_SEEDS = ["{0: [1], 1: ['dp', 'tp']}", '{0: ["tp", 0]}', "{}", "{2: [tp, dp,],}"]
PLACEMENT_SEEDS = ["S(0),S(0),R", "R,P(avg)", "_S(0,2),S(0)", "S(1), R, P"]
ALPHABET = "f32bf16int8[]@(),{}:=URIVP(avgmxsu) dptcx_'\"0123456789\t\n#-_S"


def mutate(rng: np.random.Generator, s: str) -> str:
    """A few random edits (delete, insert, replace, duplicate), or random text."""
    if rng.random() < 0.1:
        return "".join(rng.choice(list(ALPHABET), size=int(rng.integers(0, 40))))
    for _ in range(int(rng.integers(1, 5))):
        i = int(rng.integers(0, len(s) + 1))
        j = int(rng.integers(i, min(len(s), i + 4) + 1))
        ch = "".join(rng.choice(list(ALPHABET), size=int(rng.integers(1, 4))))
        op = int(rng.integers(0, 4))
        s = s[:i] + s[j:] if op == 0 else s[:i] + ch + s[i:] if op == 1 else s[:i] + ch + s[j:] if op == 2 \
            else s[:j] + s[i:j] + s[j:]
    return s


def _placements(text: str) -> Any:
    from lowering.placements import check_placements

    return check_placements(text, None, "dp=2,tp=2,cp=2", 2)


def parser_entry_points() -> dict[str, tuple[Callable[[str], Any], list[str]]]:
    return {
        "parse": (parse, TYPE_SEEDS),
        "parse_mesh": (parse_mesh, MESH_SEEDS),
        "parse_shard_order": (parse_shard_order, ORDER_SEEDS),
        "check_placements": (_placements, PLACEMENT_SEEDS),
    }


def fuzz_parsers(n: int, seed: int = 0) -> dict[str, dict[str, Any]]:
    """``n`` mutated strings through each parser entry point: only SpecError may escape,
    and what parses must print and parse back to itself."""
    out = {}
    for name, (fn, seeds) in parser_entry_points().items():
        rng = np.random.default_rng(seed)
        escapes: list[str] = []
        accepted = 0
        slowest = 0.0
        for _ in range(n):
            text = mutate(rng, seeds[int(rng.integers(0, len(seeds)))])
            t0 = time.perf_counter()
            try:
                got = fn(text)
                accepted += 1
                if name in ("parse", "parse_mesh") and (parse if name == "parse" else parse_mesh)(str(got)) != got:
                    escapes.append(f"{text!r}: does not print back to itself")
            except SpecError as e:
                if e.pos is not None and not 0 <= e.pos <= len(e.text or text):
                    escapes.append(f"{text!r}: caret {e.pos} outside the text")
            except Exception as e:  # the soak's whole point: report anything else
                escapes.append(f"{text!r}: {type(e).__name__}: {e}")
            slowest = max(slowest, time.perf_counter() - t0)
        out[name] = {"strings": n, "accepted": accepted, "escapes": escapes, "slowest_s": slowest}
    return out


SOAK_DTYPES = (np.float64, np.int64, np.int32, np.float32)
MESHES = ("dp=2,tp=4", "a=2,b=2,c=2", "x=8", "p=4,q=2", "x=3,y=2", "a=2,b=3", "u=5", "a=1,b=4")


def random_redistributions(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """``n`` random (mesh, src, dst) cases over small meshes, uneven sizes included."""
    from strategies import random_case

    from spec_lang import parse_mesh as pm

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        m = MESHES[int(rng.integers(0, len(MESHES)))]
        src, dst = random_case(rng, pm(m))
        out.append((m, str(src), str(dst)))
    return out


def check_local(cases: list[tuple[str, str, str]], fake_pg: Callable[[int], None]) -> list[str]:
    """Each case under LocalTensorMode: every rank's block equals the simulator's, the
    blocks denote the global array (the layout algebra's slices, P axes reduced), and the
    input is untouched; only SpecError may be raised (for pairs the planner refuses)."""
    import torch
    from planner_oracle import denoted_global, expected, reduce_partial, shards_of
    from torch_utils import from_local, local_mode, to_local

    from lowering import compile, simulate
    from spec_lang import parse as p
    from spec_lang import parse_mesh as pm
    from torch_backend import redistribute

    bad = []
    for i, (m, s, d) in enumerate(cases):
        dtype = SOAK_DTYPES[i % len(SOAK_DTYPES)]
        mesh, src, dst = pm(m), p(s).replace(dtype=np.dtype(dtype).name), p(d).replace(dtype=np.dtype(dtype).name)
        s, d = str(src), str(dst)
        try:
            program = compile(src, dst, mesh)
        except SpecError:
            continue
        rng = np.random.default_rng(i)
        # integer data too, with averages that do not divide evenly: an integer average must
        # truncate once, over its whole group (the soak checked float64 alone before)
        full = rng.integers(-20, 20, size=src.shape).astype(dtype)
        inputs = shards_of(full, src, mesh, rng, exact_avg=False)
        full = denoted_global(inputs, src, mesh)
        want = simulate(program, inputs)
        try:
            with local_mode(fake_pg, mesh.size) as lm:
                x = to_local(lm, [torch.from_numpy(a.copy()) for a in inputs])
                y = redistribute(x, src, dst, mesh)
                outs, after = from_local(y), from_local(x)
        except Exception as e:  # report, do not stop the soak
            bad.append(f"{m}: {s} -> {d}: {type(e).__name__}: {e}")
            continue
        for r, (o, w) in enumerate(zip(outs, want)):
            if o.shape != w.shape or not np.array_equal(o.numpy(), w):
                bad.append(f"{m}: {s} -> {d}: rank {r} differs from the simulator")
                break
        denoted = reduce_partial([o.numpy() for o in outs], dst, mesh)
        # integers exactly; floats to a few units in the last place of the data's magnitude
        # (a float average split over two collectives rounds in another order than numpy's
        # one sum: float32 values near 20 are 1.9e-6 apart)
        eps = 8 * float(np.finfo(dtype).eps) if np.issubdtype(dtype, np.floating) else 0.0
        tol = eps * (1 + float(np.abs(full).max(initial=0)))
        if any(not np.allclose(g, e, rtol=0, atol=tol) for g, e in zip(denoted, expected(full, dst, mesh))):
            bad.append(f"{m}: {s} -> {d}: the blocks do not denote the global array")
        if any(not np.array_equal(a.numpy(), b) for a, b in zip(after, inputs)):
            bad.append(f"{m}: {s} -> {d}: input modified")
    return bad


def gloo_cases(rank: int, world: int, n: int, seed: int) -> list[str]:
    """Runs on every rank of a real gloo world of 8: random cases on 8-rank meshes."""
    import torch
    from planner_oracle import shards_of
    from strategies import random_case

    from lowering import compile, simulate
    from spec_lang import parse_mesh as pm
    from torch_backend import redistribute

    meshes = [m for m in MESHES if pm(m).size == world]
    rng = np.random.default_rng(seed)
    bad = []
    for i in range(n):
        m = meshes[i % len(meshes)]
        mesh = pm(m)
        src, dst = random_case(rng, mesh)
        data = np.random.default_rng(i)
        full = data.integers(-20, 20, size=src.shape).astype(np.float64)
        inputs = shards_of(full, src, mesh, data)
        try:
            want = simulate(compile(src, dst, mesh), inputs)[rank]
        except SpecError:
            continue
        x = torch.from_numpy(inputs[rank].copy())
        y = redistribute(x, src, dst, m, timeout=30)
        if y.shape != want.shape or not np.array_equal(y.numpy(), want):
            bad.append(f"{m}: {src} -> {dst}")
        if not torch.equal(x, torch.from_numpy(inputs[rank])):
            bad.append(f"{m}: {src} -> {dst}: input modified")
    return bad
