"""A Program as one ``jax.shard_map`` over every mesh axis, differentiable.

The body runs the steps' lowerings (``jax_backend.lowerings``) one after another on this
rank's block: in its natural shape while every rank's block has one shape (JAX's even
layouts, which the source and destination are), else flat, padded to the largest rank's
(uneven intermediates). ``in_specs`` and ``out_specs`` are the source's and destination's
PartitionSpecs, their unreduced (pending-sum) and reduced axes included, so a pending sum
comes in as an unreduced array and leaves as one.

Its gradient is the dual program, as on the torch side: the backward of ``src -> dst`` is
``compile(dual(dst), dual(src))`` (the SPMD type system's duality: R and P swap), run the
same way, through ``jax.custom_vjp``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_backend.block_gather import block_gather, run_block_gather
from jax_backend.default_model import default_cost_model
from jax_backend.lowerings import Lowered, lower_step
from lowering.layout import local_shapes
from lowering.planner import compile_gradient
from lowering.program import Program, check_one_mesh
from spec_lang.ir import Mesh, TensorType
from spec_lang.jax_interop import to_jax

Block = jax.Array


def lower_program(program: Program) -> tuple[Lowered, ...]:
    """Each step's lowering, in order."""
    program = check_one_mesh(program)
    return tuple(lower_step(s, program.mesh) for s in program.steps)


def describe(program: Program) -> list[str]:
    """The lowered program as text: one line per ``lax`` call, under its step (or, where the
    program runs as whole blocks gathered within groups, its steps, then those calls)."""
    program = check_one_mesh(program)
    gather = block_gather(program)
    if gather is not None:
        return [f"{step.describe()}: {step.src} -> {step.dst}" for step in program.steps] + \
            ["  run as whole source blocks gathered within groups (jax_backend.block_gather):"] + \
            [f"    {c}" for c in gather.calls(program.mesh.names)]
    lines = []
    for step, low in zip(program.steps, lower_program(program)):
        lines.append(f"{step.describe()}: {step.src} -> {step.dst}")
        lines += [f"    {c}" for c in low.calls]
    return lines


def _body(program: Program, flat_io: bool = False) -> Callable[[Block], Block]:
    """The program on this rank's block; ``flat_io``: the block comes in and leaves flat,
    padded to the largest rank's (``run_blocks``: any type, uneven ones included)."""
    mesh = program.mesh
    steps = [(s, lower_step(s, mesh)) for s in program.steps]

    def natural(x: Block, t: TensorType) -> Block:
        shape = local_shapes(t, mesh)[0]
        return x[: int(np.prod(shape))].reshape(shape)

    def body(x: Block) -> Block:
        flat = flat_io
        for step, low in steps:
            if low.flat and not flat:
                x = _flat(x, step.src, mesh)
            elif not low.flat and flat:
                x = natural(x, step.src)
            flat = low.flat
            x = low.run(x)
        if flat_io:
            return x if flat else _flat(x, program.dst, mesh)
        return natural(x, program.dst) if flat else x

    return body


def _flat(x: Block, t: TensorType, mesh: Mesh) -> Block:
    """The block flat, padded to the largest rank's block of type ``t``."""
    width = max(int(np.prod(s)) for s in local_shapes(t, mesh))
    x = x.reshape(-1)
    return jnp.pad(x, (0, width - x.shape[0])) if width > x.shape[0] else x


def shard_mapped(program: Program, jax_mesh: Any) -> Callable[[Block], Block]:
    """``program`` as a function of the global array (``jax.shard_map``; not jitted), with
    its gradient the dual program's."""
    return _differentiable(program, jax_mesh)


def _plain(program: Program, jax_mesh: Any) -> Callable[[Block], Block]:
    spec_in = to_jax(program.src, jax_mesh).spec
    spec_out = to_jax(program.dst, jax_mesh).spec
    gather = block_gather(program)  # XLA's form where it is cheaper: groups the planner's axes cannot name
    body = _body(program) if gather is None else run_block_gather(gather, program.mesh.names)
    return jax.shard_map(body, mesh=jax_mesh, in_specs=spec_in, out_specs=spec_out, check_vma=False)


@lru_cache(maxsize=512)
def _differentiable(program: Program, jax_mesh: Any) -> Callable[[Block], Block]:
    forward = _plain(program, jax_mesh)

    @jax.custom_vjp
    def run(x: Block) -> Block:
        return forward(x)

    def fwd(x: Block) -> tuple[Block, None]:
        return forward(x), None

    def bwd(_: None, g: Block) -> tuple[Block]:
        return (_plain(compile_gradient(program, default_cost_model(program.mesh)), jax_mesh)(g),)

    run.defvjp(fwd, bwd)
    return run


