"""A Discovery's live providers: the table its surveys fill, and the resolves waiting on it.

Owns: the live-provider table (who answered, how many rounds each missed), its lock,
the threads and async tasks waiting for a provider to appear, and the closed flag a
waiting resolve answers with :class:`~nanopy.Closed`. The survey thread writes to it
(:meth:`LiveProviders.record`, :meth:`LiveProviders.end_round`); any thread reads it.

May call: nanopy/driver/waiters.py (``async_waiter``), nanopy/discovery/services.py.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from .. import _fork
from ..core.errors import Closed
from ..driver.waiters import async_waiter
from .services import Provider

Key = tuple[str, str]  # (service name, address)


class _Entry:
    """One live provider and the rounds it has missed in a row."""

    __slots__ = ("missed", "provider")

    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        self.missed = 0


class LiveProviders:
    """The providers a :class:`~nanopy.discovery.Discovery` knows alive, and its waiting resolves.

    Args:
        misses: a provider missing from this many consecutive rounds is dropped.
    """

    def __init__(self, misses: int) -> None:
        self.misses = misses
        #: set once by :meth:`close` (read without the lock by the survey loop)
        self.closed = False
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._live: dict[Key, _Entry] = {}
        self._async_waiters: list[Any] = []

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)

    def providers(self, name: str | None = None) -> list[Provider]:
        """Live providers (of one service, or all), sorted by name, priority, address."""
        with self._lock:
            found = [e.provider for e in self._live.values() if name is None or e.provider.name == name]
        return sorted(found, key=lambda p: (p.name, p.priority, p.address))

    # -- resolving --------------------------------------------------------------------------------
    def resolve(self, name: str, timeout: float | None) -> str:
        """A random live provider's address among the best priority, waiting up to ``timeout``
        seconds (None: forever). Raises LookupError, or Closed once :meth:`close` ran."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                address, left = self._step(name, end)
                if address is not None:
                    return address
                self._changed.wait(left)

    async def aresolve(self, name: str, timeout: float | None) -> str:
        """:meth:`resolve` for a trio or asyncio task: waiting does not block its loop."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                address, left = self._step(name, end)
                if address is not None:
                    return address
                waiter = async_waiter()
                self._async_waiters.append(waiter)
            try:
                await waiter.wait(left)
            finally:
                with self._lock:
                    if waiter in self._async_waiters:
                        self._async_waiters.remove(waiter)

    def _step(self, name: str, end: float | None) -> tuple[str | None, float | None]:
        """One look (lock held): ``(address, None)``, or ``(None, seconds left to wait)``.

        Raises Closed or LookupError when waiting longer cannot help.
        """
        address = self._pick(name)
        if address is not None:
            return address, None
        if self.closed:
            raise Closed("discovery is closed")
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            known = sorted({k[0] for k in self._live})
            raise LookupError(f"no live provider of {name!r}; live services: {', '.join(known) or 'none'}")
        return None, left

    def _pick(self, name: str) -> str | None:
        candidates = [e.provider for e in self._live.values() if e.provider.name == name]
        if not candidates:
            return None
        best = min(p.priority for p in candidates)
        return random.choice([p.address for p in candidates if p.priority == best])

    # -- the survey thread's side --------------------------------------------------------------------
    def record(self, provider: Provider) -> bool:
        """Take an answer: refresh a known provider (its first sighting kept, its misses
        reset) or add a new one. True when it is new."""
        key = (provider.name, provider.address)
        with self._changed:
            entry = self._live.get(key)
            if entry is not None:
                old = entry.provider
                entry.provider = Provider(
                    provider.name,
                    provider.address,
                    provider.priority,
                    provider.metadata,
                    old.first_seen,
                    provider.last_seen,
                )
                entry.missed = 0
                return False
            self._live[key] = _Entry(provider)
            self._wake()
        return True

    def end_round(self, seen: set[Key]) -> list[Key]:
        """A survey round ended: count a miss for every provider not in ``seen``; the
        ones that missed ``misses`` rounds are dropped and returned."""
        gone: list[Key] = []
        with self._changed:
            for key, entry in list(self._live.items()):
                if key in seen:
                    continue
                entry.missed += 1
                if entry.missed >= self.misses:
                    del self._live[key]
                    gone.append(key)
            self._wake()
        return gone

    def wake_all(self) -> None:
        """Wake every waiting resolve (the survey loop ended)."""
        with self._changed:
            self._wake()

    def _wake(self) -> None:
        """(lock held)"""
        self._changed.notify_all()
        for waiter in self._async_waiters:
            waiter.wake()
        self._async_waiters.clear()

    # -- closing -------------------------------------------------------------------------------------
    def close(self) -> bool:
        """Mark closed and wake every waiting resolve (they raise Closed). False when it
        already was closed."""
        with self._changed:
            if self.closed:
                return False
            self.closed = True
            self._wake()
        return True

    def after_fork_in_child(self) -> None:
        """In a forked child: closed, new locks, no provider (what the parent knew is
        never refreshed here), the parent's async waiters dropped, not woken."""
        _fork.renew_locks(self)
        self.closed = True
        self._live = {}
        self._async_waiters = []
