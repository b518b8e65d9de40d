"""``computed_once``: a property computed on first use and kept, without a lock.

Python 3.11's ``functools.cached_property`` computes under a lock, held across every instance
of the class, and runs its own ``__get__`` in Python (3.12 dropped the lock). Requests ask
several such properties once each, and every one computes a pure function of its frozen
instance: two threads that race on one (a request and a round sharing a view, off the loop)
compute it twice and store equal values, so the lock bought nothing and cost more than the
lookups it saved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class computed_once(Generic[T]):  # named as the decorator it is
    """A non-data descriptor: the first read stores the value in the instance's ``__dict__``
    under the property's name, where every later read finds it without calling here. Works
    on frozen dataclasses (their ``__setattr__`` is not involved); not on ``__slots__``."""

    def __init__(self, compute: Callable[[Any], T]) -> None:
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> computed_once[T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...

    def __get__(self, instance: object, owner: type | None = None) -> T | computed_once[T]:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value
