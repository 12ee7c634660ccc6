"""One bounded, thread-safe LRU cache for every in-process cache of Warden.

:class:`LRUCache` maps keys to values and forgets the least recently used entry first once it
holds more than ``max_entries`` entries or, when ``max_bytes`` is set, more than ``max_bytes``
estimated bytes. Sizes are estimates given by the caller when it stores a value (the cache
never measures objects); a value estimated heavier than ``max_bytes`` on its own is not kept.

Every method takes the cache's lock, so one cache may be shared by any number of threads.
:meth:`LRUCache.get_or_make` is single flight: concurrent callers asking for the same missing
key wait for the one computing it instead of computing it again.

Standard library only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar, overload

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")


class LRUCache(Generic[K, V]):
    """A mapping bounded by entry count and, optionally, by estimated bytes; least recently
    used first out.

    ``max_entries``: the most entries kept (at least 1). ``max_bytes``: the most estimated
    bytes kept, or None for a bound by count only. "Used" means stored (:meth:`put`) or read
    with :meth:`get` / :meth:`get_or_make`; :meth:`peek` and ``in`` read without refreshing.
    """

    def __init__(self, max_entries: int, max_bytes: int | None = None) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must not be negative, not {max_bytes}")
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()  # oldest first
        self._bytes = 0
        self._lock = threading.Lock()
        self._pending: dict[K, threading.Event] = {}

    # -- reading -------------------------------------------------------------------------------
    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...
    def get(self, key: K, default: object = None) -> object:
        """The value stored under ``key`` (now the most recently used), else ``default``."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return default
            self._items.move_to_end(key)
            return item[0]

    @overload
    def peek(self, key: K) -> V | None: ...
    @overload
    def peek(self, key: K, default: D) -> V | D: ...
    def peek(self, key: K, default: object = None) -> object:
        """The value stored under ``key``, else ``default``; its recency is left as it was and
        nothing is made or waited for."""
        with self._lock:
            item = self._items.get(key)
        return default if item is None else item[0]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    @property
    def nbytes(self) -> int:
        """The estimated bytes of the entries kept (the sum of the sizes they were stored with)."""
        with self._lock:
            return self._bytes

    def keys(self) -> list[K]:
        """The keys kept, least recently used first (a copy)."""
        with self._lock:
            return list(self._items)

    # -- writing -------------------------------------------------------------------------------
    def put(self, key: K, value: V, nbytes: int = 0) -> bool:
        """Stores ``value`` under ``key`` (replacing any value there) as the most recently used,
        then forgets the least recently used entries until the cache is within its bounds.
        ``nbytes``: the value's estimated size. Returns False when the value alone is over
        ``max_bytes``: it is not kept (and any older value under ``key`` is gone)."""
        with self._lock:
            return self._store(key, value, nbytes)

    def pop(self, key: K) -> V | None:
        """Forgets ``key``; returns its value, or None when it was not kept."""
        with self._lock:
            item = self._items.pop(key, None)
            if item is None:
                return None
            self._bytes -= item[1]
            return item[0]

    def clear(self) -> None:
        """Forgets every entry (a value being made by :meth:`get_or_make` is still stored)."""
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def get_or_make(
        self,
        key: K,
        make: Callable[[], V],
        keep: Callable[[V], bool] | None = None,
        nbytes: int | Callable[[V], int] = 0,
    ) -> V:
        """The value under ``key``, made by ``make()`` when missing and stored (see :meth:`put`).

        Single flight: while one thread makes the value of ``key``, other threads asking for it
        wait for that value instead of making their own; when the maker raises, the exception
        goes to the maker and one waiting thread makes the value instead. ``keep(value)`` False
        means the value is returned but not stored (a transient failure the next call retries).
        ``nbytes``: the value's estimated size, or a function of the value giving it."""
        while True:
            with self._lock:
                item = self._items.get(key)
                if item is not None:
                    self._items.move_to_end(key)
                    return item[0]
                waiting = self._pending.get(key)
                if waiting is None:
                    self._pending[key] = threading.Event()
                    break
            waiting.wait()  # the maker stored the value, or failed: then this thread makes it
        stored = False
        size = 0
        try:
            value = make()
            stored = keep is None or bool(keep(value))
            size = nbytes(value) if callable(nbytes) else nbytes
        finally:
            with self._lock:
                if stored:
                    self._store(key, value, size)
                self._pending.pop(key).set()
        return value

    def _store(self, key: K, value: V, nbytes: int) -> bool:
        """:meth:`put` with the lock held."""
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        if self.max_bytes is not None and nbytes > self.max_bytes:
            return False
        self._items[key] = (value, nbytes)
        self._bytes += nbytes
        while len(self._items) > self.max_entries or (self.max_bytes is not None and self._bytes > self.max_bytes):
            self._bytes -= self._items.popitem(last=False)[1][1]
        return True
