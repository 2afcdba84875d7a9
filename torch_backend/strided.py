"""Run a copy plan (``lowering.kinds.copies``): each copy one ``as_strided`` view pair.

Both tensors must be contiguous; the views are taken relative to each one's own storage
offset. No host synchronisation, no allocation: a CUDA graph can capture it.

A narrow innermost run (the 2-element rows of a ``[n, 2] -> [n, 8]`` unpack) is copied
as one wider integer element per run where sizes, strides and offsets allow: CPU copy
kernels pay per element, so this is several times faster and moves the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lowering.kinds.copies import Copy

# byte-for-byte element types; complex128 is the only 16-byte one (a copy moves its bits unchanged)
_WIDE = ((16, torch.complex128), (8, torch.int64), (4, torch.int32), (2, torch.int16))
_NARROW = 64  # runs of at most this many bytes are copied as wide elements
# CPU copy kernels pay per innermost row: rows of at most _COLUMNS elements are copied
# column by column instead, where there are enough of them to amortise the extra calls
_COLUMNS, _LONG = 4, 16384


def contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _width(c: Copy, item: int, so: int, do: int) -> torch.dtype | None:
    """The widest integer dtype that tiles every innermost run of ``c`` (None: keep the dtype)."""
    if c.src.stride[-1] != 1 or c.dst.stride[-1] != 1 or len(c.src.size) < 2:
        return None
    inner = c.src.size[-1] * item
    for w, dt in _WIDE:
        if w <= item or inner % w:
            continue
        if (so + c.src.offset) * item % w or (do + c.dst.offset) * item % w:
            continue
        if any(s * item % w for s in c.src.stride[:-1]) or any(s * item % w for s in c.dst.stride[:-1]):
            continue
        return dt
    return None


def run_copies(copies: Sequence[Copy], src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """Copy into ``dst`` (contiguous) from ``src`` (contiguous) along ``copies``; returns dst."""
    so, do = src.storage_offset(), dst.storage_offset()
    item = dst.element_size()
    for c in copies:
        d = dst.as_strided(c.dst.size, c.dst.stride, do + c.dst.offset)
        s = src.as_strided(c.src.size, c.src.stride, so + c.src.offset)
        wide = _width(c, item, so, do) if c.src.size[-1] * item <= _NARROW else None
        if wide is not None:
            d, s = d.view(wide), s.view(wide)
        m = _short_inner(d)
        if m is not None:
            for j in range(d.shape[m]):  # a few long strided copies beat many tiny rows
                d.select(m, j).copy_(s.select(m, j))
        else:
            d.copy_(s)
    return dst


def _short_inner(d: torch.Tensor) -> int | None:
    """The dim a CPU copy into ``d`` would run innermost (its smallest stride), where it is
    short and the copy long: copying along each of its indices in turn is faster."""
    if d.dim() < 2 or d.device.type != "cpu" or d.numel() < _LONG:
        return None
    dims = [k for k in range(d.dim()) if d.shape[k] > 1]
    if len(dims) < 2:
        return None
    m = min(dims, key=lambda k: d.stride(k))
    return m if d.shape[m] <= _COLUMNS else None
