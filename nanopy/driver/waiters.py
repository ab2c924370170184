"""Parking for callers that must wait: threads, trio tasks and asyncio tasks.

A blocked operation parks a waiter in a :class:`WaitQueue` (under the socket lock)
and waits outside the lock. The engine wakes *one* waiter when the queue's
condition turns true; a waiter that succeeds passes the wake on if more is ready,
and one that gives up (timeout, cancel) passes on a wake it already received.
Waking costs nothing when nobody waits, and never takes a trio round trip for a
thread: a thread parks on a plain lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import sniffio
import trio


class ThreadWaiter:
    __slots__ = ("_lock", "woken")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.woken = False

    def wake(self) -> None:
        if not self.woken:
            self.woken = True
            self._lock.release()

    def wait(self, timeout: float | None) -> bool:
        """Block until woken (True) or ``timeout`` (False). Ctrl-C interrupts it."""
        if timeout is None:
            return self._lock.acquire()
        return self._lock.acquire(timeout=max(timeout, 0.0))


class TrioWaiter:
    __slots__ = ("_event", "_token", "_thread", "woken")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.get_ident()
        self.woken = False

    def wake(self) -> None:
        if self.woken:
            return
        self.woken = True
        if threading.get_ident() == self._thread:
            self._event.set()
        else:
            try:
                self._token.run_sync_soon(self._event.set)
            except trio.RunFinishedError:
                pass

    async def wait(self, timeout: float | None) -> bool:
        with trio.move_on_after(float("inf") if timeout is None else max(timeout, 0.0)):
            await self._event.wait()
            return True
        return False


class AsyncioWaiter:
    __slots__ = ("_future", "_loop", "woken")

    def __init__(self) -> None:
        import asyncio

        self._loop = asyncio.get_running_loop()
        self._future = self._loop.create_future()
        self.woken = False

    def _set(self) -> None:
        if not self._future.done():
            self._future.set_result(True)

    def wake(self) -> None:
        if self.woken:
            return
        self.woken = True
        try:
            self._loop.call_soon_threadsafe(self._set)
        except RuntimeError:  # loop closed
            pass

    async def wait(self, timeout: float | None) -> bool:
        import asyncio

        try:
            await asyncio.wait_for(asyncio.shield(self._future), timeout)
        except TimeoutError:
            return False
        return True


def async_waiter() -> TrioWaiter | AsyncioWaiter:
    """A waiter for the async library running in this thread (trio or asyncio)."""
    lib = sniffio.current_async_library()
    if lib == "trio":
        return TrioWaiter()
    if lib == "asyncio":
        return AsyncioWaiter()
    raise RuntimeError(f"nanopy's async API supports trio and asyncio, not {lib}")


class WaitQueue:
    """Waiters for one condition (e.g. "the core can receive")."""

    __slots__ = ("ready", "waiters")

    def __init__(self, ready: Callable[[], bool]) -> None:
        self.ready = ready
        self.waiters: deque[Any] = deque()

    def park(self, waiter: Any) -> None:
        """Register ``waiter`` (lock held). Keyed queues (``_callers``) override this."""
        self.waiters.append(waiter)

    def wake_one(self) -> None:
        """Wake the longest-waiting waiter if the condition holds (lock held)."""
        if self.waiters and self.ready():
            self.waiters.popleft().wake()

    def wake_all(self) -> None:
        while self.waiters:
            self.waiters.popleft().wake()

    def forget_all(self) -> None:
        """Drop every waiter without waking it (in a forked child, where they all
        belong to the parent's threads and loops)."""
        self.waiters.clear()

    def abandon(self, waiter: Any) -> None:
        """A waiter gives up; pass on a wake it already got (lock held)."""
        try:
            self.waiters.remove(waiter)
        except ValueError:
            if waiter.woken:
                self.wake_one()
