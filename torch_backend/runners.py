"""The torch execution of each step kind (docs/architecture.md, "Step kinds: one definition
each"): a runner ``fn(ctx, step, pieces, x) -> y`` registered with ``@runs("kind")``, where
``pieces`` maps each mesh rank this process plays to its ``RankPieces`` and ``x`` is this
process's block (a LocalTensor under LocalTensorMode).

A kind may also have a fast runner, registered with ``@fast("kind")``: made once when a
one-step program is bound on a real group (``lean.lean_run``), it holds the group, the
output shape and the op, and per call allocates the output and issues the collective,
nothing else (bit for bit the runner's result: the same collective on the same buffers).
Only forms whose result cannot alias the input and that need no scratch buffer have one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NoReturn

import torch

from lowering.kinds import RankPieces
from lowering.kinds.base import PiecesT, own_pieces
from lowering.program import Step
from torch_backend.groups import MeshContext

Pieces = dict[int, RankPieces]  # mesh rank -> pieces, for each rank this process plays
Runner = Callable[[MeshContext, Step, Pieces, torch.Tensor], torch.Tensor]

RUNNERS: dict[str, Runner] = {}


def runs(*kinds: str) -> Callable[[Runner], Runner]:
    """Register ``fn`` as the torch execution of ``kinds``."""
    def add(fn: Runner) -> Runner:
        RUNNERS.update(dict.fromkeys(kinds, fn))
        return fn
    return add


FastRunner = Callable[[torch.Tensor], torch.Tensor]
Failed = Callable[[RuntimeError], NoReturn]  # raises a failed collective's error, named
FastMaker = Callable[[MeshContext, Step, RankPieces, Failed], FastRunner | None]

FAST: dict[str, FastMaker] = {}


def fast(*kinds: str) -> Callable[[FastMaker], FastMaker]:
    """Register ``make(ctx, step, pieces, failed)`` as the fast runner of ``kinds``: this
    rank's one-step program as one function, or None where the kind's runner must run it."""
    def add(make: FastMaker) -> FastMaker:
        FAST.update(dict.fromkeys(kinds, make))
        return make
    return add


def pieces_as(cls: type[PiecesT], pieces: Mapping[int, RankPieces]) -> dict[int, PiecesT]:
    """``pieces`` as ``cls``: a runner is given the pieces its kind built, each of the
    kind's own class (a TypeError otherwise)."""
    return dict(zip(pieces, own_pieces(cls, list(pieces.values()))))
