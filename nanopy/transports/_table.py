"""A process-wide, thread-safe table of bound endpoints (inproc names, ws ports)."""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

from .. import _fork

K = TypeVar("K")
V = TypeVar("V")


class ProcessTable(Generic[K, V]):
    """A dict guarded by a lock; emptied in a child after ``fork`` (the entries
    belong to the parent's threads and trio runs; see nanopy/_fork.py)."""

    def __init__(self) -> None:
        self._reset()
        _fork.reset_in_child(self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._items.get(key)

    def add(self, key: K, value: V) -> bool:
        """Store ``value`` unless ``key`` is taken; True if stored."""
        with self._lock:
            if key in self._items:
                return False
            self._items[key] = value
            return True

    def remove(self, key: K, value: V) -> None:
        """Forget ``key`` if it still maps to ``value``."""
        with self._lock:
            if self._items.get(key) is value:
                del self._items[key]
