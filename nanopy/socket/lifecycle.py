"""One socket's task tree in the engine, and how it is taken down.

Every engine task of a socket runs under one tree::

    SocketTasks._main
    └── pipes nursery          one task per pipe (PipeDriver.run: reader + writer)
        └── endpoints nursery  listeners (accept loop + handshakes), dialers
                               (dial, handshake, back-off), the protocol's
                               timers (stopped with the core)

A bind opens its listener before the listener task joins the tree (so binding an
in-memory address never waits for another task); the tree counts such binds, and
closing is finished only once they have ended too.

A handshake belongs to the endpoint that made the connection; once it succeeds
the connection is handed to the pipes nursery, so stopping an endpoint never cuts
off a pipe that still has queued messages to write.

Closing has two halves (``Socket.close`` and ``Socket.aclose`` call both):

1. synchronous, on the caller's thread: mark the socket closed, close the core,
   wake every blocked call (they raise ``Closed`` at once) -- ``SocketDriver.close_core``;
2. asynchronous, in the engine (:meth:`SocketTasks._main` once told to stop):
   stop the listeners (their addresses are free when they return), then the
   dialers and any handshake in progress (a bind in progress ends by closing the
   listener it opened); give the pipes what is left of
   ``linger`` to write what they queued; close the pipes; the tree then ends.

The caller waits for the end of the tree, at most ``linger + CLOSE_GRACE``
seconds (a blocking wait on its thread, or a wait in its own trio or asyncio loop
for ``aclose`` -- no worker thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from ..core.errors import Closed
from ..driver.waiters import ThreadWaiter, async_waiter

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from ..pipe.driver import PipeDriver
    from .endpoint import Endpoint

log = logging.getLogger("nanopy")

# How long close() waits, after linger, for the socket's tasks to end once they are
# cancelled: closing a connection (a TLS close_notify, a websocket close frame)
# is bounded by the transports well inside this.
CLOSE_GRACE = 2.0


class SocketTasks:
    """The engine tasks of one socket (listeners, dialers, pipes) and their shutdown.

    ``reserve``, ``start_endpoint``, ``shutdown``, ``wait`` and ``await_finished`` may
    be called from any thread; the rest runs on the engine thread.
    """

    def __init__(
        self,
        name: Callable[[], str],
        engine: Callable[[], Engine],
        pipes: Callable[[], list[PipeDriver]],
    ) -> None:
        self._name = name
        self._engine = engine
        self._pipes = pipes  # the socket's live pipe drivers, to flush and close
        self._lock = threading.Lock()
        self._used = False  # a task was ever started: the engine exists
        self._stopping = False  # shutdown() ran (any thread)
        self._deadline = 0.0  # time.monotonic() by which the linger flush ends
        self._finished = False
        self._finish_waiters: list[Any] = []
        #: called once the tree has ended, before a waiting close() returns (any thread)
        self.on_finished: Callable[[], None] | None = None
        # engine thread only
        self._main_started = False
        self._main_ended = False
        self._binds = 0  # binds opening a listener outside the tree (Socket._bind)
        self._closing = False
        self._flush_until = 0.0  # trio.current_time() by which the linger flush ends
        self._stop: trio.Event | None = None
        self._pending: list[tuple[Endpoint | None, Callable[..., Awaitable[Any]], tuple[Any, ...]]] = []
        self._endpoint_nursery: trio.Nursery | None = None
        self._pipe_nursery: trio.Nursery | None = None
        self.endpoints: list[Endpoint] = []  # with a task in the tree, in start order

    # -- any thread ----------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """True once the tree has ended (or never had a task) after :meth:`shutdown`."""
        return self._finished

    def reserve(self) -> bool:
        """Before an engine call that will start a task (a bind): False if closing."""
        with self._lock:
            if self._stopping:
                return False
            self._used = True
            return True

    def start_endpoint(self, ep: Endpoint | None, afn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``afn(*args)`` as endpoint ``ep``'s task (dropped if the socket is closing)."""
        if not self.reserve():
            return
        self._engine().run_soon(self.spawn_endpoint, ep, afn, *args)

    def start_task(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``afn(*args)`` in the tree, beside the endpoints (the socket's timers)."""
        self.start_endpoint(None, afn, *args)

    def shutdown(self, linger: float) -> None:
        """Start the asynchronous half of closing (idempotent; returns at once)."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            self._deadline = time.monotonic() + linger
            used = self._used
        if not used:
            self._finish()  # never had a task: nothing to take down (and no engine to start)
            return
        if not self._engine().run_soon(self._begin_shutdown):
            self._finish()  # the engine has stopped (at exit): its tasks are gone with it

    def wait(self) -> bool:
        """Block the calling thread until the tree has ended, at most ``linger +
        CLOSE_GRACE`` after :meth:`shutdown`; False if it was still running."""
        waiter = ThreadWaiter()
        if not self._add_finish_waiter(waiter):
            return True
        return waiter.wait(self._wait_left()) or self._gave_up(waiter)

    async def await_finished(self) -> bool:
        """:meth:`wait` for trio and asyncio callers, in their own loop (no worker thread)."""
        waiter = async_waiter()
        if not self._add_finish_waiter(waiter):
            return True
        return await waiter.wait(self._wait_left()) or self._gave_up(waiter)

    def forked(self) -> None:
        """In a child process: the engine that ran the tree is gone, and so is the tree.

        Finished at once; its finish waiters are dropped, never woken: they are the
        parent's threads and loops (waking a trio one would take that run's lock, which
        another parent thread may have held at the fork, and the child would hang)."""
        self._lock = threading.Lock()
        self._stopping = True
        self._finished = True
        self._finish_waiters = []

    def _wait_left(self) -> float:
        return max(0.0, self._deadline - time.monotonic()) + CLOSE_GRACE

    def _add_finish_waiter(self, waiter: Any) -> bool:
        with self._lock:
            if self._finished:
                return False
            self._finish_waiters.append(waiter)
            return True

    def _gave_up(self, waiter: Any) -> bool:
        with self._lock:
            if waiter in self._finish_waiters:
                self._finish_waiters.remove(waiter)
        if self._finished:
            return True
        log.warning(
            "%s: close() gave up waiting for its connections to close after linger + %.0f s; "
            "they are still being closed in the background", self._name(), CLOSE_GRACE,
        )
        return False

    def _finish(self) -> None:
        if self.on_finished is not None:
            try:
                self.on_finished()
            except Exception:  # pragma: no cover - closing must finish whatever a hook does
                log.exception("%s: error at the end of close", self._name())
        with self._lock:
            self._finished = True
            waiters, self._finish_waiters = self._finish_waiters, []
        for waiter in waiters:
            waiter.wake()

    # -- engine thread ---------------------------------------------------------------
    def spawn_endpoint(self, ep: Endpoint | None, afn: Callable[..., Awaitable[Any]], *args: Any) -> bool:
        """Engine side of :meth:`start_endpoint`; False if the socket is closing."""
        if self._closing:
            return False
        if ep is not None:
            self.endpoints.append(ep)
        nursery = self._endpoint_nursery
        if nursery is not None:
            nursery.start_soon(self._endpoint_task, ep, afn, args)
            return True
        self._pending.append((ep, afn, args))
        if not self._main_started:
            self._main_started = True
            self._stop = trio.Event()
            self._engine().spawn(self._main)
        return True

    def start_pipe(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> trio.Event:
        """Run the pipe task ``afn(*args)`` in the pipes nursery; the event is set when it ends.

        The pipe does not belong to the task that made it: if that task is
        cancelled (its endpoint stops), the pipe runs on until it is closed, or
        flushed and closed by the socket's close.
        """
        nursery = self._pipe_nursery
        if nursery is None:  # pragma: no cover - endpoints run only inside the pipes nursery
            raise RuntimeError("a pipe outside its socket's task tree")
        ended = trio.Event()

        async def pipe_task() -> None:
            try:
                await afn(*args)
            except Closed:
                pass  # the socket closed under it
            except Exception:  # one pipe's failure must not take the socket's tree down
                log.exception("%s: pipe task failed", self._name())
            finally:
                ended.set()

        nursery.start_soon(pipe_task)
        return ended

    def bind_begins(self) -> bool:
        """A bind opens a listener (engine side); False if the socket is closing.

        The listener is opened before it joins the tree (so that a bind of an
        in-memory address completes without waiting); until :meth:`bind_ends`
        the tree does not count as finished.
        """
        if self._closing:
            return False
        self._binds += 1
        return True

    def bind_ends(self) -> None:
        self._binds -= 1
        self._finish_if_idle()

    def _begin_shutdown(self) -> None:
        self._closing = True
        # The flush deadline on the engine's own clock (a test's virtual one too).
        self._flush_until = trio.current_time() + max(0.0, self._deadline - time.monotonic())
        if self._stop is not None:
            self._stop.set()
        self._finish_if_idle()

    def _finish_if_idle(self) -> None:
        """Closing, and neither the tree nor a bind runs any more: finished."""
        if self._closing and not self._binds and (self._main_ended or not self._main_started):
            self._finish()

    async def _endpoint_task(
        self, ep: Endpoint | None, afn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]
    ) -> None:
        try:
            await afn(*args)
        except Exception:
            log.exception("%s: %s failed", self._name(), f"endpoint {ep.url}" if ep else afn.__qualname__)
        finally:
            if ep in self.endpoints:
                self.endpoints.remove(ep)

    async def _main(self) -> None:
        try:
            async with trio.open_nursery() as pipes:
                self._pipe_nursery = pipes
                async with trio.open_nursery() as endpoints:
                    self._endpoint_nursery = endpoints
                    self._start_pending(endpoints)
                    assert self._stop is not None
                    await self._stop.wait()
                    self._stop_endpoints()
                self._endpoint_nursery = None
                await self._flush_pipes()
                for pipe in self._pipes():
                    pipe.close_soon()
                pipes.cancel_scope.cancel()  # pipes not yet known to the socket
        except Exception:  # pragma: no cover - every task below handles its own errors
            log.exception("%s: error while closing", self._name())
        finally:
            self._pipe_nursery = None
            self._main_ended = True
            self._closing = True  # (cancelled from outside: the engine is stopping)
            self._finish_if_idle()

    def _start_pending(self, endpoints: trio.Nursery) -> None:
        pending, self._pending = self._pending, []
        for ep, afn, args in pending:
            endpoints.start_soon(self._endpoint_task, ep, afn, args)

    def _stop_endpoints(self) -> None:
        """Listeners first (no new connection comes in), then dialers (none goes out),
        then whatever else runs there (handshakes, timers)."""
        for want_dialers in (False, True):
            for ep in list(self.endpoints):
                if ep.dialer == want_dialers:
                    ep.cancel()
        assert self._endpoint_nursery is not None
        self._endpoint_nursery.cancel_scope.cancel()

    async def _flush_pipes(self) -> None:
        """Give the pipes until the linger deadline to write what they queued."""
        if self._flush_until <= trio.current_time():
            return
        with trio.move_on_at(self._flush_until):
            for pipe in self._pipes():
                await pipe.wait_flushed()


__all__ = ["CLOSE_GRACE", "SocketTasks"]
