"""A memoised attribute of an immutable object, for the IR's hot derived values."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, Generic, TypeVar, overload

_T = TypeVar("_T")


class memo(Generic[_T]):
    """``functools.cached_property`` without its lock (Python 3.11 takes one on every first
    read, which the planner pays for each of the many states it builds): the value is a pure
    function of a frozen object, so two threads computing it at once store equal values."""

    def __init__(self, fn: Callable[[Any], _T]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> memo[_T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...

    def __get__(self, obj: object, owner: type | None = None) -> memo[_T] | _T:
        if obj is None:
            return self
        value = self.fn(obj)
        obj.__dict__[self.name] = value  # an instance attribute: later reads skip this descriptor
        return value


def unmemoised_state(obj: object) -> dict[str, Any]:
    """``obj``'s fields for pickling, without its memoised values: they are recomputed on
    first read, and a hash must be (a string's hash differs between processes)."""
    cls: type = type(obj)  # as ``type``: mypy checks a type[object] against Hashable as an instance
    skip = _memo_names(cls)
    return {k: v for k, v in obj.__dict__.items() if k not in skip}


@cache
def _memo_names(cls: type) -> frozenset[str]:
    return frozenset(k for c in cls.__mro__ for k, v in vars(c).items() if isinstance(v, memo))
