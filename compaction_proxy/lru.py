"""A bounded map, least recently used first out (pure data, no I/O)."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``size`` entries. Safe from the event loop and worker threads at once (a big
    request is metered and viewed in a worker thread): each step is one call into an
    OrderedDict, where a lookup followed by ``move_to_end`` would not be atomic (another
    thread may evict the key in between)."""

    def __init__(self, size: int) -> None:
        self._data: OrderedDict[K, V] = OrderedDict()
        self._size = size

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: K) -> V | None:
        # Taken out and put back last: the most recently used.
        value = self._data.pop(key, None)
        if value is not None:
            self._data[key] = value
        return value

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        if len(self._data) > self._size:
            with contextlib.suppress(KeyError):  # another thread took the oldest first
                self._data.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._data.pop(key, None)
