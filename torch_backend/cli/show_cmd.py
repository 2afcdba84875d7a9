"""``shardc show TYPE --mesh M``: which rank holds which block, drawn like
``jax.debug.visualize_array_sharding`` (docs/dsl.md, "Command line", describes the
picture): the global index space cut at every rank's block boundaries, each tile listing
the ranks holding it. Only rich is imported (no torch, no jax).
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass
from typing import Any

from spec_lang.errors import SpecError
from torch_backend.cli.ranks import blocks_text, cat_text, rank_line, ranks_text

_PALETTE = (
    "on dark_blue", "on dark_green", "on dark_red", "on purple4", "on dark_orange3", "on deep_sky_blue4",
    "on dark_olive_green3", "on medium_violet_red", "on steel_blue", "on gold3", "on dark_cyan",
    "on indian_red", "on slate_blue3", "on chartreuse4", "on orange4", "on grey37",
)
MIN_WIDTH = 24  # below this not even one tile and its row label fit
MAX_SEGMENTS = 64  # blocks drawn per dim; beyond, the first and last MAX_SEGMENTS // 2
MAX_CELL = 24  # widest tile text before it wraps inside the tile
LIST_RANKS = 64  # an uneven type's blocks are listed for this many ranks at most


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("type", help="a type, e.g. 'f32[8@(dp,tp),16]' (quote it in the shell)")
    parser.add_argument("--mesh", required=True, help="a mesh, e.g. dp=2,tp=4")
    parser.add_argument("--width", type=int, default=None,
                        help=f"console width, at least {MIN_WIDTH} (default: the terminal's, 80 when piped); "
                        "a wider grid is drawn in bands of columns")
    parser.add_argument("--no-color", action="store_true", help="no colours")


def cuts(b: Any, shape: tuple[int, ...], d: int) -> list[tuple[int, int]]:
    """The segments [lo, hi) of dim ``d`` between all block boundaries (empty blocks ignored).

    A dim of size 0 is one empty segment (0, 0), and it empties no block: the picture of
    an empty tensor shows how its other dims are cut."""
    import numpy as np

    if shape[d] == 0:
        return [(0, 0)]
    live = (b[:, :, 1] > b[:, :, 0]) | (np.array(shape) == 0)
    nonempty = b[live.all(axis=1)]
    pts = sorted({0, shape[d]} | {int(x) for x in set(nonempty[:, d, :].ravel().tolist())})
    return [(lo, hi) for lo, hi in zip(pts[:-1], pts[1:], strict=True) if hi > lo]


def holders(b: Any, lo: tuple[int, ...], hi: tuple[int, ...], owners: Any = None) -> list[int]:
    """Ranks whose block contains the tile [lo, hi): block i is rank i's, or ``owners[i]``'s
    (a tile empty in a dim, of a dim of size 0, is held by the blocks that cover the rest)."""
    import numpy as np

    lo_a, hi_a = np.array(lo), np.array(hi)
    live = ((b[:, :, 1] > b[:, :, 0]) | (lo_a == hi_a)).all(axis=1)
    ok = (b[:, :, 0] <= lo_a).all(axis=1) & (b[:, :, 1] >= hi_a).all(axis=1) & live
    hit = np.nonzero(ok)[0]
    return [int(r) for r in (hit if owners is None else np.unique(owners[hit]))]


def _elide(segs: list[tuple[int, int]]) -> tuple[list[tuple[int, int] | None], int]:
    """At most MAX_SEGMENTS segments: the first and last halves, None where the rest were."""
    if len(segs) <= MAX_SEGMENTS:
        return list(segs), 0
    half = MAX_SEGMENTS // 2
    return [*segs[:half], None, *segs[-half:]], len(segs) - 2 * half


@dataclass
class Grid:
    """The tiles of the last one or two dims, as text: what gets laid out and drawn."""

    corner: str
    row_labels: list[str]
    col_labels: list[str]
    cells: list[list[tuple[str, tuple[int, ...]]]]  # (text, holders) per row, per column
    col_segs: list[tuple[int, int] | None]  # None where blocks were left out
    elided: list[str]  # notes on blocks left out


def grid(b: Any, shape: tuple[int, ...], fixed: list[tuple[int, int]], owners: Any = None) -> Grid:
    nd = len(shape)
    rows, row_gap = _elide(cuts(b, shape, nd - 2) if nd >= 2 else [(0, 1)])
    cols, col_gap = _elide(cuts(b, shape, nd - 1))
    elided = [f"dim {d}: {gap} of its {gap + MAX_SEGMENTS} blocks not drawn (the middle ones)"
              for d, gap in ((nd - 2, row_gap), (nd - 1, col_gap)) if gap]
    cells = []
    for r in rows:
        line: list[tuple[str, tuple[int, ...]]] = []
        for c in cols:
            if r is None or c is None:
                line.append(("...", ()))
                continue
            lo = tuple(s[0] for s in fixed) + ((r[0],) if nd >= 2 else ()) + (c[0],)
            hi = tuple(s[1] for s in fixed) + ((r[1],) if nd >= 2 else ()) + (c[1],)
            who = holders(b, lo, hi, owners)
            line.append((ranks_text(who) or "-", tuple(who)))
        cells.append(line)
    return Grid(
        corner=f"d{nd - 2}\u2193 d{nd - 1}\u2192" if nd >= 2 else "",  # rows down, columns across
        row_labels=["..." if r is None else f"{r[0]}:{r[1]}" for r in rows] if nd >= 2 else ["dim 0"],
        col_labels=["..." if c is None else f"{c[0]}:{c[1]}" for c in cols],
        cells=cells,
        col_segs=cols,
        elided=elided,
    )


def bands(g: Grid, width: int) -> tuple[int, list[range]]:
    """One tile width for every column (JAX's picture keeps every rank number whole), and
    the column ranges that fit ``width`` side by side next to the row labels.

    Long rank lists wrap at commas inside their tile when that lets all columns fit in one
    band; otherwise the grid is cut into bands of columns at the natural tile width.
    """
    texts = [t for row in g.cells for t, _ in row]
    natural = min(MAX_CELL, max(len(t) for t in g.col_labels + texts))
    narrowest = max(len(t) for t in g.col_labels + [tok + "," for t in texts for tok in t.split(",")])
    room = _room(width, max(len(t) for t in [g.corner, *g.row_labels]))
    n = len(g.col_labels)
    fit_one_band = room // n - 3
    cell = natural if fit_one_band >= natural else (fit_one_band if fit_one_band >= narrowest else natural)
    per_band = max(1, room // (cell + 3))
    return cell, [range(i, min(n, i + per_band)) for i in range(0, n, per_band)]


def _room(width: int, label: int) -> int:
    """The columns left for tiles beside a row label ``label`` wide: rich draws each column
    as padding 1 + text + padding 1, plus one border per column and one at the end."""
    return width - (label + 3) - 1


def wrap_ranks(text: str, width: int) -> str:
    """``0-4,20-24,40-44`` in tiles ``width`` wide: lines broken after commas."""
    lines: list[str] = []
    toks = text.split(",")
    for i, tok in enumerate(toks):
        comma = 1 if i + 1 < len(toks) else 0  # a line that goes on ends in a comma
        if lines and len(lines[-1]) + 1 + len(tok) + comma <= width:
            lines[-1] += "," + tok
        else:
            if lines:
                lines[-1] += ","
            lines.append(tok)
    return "\n".join(lines)


def _table(g: Grid, cols: range, cell: int, colour: Any, title: str) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title or None, show_lines=True, show_header=True, header_style="bold")
    table.add_column(g.corner, style="bold", justify="right", no_wrap=True)
    for j in cols:
        table.add_column(g.col_labels[j], justify="center", min_width=cell, max_width=cell, overflow="fold")
    for label, row in zip(g.row_labels, g.cells, strict=True):
        table.add_row(label, *[Text(wrap_ranks(row[j][0], cell), style=colour(row[j][1]), justify="center")
                               for j in cols])
    return table


def _folded(g: Grid, cell: int, width: int, colour: Any) -> Any:
    """A 1-D grid too wide for one band, as rows of tiles in one table: each row labelled
    with the span it covers, each tile with its slice over the ranks holding it (bands of
    one-row tables would take six lines per row)."""
    from rich.table import Table
    from rich.text import Text

    n = len(g.col_labels)
    label = 2 * len(str(max(hi for _, hi in (c for c in g.col_segs if c is not None)))) + 1  # the widest lo:hi
    per_row = max(1, _room(width, label) // (cell + 3))
    table = Table(show_header=False, show_lines=True)
    table.add_column(style="bold", justify="right", no_wrap=True)
    for _ in range(min(per_row, n)):
        table.add_column(justify="center", min_width=cell, max_width=cell, overflow="fold")
    # blocks left out (None) get a row of their own, so that no row's span hides them
    gap = g.col_segs.index(None) if None in g.col_segs else n
    runs = [range(0, gap)] + ([range(gap + 1, n)] if gap < n else [])
    for k, run in enumerate(runs):
        if k:
            table.add_row("...", *["..."] * min(per_row, n))
        for start in range(run.start, run.stop, per_row):
            cols = range(start, min(run.stop, start + per_row))
            first, last = g.col_segs[cols.start], g.col_segs[cols.stop - 1]
            assert first is not None and last is not None  # the left-out block lies between runs
            span = f"{first[0]}:{last[1]}"
            tiles = [Text.assemble((g.col_labels[j], "dim"), "\n", wrap_ranks(g.cells[0][j][0], cell),
                                   style=colour(g.cells[0][j][1]), justify="center") for j in cols]
            table.add_row(span, *tiles)
    return table


_HOLD = {"V": "V - varying: ranks along {} hold different values (dims are per-rank shape)",
         "R": "R - replicated (gradient partial)", "I": "I - replicated, invariant (unannotated)"}


def notes(t: Any, mesh: Any) -> list[str]:
    """One line per mesh axis that shards nothing: what its ranks hold."""
    out = []
    for name in (n for n in mesh.names if t.dim_of(n) is None):
        at = t.axis_type(name)
        if at.kind == "P":
            out.append(f"{name}: {at.code} - partial ({at.op}): ranks along {name} hold addends of a pending "
                       f"{at.op}; the block's value is their {at.op}")
        else:
            out.append(f"{name}: " + _HOLD[at.kind].format(name))
    return out


def all_blocks(t: Any, mesh: Any) -> tuple[Any, Any, list[Any] | None]:
    """Every block of every rank, the rank holding each (None: block r is rank r's box) and,
    for an uneven type, each rank's layout."""
    import numpy as np

    from lowering.layout import boxes, layouts

    named = None if mesh.ranks is None else np.asarray(mesh.ranks)  # tiles name global ranks
    if not t.is_uneven:
        return boxes(t, mesh), named, None
    lays = layouts(t, mesh)
    b = np.concatenate([lay.blocks for lay in lays]).reshape(-1, t.ndim, 2)
    owners = np.repeat(np.arange(mesh.size), [len(lay.blocks) for lay in lays])
    return b, owners if named is None else named[owners], lays


def render(type_text: str, mesh_text: str, console: Any) -> None:
    """Print the picture of ``type_text`` on ``mesh_text`` to a rich console, fitted to its width."""
    from lowering.checks import resolve
    from lowering.layout import local_shapes

    t, mesh = resolve(type_text, mesh_text)
    b, owners, lays = all_blocks(t, mesh)
    console.print(f"[bold]{t}[/bold] on mesh {mesh}")
    console.print("tiles list the ranks holding them" + ("" if mesh.ranks is None else " (global ranks)"),
                  style="dim")
    if t.ndim == 0:
        console.print(f"a scalar: every rank ({ranks_text(sorted(mesh.global_ranks))}) holds it")
    else:
        styles: dict[tuple[int, ...], str] = {}

        def colour(who: tuple[int, ...]) -> str:
            if not who:
                return ""
            return styles.setdefault(who, _PALETTE[len(styles) % len(_PALETTE)])

        lead = t.ndim - 2
        if lead > 0:
            leading = "dim 0" if lead == 1 else f"dims 0..{lead - 1}"
            console.print(f"{t.ndim}-d: the last two dims (dim {t.ndim - 2} down, {t.ndim - 1} across), "
                          f"once per block of {leading}")
        leading_segs = [_elide(cuts(b, t.shape, d)) for d in range(max(lead, 0))]
        said = {f"dim {d}: {gap} blocks not drawn (the middle ones)" for d, (_, gap) in enumerate(leading_segs) if gap}
        for combo in itertools.product(*(segs for segs, _ in leading_segs)):
            fixed = [seg for seg in combo if seg is not None]
            if len(fixed) < len(combo):
                console.print("...")
                continue
            g = grid(b, t.shape, fixed, owners)
            said.update(g.elided)
            cell, col_bands = bands(g, console.width)
            if t.ndim == 1 and len(col_bands) > 1:
                console.print(_folded(g, cell, console.width, colour))
                said.add(f"folded into rows of tiles to fit {console.width} columns (--width W for wider rows)")
                continue
            head = "[" + ", ".join(f"{lo}:{hi}" for lo, hi in fixed) + ", :, :]" if fixed else ""
            for k, cols in enumerate(col_bands):
                title = head
                if len(col_bands) > 1:
                    drawn = [c for c in g.col_segs[cols.start:cols.stop] if c is not None]
                    span = f"{drawn[0][0]}:{drawn[-1][1]}" if drawn else "..."
                    title = (f"{head} " if head else "") + f"dim {t.ndim - 1} {span} (band {k + 1}/{len(col_bands)})"
                console.print(_table(g, cols, cell, colour, title))
            if len(col_bands) > 1:
                said.add(f"wider than {console.width} columns, so drawn in bands (--width W for wider ones)")
        for line in sorted(said):
            console.print(f"note: {line}", markup=False)
    if lays is not None:
        _rank_blocks(lays, mesh, console)
    if lays is None and 0 in t.shape:
        console.print(f"an empty tensor (dim {t.shape.index(0)} has size 0): the tiles show how its other dims "
                      "are cut")
    else:
        empty = sorted(mesh.global_ranks[r] for r, shape in enumerate(local_shapes(t, mesh)) if 0 in shape)
        if empty:
            rule = "uneven split" if lays is not None else "uneven chunk rule"
            console.print(f"ranks holding no elements ({rule}): {ranks_text(empty, max_runs=16)}")
    for line in notes(t, mesh):
        console.print(line, markup=False)


def _rank_blocks(lays: list[Any], mesh: Any, console: Any) -> None:
    """An uneven type's blocks, rank by rank, in local order."""
    console.print(f"each rank's blocks, in local order ({cat_text(lays[0].cat)}):")
    for r, lay in enumerate(lays[:LIST_RANKS]):
        console.print(rank_line(mesh.global_ranks[r], zip(mesh.names, mesh.coords(r), strict=True),
                                blocks_text(lay.blocks), lay.shape), markup=False, soft_wrap=True)
    if len(lays) > LIST_RANKS:
        console.print(f"  ... ({len(lays) - LIST_RANKS} more ranks)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    if args.width is not None and args.width < MIN_WIDTH:
        raise SpecError(f"--width {args.width} is too narrow", text=str(args.width), pos=0,
                        hint=f"give a console width of at least {MIN_WIDTH} columns, or leave --width out")
    console = Console(width=args.width, no_color=args.no_color, highlight=False)
    render(args.type, args.mesh, console)
    return 0
