"""Copy plans: a step's pack or unpack as a few strided copies instead of one per piece.

Packing a rank's pieces into a flat send buffer (and unpacking a receive buffer into
the output block) is a list of box-to-run copies, one per peer. Run one by one, each
costs a dispatch; for n peers and a 1 MiB block that overhead is several times the copy
itself. Pieces of a regular layout repeat with a constant stride on both sides (the
column blocks of an ``S(0) -> S(1)`` exchange lie ``c`` elements apart in the input and
``rows*c`` apart in the buffer), so consecutive ones fold into one higher-rank strided
view::

    input [r, n*c]: | p0 | p1 | p2 |        buffer: [p0 rows][p1 rows][p2 rows]
    3 copies of (r, c)                 =>   1 copy of (3, r, c), strides (c, n*c, 1) -> (r*c, c, 1)

Each copy is a pair of ``(offset, size, stride)`` views of two row-major contiguous
tensors, the form ``torch.as_strided`` takes. Torch-free, computed once per rank's pieces.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from lowering.kinds.base import Piece, Slices, numel


class View(NamedTuple):
    """A strided view of a contiguous tensor, in elements (``torch.as_strided``'s arguments)."""

    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


class Copy(NamedTuple):
    src: View
    dst: View

    @property
    def numel(self) -> int:
        return numel(self.src.size)


def row_major(shape: Sequence[int]) -> tuple[int, ...]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return tuple(reversed(out))


def box_view(sl: Slices, shape: tuple[int, ...]) -> View:
    """Sub-box ``sl`` of a contiguous ``shape`` tensor."""
    strides = row_major(shape)
    off = sum(s.start * st for s, st in zip(sl, strides))
    return View(off, tuple(s.stop - s.start for s in sl), strides)


def run_view(offset: int, shape: tuple[int, ...]) -> View:
    """A contiguous run of a flat buffer, viewed with ``shape``."""
    return View(offset, tuple(shape), row_major(shape))


def _run_length(ops: list[Copy], i: int) -> tuple[int, int, int]:
    """How many copies from ``i`` on share one shape and strides and step by a constant
    offset on both sides, and those steps."""
    a = ops[i]
    j, ds, dd = i + 1, 0, 0
    while j < len(ops):
        b = ops[j]
        if (b.src.size, b.src.stride, b.dst.size, b.dst.stride) != (a.src.size, a.src.stride,
                                                                      a.dst.size, a.dst.stride):
            break
        step_s, step_d = b.src.offset - ops[j - 1].src.offset, b.dst.offset - ops[j - 1].dst.offset
        if j == i + 1:
            if step_s < 0 or step_d <= 0:  # a piece sent to several peers is read again: stride 0
                break
            ds, dd = step_s, step_d
        elif (step_s, step_d) != (ds, dd):
            break
        j += 1
    return j - i, ds, dd


def _fold(ops: list[Copy]) -> list[Copy]:
    """One pass: consecutive copies of one shape and strides whose offsets step by a
    constant on both sides become one copy with a leading dim. A pair that would take
    the head of a longer run (the piece before the own one, say) is left alone."""
    out: list[Copy] = []
    i = 0
    while i < len(ops):
        a = ops[i]
        k, ds, dd = _run_length(ops, i)
        if k == 2 and i + 1 < len(ops) and _run_length(ops, i + 1)[0] > 2:
            k = 1
        dst = View(a.dst.offset, (k,) + a.dst.size, (dd,) + a.dst.stride)
        if k == 1 or _self_overlaps(dst):  # copies that write one element twice stay apart:
            out.append(a)  # an accumulating unpack (reduce_scatterv) must add each of them
            k = 1
        else:
            out.append(Copy(View(a.src.offset, (k,) + a.src.size, (ds,) + a.src.stride), dst))
        i += k
    return out


def _self_overlaps(v: View) -> bool:
    """Whether two elements of the view may share one memory location (conservative: dims
    sorted by stride, each must step past everything the smaller ones reach)."""
    reach = 0
    for n, s in sorted(((n, s) for n, s in zip(v.size, v.stride) if n > 1), key=lambda d: d[1]):
        if s <= reach:
            return True
        reach += (n - 1) * s
    return False


def _simplify(c: Copy) -> Copy:
    """Drop size-1 dims; merge neighbouring dims that are one run on both sides."""
    dims = [(n, s, d) for n, s, d in zip(c.src.size, c.src.stride, c.dst.stride) if n != 1]
    merged: list[tuple[int, int, int]] = []
    for n, s, d in dims:
        if merged:
            pn, ps, pd = merged[-1]
            if ps == s * n and pd == d * n:
                merged[-1] = (pn * n, s, d)
                continue
        merged.append((n, s, d))
    if not merged:
        merged = [(1, 1, 1)]
    size = tuple(m[0] for m in merged)
    return Copy(View(c.src.offset, size, tuple(m[1] for m in merged)),
                View(c.dst.offset, size, tuple(m[2] for m in merged)))


def plan_copies(pairs: Iterable[tuple[View, View]]) -> tuple[Copy, ...]:
    """The (src, dst) view pairs of equal sizes as few strided copies (empty ones dropped)."""
    ops = [Copy(s, d) for s, d in pairs if numel(s.size)]
    while True:
        folded = _fold(ops)
        if len(folded) == len(ops):
            break
        ops = folded
    return tuple(_simplify(c) for c in ops)


def boxes_to_runs(pieces: Sequence[Piece], offsets: Sequence[int], shape: tuple[int, ...]) -> tuple[Copy, ...]:
    """Pack: each piece's ``src`` box of a ``shape`` block to the flat run at its offset."""
    return plan_copies((box_view(p.src, shape), run_view(o, p.shape)) for p, o in zip(pieces, offsets) if p.numel)


def runs_to_boxes(pieces: Sequence[Piece], offsets: Sequence[int], shape: tuple[int, ...]) -> tuple[Copy, ...]:
    """Unpack: the flat run at each piece's offset to its ``dst`` box of a ``shape`` block."""
    return plan_copies((run_view(o, p.shape), box_view(p.dst, shape)) for p, o in zip(pieces, offsets) if p.numel)


def back_to_back(pieces: Sequence[Piece]) -> list[int]:
    """The offsets of the pieces laid out one after the other."""
    out, off = [], 0
    for p in pieces:
        out.append(off)
        off += p.numel
    return out


def as_run(copies: Sequence[Copy], total: int, into: bool = False) -> int | None:
    """If ``copies`` move one contiguous run of ``total`` elements in order, that run's offset
    in the source (``into``: in the destination), the other side being a whole flat buffer:
    then that buffer can be a view of the block and the copy skipped."""
    if len(copies) != 1:
        return None
    c = copies[0]
    run, whole = (c.dst, c.src) if into else (c.src, c.dst)
    if run.stride == (1,) and whole.stride == (1,) and whole.offset == 0 and whole.size == (total,):
        return run.offset
    return None
