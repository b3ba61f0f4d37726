"""The client's two bounded caches: least recently used (found schemas, which never change) and
expiring (unknown ids, failures and subject lists, which may change)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["ExpiringCache", "LruCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """At most ``size`` entries; the least recently used goes first."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        entries = self._entries
        entries[key] = value
        entries.move_to_end(key)
        while len(entries) > self.size:
            entries.popitem(last=False)

    def pop(self, key: K) -> None:
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)


class ExpiringCache(Generic[K, V]):
    """Entries valid for a time of their own (``clock`` seconds); at most ``size``: when full, the
    expired go first, then the oldest."""

    def __init__(self, size: int, clock: Callable[[], float]) -> None:
        self.size = max(1, size)
        self.clock = clock
        self._entries: dict[K, tuple[V, float]] = {}

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[1] <= self.clock():
            del self._entries[key]
            return None
        return entry[0]

    def put(self, key: K, value: V, ttl: float) -> None:
        entries = self._entries
        entries.pop(key, None)  # re-inserted: the newest
        entries[key] = (value, self.clock() + ttl)
        if len(entries) > self.size:
            now = self.clock()
            for stale in [k for k, (_, expires) in entries.items() if expires <= now]:
                del entries[stale]
            while len(entries) > self.size:
                del entries[next(iter(entries))]

    def pop(self, key: K) -> None:
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
