"""A small thread-safe in-process LRU cache keyed by cache key strings."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["MemoryCache"]

V = TypeVar("V")
_MISSING: Any = object()


class MemoryCache(Generic[V]):
    """An LRU mapping from key strings to values, safe to share between threads.

    ``maxsize`` bounds the number of entries (the least recently used one is
    dropped first); ``None`` means unbounded. ``get_or_create`` runs a build at
    most once per key at a time: threads asking for the same missing key wait
    for the first one's result instead of building it again.
    """

    def __init__(self, maxsize: int | None = 256) -> None:
        if maxsize is not None and maxsize < 1:
            raise ValueError(f"maxsize must be at least 1 or None, got {maxsize}")
        self.maxsize = maxsize
        self._data: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[str, list[Any]] = {}  # key -> [lock, waiters]
        self.hits = 0
        self.misses = 0

    def get(self, key: str, default: Any = None) -> V | Any:
        """The value for ``key`` (now the most recently used), else ``default``."""
        with self._lock:
            try:
                value = self._data[key]
            except KeyError:
                self.misses += 1
                return default
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: str, value: V) -> None:
        """Store ``value``; drops the least recently used entries beyond ``maxsize``."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            if self.maxsize is not None:
                while len(self._data) > self.maxsize:
                    self._data.popitem(last=False)

    def pop(self, key: str, default: Any = None) -> V | Any:
        with self._lock:
            return self._data.pop(key, default)

    def get_or_create(self, key: str, build: Callable[[], V]) -> V:
        """The cached value for ``key``, else ``build()``'s result, stored.

        If ``build`` raises, nothing is stored and the exception propagates.
        """
        value = self.get(key, _MISSING)
        if value is not _MISSING:
            return value
        with self._lock:
            slot = self._building.setdefault(key, [threading.Lock(), 0])
            slot[1] += 1
        try:
            with slot[0]:
                with self._lock:
                    value = self._data.get(key, _MISSING)
                    if value is not _MISSING:
                        self._data.move_to_end(key)
                        return value
                value = build()
                self.put(key, value)
                return value
        finally:
            with self._lock:
                slot[1] -= 1
                if slot[1] == 0:
                    del self._building[key]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def keys(self) -> list[str]:
        """The keys, least recently used first (a snapshot)."""
        with self._lock:
            return list(self._data)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._data

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def __repr__(self) -> str:
        return f"MemoryCache({len(self)}/{self.maxsize} entries, {self.hits} hits, {self.misses} misses)"
