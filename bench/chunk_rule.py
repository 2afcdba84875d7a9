"""The chunk rule and the byte lower bound, written out here once more, independently of
``lowering``, so that the recorded cases check shardc rather than echo it.

Chunk rule: a dim sharded over (a1..ak) is cut with torch.chunk one axis at a time, major
to minor (chunk size ceil(L/n), trailing chunks smaller or empty); each rank holds one
[start, stop) range per dim.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from spec_lang.ir import Mesh, TensorType

LB_DEFINITION = (
    "max(lb_recv_max, lb_sent_avg) x dtype bytes: lb_recv_max = max over ranks of dst-local elements "
    "missing from its src-local box (all dst-local elements if a reduction is pending); lb_sent_avg = "
    "total required element transfers / world size ((k-1)+(needers-1) per element for a k-way pending "
    "reduction). Data-movement bound, chunk-rule layouts; 0 when dst is partial on an axis src is not."
)


def chunk_boxes(t: TensorType, mesh: Mesh) -> list[list[tuple[int, int]]]:
    """Each rank's [start, stop) per dim: torch.chunk one axis at a time, major to minor."""
    out = []
    for r in range(mesh.size):
        coords = dict(zip(mesh.names, mesh.coords(r)))
        box = []
        for d in t.dims:
            lo, hi = 0, d.size
            for a in d.axes:
                n, length = mesh.axis_size(a), hi - lo
                c = -(-length // n) if length else 0
                lo, hi = min(lo + coords[a] * c, hi), min(lo + (coords[a] + 1) * c, hi)
            box.append((lo, hi))
        out.append(box)
    return out


def lower_bound(src: TensorType, dst: TensorType, mesh: Mesh) -> dict[str, Any]:
    """The data-movement bound, counted on the cells cut by every src and dst box edge."""
    item = src.itemsize
    sp, dp = set(src.partial_axes), set(dst.partial_axes)
    sb, db = chunk_boxes(src, mesh), chunk_boxes(dst, mesh)
    if dp - sp:
        return {"bytes": 0, "definition": LB_DEFINITION, "lb_recv_max_bytes": 0, "lb_sent_avg_bytes": 0}
    cuts = [sorted({0, s, *(b[i][j] for b in sb + db for j in (0, 1))}) for i, s in enumerate(src.shape)]
    cells = list(itertools.product(*[list(zip(c[:-1], c[1:])) for c in cuts]))

    def inside(cell: tuple, box: list[tuple[int, int]]) -> bool:
        return all(lo <= a and b <= hi and b > a for (a, b), (lo, hi) in zip(cell, box))

    size = [math.prod(b - a for a, b in cell) for cell in cells]
    reduced = sorted(sp - dp)
    recv = [0] * mesh.size
    transfers = 0
    if reduced:
        k = math.prod(mesh.axis_size(a) for a in reduced)
        kept = [mesh.index(a) for a in sorted(dp)]
        for r in range(mesh.size):
            recv[r] = math.prod(hi - lo for lo, hi in db[r])
        for cell, n in zip(cells, size):
            needers: dict[tuple, int] = {}
            for r in range(mesh.size):
                if inside(cell, db[r]):
                    key = tuple(mesh.coords(r)[i] for i in kept)
                    needers[key] = needers.get(key, 0) + 1
            transfers += n * sum(k - 1 + c - 1 for c in needers.values())
    else:
        for cell, n in zip(cells, size):
            for r in range(mesh.size):
                if inside(cell, db[r]) and not inside(cell, sb[r]):
                    recv[r] += n
        transfers = sum(recv)
    recv_b, sent_b = max(recv) * item, transfers * item / mesh.size
    sent_b = int(sent_b) if sent_b == int(sent_b) else sent_b
    return {"bytes": max(recv_b, math.ceil(sent_b)), "definition": LB_DEFINITION,
            "lb_recv_max_bytes": recv_b, "lb_sent_avg_bytes": sent_b}

def norm_boxes(boxes: list[list[tuple[int, int]]]) -> list[Any]:
    """Boxes for comparison: a box with an empty range is just 'empty'."""
    return [["empty"] if any(hi <= lo for lo, hi in b) else [list(x) for x in b] for b in boxes]
