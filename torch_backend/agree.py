"""``agree=True``: before any collective of the program, the ranks compare what decides it.

One all_reduce over the mesh gathers each rank's hash of its call and whether its checks
failed, 8 bytes a rank; where any differ, a second gathers a short description each, and
every rank raises, naming the ranks at fault. It runs before the program is bound: binding
makes the groups, where ranks with different programs would wait for each other.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from lowering.caching import cached
from spec_lang.errors import SpecError
from spec_lang.ir import Mesh, TensorType
from torch_backend import comm
from torch_backend.faults import unrecorded
from torch_backend.groups import GroupHandle, MeshContext, context, is_device_mesh, local_tensor_mode

T = TypeVar("T")

TEXT_BYTES = 512  # each rank's description in the second gather (longer ones are cut)
SHOWN = 3  # failed ranks whose errors a message quotes
HINT = "every rank of the mesh passes the same types and mesh, and its own block of the source type"


def describe(pairs: Sequence[tuple[TensorType, TensorType]], ctx: MeshContext, xs: Sequence[Any] = ()) -> str:
    """The canonical text of a call: what the ranks must agree on."""
    kinds = tuple(sorted({str(getattr(getattr(x, "device", None), "type", type(x).__name__)) for x in xs}))
    return _call_text(tuple(pairs), ctx.mesh, ctx.to_global, kinds, len(xs) > 1)


@cached(maxsize=1024)  # an agreeing call in a loop describes the same call every time
def _call_text(pairs: tuple[tuple[TensorType, TensorType], ...], mesh: Mesh, to_global: tuple[int, ...],
               kinds: tuple[str, ...], several: bool) -> str:
    text = "; ".join(f"{s} -> {d}" for s, d in pairs) + f" on mesh {mesh}"
    if to_global != tuple(range(mesh.size)):
        text += f" (global ranks {list(to_global)})"
    return text + (f", {'/'.join(kinds)} tensor{'s' if several else ''}" if kinds else "")


@dataclass
class Checks:
    """What a rank's checks found, filled in as they go (a rank failing half-way still says what it can)."""

    ctx: MeshContext | None = None
    call: str | None = None


def agreed(mesh: Any, run: Callable[[Checks], T]) -> T:
    """``run(found)``, this rank's checks, then the agreement with the other ranks of the mesh:
    what ``run`` returned once every rank passed with the same call, else an error on every
    rank. ``mesh``: where a rank whose mesh did not resolve agrees."""
    found = Checks()
    out: Any = None
    error: BaseException | None = None
    try:
        with unrecorded():  # every rank raises together: none is left waiting to name this one
            out = run(found)
    except Exception as e:  # joins the agreement as failed, then raised
        error = e
    where = found.ctx if found.ctx is not None else _world_context(mesh)
    # where this process plays every rank (LocalTensorMode) there is no one to compare with
    if where is not None and len(where.ranks) == 1 and where.mesh.size > 1:
        error = compare_gathering(where, found.call, error, None)[0]
    if error is not None:
        raise error
    return out


def _world_context(mesh: Any) -> MeshContext | None:
    """Where a rank whose mesh did not resolve agrees: the default group's world (None for a
    DeviceMesh, or no real world)."""
    if is_device_mesh(mesh) or local_tensor_mode() is not None or not dist.is_initialized():
        return None
    try:
        return context(Mesh(("world",), (dist.get_world_size(),)))
    except SpecError:
        return None


