"""Rank sets as short text: ``[0,1,2,3,6]`` -> ``0-3,6``, and a rank's blocks and entry as
text (shared by ``parse`` and ``show``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def ranks_text(ranks: Sequence[int] | Any, max_runs: int | None = None) -> str:
    """Sorted ranks ``[0,1,2,3,6]`` -> ``0-3,6``; past ``max_runs`` runs, ``... (N more
    runs)`` (the runs found vectorized: meshes can have millions of ranks)."""
    import numpy as np

    r = np.asarray(ranks, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(r) != 1)
    runs = list(zip(np.concatenate((r[:1], r[breaks + 1])).tolist(), np.concatenate((r[breaks], r[-1:])).tolist(),
                    strict=True))
    shown = runs if max_runs is None else runs[:max_runs]
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in shown)
    if len(shown) < len(runs):
        text += f",... ({len(runs) - len(shown)} more runs)"
    return text


def box_text(box: Any) -> str:
    """A global box ``[[0, 4], [2, 8]]`` -> ``[0:4, 2:8]``."""
    return "[" + ", ".join(f"{int(a)}:{int(b)}" for a, b in box) + "]"


def blocks_text(blocks: Any) -> str:
    """A rank's blocks (``lowering.layout.LocalLayout.blocks``) in local order, on one line."""
    return " ".join(box_text(b) for b in blocks) or "no blocks"


def cat_text(cat: int | None) -> str:
    """How a layout's blocks make up the local tensor (``LocalLayout.cat``)."""
    return "flattened, then concatenated" if cat is None else f"concatenated along dim {cat}"


def rank_line(rank: int, coords: Iterable[tuple[str, int]], held: str, shape: Sequence[int]) -> str:
    """One rank's entry in a listing: ``  rank   3 (dp=1,tp=1): [0:4, 8:16] shape (4, 8)``."""
    return f"  rank {rank:>3} ({','.join(f'{k}={v}' for k, v in coords)}): {held} shape {tuple(shape)}"
