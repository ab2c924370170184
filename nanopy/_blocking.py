"""How socket calls wait: the blocking machinery behind every nanopy call.

An operation is an ``attempt`` run under the socket lock that either completes
or raises :class:`WouldBlock`. :meth:`BlockingCalls._call` (threads) and
:meth:`BlockingCalls._acall` (trio/asyncio tasks) retry it, parking a waiter on a
:class:`WaitQueue` in between; the engine wakes one waiter when the queue's
condition turns true. Timeouts, Ctrl-C and cancellation abandon the waiter
without losing a wake-up: a message leaves the core only inside a successful
attempt.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ._errors import Timeout, WouldBlock
from ._util import ASYNC_YIELD_EVERY as _ASYNC_YIELD_EVERY
from ._util import DEFAULT as _DEFAULT
from ._util import yield_to_loop
from ._waiters import ThreadWaiter, WaitQueue, async_waiter


class BlockingCalls:
    """Mixed into :class:`nanopy.Socket`; uses its lock, core and wait queues."""

    def _timeout(self, timeout: Any, default: float | None) -> float | None:
        if timeout is _DEFAULT:
            return default
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(f"timeout must be a number of seconds or None, not {type(timeout).__name__}")
            if timeout < 0:
                raise ValueError(f"timeout must be >= 0, got {timeout}")
        return timeout

    def _timed_out(self, what: str) -> Timeout:
        """The Timeout for ``what``; it says so when no peer was connected to wait for."""
        if self._pipes:  # type: ignore[attr-defined]
            return Timeout(f"{self.name}: {what} timed out")
        return Timeout(
            f"{self.name}: {what} timed out: no peer connected "
            "(check that a peer is running at the connected address, or connected to the bound one)"
        )

    def _attempt(self, attempt: Callable[[], Any], park: Callable[[], Any]) -> tuple[Any, Any]:
        """One try of ``attempt`` under the lock.

        Returns ``(result, None)`` after carrying out the core's actions, or
        ``(BLOCKED, park())`` when it would block -- ``park`` runs under the lock,
        so a waiter it registers cannot miss a wake-up.
        """
        with self._lock:
            if self._closed:
                raise self._closed_error()
            try:
                result = attempt()
            except WouldBlock:
                return BLOCKED, park()
            actions = self._take_actions()
            self._wake()
        if actions:
            self._execute(actions)
        return result, None

    def _abandon(self, queue: WaitQueue, waiter: Any) -> None:
        with self._lock:
            queue.abandon(waiter)

    def _call(self, attempt: Callable[[], Any], queue: WaitQueue, timeout: float | None, what: str) -> Any:
        """Run ``attempt`` until it stops raising WouldBlock, parking this thread between tries."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def park() -> ThreadWaiter | None:
            return _park(queue, deadline, ThreadWaiter)

        while True:
            result, waiter = self._attempt(attempt, park)
            if result is not BLOCKED:
                return result
            if waiter is None:
                raise self._timed_out(what)
            if self._engine_obj is not None and self._engine_obj.in_engine_thread():
                self._abandon(queue, waiter)
                raise RuntimeError(
                    f"{self.name}: a blocking {what} on the nanopy engine thread would deadlock; "
                    "pass timeout=0 in pipe callbacks"
                )
            try:
                woken = waiter.wait(None if deadline is None else deadline - time.monotonic())
            except BaseException:  # Ctrl-C: the call took nothing
                self._abandon(queue, waiter)
                raise
            if not woken:
                self._abandon(queue, waiter)
                # One last try: the condition may have turned true as we timed out.
                result, _ = self._attempt(attempt, no_park)
                if result is not BLOCKED:
                    return result
                raise self._timed_out(what)

    def _try_now(self, attempt: Callable[[], Any]) -> Any:
        """Async fast path: run ``attempt`` once; None if it would block.

        Every ``ASYNC_YIELD_EVERY`` calls it declines, so the async caller takes
        the slow path, which checkpoints: a task looping on ready data cannot
        starve its event loop.
        """
        self._async_calls += 1
        if self._async_calls % _ASYNC_YIELD_EVERY == 0:
            return None
        result, _ = self._attempt(attempt, no_park)
        if result is BLOCKED:
            return None
        return True if result is None else result

    async def _acall(self, attempt: Callable[[], Any], queue: WaitQueue, timeout: float | None, what: str) -> Any:
        """Async twin of :meth:`_call` for trio and asyncio tasks (cancellation is lossless)."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def park() -> Any:
            return _park(queue, deadline, async_waiter)

        await yield_to_loop()
        while True:
            result, waiter = self._attempt(attempt, park)
            if result is not BLOCKED:
                return result
            if waiter is None:
                raise self._timed_out(what)
            try:
                woken = await waiter.wait(None if deadline is None else deadline - time.monotonic())
            except BaseException:
                self._abandon(queue, waiter)
                raise
            if not woken:
                self._abandon(queue, waiter)
                raise self._timed_out(what)


BLOCKED: Any = object()  # _attempt's "would block" marker


def no_park() -> None:
    return None


def _park(queue: WaitQueue, deadline: float | None, make: Callable[[], Any]) -> Any:
    """Register a new waiter on ``queue`` unless the deadline has passed (lock held)."""
    if deadline is not None and deadline <= time.monotonic():
        return None
    waiter = make()
    queue.park(waiter)  # a queue may key the waiter by caller (nanopy._callers)
    return waiter
