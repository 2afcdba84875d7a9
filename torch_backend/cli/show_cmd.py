"""``shardc show TYPE --mesh M``: which rank holds which block, drawn like
``jax.debug.visualize_array_sharding``.

The global index space is cut at every rank's block boundaries; each tile lists the
ranks holding it (numbers are ranks, rank = row-major mesh coordinate). 1-D types are
one row of tiles, 2-D types a grid (dim 0 down, dim 1 across). For 3+ dims the last
two dims are drawn as a grid once for every distinct block of the leading dims (not
once per index, so the output stays as small as the layout). Tiles held by the same
ranks get the same colour. Notes below the picture say what the unsharded axes mean:
a partial axis (U / P(op)) holds pending-reduction addends, R/I replicas, V per-rank
values. Only rich is imported (no torch, no jax).
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import numpy as np

_PALETTE = (
    "on dark_blue", "on dark_green", "on dark_red", "on purple4", "on dark_orange3", "on deep_sky_blue4",
    "on dark_olive_green3", "on medium_violet_red", "on steel_blue", "on gold3", "on dark_cyan",
    "on indian_red", "on slate_blue3", "on chartreuse4", "on orange4", "on grey37",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("type", help="a type, e.g. 'f32[8@(dp,tp),16]' (quote it in the shell)")
    parser.add_argument("--mesh", required=True, help="a mesh, e.g. dp=2,tp=4")
    parser.add_argument("--width", type=int, default=None, help="console width (default: the terminal's)")
    parser.add_argument("--no-color", action="store_true", help="no colours")


def ranks_text(ranks: list[int]) -> str:
    """``[0,1,2,3,6]`` -> ``0-3,6`` (runs compressed so big meshes fit in a tile)."""
    out: list[str] = []
    for _, run in itertools.groupby(enumerate(ranks), key=lambda p: p[1] - p[0]):
        vals = [v for _, v in run]
        out.append(str(vals[0]) if len(vals) == 1 else f"{vals[0]}-{vals[-1]}")
    return ",".join(out)


def cuts(b: np.ndarray, d: int, size: int) -> list[tuple[int, int]]:
    """The segments [lo, hi) of dim ``d`` between all block boundaries (empty blocks ignored)."""
    nonempty = b[(b[:, :, 1] > b[:, :, 0]).all(axis=1)]
    pts = sorted({0, size} | {int(x) for x in nonempty[:, d, :].ravel()})
    return [(lo, hi) for lo, hi in zip(pts[:-1], pts[1:], strict=True) if hi > lo]


def holders(b: np.ndarray, lo: tuple[int, ...], hi: tuple[int, ...]) -> list[int]:
    """Ranks whose block contains the tile [lo, hi)."""
    lo_a, hi_a = np.array(lo), np.array(hi)
    ok = (b[:, :, 0] <= lo_a).all(axis=1) & (b[:, :, 1] >= hi_a).all(axis=1) & (b[:, :, 1] > b[:, :, 0]).all(axis=1)
    return [int(r) for r in np.nonzero(ok)[0]]


def _grid(b: np.ndarray, shape: tuple[int, ...], fixed: list[tuple[int, int]], colour: Any, title: str) -> Any:
    """A rich Table for the last one or two dims, the leading dims fixed to ``fixed`` segments."""
    from rich.table import Table
    from rich.text import Text

    nd = len(shape)
    rows = cuts(b, nd - 2, shape[-2]) if nd >= 2 else [(0, 1)]
    cols = cuts(b, nd - 1, shape[-1])
    table = Table(title=title, show_lines=True, show_header=True, header_style="bold")
    corner = f"d{nd - 2}\u2193 d{nd - 1}\u2192" if nd >= 2 else ""  # rows down, columns across
    table.add_column(corner, style="bold", justify="right")
    for lo, hi in cols:
        table.add_column(f"{lo}:{hi}", justify="center")
    for rlo, rhi in rows:
        cells: list[Any] = [f"{rlo}:{rhi}" if nd >= 2 else "dim 0"]
        for clo, chi in cols:
            lo = tuple(s[0] for s in fixed) + ((rlo,) if nd >= 2 else ()) + (clo,)
            hi = tuple(s[1] for s in fixed) + ((rhi,) if nd >= 2 else ()) + (chi,)
            who = holders(b, lo, hi)
            cells.append(Text(ranks_text(who) or "-", style=colour(tuple(who))))
        table.add_row(*cells)
    return table


def notes(t: Any, mesh: Any) -> list[str]:
    """One line per mesh axis that shards nothing: what its ranks hold."""
    out = []
    for name in mesh.names:
        if t.dim_of(name) is not None:
            continue
        at = t.axis_type(name)
        if at.kind == "P":
            out.append(f"{name}: {at.code} - partial ({at.op}): ranks along {name} hold addends of a pending "
                       f"{at.op}; the block's value is their {at.op}")
        elif at.kind == "V":
            out.append(f"{name}: V - varying: ranks along {name} hold different values (dims are per-rank shape)")
        elif at.kind == "R":
            out.append(f"{name}: R - replicated (gradient partial)")
        else:
            out.append(f"{name}: I - replicated, invariant (unannotated)")
    return out


def render(type_text: str, mesh_text: str, console: Any) -> None:
    """Print the picture of ``type_text`` on ``mesh_text`` to a rich console."""
    from lowering.checks import resolve
    from lowering.layout import boxes

    t, mesh = resolve(type_text, mesh_text)
    b = boxes(t, mesh)
    console.print(f"[bold]{t}[/bold] on mesh {mesh}  (tiles list the ranks holding them)")
    if t.ndim == 0:
        console.print(f"a scalar: every rank (0-{mesh.size - 1}) holds it")
    else:
        styles: dict[tuple[int, ...], str] = {}

        def colour(who: tuple[int, ...]) -> str:
            if not who:
                return ""
            return styles.setdefault(who, _PALETTE[len(styles) % len(_PALETTE)])

        lead = t.ndim - 2
        if lead > 0:
            console.print(f"{t.ndim}-d: the last two dims (dim {t.ndim - 2} down, dim {t.ndim - 1} across) "
                          f"for each distinct block of dims 0..{lead - 1}")
        seg_lists = [cuts(b, d, t.shape[d]) for d in range(max(lead, 0))]
        for fixed in itertools.product(*seg_lists):
            title = None
            if fixed:
                title = "[" + ", ".join(f"{lo}:{hi}" for lo, hi in fixed) + ", :, :]"
            console.print(_grid(b, t.shape, list(fixed), colour, title or ""))
    empty = [r for r in range(mesh.size) if (b[r, :, 1] <= b[r, :, 0]).any()]
    if empty:
        console.print(f"ranks holding no elements (uneven chunk rule): {ranks_text(empty)}")
    for line in notes(t, mesh):
        console.print(line, markup=False)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(width=args.width, no_color=args.no_color, highlight=False)
    render(args.type, args.mesh, console)
    return 0