def compare_gathering(ctx: MeshContext, call: str | None, error: BaseException | None, extra: int | None, *,
                      lead: str = "agree=True", hint: str = HINT) -> tuple[BaseException | None, dict[int, int]]:
    """The agreement over ``ctx``'s mesh, carrying one more int64 a rank where ``extra`` is not
    None (a cross-mesh call's grad code): the error to raise (None: every rank agrees; a
    failed rank's own ``error``, with what the others passed), and each member's extra.
    ``lead`` and ``hint``: what the messages call the agreement, and how to fix it."""
    group = ctx.group(ctx.mesh.names, ctx.rank)
    device = torch.device("cuda", torch.cuda.current_device()) if ctx.backend == "nccl" else torch.device("cpu")
    # one int64 a rank: the call's hash, shifted, and whether the rank's checks failed
    mine = [_digest(call) << 1 | int(error is not None), *(() if extra is None else (extra,))]
    table = _gather(ctx, group, mine, torch.int64, device).view(-1, len(mine)).tolist()
    rows = [row[0] for row in table]
    extras = {q: row[-1] for q, row in zip(group.members, table)} if extra is not None else {}
    failed = [q for q, v in zip(group.members, rows) if v & 1]
    digests = {q: v >> 1 for q, v in zip(group.members, rows) if v >> 1}
    if not failed and len(digests) == len(group.members) and len(set(digests.values())) == 1:
        return None, extras
    first = str(error).splitlines()[0] if error is not None and str(error) else type(error).__name__
    texts = _gather_texts(ctx, group, (call or "") + "\0" + (first if error is not None else ""), device)
    disagree, odd = _disagreement(digests, texts)
    if error is not None:
        return (_with_note(error, disagree, lead) if disagree else error), extras
    others = [q for q in failed if q != ctx.rank]
    parts = []
    if others:
        quoted = "; ".join(f"rank {q}: {texts[q][1]}" for q in others[:SHOWN])
        parts.append(f"{_ranks(others)} failed {'its' if len(others) == 1 else 'their'} checks ({quoted}"
                     f"{'; ...' if len(others) > SHOWN else ''})")
    if disagree:
        parts.append(disagree)
    at_fault = sorted(set(others) | set(odd))
    return SpecError(
        f"{lead}: the ranks do not agree on this call: " + "; ".join(parts),
        hint=f"{hint}; see the error on {_ranks(at_fault)}" if at_fault else "see the error on each rank",
    ), extras


def _digest(call: str | None) -> int:
    """62 bits of the call's hash, not 0 (0: no description, the rank failed before one)."""
    if call is None:
        return 0
    return int.from_bytes(hashlib.blake2b(call.encode(), digest_size=8).digest(), "little") >> 2 or 1


def _gather(ctx: MeshContext, group: GroupHandle, mine: Sequence[int], dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
    """Every member's row ``mine``, in group order: a summed table, each rank's row its own."""
    k = len(mine)
    table = torch.zeros(k * len(group.members), dtype=dtype)
    at = group.members.index(ctx.rank) * k
    table[at:at + k] = torch.tensor(mine, dtype=dtype)
    out = table.to(device)
    try:
        comm.all_reduce(ctx, out, "sum", group)
    except RuntimeError as e:
        raise comm.failed(ctx, f"rank {ctx.rank}: agree=True's exchange", e, group.members, ctx.mesh.names) from e
    return out


def _gather_texts(ctx: MeshContext, group: GroupHandle, text: str, device: torch.device) -> dict[int, tuple[str, str]]:
    """Every rank's (call, first line of its error), cut to ``TEXT_BYTES``."""
    raw = text.encode()[:TEXT_BYTES]
    rows = _gather(ctx, group, [*raw, *bytes(TEXT_BYTES - len(raw))], torch.uint8, device).view(-1, TEXT_BYTES).cpu()
    texts = (bytes(row.tolist()).rstrip(b"\0").decode(errors="ignore").partition("\0") for row in rows)
    return {q: (call, err) for q, (call, _, err) in zip(group.members, texts)}


def _disagreement(digests: dict[int, int], texts: dict[int, tuple[str, str]]) -> tuple[str, list[int]]:
    """Who passed what where the calls differ ('' where not), and the ranks off the majority's
    call (every rank without one)."""
    counts = Counter(digests.values()).most_common()
    if len(counts) < 2:
        return "", []
    by_call: dict[int, list[int]] = {}
    for q, d in sorted(digests.items()):
        by_call.setdefault(d, []).append(q)
    major = counts[0][0] if counts[0][1] > counts[1][1] else None
    parts = [f"{_ranks(qs)} passed {texts[qs[0]][0]}" for d, qs in by_call.items() if d != major]
    if major is not None:
        n = len(by_call[major])
        parts.append(f"the other {n} rank{'s' if n > 1 else ''} passed {texts[by_call[major][0]][0]}")
    else:
        parts.insert(0, "no call has a majority")
    return "; ".join(parts), sorted(q for q, d in digests.items() if d != major)


def _ranks(qs: Sequence[int]) -> str:
    return f"rank {qs[0]}" if len(qs) == 1 else f"ranks {list(qs)}"


def _with_note(error: BaseException, note: str, lead: str) -> BaseException:
    line = f"({lead}: {note})"
    if isinstance(error, SpecError):
        return SpecError(f"{error.message}\n{line}", text=error.text, pos=error.pos, hint=error.hint,
                         subject=error.subject)
    error.add_note(line)
    return error
