"""The socket's end of life: close and aclose, flush and aflush, the wait of devices
for a close, and what a forked child does with an inherited socket.

Owns: the order of closing's synchronous half (mark closed, close the core, wake
every blocked call, forget the endpoints) before its asynchronous half in the engine
(nanopy/socket/lifecycle.py, ``SocketTasks.shutdown``); the flush wait; the closing
wait queue of devices.

May call: the socket's driver, its task tree and its endpoints part (``PipeHost``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from ..core.errors import Timeout, WouldBlock
from ..driver.socket_driver import checkpoint_after, checkpoint_before
from ..driver.waiters import WaitQueue
from .util import check_timeout, run_in_worker_thread

if TYPE_CHECKING:
    from ..driver.socket_driver import SocketDriver
    from ..engine.engine import Engine
    from .lifecycle import SocketTasks
    from .pipes import PipeHost


def _never() -> bool:
    return False


class Closing:
    """The closing-and-flushing part of a socket (``close``, ``aclose``, ``flush``,
    ``aflush`` and the engine's fork and exit hooks delegate here)."""

    def __init__(self, sock: Any, driver: SocketDriver, tasks: SocketTasks, host: PipeHost,
                 options: Any, engine: Callable[[], Engine], running_engine: Callable[[], Engine | None]) -> None:
        self._sock = sock  # (its repr names it in a flush Timeout)
        self._driver = driver
        self._tasks = tasks
        self._host = host
        self._options = options  # (read per call: linger may change)
        self._engine = engine  # the socket's engine, started on first use
        self._running_engine = running_engine  # ... or None if it never started
        self._closing_q: WaitQueue | None = None  # made by the first await_closed

    def _in_engine_thread(self) -> bool:
        engine = self._running_engine()
        return engine is not None and engine.in_engine_thread()

    # -- closing ----------------------------------------------------------------
    def close(self, linger: float | None) -> None:
        """:meth:`nanopy.Socket.close`'s work."""
        self.start(linger)
        if self._in_engine_thread():
            return  # from a pipe callback: the engine cannot wait for itself
        self._tasks.wait()

    async def aclose(self, linger: float | None) -> None:
        """:meth:`nanopy.Socket.aclose`'s work."""
        self.start(linger)
        if self._tasks.finished or self._in_engine_thread():
            # Nothing to wait for, or a pipe callback (the engine cannot wait for itself).
            await checkpoint_after(await checkpoint_before())
            return
        await self._tasks.await_finished()

    def start(self, linger: float | None) -> None:
        """Closing, without the wait: the synchronous half (mark closed, close the
        core, wake every blocked call) here, then the asynchronous half started in
        the engine (listeners, dialers, flush within ``linger``, pipes). A second
        call changes nothing."""
        if linger is None:
            linger = self._options.linger
        if self._driver.close_core():
            self._host.close_endpoints()  # (wait_for_pipes raises Closed)
        self._tasks.shutdown(linger)

    def forked(self) -> None:
        """In a forked child: the engine serving this socket is gone. Closed at once,
        nobody woken (every waiter is a parent's thread or loop): calls raise
        ``Closed`` naming the fork."""
        self._driver.forked()
        self._tasks.forked()
        self._host.forked()
        if self._closing_q is not None:
            self._closing_q.forget_all()

    async def await_closed(self) -> None:
        """Wait (trio or asyncio) until the socket closes; raises :class:`Closed` then.

        Devices watch both of their sockets with it, so a pump blocked on one
        socket ends when the *other* one closes. ``close`` wakes every wait queue.
        """
        driver = self._driver

        def attempt() -> None:
            raise WouldBlock

        await driver.acall(attempt, driver.feed(self._closing_queue), None, "wait for close")

    def _closing_queue(self) -> WaitQueue:
        """(Under the socket lock) the wait queue of :meth:`await_closed`, made once."""
        queue = self._closing_q
        if queue is None:
            queue = self._closing_q = WaitQueue(_never)
            self._driver.queues.append(queue)
        return queue

    # -- flushing ---------------------------------------------------------------
    def flush(self, timeout: Any) -> None:
        """:meth:`nanopy.Socket.flush`'s work."""
        timeout = check_timeout(timeout, None)
        self._driver.check_open()
        self._host.refuse_engine_thread("flush")
        if self._written():
            return
        if timeout == 0 or not self._engine().run(self._await_written, timeout):
            raise Timeout(self._still_queued(timeout))

    async def aflush(self, timeout: Any) -> None:
        """:meth:`nanopy.Socket.aflush`'s work."""
        timeout = check_timeout(timeout, None)
        self._driver.check_open()
        if self._written():
            await checkpoint_after(await checkpoint_before())
            return
        if timeout == 0 or not await run_in_worker_thread(self._engine().run, self._await_written, timeout):
            raise Timeout(self._still_queued(timeout))

    def _written(self) -> bool:
        return all(pipe.flushed() for pipe in self._driver.pipe_drivers())

    def _still_queued(self, timeout: float | None) -> str:
        return (f"{self._sock!r}: {self._driver.queued_out()} message(s) still queued after {timeout}s; "
                "a peer is not reading (see stats().queued_out and pipes())")

    async def _await_written(self, timeout: float | None) -> bool:
        """Engine side of :meth:`flush`: True once the pipes of the call's time wrote all."""
        with trio.move_on_after(math.inf if timeout is None else timeout):
            for pipe in self._driver.pipe_drivers():
                await pipe.wait_flushed()
            return True
        return False
