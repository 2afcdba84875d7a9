"""Random redistributions on a real 8-rank gloo world, checked against the simulator.

Every case runs through ``torch_backend.redistribute`` on real process groups and each
rank compares its block with the reference simulator's, exactly. Besides plain random
cases, the draw keeps cases whose programs take the executor paths that LocalTensorMode
never takes (it has no point-to-point and no shared buffers):

* ``ring``: an all_gather whose group's blocks differ in size (p2p around the group);
* ``permute``: a permute step that moves data (``batch_isend_irecv``);
* ``direct all_gather`` / ``direct reduce_scatter``: equal blocks that are consecutive
  runs of the gathered (reduced) block, so the output (input) tensor is the buffer.

Which path a step takes is read off the program and the layout algebra here, not from
the executor, and the test asserts that each path is hit.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from lowering.layout import all_groups, boxes  # noqa: E402
from lowering.planner import compile  # noqa: E402
from lowering.program import Program  # noqa: E402
from spec_lang import parse, parse_mesh  # noqa: E402
from spec_lang.ir import AxisType, Dim, Mesh, TensorType  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")

MESHES = ("dp=2,tp=4", "a=2,b=2,c=2", "x=8", "p=4,q=2")
PLAIN_PER_MESH = 6  # plain random cases per mesh
PER_PATH = 6  # cases kept for each executor path, over all meshes
PATHS = ("ring", "permute", "direct all_gather", "direct reduce_scatter")


def _rel(inner: np.ndarray, outer: np.ndarray) -> tuple[slice, ...]:
    return tuple(slice(int(i0 - o0), int(i1 - o0)) for (i0, i1), (o0, _) in zip(inner, outer))


def executor_paths(program: Program, mesh: Mesh) -> set[str]:
    """The executor paths that ``program``'s steps take on real process groups."""
    out: set[str] = set()
    for st in program.steps:
        sb, db = boxes(st.src, mesh), boxes(st.dst, mesh)
        if st.kind == "permute" and not np.array_equal(sb, db):  # some rank's block moves
            out.add("permute")
        if st.kind not in ("all_gather", "reduce_scatter"):
            continue
        gather = st.kind == "all_gather"
        # all_gather: members' src blocks tile the dst block; reduce_scatter: members' dst
        # blocks tile the (reduced) src block
        whole, piece = (db, sb) if gather else (sb, db)
        for group in all_groups(mesh, st.axes):
            sizes = [int(np.prod(piece[q][:, 1] - piece[q][:, 0])) for q in group]
            if len(group) == 1 or not any(sizes):
                continue
            if len(set(sizes)) > 1:
                out.add("ring" if gather else "uneven reduce_scatter")
                continue
            outer = whole[group[0]]
            flat = np.arange(int(np.prod(outer[:, 1] - outer[:, 0]))).reshape(outer[:, 1] - outer[:, 0])
            c = sizes[0]
            if all(np.array_equal(flat[_rel(piece[q], outer)].ravel(), np.arange(i * c, (i + 1) * c))
                   for i, q in enumerate(group)):
                out.add(f"direct {st.kind}")
    return out


def _layout(rng: np.random.Generator, mesh: Mesh, shape: tuple[int, ...], partial: list[str]) -> TensorType:
    dims: list[list[str]] = [[] for _ in shape]
    types = [(a, AxisType("P", "sum")) for a in partial]
    for a in rng.permutation(list(mesh.names)):
        a = str(a)
        if a not in partial and (k := int(rng.integers(-1, len(shape)))) >= 0:
            dims[k].append(a)
    return TensorType("float64", tuple(Dim(s, tuple(ax)) for s, ax in zip(shape, dims)), tuple(types))


