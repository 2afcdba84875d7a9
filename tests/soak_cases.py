"""The soak: many fuzzed strings and random redistributions, no escape, no hang, no wrong result.

Shared by the CI-sized slice (``tests/test_soak.py``) and the full run (``bench/soak.py``):
each function takes a count and a seed, draws its cases without hypothesis (so every
rank of a multi-process run draws the same ones), and returns what went wrong.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
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


# ---- malformed Python objects in every argument of every public call ------------------------


class Unprintable:
    """An object whose str() and repr() raise: a message must not print it blindly."""

    def __str__(self) -> str:
        raise RuntimeError("this object cannot be printed")

    __repr__ = __str__


class Incomparable:
    """An object whose == and hash raise."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("this object cannot be compared")

    def __hash__(self) -> int:
        raise RuntimeError("this object cannot be hashed")


def malformed_values() -> list[tuple[str, Callable[[], Any]]]:
    """(name, maker) of the wrong objects a soak passes: wrong types, odd numbers, numpy
    arrays, containers, tensors of the wrong dtype, shape or device, a DTensor, bytes, empty
    strings, and objects that cannot be printed or compared."""
    import torch

    meshes: list[Any] = []  # one DeviceMesh for every DTensor made

    def dtensor() -> Any:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard

        if not meshes:
            meshes.append(init_device_mesh("cpu", (2,), mesh_dim_names=("dp",)))
        return DTensor.from_local(torch.zeros(4), meshes[0], [Shard(0)], run_check=False)

    return [
        ("None", lambda: None), ("0", lambda: 0), ("-1", lambda: -1), ("10**30", lambda: 10**30),
        ("True", lambda: True), ("1.5", lambda: 1.5), ("nan", lambda: float("nan")), ("inf", lambda: float("inf")),
        ("''", lambda: ""), ("' '", lambda: " "), ("'x'", lambda: "x"), ("b'f32[8]'", lambda: b"f32[8]"),
        ("bytearray", lambda: bytearray(b"dp=2")), ("[]", lambda: []), ("()", lambda: ()), ("{}", lambda: {}),
        ("set", lambda: {"dp"}), ("[None]", lambda: [None]), ("[[]]", lambda: [[]]), ("{'dp': None}", lambda: {"dp": None}),
        ("(1.5,)", lambda: (1.5,)), ("['dp', 3]", lambda: ["dp", 3]), ("object()", lambda: object()),
        ("np.array([1, 2])", lambda: np.array([1, 2])), ("np.array(['dp', 'tp'])", lambda: np.array(["dp", "tp"])),
        ("np.array('f32[8]')", lambda: np.array("f32[8]")), ("np.zeros((2, 0))", lambda: np.zeros((2, 0))),
        ("np.int64(2)", lambda: np.int64(2)), ("np.float32(2)", lambda: np.float32(2)),
        ("int64 tensor", lambda: torch.zeros(4, dtype=torch.int64)), ("3x5 tensor", lambda: torch.zeros(3, 5)),
        ("0-d tensor", lambda: torch.tensor(2.0)), ("meta tensor", lambda: torch.zeros(4, device="meta")),
        ("bool tensor", lambda: torch.zeros(4, dtype=torch.bool)), ("DTensor", dtensor),
        ("type", lambda: int), ("function", lambda: (lambda: None)), ("Ellipsis", lambda: ...),
        ("Unprintable", Unprintable), ("Incomparable", Incomparable),
    ]


Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def public_calls() -> dict[str, Callable[[], Call]]:
    """Every public call of spec_lang, lowering, torch_backend, torch_backend.spmd and jax_backend, each
    with a good call on the mesh dp=2 (a maker: fresh tensors every time) that the soak
    spoils one argument at a time. The classes that only the library builds (Program,
    Step, Cost, CrossProgram, JointProgram, MeshContext, Redistributor, the errors) are
    reached through the calls that build them."""
    import jax
    import torch
    from jax.sharding import PartitionSpec

    import jax_backend
    import lowering
    import spec_lang
    import torch_backend
    from torch_backend import spmd

    M, S_, D_ = "dp=2", "f32[8@dp]", "f32[8]"

    def x() -> Any:
        return torch.zeros(4)

    def typed(t: Any) -> Any:
        return spmd.assert_type(torch.zeros(4), {"dp": t})

    def jax_mesh() -> Any:
        return jax.sharding.Mesh(np.array(jax.devices()[:1]), ("dp",))

    def jax_array() -> Any:  # a jax.Array laid out as f32[8] on the one-device mesh dp=1
        return jax.device_put(np.arange(8, dtype=np.float32), jax.sharding.NamedSharding(jax_mesh(), PartitionSpec()))

    def typed2(t: Any) -> Any:  # V stacks on dim 0: one row per rank of dp
        return spmd.assert_type(torch.zeros(2, 3), {"dp": t})

    cost_file = str(Path(tempfile.mkdtemp()) / "cost.json")
    Path(cost_file).write_text(json.dumps(lowering.CostModel().to_json()))

    def under_local_mode(*args: Any, **kwargs: Any) -> Any:
        """uneven_type under LocalTensorMode (its size exchange needs every rank's sizes);
        a plain tensor in the first slot becomes rank r's block of r + 3 rows."""
        from torch.distributed._local_tensor import LocalTensor, LocalTensorMode

        with LocalTensorMode(2) as lm:
            if args and type(args[0]) is torch.Tensor and args[0].ndim == 1 and args[0].dtype == torch.float32:
                with lm.disable():
                    args = (LocalTensor({r: torch.zeros(r + 3) for r in range(2)}), *args[1:])
            return torch_backend.uneven_type(*args, **kwargs)

    calls: dict[str, Callable[[], Call]] = {
        # spec_lang
        "AxisType": lambda: (spec_lang.AxisType, ("P", "avg", None), {}),
        "Dim": lambda: (spec_lang.Dim, (8, ("dp",), None, 0), {}),
        "LocalType": lambda: (spec_lang.LocalType, ("S", "sum", 0), {}),
        "Mesh": lambda: (spec_lang.Mesh, (("dp", "tp"), (2, 1), None), {}),
        "TensorType": lambda: (spec_lang.TensorType, ("float32", (spec_lang.Dim(8, ("dp",)),), ()), {}),
        "format_type": lambda: (spec_lang.format_type, (S_, False), {}),
        "from_jax": lambda: (spec_lang.from_jax, (PartitionSpec("dp"),), {"shape": (8,), "dtype": "f32", "mesh": M}),
        "mesh_from_jax": lambda: (spec_lang.mesh_from_jax, (jax_mesh(),), {}),
        "parse": lambda: (spec_lang.parse, (S_,), {}),
        "parse_local_type": lambda: (spec_lang.parse_local_type, ("P(avg)", "type"), {}),
        "parse_mesh": lambda: (spec_lang.parse_mesh, (M,), {}),
        "parse_shard_order": lambda: (spec_lang.parse_shard_order, ("{0: ['dp']}",), {}),
        "to_jax": lambda: (spec_lang.to_jax, (S_, jax_mesh()), {}),
        # lowering
        "CostModel": lambda: (lowering.CostModel, ((("dp", 1e-5),), (("dp", 1e-9),)), {}),
        "CostModel.load": lambda: (lowering.CostModel.load, (cost_file,), {}),
        "DynamicShard": lambda: (lowering.DynamicShard, (0, (3, 5)), {}),
        "PartitionedShard": lambda: (lowering.PartitionedShard, (0, 2, ((1, 2), (3, 2))), {"aligned": False}),
        "RaggedShard": lambda: (lowering.RaggedShard, ((0,), (1, 3)), {}),
        "boxes": lambda: (lowering.boxes, (S_, M), {}),
        "check_placements": lambda: (lowering.check_placements, ("S(0)", None, M, 1), {}),
        "check_type": lambda: (lowering.check_type, (S_, M, None), {}),
        "compile": lambda: (lowering.compile, (S_, D_, M), {"cost_model": None}),
        "compile_many": lambda: (lowering.compile_many, ([S_], [D_], M), {"cost_model": None}),
        "from_placements": lambda: (lowering.from_placements, ("S(0)", M, (8,), "f32"), {"shard_order": None}),
        "local_indices": lambda: (lowering.local_indices, (S_, M), {}),
        "local_shape": lambda: (lowering.local_shape, (S_, M, 1), {}),
        "local_shapes": lambda: (lowering.local_shapes, (S_, M), {}),
        "local_slices": lambda: (lowering.local_slices, (S_, M), {}),
        "lower_bound": lambda: (lowering.lower_bound, (S_, D_, M), {}),
        "make_program": lambda: (lowering.make_program, ([lowering.make_step("all_gather", S_, D_, M)], M),
                                 {"cost_model": None, "src": None}),
        "make_step": lambda: (lowering.make_step, ("all_gather", S_, D_, M), {"axes": None, "padded": None}),
        "rank_pieces": lambda: (lowering.rank_pieces, (lowering.make_step("all_gather", S_, D_, M), M, 0, None), {}),
        "resolve": lambda: (lowering.resolve, (S_, M), {}),
        "simulate": lambda: (lowering.simulate, (lowering.compile(S_, D_, M), [np.zeros(4), np.ones(4)]), {}),
        "to_placements": lambda: (lowering.to_placements, (S_, M), {"strided": False, "shard_order_format": "names"}),
        # torch_backend
        "backward_program": lambda: (torch_backend.backward_program, (lowering.compile(S_, D_, M),), {}),
        "context": lambda: (torch_backend.context, (M,), {"timeout": None}),
        "distribute": lambda: (torch_backend.distribute, (torch.zeros(8), M, S_), {}),
        "dual_type": lambda: (torch_backend.dual_type, ("f32[8]{U:dp}",), {}),
        "execute": lambda: (torch_backend.execute, (lowering.compile(S_, D_, M), x()), {}),
        "redistribute": lambda: (torch_backend.redistribute, (x(), S_, D_, M),
                                 {"timeout": None, "agree": None, "async_op": False}),
        "redistribute_many": lambda: (torch_backend.redistribute_many, ([x()], [S_], [D_], M),
                                      {"timeout": None, "agree": None, "async_op": False}),
        "redistributor": lambda: (torch_backend.redistributor, (S_, D_, M), {"timeout": None, "agree": None}),
        "Redistributor.__call__": lambda: (torch_backend.redistributor(S_, D_, M), (x(),), {}),
        "uneven_type": lambda: (under_local_mode, (x(), M, "dp", 0),
                                {"partitions": None, "aligned": False, "template": None}),
        # torch_backend.spmd, inside use_mesh(dp=2)
        "spmd.S": lambda: (spmd.S, (1,), {}),
        "spmd.assert_type": lambda: (spmd.assert_type, (x(), {"dp": spmd.V}), {}),
        "spmd.typeof": lambda: (spmd.typeof, (typed(spmd.V),), {}),
        "spmd.all_gather": lambda: (spmd.all_gather, (typed(spmd.V), "dp"), {"src": spmd.V, "dst": spmd.R}),
        "spmd.all_reduce": lambda: (spmd.all_reduce, (typed(spmd.P), "dp"), {"src": spmd.P, "dst": spmd.R}),
        "spmd.all_to_all": lambda: (spmd.all_to_all, (typed2(spmd.V), "dp"), {"src": spmd.V, "dst": spmd.V}),
        "spmd.reduce_scatter": lambda: (spmd.reduce_scatter, (typed2(spmd.P), "dp"), {"src": spmd.P, "dst": spmd.V}),
        "spmd.convert": lambda: (spmd.convert, (typed2(spmd.R), "dp"), {"src": spmd.R, "dst": spmd.V}),
        "spmd.reinterpret": lambda: (spmd.reinterpret, (typed(spmd.R), "dp"), {"src": spmd.R, "dst": spmd.V}),
        "spmd.redistribute": lambda: (spmd.redistribute, (typed(spmd.V), "dp"), {"src": spmd.V, "dst": spmd.R}),
        "spmd.einsum": lambda: (spmd.einsum, ("ij,jk->ik", torch.zeros(2, 3), torch.zeros(3, 4)),
                                {"out_partial_axes": None}),
        "spmd.linear": lambda: (spmd.linear, (torch.zeros(2, 3), torch.zeros(4, 3), None), {"out_partial_axes": None}),
        "spmd.local_map": lambda: (spmd.local_map, (torch.neg,), {"in_types": [{"dp": spmd.V}],
                                                                  "out_types": {"dp": spmd.V}}),
        "spmd.use_mesh": lambda: (_enter(spmd.use_mesh), (M,), {}),
        "spmd.typecheck": lambda: (_enter(spmd.typecheck), (False,), {}),
        # jax_backend, on a one-device JAX mesh dp=1
        "jax_backend.redistribute": lambda: (jax_backend.redistribute, (jax_array(), S_, jax_mesh()), {"src": D_}),
        "jax_backend.redistributor": lambda: (jax_backend.redistributor, (D_, S_, jax_mesh()), {}),
        "jax_backend.redistributor(...)": lambda: (jax_backend.redistributor(D_, S_, jax_mesh()), (jax_array(),), {}),
        "jax_backend.to_torch": lambda: (jax_backend.to_torch, (jax_array(),), {}),
        "jax_backend.from_torch": lambda: (jax_backend.from_torch, ([torch.zeros(8)], D_, jax_mesh()), {}),
        "jax_backend.to_blocks": lambda: (jax_backend.to_blocks, (jax_array(),), {}),
        "jax_backend.blocks_of": lambda: (jax_backend.blocks_of, (jax_array(),), {}),
        "jax_backend.from_blocks": lambda: (jax_backend.from_blocks, ([np.zeros(8, np.float32)], D_, jax_mesh()), {}),
        "jax_backend.describe": lambda: (jax_backend.describe, (lowering.compile(S_, D_, "dp=1"),), {}),
        "jax_backend.lower_program": lambda: (jax_backend.lower_program, (lowering.compile(S_, D_, "dp=1"),), {}),
        "jax_backend.default_cost_model": lambda: (jax_backend.default_cost_model, (spec_lang.parse_mesh("dp=1"),), {}),
    }
    return calls


