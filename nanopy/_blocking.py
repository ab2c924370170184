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

    def _call(self, attempt: Callable[[], Any], queue: WaitQueue, timeout: float | None, what: str) -> Any:
        """Run ``attempt`` under the lock until it stops raising WouldBlock."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._closed:
                    raise self._closed_error()
                try:
                    result = attempt()
                except WouldBlock:
                    waiter = None
                    if deadline is None or deadline > time.monotonic():
                        waiter = ThreadWaiter()
                        queue.waiters.append(waiter)
                else:
                    actions = self._take_actions()
                    self._wake()
                    break
            if waiter is None:
                raise Timeout(f"{self.name}: {what} timed out")
            if self._engine_obj is not None and self._engine_obj.in_engine_thread():
                with self._lock:
                    queue.abandon(waiter)
                raise RuntimeError(
                    f"{self.name}: a blocking {what} on the nanopy engine thread would deadlock; "
                    "pass timeout=0 in pipe callbacks"
                )
            try:
                woken = waiter.wait(None if deadline is None else deadline - time.monotonic())
            except BaseException:
                with self._lock:
                    queue.abandon(waiter)
                raise
            if not woken:
                with self._lock:
                    queue.abandon(waiter)
                    # One last try: the condition may have turned true as we timed out.
                    if not self._closed:
                        try:
                            result = attempt()
                        except WouldBlock:
                            pass
                        else:
                            actions = self._take_actions()
                            self._wake()
                            break
                raise Timeout(f"{self.name}: {what} timed out")
        if actions:
            self._execute(actions)
        return result

    def _try_now(self, attempt: Callable[[], Any]) -> Any:
        """Async fast path: run ``attempt`` once; None if it would block.

        Every ``_ASYNC_YIELD_EVERY`` calls it declines, so the async caller takes
        the slow path, which checkpoints: a task looping on ready data cannot
        starve its event loop.
        """
        self._async_calls += 1
        if self._async_calls % _ASYNC_YIELD_EVERY == 0:
            return None
        with self._lock:
            if self._closed:
                raise self._closed_error()
            try:
                result = attempt()
            except WouldBlock:
                return None
            actions = self._take_actions()
            self._wake()
        if actions:
            self._execute(actions)
        return True if result is None else result

    async def _acall(self, attempt: Callable[[], Any], queue: WaitQueue, timeout: float | None, what: str) -> Any:
        """Async twin of :meth:`_call` for trio and asyncio tasks."""
        deadline = None if timeout is None else time.monotonic() + timeout
        await yield_to_loop()
        while True:
            with self._lock:
                if self._closed:
                    raise self._closed_error()
                try:
                    result = attempt()
                except WouldBlock:
                    waiter = None
                    if deadline is None or deadline > time.monotonic():
                        waiter = async_waiter()
                        queue.waiters.append(waiter)
                else:
                    actions = self._take_actions()
                    self._wake()
                    break
            if waiter is None:
                raise Timeout(f"{self.name}: {what} timed out")
            try:
                woken = await waiter.wait(None if deadline is None else deadline - time.monotonic())
            except BaseException:
                with self._lock:
                    queue.abandon(waiter)
                raise
            if not woken:
                with self._lock:
                    queue.abandon(waiter)
                raise Timeout(f"{self.name}: {what} timed out")
        if actions:
            self._execute(actions)
        return result
