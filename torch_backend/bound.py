"""The one bound object: N >= 1 programs on one mesh (or between two: ``bind_across``) with
this process's pieces of every step, built once and replayed by every call of every door:
``run`` (sync), ``start`` (async, a ``Handle``), ``dual`` (the gradient's), all on one
autograd Function (``_Run``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NoReturn

import torch

from lowering.cross_mesh import CrossProgram
from lowering.joint import JointProgram, Merged, plan_jointly
from lowering.layout import local_shapes
from lowering.program import Program, Step
from torch_backend import collectives, comm
from torch_backend.autograd import backward_program
from torch_backend.cross_rounds import crossing_pieces, finish_groups, world
from torch_backend.dtypes import to_torch_dtype
from torch_backend.executor import aliases, build_pieces, execute
from torch_backend.faults import CollectiveError
from torch_backend.groups import MeshContext
from torch_backend.lean import collective_error, lean_run
from torch_backend.packed import LAUNCHABLE, PACKED
from torch_backend.runners import RUNNERS, Pieces
from torch_backend.scratch import Scratch, using
from torch_backend.tensor_checks import check_all, check_cross_block, expected_block, fits_block
from torch_backend.type_tags import Tags, output_tags, typed_output

Flying = tuple[Merged, tuple[int, ...], Any, Callable[[], Any]]  # a group in flight: members, work, finish


@dataclass(eq=False)
class BoundCall:
    """``programs`` (one mesh) bound to ``ctx``. ``scratch``: a prepared call's reused buffers;
    ``backward``: each program's gradient program, which ``dual`` binds."""

    programs: tuple[Program, ...]
    ctx: MeshContext
    pieces: tuple[list[Pieces], ...]
    scratch: Scratch | None = None
    backward: Callable[[Program], Program] = backward_program
    across: Across | None = None  # a cross-mesh bound's (``bind_across``); ``ctx`` is then the world's
    tags: list[Tags] = field(init=False, repr=False)  # each output's SPMD types (type_tags.typed_output)
    expect: list[tuple[Any, ...]] = field(init=False, repr=False)  # what a fitting tensor has (fits_block)
    _joint: JointProgram | None = field(default=None, repr=False)
    _one: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, repr=False)  # ``runner()``
    _dual: BoundCall | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.across is not None:  # the cross-mesh doors check the blocks and type the outputs themselves
            self.tags, self.expect = [], []
            return
        self.tags = [output_tags(p) for p in self.programs]
        self.expect = [expected_block(p.src, self.ctx) for p in self.programs]

    @property
    def program(self) -> Program:
        return self.programs[0]

    @property
    def joint(self) -> JointProgram:
        """The programs in lockstep rounds (made on first use: one program's rounds are its steps)."""
        if self._joint is None:
            self._joint = plan_jointly(self.programs)
        return self._joint

    # ---- running ---------------------------------------------------------------------

    def check(self, x: Any) -> torch.Tensor:
        return self.checked([x], one=True)[0]

    def checked(self, xs: Sequence[Any], one: bool = False) -> list[Any]:
        """Every program's tensor against its source type (``one``: a one-tensor call, whose
        error names no tensor); a cross-mesh call's blocks, None off the source mesh."""
        if self.across is not None:
            for i, (p, x) in enumerate(zip(self.programs, xs, strict=True)):
                error = check_cross_block(x, CrossProgram(p), self.ctx.rank, None if one else i)
                if error is not None:
                    raise error
            return list(xs)
        return check_all(xs, [p.src for p in self.programs], self.ctx, self.expect, one)

    def fits(self, x: Any, j: int = 0) -> bool:
        return type(x) is torch.Tensor and fits_block(x, self.expect[j])

    def hot(self, x: Any) -> torch.Tensor | None:
        """The fast path of a one-program call: a plain tensor that ``fits`` runs at once,
        differentiable and typed; else None. A plain tensor is never a traced one."""
        if type(x) is not torch.Tensor or not fits_block(x, self.expect[0]):
            return None
        if x.requires_grad and torch.is_grad_enabled():
            y = _Run.apply(self, None, x)[0]
        else:
            y = (self._one or self.runner())(x)
        return typed_output(y, x, self.tags[0])

    def run(self, xs: Sequence[Any]) -> list[Any]:
        """Every program on its checked tensor; the results never alias the inputs."""
        if self.across is not None:
            return self.run_across(xs)
        if len(self.programs) == 1:
            return [self.run_one(xs[0])]
        with using(self.scratch):
            return self.unaliased(xs, self.run_rounds(list(xs), self.joint.rounds))

    def run_across(self, xs: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """This rank's block of each destination, None off its mesh (or, where its gradient
        moves back, the forward's empty stand-in its backward starts from)."""
        a = self.across
        assert a is not None
        me = self.ctx.rank
        out: list[torch.Tensor | None] = [None] * a.width
        if not self.pieces[0][-1]:  # past both meshes' ranks: no message to or from this rank
            return out
        ins = [x.contiguous() if (x := xs[s]) is not None and me in p.mesh.global_ranks
               else torch.empty(0, dtype=to_torch_dtype(p.src.dtype), device=a.device)
               for s, p in zip(a.slots, self.programs, strict=True)]
        with using(self.scratch):
            ys = self.run_rounds(ins, self.joint.rounds)
        for k, (s, p) in enumerate(zip(a.slots, self.programs, strict=True)):
            x = xs[s]
            on_dst = p.dst_mesh is not None and me in p.dst_mesh.global_ranks
            stand_in = a.stand_ins and a.backs[k] is not None and x is not None
            out[s] = ys[k] if on_dst else x.new_empty(0) if stand_in and x is not None else None
        return out

    def run_one(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # traced: the interpreter, on functional collectives
            return execute(self.program, x, ctx=self.ctx, pieces=self.pieces[0])
        return (self._one or self.runner())(x)

    def runner(self) -> Callable[[torch.Tensor], torch.Tensor]:
        if self._one is None:
            self._one = lean_run(self.program, self.ctx, self.pieces[0], aliases, self.scratch) or self._interpret
        return self._one

    def _interpret(self, x: torch.Tensor) -> torch.Tensor:
        with using(self.scratch):
            return execute(self.program, x, ctx=self.ctx, pieces=self.pieces[0])

    def run_rounds(self, ys: list[torch.Tensor], rounds: Sequence[tuple[Merged, ...]]) -> list[torch.Tensor]:
        for rnd in rounds:
            for g in rnd:
                self.run_group(g, ys)
        return ys

    def run_group(self, g: Merged, ys: list[torch.Tensor]) -> None:
        """One round's group: a step alone, or same-kind steps packed into one collective."""
        try:
            if not g.packed:
                j, i = g.members[0]
                step = self.programs[j].steps[i]
                ctx = self.ctx_of(j, step)
                if ctx is not None:  # None: a source-mesh step, this rank off that mesh
                    ys[j] = RUNNERS[step.kind](ctx, step, self.pieces[j][i], ys[j])
                return
            outs = PACKED[g.kind](self.ctx, *self.packed(g, ys))
        except RuntimeError as e:
            self.raise_failed(g, e)
        for (j, _), y in zip(g.members, outs):
            ys[j] = y

    def packed(self, g: Merged, ys: list[torch.Tensor]) -> tuple[list[Step], list[Pieces], list[torch.Tensor]]:
        return ([self.joint.step(ref) for ref in g.members], [self.pieces[j][i] for j, i in g.members],
                [ys[j] for j, _ in g.members])

    def ctx_of(self, j: int, step: Step) -> MeshContext | None:
        """Where program ``j``'s ``step`` runs: ``ctx``, or a cross-mesh program's source mesh."""
        return self.across.on_src[j] if self.across is not None and step.dst_mesh is None else self.ctx

    def raise_failed(self, g: Merged, e: RuntimeError) -> NoReturn:
        j, i = g.members[0]
        step = self.programs[j].steps[i]
        if not step.is_collective or isinstance(e, CollectiveError):
            raise e
        ctx = self.ctx_of(j, step)
        assert ctx is not None  # the step ran here
        tensors = sorted({j for j, _ in g.members}) if len(self.programs) > 1 else ()
        raise collective_error(ctx, self.program, i, step, e, tensors) from e

    def unaliased(self, xs: Sequence[torch.Tensor], ys: list[torch.Tensor]) -> list[torch.Tensor]:
        for j, (x, y) in enumerate(zip(xs, ys)):
            if aliases(self.ctx, y, x):
                ys[j] = comm.rank_map(self.ctx, lambda r, t: t.clone(memory_format=torch.contiguous_format), y)
        return ys

    # ---- calls -----------------------------------------------------------------------

    def call(self, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Every program on its checked tensor: differentiable, the outputs typed."""
        return self.call_across(xs) if self.across is not None else self.typed(self.taped(xs), xs)

    def taped(self, xs: Sequence[torch.Tensor], handle: Handle | None = None) -> list[torch.Tensor]:
        """The run (or ``handle``'s finish), on autograd's tape where an input requires grad
        (untyped: the typed SPMD collectives type it themselves)."""
        if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
            return list(_Run.apply(self, handle, *xs))
        return handle.result() if handle is not None else self.run(xs)

    def call_across(self, xs: Sequence[Any]) -> list[Any]:
        """A cross-mesh call: where a gradient moves back, a rank on either mesh records the
        move on ``_Run``, its outputs off the source mesh hanging on empty leaves."""
        a, me, p = self.across, self.ctx.rank, self.program
        assert a is not None and p.dst_mesh is not None
        if not (torch.is_grad_enabled() and any(b is not None for b in a.backs)) or \
                me not in p.mesh.global_ranks and me not in p.dst_mesh.global_ranks:
            with torch.no_grad():
                return self.run_across(xs)
        held = [torch.empty(0, device=a.device, requires_grad=True) if x is None and b is not None else x
                for x, b in zip(xs, a.backs, strict=True)]
        return list(_Run.apply(self, None, *held))

    def typed(self, ys: list[torch.Tensor], xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [typed_output(y, x, t) for y, x, t in zip(ys, xs, self.tags)]

    def start(self, xs: Sequence[torch.Tensor], one: bool) -> Handle:
        plain = [x.detach() if x.requires_grad else x for x in xs]
        return Handle(self, xs, *self.split(plain, self.scratch), self.scratch, one)

    def last_collective(self) -> int:
        """The last round holding a collective that sends anything (-1: none)."""
        joint = self.joint
        return max((k for k, rnd in enumerate(joint.rounds) for g in rnd for m in g.members
                    if joint.step(m).is_collective and joint.step(m).bytes_sent_max > 0), default=-1)

    # ---- async under torch.compile: two traced regions around the user's wait ----------

    def launches(self, g: Merged) -> bool:
        if g.packed:
            return g.kind in LAUNCHABLE
        j, i = g.members[0]
        return collectives.launchable(self.ctx, self.programs[j].steps[i], self.pieces[j][i])

    def launch(self, g: Merged, ys: list[torch.Tensor]) -> tuple[tuple[int, ...], Any, Callable[[], Any]] | None:
        """Group ``g``'s collective on the wire: the tensors it writes, its work and what
        finishes it (their results, in order); None where it must run synchronously."""
        if g.packed and g.kind in LAUNCHABLE:  # where nothing stays on the wire, the work is None
            work, unpack = PACKED[g.kind](self.ctx, *self.packed(g, ys), launch_only=True)
            return tuple(j for j, _ in g.members), work, unpack
        if not g.packed:
            j, i = g.members[0]
            out = collectives.launch(self.ctx, self.programs[j].steps[i], self.pieces[j][i], ys[j])
            if out is not None:
                work, finish = out
                return (j,), work, lambda: [finish()]
        return None

    def issues(self) -> bool:
        k = self.last_collective()
        return k >= 0 and any(self.launches(g) for g in self.joint.rounds[k])

    def split(self, xs: Sequence[torch.Tensor], scratch: Scratch | None = None) -> tuple[list[torch.Tensor], list[Flying]]:
        """The first half of every async call: the rounds up to the last holding a collective,
        its launchable groups left on the wire (the others run, in call order on every rank):
        every tensor as that round left it, and the groups in flight."""
        k, rounds = self.last_collective(), self.joint.rounds
        flying: list[Flying] = []
        with using(scratch):
            ys = self.run_rounds(list(xs), rounds[:k])
            for g in rounds[k] if k >= 0 else ():
                launched = self.launch(g, ys)
                if launched is None:
                    self.run_group(g, ys)
                else:
                    flying.append((g, *launched))
        return ys, flying

    def landing(self, xs: Sequence[torch.Tensor], ys: list[torch.Tensor], flying: Sequence[Flying],
                scratch: Scratch | None = None) -> list[torch.Tensor]:
        """The second half: each group in flight waited and landed, in launch order, then the
        rounds after."""
        for g, members, work, finish in flying:
            try:
                comm.wait(self.ctx, work)
            except RuntimeError as e:
                self.raise_failed(g, e)
            for j, y in zip(members, finish()):
                ys[j] = y
        with using(scratch):
            ys = self.run_rounds(ys, self.joint.rounds[self.last_collective() + 1:])
        return self.unaliased(xs, ys)

    def issue(self, xs: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The first region of a compiled async call: ``split``, each collective in flight as its
        result before its wait (``comm.in_flight``), and every tensor as ``split`` left it."""
        ys, flying = self.split([x.detach() for x in xs])
        return [comm.in_flight(work) for _, _, work, _ in flying], ys

    def land(self, xs: Sequence[torch.Tensor], got: tuple[list[torch.Tensor], list[torch.Tensor]]) -> list[torch.Tensor]:
        """The second region: ``issue``'s collectives replayed, landing their waited results ``got``."""
        waited, ys = iter(got[0]), list(got[1])
        flying: list[Flying] = []
        for g in self.joint.rounds[self.last_collective()]:
            if self.launches(g):  # the others ran in the first region
                with comm.landed(next(waited)):
                    launched = self.launch(g, ys)
                assert launched is not None
                flying.append((g, *launched))
        # no scratch buffers: this runs only in a trace, whose tensors a later eager call must not reuse
        out: list[torch.Tensor] = Handle(self, xs, ys, flying, None).wait()
        return out

    # ---- the gradient ----------------------------------------------------------------

    def dual(self) -> BoundCall:
        """The bound gradient programs, built once (a prepared call's with buffers of their own)."""
        if self._dual is None and self.across is not None:
            a = self.across
            carried = [(k, b) for k, b in enumerate(a.backs) if b is not None]  # the dual moves only these
            self._dual = bind_across([b for _, b in carried], [self.programs[k] for k, _ in carried], a.width,
                                     a.device, a.timeout, a.backend, [a.slots[k] for k, _ in carried],
                                     not a.stand_ins)
        if self._dual is None:
            dual = bind([self.backward(p) for p in self.programs], self.ctx, self.backward)
            self._dual = dual.prepared() if self.scratch is not None else dual
        return self._dual

    def prepared(self) -> BoundCall:
        return BoundCall(self.programs, self.ctx, self.pieces, Scratch(), self.backward, self.across,
                         _joint=self._joint)

    def fixed(self, ys: Any) -> list[torch.Tensor]:
        """The outputs that carry no gradient: a cross-mesh move's whose gradient does not move back."""
        a = self.across
        return [] if a is None else [ys[s] for s, b in zip(a.slots, a.backs, strict=True)
                                     if ys[s] is not None and b is None]

    def zeros(self, j: int) -> torch.Tensor | None:
        """A zero gradient for output ``j`` that autograd did not use; None across meshes."""
        if self.across is not None:
            return None
        p = self.programs[j]
        shapes = local_shapes(p.dst, p.mesh)
        dt = to_torch_dtype(p.dst.dtype)
        return comm.rank_map(self.ctx, lambda r: torch.zeros(shapes[r], dtype=dt))


def bind(programs: Program | Sequence[Program], ctx: MeshContext,
         backward: Callable[[Program], Program] = backward_program) -> BoundCall:
    """The programs with this process's pieces, its groups made."""
    ps = (programs,) if isinstance(programs, Program) else tuple(programs)
    return BoundCall(ps, ctx, tuple(build_pieces(p, ctx) for p in ps), backward=backward)


@dataclass(frozen=True)
class Across:
    """What a cross-mesh bound adds (``bind_across``)."""

    on_src: tuple[MeshContext | None, ...]  # each program's context on its source mesh (None off it)
    backs: tuple[Program | None, ...]  # its gradient's move back (None: it carries none)
    slots: tuple[int, ...]  # the call's tensor it moves (a dual moves only those carrying a gradient)
    width: int  # the call's tensors
    device: torch.device  # where an empty block lives
    timeout: timedelta | None
    backend: str
    stand_ins: bool  # a rank off the destination gets an empty stand-in (the forward's: its backward starts there)
    outs: tuple[Any, ...] = ()  # the DeviceMesh each result is laid on as a DTensor (None or none: a local tensor)


def bind_across(programs: Sequence[Program], backs: Sequence[Program | None], width: int, device: torch.device,
                timeout: timedelta | None, backend: str, slots: Sequence[int] | None = None,
                stand_ins: bool = True, outs: Sequence[Any] = ()) -> BoundCall:
    """Cross-mesh programs between the same two meshes bound on this rank of the world, which
    every rank calls alike (a dual only the two meshes' ranks): each one's source-mesh
    groups and pieces there, its crossing's pieces of this rank (none past both meshes)."""
    ctx = world(timeout)
    on_src: list[MeshContext | None] = []
    pieces: list[list[Pieces]] = []
    for p in programs:
        view = CrossProgram(p)
        src_ctx = finish_groups(view, timeout, backend)
        finish = build_pieces(view.finish, src_ctx) if src_ctx is not None and view.finish is not None \
            else [{} for _ in p.steps[:-1]]
        crossing: Pieces = {ctx.rank: crossing_pieces(view.crossing, p.mesh, ctx.rank)} if ctx.rank < view.world \
            else {}
        on_src.append(src_ctx)
        pieces.append([*finish, crossing])
    across = Across(tuple(on_src), tuple(backs), tuple(range(width)) if slots is None else tuple(slots), width,
                    device, timeout, backend, stand_ins, tuple(outs))
    return BoundCall(tuple(programs), ctx, tuple(pieces), across=across)


def joined(bounds: Sequence[BoundCall]) -> BoundCall:
    """One bound of several one-program bounds on one context (their pieces reused)."""
    return BoundCall(tuple(b.program for b in bounds), bounds[0].ctx, tuple(b.pieces[0] for b in bounds),
                 backward=bounds[0].backward)


class Handle:
    """What an ``async_op=True`` call returns, between its two halves (``BoundCall.split``,
    ``landing``): ``wait()`` gives the result (a tensor for ``one``, else a list), once,
    differentiable. Do not modify the inputs before it."""

    def __init__(self, bound: BoundCall, xs: Sequence[torch.Tensor], ys: list[torch.Tensor], flying: list[Flying],
                 scratch: Scratch | None, one: bool = False) -> None:
        self.bound, self._xs, self._ys, self._one = bound, list(xs), ys, one
        self._inflight, self._scratch = flying, scratch
        self._result: list[torch.Tensor] | None = None
        self._out: list[torch.Tensor] | None = None
        if not flying:
            self.result()

    def result(self) -> list[torch.Tensor]:
        if self._result is None:
            self._result = self.bound.landing(self._xs, self._ys, self._inflight, self._scratch)
            self._inflight, self._ys = [], []
        return self._result

    def wait(self) -> Any:
        if self._out is None:
            self._out = self.bound.typed(self.bound.taped(self._xs, self), self._xs)
        return self._out[0] if self._one else self._out


class _Run(torch.autograd.Function):
    """The one autograd Function of every redistribution: a bound call's run (or its
    ``Handle``'s finish), with the bound dual as its backward."""

    @staticmethod
    def forward(ctx: Any, bound: BoundCall, pending: Handle | None,
                *xs: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        ctx.bound = bound
        ys = tuple(pending.result() if pending is not None else bound.run(xs))
        fixed = bound.fixed(ys)
        if fixed:
            ctx.mark_non_differentiable(*fixed)
        return ys

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        bound: BoundCall = ctx.bound
        filled = [g if g is not None else bound.zeros(j) for j, g in enumerate(grads)]
        dual = bound.dual()
        # where autograd records the backward itself (create_graph=True: a gradient penalty,
        # a Hessian-vector product) the dual runs on the tape too, so the gradient has its own
        # backward (the dual of the dual is the forward) instead of counting as a constant
        if torch.is_grad_enabled() and any(g is not None and g.requires_grad for g in filled):
            return (None, None, *_Run.apply(dual, None, *filled))
        return (None, None, *dual.run(filled))