def _draw(rng: np.random.Generator, mesh: Mesh) -> tuple[TensorType, TensorType]:
    """A random pair; dim 0 is often a multiple of the mesh (even, direct candidates), and a
    pending sum on src is reduced into dst (reduce_scatter candidates)."""
    ndim = int(rng.integers(1, 4))
    shape = tuple(int(rng.choice([mesh.size, 2 * mesh.size])) if (d == 0 and rng.random() < 0.5)
                  else int(rng.integers(1, 13)) for d in range(ndim))
    partial = [a for a in mesh.names if rng.random() < 0.25]
    src = _layout(rng, mesh, shape, partial)
    if rng.random() < 0.3:  # the same axes within each dim, in another order: a permute
        dst = src.replace(dims=tuple(Dim(d.size, tuple(str(a) for a in rng.permutation(list(d.axes))))
                                     for d in src.dims), axis_types=())
        return src, dst
    return src, _layout(rng, mesh, shape, [])


def gloo_cases() -> tuple[list[tuple[str, str, str]], dict[str, int]]:
    """Plain random cases, then the first PER_PATH cases found for each path (seeded)."""
    rng = np.random.default_rng(2024)
    chosen: list[tuple[str, str, str]] = []
    hits = dict.fromkeys(PATHS, 0)
    for m_text in MESHES:
        mesh = parse_mesh(m_text)
        plain = 0
        for _ in range(200):
            src, dst = _draw(rng, mesh)
            if src == dst:
                continue
            paths = executor_paths(compile(src, dst, mesh), mesh)
            wanted = [p for p in PATHS if p in paths and hits[p] < PER_PATH]
            if wanted or plain < PLAIN_PER_MESH:
                plain += not wanted
                for p in paths & set(PATHS):
                    hits[p] += 1
                chosen.append((m_text, str(src), str(dst)))
            if plain >= PLAIN_PER_MESH and all(hits[p] >= PER_PATH * (MESHES.index(m_text) + 1) / len(MESHES)
                                               for p in PATHS):
                break
    return chosen, hits


def run_cases(rank: int, world: int, cases: list[tuple[str, str, str]]) -> list[str]:
    """Runs on every rank: a description of each case that went wrong here."""
    from planner_oracle import shards_of

    from lowering.simulator import simulate
    from torch_backend import redistribute, redistributor

    bad = []
    for i, (m_text, s_text, d_text) in enumerate(cases):
        mesh, src, dst = parse_mesh(m_text), parse(s_text), parse(d_text)
        data_rng = np.random.default_rng(i)  # the same on every rank
        full = data_rng.integers(-20, 20, size=src.shape).astype(np.float64)
        inputs = shards_of(full, src, mesh, data_rng)
        want = simulate(compile(src, dst, mesh), inputs)[rank]
        x = torch.from_numpy(inputs[rank].copy())
        y = redistribute(x, src, dst, m_text, timeout=20)
        if not (y.shape == want.shape and np.allclose(y.numpy(), want, rtol=0, atol=1e-12)):
            bad.append(f"{m_text}: {s_text} -> {d_text}")
        if not torch.equal(x, torch.from_numpy(inputs[rank])):
            bad.append(f"{m_text}: {s_text} -> {d_text} modified its input")
        # a prepared program reuses its buffers: a second call on other data must leave
        # the first call's result alone
        f = redistributor(src, dst, m_text, timeout=20)
        other = [-a for a in inputs]
        y1 = f(x)
        y2 = f(torch.from_numpy(other[rank].copy()))
        want2 = simulate(compile(src, dst, mesh), other)[rank]
        if not (torch.equal(y1, y) and np.array_equal(y2.numpy(), want2)):
            bad.append(f"{m_text}: {s_text} -> {d_text} prepared")
    return bad


def test_the_draw_hits_every_real_group_path() -> None:
    cases, hits = gloo_cases()
    assert all(hits[p] >= PER_PATH for p in PATHS), hits
    assert len(cases) <= len(MESHES) * PLAIN_PER_MESH + len(PATHS) * PER_PATH
    assert all(parse_mesh(m).size == 8 for m in MESHES)  # every case runs on all of the pool's ranks


@pytest.mark.timeout(300)
def test_random_redistributions_on_gloo(gloo_pool) -> None:
    cases, _ = gloo_cases()
    results = gloo_pool.run(run_cases, cases, timeout_s=280)
    bad = {r: res for r, res in results.items() if res}
    assert not bad, f"wrong blocks: {bad}"
