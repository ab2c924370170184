"""The process-wide trio engine: one background thread running one trio loop.

Started lazily by the first socket that needs it (never at import), re-created in
a child after ``os.fork()`` (nanopy/_fork.py), and shut down at interpreter exit
after live sockets have had their ``linger`` to flush. All pipe I/O, dialers, listeners and timers run
here, each socket's tasks in one tree (nanopy/socket/lifecycle.py); user threads only
touch socket state under each socket's lock and wake the loop when a task there is
parked.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .. import _fork

log = logging.getLogger("nanopy")

# At exit, after the sockets have closed, how long to wait for the engine thread.
STOP_TIMEOUT = 5.0


class Engine:
    def __init__(self) -> None:
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._ready = threading.Event()
        self._stopped = False
        # The engine's clock in seconds, readable from any thread (timers and pipe
        # writers use it; an engine inside a test's trio run reads that run's clock).
        # An attribute, not a method: senders read it once per batch.
        self.now: Callable[[], float] = time.monotonic
        self._thread = threading.Thread(target=self._thread_main, name="nanopy-engine", daemon=True)
        self._thread.start()
        self._ready.wait()
        self.thread_id = self._thread.ident

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException:  # pragma: no cover - the engine must never die silently
            log.exception("nanopy engine crashed")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._ready.set()
            await trio.sleep_forever()

    # -- doors in from other threads --------------------------------------------
    def in_engine_thread(self) -> bool:
        return threading.get_ident() == self.thread_id

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Run ``fn(*args)`` on the engine thread soon (from any thread); False if the
        engine has stopped (at interpreter exit) and it will never run."""
        try:
            self._token.run_sync_soon(fn, *args)  # type: ignore[union-attr]
        except trio.RunFinishedError:
            return False
        return True

    def run_soon(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Run ``fn(*args)`` on the engine thread: at once when called there, soon
        otherwise; False if the engine has stopped and it will never run."""
        if self.in_engine_thread():
            fn(*args)
            return True
        return self.call_soon(fn, *args)

    def spawn(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``afn(*args)`` as a task in the engine's nursery."""
        self.run_soon(self._nursery.start_soon, afn, *args)  # type: ignore[union-attr]

    def run(self, afn: Callable[..., Awaitable[Any]], *args: Any, timeout: float | None = None) -> Any:
        """Run ``afn(*args)`` in the engine and block the calling thread for its result."""
        if self.in_engine_thread():
            raise RuntimeError(
                "a blocking nanopy call was made on the nanopy engine thread (from a pipe "
                "callback?); use the *_nowait or async forms there"
            )
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        async def runner() -> None:
            try:
                result = await afn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)
            else:
                future.set_result(result)

        if self._stopped:
            raise RuntimeError("the nanopy engine has shut down")
        self.call_soon(self._nursery.start_soon, runner)  # type: ignore[union-attr]
        return future.result(timeout)

    def forked(self) -> None:
        """In a forked child: this engine's thread and trio run are the parent's and do
        not exist here. Mark it stopped, and cut the way into its run, whose lock may be
        held and whose wake-up socket the parent shares: a call that would reach it
        finds the run finished instead."""
        self._stopped = True
        self._token = _GONE

    def stop(self) -> None:
        """Cancel every task and wait (at most ``STOP_TIMEOUT``) for the thread to end."""
        if self._stopped:
            return
        self._stopped = True
        if self._nursery is not None:
            self.call_soon(self._nursery.cancel_scope.cancel)
        if not self.in_engine_thread():
            self._thread.join(timeout=STOP_TIMEOUT)


class _GoneRun:
    """Stands for the trio token of a parent's run in a forked child."""

    def run_sync_soon(self, *args: Any, **kwargs: Any) -> None:
        raise trio.RunFinishedError("this trio run belongs to the parent process (os.fork)")


_GONE: Any = _GoneRun()

_lock = _fork.process_lock()
_engine: Engine | None = None
# Set by nanopy.testing.engine_in_this_loop: sockets made meanwhile use this engine.
_test_engine: Engine | None = None
_sockets: weakref.WeakSet[Any] = weakref.WeakSet()


def get_engine() -> Engine:
    """The engine of this process, started on first use."""
    global _engine
    engine = _test_engine or _engine
    if engine is not None:
        return engine
    with _lock:
        if _engine is None:
            _engine = Engine()
        return _engine


def track_socket(sock: Any) -> None:
    _sockets.add(sock)


@_fork.reset_in_child
def _forget_parent_engine() -> None:
    """The parent's engine thread does not exist here: start afresh, lazily.

    Sockets inherited from the parent are fork-closed (their tasks lived in the
    parent's engine): any call on them raises ``Closed`` saying to create a new socket,
    and this process's copies of their connections and listening sockets are closed.
    """
    global _engine, _test_engine
    for engine in (_engine, _test_engine):
        if engine is not None:
            engine.forked()
    _engine = _test_engine = None
    for sock in list(_sockets):
        sock._forked()
    _sockets.clear()


def _shutdown_at_exit() -> None:
    """Close every live socket as ``close()`` would, then stop the engine.

    All sockets are closed together: each one's blocked calls are woken at once,
    and their linger flushes run side by side, so the exit waits for the longest
    linger (plus the close grace), not for their sum.
    """
    engine = _engine
    if engine is None:
        return
    closing = []
    for sock in list(_sockets):
        try:
            sock._close_start(None)
            closing.append(sock)
        except Exception:  # pragma: no cover
            log.debug("error closing %r at exit", sock, exc_info=True)
    for sock in closing:
        sock._tasks.wait()
    engine.stop()


atexit.register(_shutdown_at_exit)
