"""Torch execution of ``relay`` (its definition: ``lowering.kinds.relay``): two exact
``all_to_all_single`` calls, each with every peer's exact split (never padded, no
point-to-point, so the same code runs eagerly, under LocalTensorMode and traced)::

    phase 1: each holder sends a piece once, to the rank that owns it (into its output)
    phase 2: each owner sends its pieces, from its input or from what phase 1 brought,
             to the other ranks that need them
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from lowering.kinds.relay import RelayPieces
from lowering.program import Step
from torch_backend import comm
from torch_backend.comm import rank_map
from torch_backend.groups import GroupHandle, MeshContext
from torch_backend.runners import Pieces, pieces_as, runs
from torch_backend.strided import contiguous, nothing_of, run_copies


def _phase(ctx: MeshContext, plans: Mapping[int, RelayPieces], g: GroupHandle, x: torch.Tensor, y: torch.Tensor,
           first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``y`` after one phase (pack, one exact all_to_all over the group, unpack into ``y``),
    and what the phase received."""
    send_splits = {r: list(p.send1 if first else p.send2) for r, p in plans.items()}
    recv_splits = {r: list(p.recv1 if first else p.recv2) for r, p in plans.items()}

    def pack(r: int, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if not sum(send_splits[r]):  # drawn from the input all the same (see strided.nothing_of)
            return nothing_of(t)
        p, buf = plans[r], t.new_empty(sum(send_splits[r]))
        run_copies(p.pack1 if first else p.pack2_in, contiguous(t), buf)
        return buf if first else run_copies(p.pack2_out, contiguous(out), buf)

    got = comm.all_to_all(ctx, rank_map(ctx, pack, x, y), send_splits, recv_splits, g)

    def land(r: int, out: torch.Tensor, recv: torch.Tensor) -> torch.Tensor:
        return run_copies(plans[r].unpack1 if first else plans[r].unpack2, contiguous(recv), out)

    return rank_map(ctx, land, y, got), got


@runs("relay")
def relay(ctx: MeshContext, step: Step, pieces: Pieces, x: torch.Tensor) -> torch.Tensor:
    """Keep what this rank holds and needs, then the two phases."""
    plans = pieces_as(RelayPieces, pieces)
    y = rank_map(ctx, lambda r, t: run_copies(plans[r].keep, contiguous(t), t.new_empty(plans[r].out_shape)), x)
    # under LocalTensorMode one call plays every group: a phase runs where any group has one
    active = [any(p.active[i] for p in plans.values()) for i in (0, 1)]
    got: list[tuple[int, torch.Tensor]] = []
    if next(iter(plans.values())).n > 1 and any(active):
        g = ctx.group(step.axes, ctx.ranks[0])
        for phase in (1, 2):
            if active[phase - 1]:
                y, recv = _phase(ctx, plans, g, x, y, phase == 1)
                got.append((phase, recv))

    def settle(r: int, out: torch.Tensor, t: torch.Tensor, *recvs: torch.Tensor) -> torch.Tensor:
        # a compiled graph orders collectives by data alone: an output that read nothing of
        # the input or of a phase's receive is tied to them (see comm.tied), once, at the end,
        # since a tied block is a view that the phases' strided copies may not write into
        p = plans[r]
        unread = [b for (phase, _), b in zip(got, recvs) if not sum(p.recv1 if phase == 1 else p.recv2)]
        return out if p.keep and not unread else comm.tied(ctx, out, t, *unread)

    return rank_map(ctx, settle, y, x, *(b for _, b in got))