def _text(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:
        return "(its message cannot be printed)"


def _where(e: BaseException) -> str:
    """The innermost frame of shardc's own code that the exception passed through."""
    import traceback

    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if any(f"/{p}/" in f.filename for p in ("spec_lang", "lowering", "torch_backend", "jax_backend"))]
    return f"{frames[-1].filename.rsplit('/', 2)[-2]}/{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" \
        if frames else "outside shardc"


def _enter(cm: Callable[..., Any]) -> Callable[..., Any]:
    """A context manager's call as the soak makes it: entered and left."""
    def call(*args: Any, **kwargs: Any) -> None:
        with cm(*args, **kwargs):
            pass
    call.__name__ = getattr(cm, "__name__", "context")
    return call


def malformed_calls(fake_pg: Callable[[int], None], every: int = 1) -> dict[str, Any]:
    """Every public call with each argument in turn replaced by each malformed value (every
    ``every``-th pair of argument and value, for a quick slice): only a SpecError may
    escape. The good calls themselves must pass. Returns the counts and the escapes."""
    import torch_backend
    from torch_backend import spmd

    fake_pg(2)
    values = malformed_values()
    escapes: list[str] = []
    bad_baselines: list[str] = []
    tried = refused = accepted = 0
    k = 0
    with spmd.use_mesh("dp=2"):
        for name, make in public_calls().items():
            try:
                fn, args, kwargs = make()
                fn(*args, **kwargs)
            except Exception as e:
                bad_baselines.append(f"{name}: the good call fails: {type(e).__name__}: {e}")
                continue
            slots = [(i, None) for i in range(len(args))] + [(None, key) for key in kwargs]
            for i, key in slots:
                for vname, value in values:
                    k += 1
                    if k % every:
                        continue
                    fn, args, kwargs = make()
                    if key is None:
                        args = args[:i] + (value(),) + args[i + 1:]
                        where = f"argument {i}"
                    else:
                        kwargs = dict(kwargs, **{key: value()})
                        where = f"{key}="
                    tried += 1
                    try:
                        fn(*args, **kwargs)
                        accepted += 1
                    except SpecError:
                        refused += 1
                    except Exception as e:  # the soak's point: anything else escaped
                        escapes.append(f"{name}, {where} {vname}: {type(e).__name__}: {_text(e)[:200]}"
                                       f" (at {_where(e)})")
    torch_backend.clear_caches()
    return {"calls": len(public_calls()), "tried": tried, "refused": refused, "accepted": accepted,
            "escapes": escapes, "bad_baselines": bad_baselines}
