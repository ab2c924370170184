"""Waiting: blocking calls for threads, awaitable calls for trio and asyncio tasks.

Owns: the retry loop of an attempt that raises ``WouldBlock`` (``call``,
``acall``), parking a waiter between tries, timeouts, and the checkpoints of
every ``a*`` call (``cancellation_point``, ``checkpoint_before``/``after``).

May call: the round, through :class:`WaitHost` (its attempt rounds, the pipes
and the receive queue), and the direct read
(:class:`~nanopy.driver.direct.DirectRead`) when the socket's only pipe can be read here.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import sniffio
import trio

from ..core.errors import Timeout
from .direct import DirectRead, _asyncio_wait_for_fds, _trio_wait_readable
from .round import BLOCKED, _Blocked
from .waiters import ThreadWaiter, WaitQueue, async_waiter

if TYPE_CHECKING:
    from ..engine.engine import Engine

T = TypeVar("T")


class WaitHost(Protocol):
    """What the waiting part needs of the driver (the round): one try of an
    attempt in a round, giving a waiter up, and what a timeout reports."""

    recv_q: WaitQueue
    _name: Callable[[], str]
    _engine: Callable[[], Engine]

    @property
    def pipes(self) -> Mapping[int, object]:
        """The live pipes (how many: a sole one may be read directly)."""
        ...

    def _attempt(self, attempt: Callable[[], T], park: Callable[[], Any] | None) -> tuple[T | _Blocked, Any]: ...

    def try_once(self, attempt: Callable[[], T]) -> T | _Blocked: ...

    def _abandon(self, queue: WaitQueue, waiter: Any) -> None: ...


class Waiting:
    """Blocking and async calls (see the module docstring)."""

    def __init__(self, driver: WaitHost, direct: DirectRead[Any]) -> None:
        self.round = driver  # the attempt's rounds, the wait queues, the pipes
        self.direct = direct  # reads the only pipe in the caller's own thread

    # -- waiting -------------------------------------------------------------------------
    def _timed_out(self, what: str) -> Timeout:
        """The Timeout for ``what``; it says so when no peer was connected to wait for."""
        r = self.round
        if r.pipes:
            return Timeout(f"{r._name()}: {what} timed out")
        return Timeout(
            f"{r._name()}: {what} timed out: no peer connected "
            "(check that a peer is running at the connected address, or connected to the bound one)"
        )

    def call(self, attempt: Callable[[], T], queue: WaitQueue, timeout: float | None, what: str) -> T:
        """Run ``attempt`` until it stops raising WouldBlock, parking this thread between tries."""
        r = self.round
        deadline = None if timeout is None else time.monotonic() + timeout
        if queue is r.recv_q and len(r.pipes) == 1:
            result = self.direct.recv(attempt, deadline)
            if not isinstance(result, _Blocked):
                return result

        def park() -> ThreadWaiter | None:  # (made only when the direct receive did not answer)
            waiter: ThreadWaiter | None = _park(queue, deadline, ThreadWaiter)
            return waiter

        engine_checked = False
        while True:
            result, waiter = r._attempt(attempt, park)
            if not isinstance(result, _Blocked):
                return result
            if waiter is None:
                raise self._timed_out(what)
            if not engine_checked:
                engine_checked = True
                if r._engine().in_engine_thread():
                    r._abandon(queue, waiter)
                    raise RuntimeError(
                        f"{r._name()}: a blocking {what} on the nanopy engine thread would "
                        "deadlock; pass timeout=0 in pipe callbacks"
                    )
            try:
                woken = waiter.wait(None if deadline is None else deadline - time.monotonic())
            except BaseException:  # Ctrl-C: the call took nothing
                r._abandon(queue, waiter)
                raise
            if not woken:
                r._abandon(queue, waiter)
                # One last try: the condition may have turned true as we timed out.
                result = r.try_once(attempt)
                if not isinstance(result, _Blocked):
                    return result
                raise self._timed_out(what)

    async def acall(self, attempt: Callable[[], T], queue: WaitQueue, timeout: float | None, what: str) -> T:
        """Async twin of :meth:`call` for trio and asyncio tasks; a checkpoint.

        A call cancelled before it completes raises Cancelled (CancelledError) and
        took or sent nothing: the attempt runs only after the cancellation check,
        and a message leaves the core only inside a successful attempt.
        """
        r = self.round
        trio_task = await checkpoint_before()
        deadline = None if timeout is None else time.monotonic() + timeout

        def park() -> Any:
            return _park(queue, deadline, async_waiter)

        result: T | _Blocked = BLOCKED
        waited = False
        if queue is r.recv_q and len(r.pipes) == 1:
            wait = _trio_wait_readable if trio_task else _asyncio_wait_for_fds()
            if wait is not None:
                result, waited = await self.direct.arecv(attempt, deadline, wait)
        while isinstance(result, _Blocked):
            result, waiter = r._attempt(attempt, park)
            if not isinstance(result, _Blocked):
                break
            if waiter is None:
                raise self._timed_out(what)
            waited = True
            try:
                woken = await waiter.wait(None if deadline is None else deadline - time.monotonic())
            except BaseException:
                r._abandon(queue, waiter)
                raise
            if not woken:
                r._abandon(queue, waiter)
                raise self._timed_out(what)
        if trio_task and not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()  # the call's schedule point
        return result


def _park(queue: WaitQueue, deadline: float | None, make: Callable[[], Any]) -> Any:
    """Register a new waiter on ``queue`` unless the deadline has passed (lock held)."""
    if deadline is not None and deadline <= time.monotonic():
        return None
    waiter = make()
    queue.park(waiter)  # a queue may key the waiter by caller (nanopy.core.callers)
    return waiter


def in_trio() -> bool:
    """Whether the calling task runs under trio (else asyncio)."""
    return sniffio.thread_local.name == "trio" or sniffio.current_async_library() == "trio"


def cancellation_point(trio_task: bool) -> Awaitable[None]:
    """The cancellation point at the start of every async call, to be awaited.

    trio: raises Cancelled if the scope is cancelled (the caller must then add a
    schedule point, ``cancel_shielded_checkpoint``, if it completes without
    waiting). asyncio: one loop turn, where a pending cancel raises CancelledError.
    A plain function returning the awaitable: the hot paths (``Socket.asend``,
    ``arecv``) pay no coroutine level of their own for it.
    """
    if trio_task:
        return trio.lowlevel.checkpoint_if_cancelled()  # noqa: ASYNC105 - the caller awaits it
    import asyncio

    return asyncio.sleep(0)


async def checkpoint_before() -> bool:
    """:func:`cancellation_point` in one call; True under trio."""
    trio_task = in_trio()
    await cancellation_point(trio_task)
    return trio_task


async def checkpoint_after(trio_task: bool) -> None:
    """The schedule point ending an async call that completed without waiting."""
    if trio_task:
        await trio.lowlevel.cancel_shielded_checkpoint()