SMALL_BLOCK = 4096  # bytes: a program whose every block is this small compiles cheaply on CPU
CHEAP_CPU_CODEGEN = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def compile_options(program: Program, jax_mesh: Any) -> dict[str, Any]:
    """XLA's options for the program's ``jax.jit``: on CPU, where every rank's block of every
    step is at most ``SMALL_BLOCK`` bytes, XLA's cheapest code generation
    (``CHEAP_CPU_CODEGEN``). A small program's call is ~0.3 ms of collective latency whatever
    its copies' code, but its first call is mostly XLA compiling those copies (the slices and
    updates by ``axis_index``): without LLVM's optimisation and the fusion emitters that
    took 1.5-2.5x less time on the recorded 8-device cases, their calls' times unchanged.
    Larger programs, and other backends, keep XLA's defaults."""
    from jax.sharding import Mesh as JaxMesh

    # a traced value's AbstractMesh has no devices (and under an outer jit, no options apply)
    platform = jax_mesh.devices.flat[0].platform if isinstance(jax_mesh, JaxMesh) else jax.default_backend()
    if platform != "cpu":
        return {}
    mesh = program.mesh
    types = (program.src, *(s.dst for s in program.steps))
    biggest = max(max(int(np.prod(s)) for s in local_shapes(t, mesh)) * t.itemsize for t in types)
    return dict(CHEAP_CPU_CODEGEN) if biggest <= SMALL_BLOCK else {}


def jitted(program: Program, jax_mesh: Any) -> Callable[[Block], Block]:
    """``shard_mapped(program, jax_mesh)`` under ``jax.jit``, with ``compile_options``."""
    return jax.jit(shard_mapped(program, jax_mesh), compiler_options=compile_options(program, jax_mesh) or None)


def device_mesh(mesh: Mesh) -> Any:
    """An Explicit-axes jax Mesh of ``mesh``'s shape over the first devices (rank r: device r)."""
    return to_jax(TensorType("float32", (), ()), mesh).mesh


def run_blocks(program: Program, blocks: Sequence[Any], jax_mesh: Any = None) -> list[np.ndarray]:
    """Run ``program`` on one block per rank (rank order; any type, uneven and V included)
    as one ``shard_map``; returns each rank's output block. Each block travels flat, padded
    to the largest rank's (the test oracle's door: ``lowering.simulate`` takes the same)."""
    fn, x = blocks_call(program, blocks, jax_mesh)
    return blocks_out(program, fn(x))


def blocks_call(program: Program, blocks: Sequence[Any], jax_mesh: Any = None) -> tuple[Callable[[Block], Block], Block]:
    """``run_blocks`` in two halves: the jitted function (cached per program and mesh) and
    its input, the blocks flat and padded on their devices; ``blocks_out`` reads its output."""
    mesh = program.mesh
    jm = device_mesh(mesh) if jax_mesh is None else jax_mesh
    width = _width(program)
    flat = np.zeros((mesh.size, width), dtype=np.asarray(blocks[0]).dtype)
    for r, b in enumerate(blocks):
        b = np.asarray(b).reshape(-1)
        flat[r, : b.size] = b
    from jax.sharding import NamedSharding, PartitionSpec

    x = jax.device_put(flat.reshape(-1), NamedSharding(jm, PartitionSpec(mesh.names)))
    return _blocks_fn(program, jm), x


def blocks_out(program: Program, y: Block) -> list[np.ndarray]:
    out = np.asarray(y).reshape(program.mesh.size, _width(program))
    shapes = local_shapes(program.dst, program.mesh)
    return [out[r, : int(np.prod(s))].reshape(s) for r, s in enumerate(shapes)]


def _width(program: Program) -> int:
    mesh = program.mesh
    return max(1, *(max(int(np.prod(s)) for s in local_shapes(t, mesh)) for t in (program.src, program.dst)))


@lru_cache(maxsize=256)
def _blocks_fn(program: Program, jm: Any) -> Callable[[Block], Block]:
    from jax.sharding import PartitionSpec

    spec = PartitionSpec(program.mesh.names)
    body = _body(program, flat_io=True)
    width = _width(program)

    def padded(x: Block) -> Block:
        y = body(x.reshape(-1))
        return jnp.pad(y, (0, width - y.shape[0])) if y.shape[0] < width else y

    return jax.jit(jax.shard_map(padded, mesh=jm, in_specs=spec, out_specs=spec, check_vma=False),
                   compiler_options=compile_options(program, jm) or None)
