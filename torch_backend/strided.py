"""Run a copy plan (``lowering.kinds.copies``): each copy one ``as_strided`` view pair,
relative to each (contiguous) tensor's storage offset; no host synchronisation, no
allocation, so a CUDA graph can capture it. Which CPU copies run faster as integers
(narrow rows as one wider element; strided inner loops as integers of the element's
size) and why: docs/running.md, "Performance", measured by bench/pack_vs_copy.py.
Contiguous inner loops are vectorised whatever the dtype and keep it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from lowering.kinds.copies import Copy

# byte-for-byte element types; complex128 is the only 16-byte one (a copy moves its bits unchanged)
_WIDE = ((16, torch.complex128), (8, torch.int64), (4, torch.int32), (2, torch.int16))
_BITS = {w: dt for w, dt in _WIDE} | {1: torch.uint8}  # the fastest CPU copy per element size
_NARROW = 64  # runs of at most this many bytes are copied as wide elements
_BITS_MIN = 4096  # elements: below this the two extra views cost more than they save
# CPU copy kernels pay per innermost row: a copy whose innermost dim is at most _COLUMNS
# long (and _COLUMN_BYTES wide) is run along each of its indices instead, where it has
# enough elements to amortise the extra calls; a strided element costs more the wider it is
_COLUMNS, _COLUMN_BYTES, _LONG = 4, 32, 16384

How = tuple[torch.dtype | None, int | None]  # (dtype to copy as, None: its own; CPU: dim to split)
_HOW: dict[tuple[Copy, int, bool], How] = {}
_HOW_MAX = 1 << 14


def contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` as one flat contiguous buffer (a view where it already is one)."""
    return t.view(-1) if t.is_contiguous() else t.contiguous().view(-1)


def nothing_of(t: torch.Tensor) -> torch.Tensor:
    """A 0-element flat view of ``t``: the send buffer of a rank that sends nothing, drawn
    from the step's input so that no collective runs ahead of its step in a trace
    (docs/running.md, "torch.compile")."""
    return t.view(-1)[:0] if t.is_contiguous() else t.narrow(0, 0, 0).reshape(-1)


def _width(c: Copy, item: int, so: int | torch.SymInt, do: int | torch.SymInt) -> torch.dtype | None:
    """The widest integer dtype that tiles every innermost run of ``c`` (None: keep the dtype)."""
    if c.src.stride[-1] != 1 or c.dst.stride[-1] != 1 or len(c.src.size) < 2 or c.src.size[-1] * item > _NARROW:
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


def _split_dim(size: Sequence[int], dst_stride: Sequence[int], width: int) -> int | None:
    """The dim a CPU copy would run innermost (the destination's smallest stride), where it
    is short and the copy long: copying along each of its indices in turn is faster."""
    dims = [k for k in range(len(size)) if size[k] > 1]
    if math.prod(size) < _LONG or len(dims) < 2:
        return None
    m = min(dims, key=lambda k: dst_stride[k])
    return m if size[m] <= _COLUMNS and size[m] * width <= _COLUMN_BYTES else None


def _strided_inner(c: Copy, split: int | None) -> bool:
    """Whether the CPU copy's innermost loop (the destination's smallest stride, the split
    dim aside) steps by more than one element on either side: a gather or a scatter."""
    dims = [k for k in range(len(c.dst.size)) if c.dst.size[k] > 1 and k != split]
    if not dims:
        return False
    k = min(dims, key=lambda k: c.dst.stride[k])
    return c.src.stride[k] != 1 or c.dst.stride[k] != 1


def _how(c: Copy, item: int, cpu: bool, so: int | torch.SymInt, do: int | torch.SymInt) -> How:
    """How to run ``c`` for elements of ``item`` bytes from storage offsets ``so``/``do``
    (cached for aligned storage offsets, the common case)."""
    aligned = (so * item) % 16 == 0 and (do * item) % 16 == 0
    key = (c, item, cpu)
    if aligned:
        got = _HOW.get(key)
        if got is not None:
            return got
    dt = _width(c, item, so, do)
    width = dt.itemsize if dt is not None else item
    k = width // item
    size = c.dst.size[:-1] + (c.dst.size[-1] // k,) if k > 1 else c.dst.size
    stride = tuple(s // k for s in c.dst.stride[:-1]) + (1,) if k > 1 else c.dst.stride
    m = _split_dim(size, stride, width) if cpu else None
    if dt is None and cpu and c.numel >= _BITS_MIN and item in _BITS and _strided_inner(c, m):
        dt = _BITS[item]
    how = (dt, m)
    if aligned:
        if len(_HOW) >= _HOW_MAX:
            _HOW.clear()
        _HOW[key] = how
    return how


def run_copies(copies: Sequence[Copy], src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """Copy into ``dst`` (contiguous) from ``src`` (contiguous) along ``copies``; returns dst."""
    so, do = src.storage_offset(), dst.storage_offset()
    item = dst.element_size()
    cpu = dst.device.type == "cpu"
    for c in copies:
        d = dst.as_strided(c.dst.size, c.dst.stride, do + c.dst.offset)
        s = src.as_strided(c.src.size, c.src.stride, so + c.src.offset)
        as_dtype, m = _how(c, item, cpu, so, do)
        if as_dtype is not None and as_dtype != d.dtype:
            d, s = d.view(as_dtype), s.view(as_dtype)
        if m is not None:
            for j in range(d.shape[m]):
                d.select(m, j).copy_(s.select(m, j))
        else:
            d.copy_(s)
    return dst
