"""The operator's one in-memory cache: least recently used out, bounded, thread-safe.

Passes of different models run in parallel threads, and each keeps what is expensive to
compute and cheap to key: the optimizer's DP per profile, the SLO provisioning per signature,
the pipeline planner's answer per signature. All three are an :class:`Lru`; losing one (an
operator restart) costs a recomputation, never a wrong answer, since the keys say everything
the value depends on.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """At most ``size`` values by key; ``misses`` counts the values made or missed."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self.misses = 0
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The value for ``key``, made by ``make`` (outside the lock) when it is missing."""
        found = self.get(key)
        if found is not None:
            return found
        with self._lock:
            self.misses += 1
        value = make()
        self.put(key, value)
        return value

    def __len__(self) -> int:
        return len(self._items)
