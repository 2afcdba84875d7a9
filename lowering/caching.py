"""Caches for the planner's pure functions, bounded by the bytes they hold.

Planning a mesh of thousands of ranks builds world-sized arrays (layout boxes, the
bytes each rank sends in a move, every rank's local shape), and a process that compiles
many distinct programs would keep all of them if its caches were capped by entry count
only. ``@cached(max_bytes=..., maxsize=...)`` is ``functools.lru_cache`` with a second
bound: an estimate of the bytes its values hold, evicting least recently used entries
until both bounds hold (nearly: a hit marks its entry instead of moving it, and eviction
gives a marked entry a second chance, as the CLOCK algorithm does, so a hit hashes its
key once). Every cache registers itself, so ``clear_caches()`` empties them
all at once (decorated functions keep ``cache_clear()`` and ``cache_info()``). With no
``max_bytes`` (small values: ints, flags, short tuples) it is ``functools.lru_cache``
itself, registered, so the hot paths of the search pay nothing for the registry.

The estimate is cheap, not exact: a numpy array counts its ``nbytes``; a tuple, list
or dict counts its slots plus its elements, sampled when long (a tuple of 4,096 equal
shapes costs about its slots); a dataclass (a Program, a Step) counts its fields, except
the IR's types and meshes, which are small and shared.

Thread safety: a hit reads the table without a lock; inserting and evicting hold one.
Two threads missing on the same key may both compute it (the functions are pure), and
the first result stored wins.

Imports neither torch nor jax.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any, TypeVar

import numpy as np

from spec_lang.ir import AxisType, Dim, Mesh, TensorType

MIB = 1 << 20
# IR objects: small, and shared by every cache that mentions them (the parser returns one
# object per string), so a value that refers to them is not charged for them
_SHARED = (TensorType, Mesh, Dim, AxisType)
_SAMPLE = 8  # elements of a long container whose sizes stand for all of them
_MAX_DEPTH = 6
_KWARGS = object()  # separates positional from keyword arguments in a key

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class CacheInfo:
    """One cache's counters: ``functools``' four, plus the bytes held and both bounds."""

    name: str
    hits: int
    misses: int
    maxsize: int | None
    currsize: int
    bytes: int
    max_bytes: int


# what estimate_bytes does with a value, by its type (worked out once per type)
_SEQ, _INT, _NOTHING, _ARRAY, _FLOAT, _SIZEOF, _DICT, _OTHER = range(8)
_KIND: dict[type, int] = {}


def _kind_of(t: type) -> int:
    if issubclass(t, np.ndarray):
        return _ARRAY
    if t is bool or t is type(None) or issubclass(t, _SHARED):
        return _NOTHING
    if issubclass(t, int):
        return _INT
    if issubclass(t, float):
        return _FLOAT
    if issubclass(t, (str, bytes)):
        return _SIZEOF
    if issubclass(t, (tuple, list, frozenset, set)):
        return _SEQ
    return _DICT if issubclass(t, dict) else _OTHER


def estimate_bytes(value: Any, _depth: int = 0) -> int:
    """A cheap estimate of the memory ``value`` keeps alive (shared objects count again)."""
    # called for every field of every sampled element of a cached value: one lookup of the
    # value's type instead of a chain of isinstance tests
    t = type(value)
    kind = _KIND.get(t)
    if kind is None:
        kind = _KIND.setdefault(t, _kind_of(t))
    if kind == _SEQ:
        return 64 if _depth >= _MAX_DEPTH else 56 + 8 * len(value) + _elements(value, _depth)
    if kind == _INT:
        return 0 if -5 <= value <= 256 else 28  # small ints are shared by the interpreter
    if kind == _NOTHING:  # None, flags, and the IR's shared types and meshes
        return 0
    if kind == _ARRAY:
        return value.nbytes + 112
    if kind == _FLOAT:
        return 24
    if kind == _SIZEOF:
        return sys.getsizeof(value)
    if _depth >= _MAX_DEPTH:
        return 64
    if kind == _DICT:
        return 232 + 24 * len(value) + _elements(value.values(), _depth) + _elements(value.keys(), _depth)
    fields = getattr(value, "__dict__", None)
    if fields is not None:
        return 56 + sum(map(estimate_bytes, fields.values(), repeat(_depth + 1)))
    try:
        return sys.getsizeof(value)
    except TypeError:
        return 64


def _elements(items: Any, depth: int) -> int:
    """The elements' bytes: all of them when few, else a spread sample scaled up. Equal
    objects in the sample (the same shape for every rank) scale by how few are distinct."""
    seq = items if isinstance(items, (tuple, list)) else tuple(items)
    n = len(seq)
    if n <= _SAMPLE:
        return sum(map(estimate_bytes, seq, repeat(depth + 1)))
    sample = [seq[i * (n - 1) // (_SAMPLE - 1)] for i in range(_SAMPLE)]
    distinct = {id(v): v for v in sample}
    per = sum(map(estimate_bytes, distinct.values(), repeat(depth + 1))) / len(distinct)
    if len(distinct) == 1:  # one object in every slot sampled: counted once
        return int(per)
    return int(per * n * len(distinct) / _SAMPLE)


class _Store:
    """One cache's table (key -> [value, bytes, hit since it last reached the front]), its
    totals and its bounds."""

    def __init__(self, name: str, maxsize: int | None, max_bytes: int) -> None:
        self.name = name
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self.table: OrderedDict[Any, list[Any]] = OrderedDict()
        self.bytes = 0
        self.hits_box = [0]  # a list: the wrapper's hit path bumps it without an attribute lookup
        self.misses = 0
        self.lock = threading.Lock()

    def put(self, key: Any, value: Any) -> Any:
        # an array (most values of the hot caches) is priced inline: what estimate_bytes says
        size = value.nbytes + 112 if type(value) is np.ndarray else estimate_bytes(value)
        with self.lock:
            self.misses += 1
            if size > self.max_bytes:  # bigger than the whole cache: never stored
                held = self.table.get(key)
                return value if held is None else held[0]
            entry = [value, size, False]
            held = self.table.setdefault(key, entry)  # one hash of the key
            if held is not entry:  # another thread stored it meanwhile: keep one copy
                return held[0]
            self.bytes += size
            while self.bytes > self.max_bytes or (self.maxsize is not None and len(self.table) > self.maxsize):
                oldest, entry = self.table.popitem(last=False)
                if entry[2] or oldest is key:  # hit since it was last here (or just stored): kept
                    entry[2] = False
                    self.table[oldest] = entry
                    continue
                self.bytes -= entry[1]
        return value

    def clear(self) -> None:
        with self.lock:
            self.table.clear()
            self.bytes = 0
            self.hits_box[0] = 0
            self.misses = 0

    def info(self) -> CacheInfo:
        return CacheInfo(self.name, self.hits_box[0], self.misses, self.maxsize, len(self.table), self.bytes,
                         self.max_bytes)


class _LruStore:
    """A count-bounded ``functools.lru_cache``, registered like a :class:`_Store`."""

    def __init__(self, name: str, lru: Any) -> None:
        self.name = name
        self.lru = lru

    @property
    def bytes(self) -> int:
        return 0  # small values only: not estimated

    def clear(self) -> None:
        self.lru.cache_clear()

    def info(self) -> CacheInfo:
        i = self.lru.cache_info()
        return CacheInfo(self.name, i.hits, i.misses, i.maxsize, i.currsize, 0, 0)


_REGISTRY: list[_Store | _LruStore] = []
_CLEAR_HOOKS: list[Callable[[], None]] = []


def cached(*, maxsize: int | None = None, max_bytes: int | None = None) -> Callable[[F], F]:
    """Memoise a pure function; evict (nearly) least recently used entries past ``maxsize``
    entries or past ``max_bytes`` held (by :func:`estimate_bytes`).

    Without ``max_bytes`` this is ``functools.lru_cache(maxsize)`` (for small values: ints,
    flags, short tuples), registered for :func:`clear_caches`. Arguments must be hashable;
    exceptions are not cached.
    """
    if maxsize is not None and maxsize < 1:
        raise ValueError("maxsize must be at least 1, or None for no entry bound")
    if max_bytes is not None and max_bytes < 1:
        raise ValueError("max_bytes must be at least 1, or None for no byte bound")

    def decorate(fn: F) -> F:
        name = f"{fn.__module__}.{fn.__qualname__}"
        if max_bytes is None:
            lru = functools.lru_cache(maxsize=maxsize)(fn)
            _REGISTRY.append(_LruStore(name, lru))
            return lru  # type: ignore[return-value]  # fn's signature, which F cannot say of a wrapper
        store = _Store(name, maxsize, max_bytes)
        get, hits = store.table.get, store.hits_box

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = (*args, _KWARGS, *kwargs.items()) if kwargs else args
            held = get(key)
            if held is not None:
                held[2] = True  # a second chance at eviction (a write, not a move: no lock)
                hits[0] += 1
                return held[0]
            return store.put(key, fn(*args, **kwargs))

        # lru_cache's two methods, on a plain function (which declares no such attributes)
        wrapper.cache_clear = store.clear  # type: ignore[attr-defined]
        wrapper.cache_info = store.info  # type: ignore[attr-defined]
        _REGISTRY.append(store)
        return wrapper  # type: ignore[return-value]  # fn's signature (functools.wraps), which F cannot say

    return decorate


def on_clear(hook: Callable[[], None]) -> Callable[[], None]:
    """Also run ``hook`` on ``clear_caches()`` (for caches kept elsewhere, such as the
    parser's); returns it, so it can decorate."""
    if hook not in _CLEAR_HOOKS:
        _CLEAR_HOOKS.append(hook)
    return hook


def anchored_get(table: OrderedDict[Any, tuple[Any, Any]], key: Any, anchor: Any) -> Any | None:
    """The value ``anchored_put`` stored under ``key`` with ``anchor`` (compared by identity:
    an entry made for another world, mode or context never matches), now the most recently
    used; else None. For the caches of objects made for a process's state, kept elsewhere."""
    try:
        hit = table.get(key)
    except Exception:  # an unhashable key (or one whose hash or == raises): never stored
        return None
    if hit is None or hit[0] is not anchor:
        return None
    try:
        table.move_to_end(key)
    except KeyError:  # another thread evicted it since the lookup: the value found is still good
        pass
    return hit[1]


def anchored_put(table: OrderedDict[Any, tuple[Any, Any]], key: Any, anchor: Any, value: Any, most: int) -> None:
    """Store ``value`` under ``key`` with ``anchor``; the least recently used entries past
    ``most`` go, one at a time."""
    table[key] = (anchor, value)
    while len(table) > most:
        try:
            table.popitem(last=False)
        except KeyError:  # emptied by another thread (clear_caches)
            break


def cache_stats() -> list[CacheInfo]:
    """Every registered cache's counters, in registration order."""
    return [s.info() for s in _REGISTRY]


def cache_bytes() -> int:
    """The bytes every registered cache holds, by the estimate."""
    return sum(s.bytes for s in _REGISTRY)


def clear_caches() -> None:
    """Empty every cache of ``lowering`` (layout, cost, bounds, planner) and of the
    parser's parsed strings, and those registered with :func:`on_clear`. Compiling
    afterwards gives equal programs; it only takes the time of a first compile again."""
    for store in _REGISTRY:
        store.clear()
    for hook in _CLEAR_HOOKS:
        hook()
    from spec_lang import ir, parser

    # spec_lang keeps its own small caches (it cannot import this module); not the grammar
    for module, name in ((parser, "_parse_type"), (parser, "_parse_mesh"), (ir, "_dim_axes_ok"), (ir, "_check_layout")):
        clear = getattr(getattr(module, name, None), "cache_clear", None)
        if callable(clear):
            clear()
