"""Waiting on several sockets at once: :class:`Poller` and :func:`poll`.

Named and shaped after pyzmq's poller so readers of the ZeroMQ Guide find it,
with timeouts in seconds like the rest of nanopy.

How it works: a socket's readiness is what its driver says -- POLLIN
when the socket is readable (a ``recv(timeout=0)`` would succeed now), POLLOUT when
it is writable (a ``send(timeout=0)`` would). Both are asked on the polling
thread or task, so per-caller protocols (a REQ's classic reply, a REP's pending
request) answer for the poller's caller. A poll that finds nothing ready parks
one waiter (a lock for a thread, an event for a task) on every registered
socket; a socket wakes its watchers whenever its state may have changed (the
socket's wake pass, see :class:`Pollable`) and when it closes. The poll then
looks again. An idle poll therefore sleeps, and costs nothing per message when
nobody polls.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from ..driver.waiters import ThreadWaiter, async_waiter
from .util import yield_to_loop

if TYPE_CHECKING:
    from ..driver.socket_driver import SocketDriver
    from .socket import Socket

POLLIN = 1
POLLOUT = 2
_ALL = POLLIN | POLLOUT


class Pollable:
    """Mixed into :class:`nanopy.Socket`: the readiness/notification hook pollers use.

    The socket driver wakes the blocked polls (``SocketDriver.watchers``) from its
    wake pass and when the socket closes; everything else here runs on the
    polling caller's thread.
    """

    _driver: SocketDriver

    def _notify_watchers(self) -> None:
        """Wake every blocked poll on this socket (lock held); each re-registers."""
        self._driver.notify_watchers()

    def _poll_flags(self, flags: int, waiter: Any = None) -> int:
        """Which of ``flags`` hold now; with ``waiter``, also watch for a change.

        Checking and registering under one lock round means a change that
        happens after the check always reaches the waiter.
        """
        driver = self._driver

        def check() -> int:
            ready = 0
            if flags & POLLIN and driver.readable():
                ready |= POLLIN
            if flags & POLLOUT and driver.writable():
                ready |= POLLOUT
            if waiter is not None and not ready:
                driver.watchers.append(waiter)
            return ready

        return driver.inspect(check)

    def _unwatch(self, waiter: Any) -> None:
        driver = self._driver

        def unwatch() -> None:
            try:
                driver.watchers.remove(waiter)
            except ValueError:
                pass  # already woken (and dropped)

        driver.inspect(unwatch, check_open=False)


def _check_flags(flags: Any) -> int:
    if isinstance(flags, bool) or not isinstance(flags, int):
        raise TypeError(f"poll flags must be an int (nanopy.POLLIN, POLLOUT or both), not {type(flags).__name__}")
    if flags & ~_ALL or flags < 0:
        raise ValueError(f"poll flags must be a combination of nanopy.POLLIN and nanopy.POLLOUT, got {flags!r}")
    return flags


def _check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds or None, not {type(timeout).__name__}")
    if timeout != timeout or timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds (or None to wait forever), got {timeout!r}")
    return float(timeout)


class Poller:
    """Wait until any of several sockets can receive (POLLIN) or send (POLLOUT).

    ::

        poller = nanopy.Poller()
        poller.register(pull, nanopy.POLLIN)
        poller.register(sub, nanopy.POLLIN)
        for sock, flags in poller.poll(timeout=1.0):
            sock.recv(timeout=0)

    A poller may be shared by threads; each ``poll`` call waits on its own.
    """

    def __init__(self) -> None:
        self._sockets: dict[Socket, int] = {}

    @property
    def sockets(self) -> list[tuple[Socket, int]]:
        """The registered ``(socket, flags)`` pairs, in registration order."""
        return list(self._sockets.items())

    def register(self, socket: Socket, flags: int = _ALL) -> None:
        """Watch ``socket`` for ``flags`` (``POLLIN | POLLOUT`` by default).

        Registering again changes the flags; flags ``0`` unregisters (as pyzmq).

        Args:
            socket: a :class:`nanopy.Socket`.
            flags: ``POLLIN``, ``POLLOUT`` or both (``|``).

        Raises:
            TypeError: not a socket, or flags not an int.
            ValueError: flags other than POLLIN/POLLOUT.
        """
        from .socket import Socket

        if not isinstance(socket, Socket):
            raise TypeError(f"Poller.register() takes a nanopy.Socket, not {type(socket).__name__}")
        flags = _check_flags(flags)
        if flags:
            self._sockets[socket] = flags
        else:
            self._sockets.pop(socket, None)

    def unregister(self, socket: Socket) -> None:
        """Stop watching ``socket``.

        Args:
            socket: a socket registered with this poller.

        Raises:
            KeyError: it is not registered.
        """
        try:
            del self._sockets[socket]
        except KeyError:
            raise KeyError(f"{socket!r} is not registered with this poller") from None

    def _check(self, items: list[tuple[Socket, int]], waiter: Any) -> list[tuple[Socket, int]]:
        """Ready (socket, flags); with ``waiter``, watch every socket if none is."""
        ready = []
        watched: list[Socket] = []
        try:
            for sock, flags in items:
                got = sock._poll_flags(flags, waiter)
                if got:
                    ready.append((sock, got))
                elif waiter is not None:
                    watched.append(sock)
        except BaseException:
            self._unwatch(watched, waiter)
            raise
        if ready and waiter is not None:
            self._unwatch(watched, waiter)
        return ready

    @staticmethod
    def _unwatch(socks: Iterable[Socket], waiter: Any) -> None:
        for sock in socks:
            sock._unwatch(waiter)

    def _deadline(self, timeout: Any) -> float | None:
        timeout = _check_timeout(timeout)
        if timeout is None and not self._sockets:
            raise ValueError("poll(timeout=None) with no socket registered would wait forever")
        return None if timeout is None else time.monotonic() + timeout

    def _arm(self, deadline: float | None, make: Any) -> _Round:
        """One look at every socket; if none is ready and time is left, a waiter watches them all."""
        items = self.sockets
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return _Round(self._check(items, None), None, items, 0.0)  # timeout 0, or time is up
        waiter = make()
        ready = self._check(items, waiter)
        return _Round(ready, None if ready else waiter, items, remaining)

    def poll(self, timeout: float | None = None) -> list[tuple[Socket, int]]:
        """Wait until a registered socket is ready.

        Args:
            timeout: seconds to wait; ``None`` waits forever, ``0`` just looks.

        Returns:
            ``[(socket, flags), ...]`` for the sockets that are ready, in
            registration order; ``[]`` when the timeout expired.

        Raises:
            Closed: a registered socket is (or gets) closed.
            ValueError: a negative timeout, or ``None`` with nothing registered.
        """
        deadline = self._deadline(timeout)
        while True:
            r = self._arm(deadline, ThreadWaiter)
            if r.waiter is None:
                return r.ready
            try:
                r.waiter.wait(r.remaining)
            finally:
                self._unwatch([s for s, _ in r.items], r.waiter)

    async def apoll(self, timeout: float | None = None) -> list[tuple[Socket, int]]:
        """Async :meth:`poll` for trio and asyncio (always a checkpoint).

        Cancelling it is harmless: polling takes nothing from the sockets.

        Args:
            timeout: seconds to wait; ``None`` waits forever, ``0`` just looks.

        Returns:
            ``[(socket, flags), ...]`` for the ready sockets; ``[]`` on timeout.

        Raises:
            Closed: a registered socket is (or gets) closed.
        """
        deadline = self._deadline(timeout)
        await yield_to_loop()
        while True:
            r = self._arm(deadline, async_waiter)
            if r.waiter is None:
                return r.ready
            try:
                await r.waiter.wait(r.remaining)
            finally:
                self._unwatch([s for s, _ in r.items], r.waiter)


class _Round(NamedTuple):
    """One look of a poll: what is ready, or the waiter now watching ``items``."""

    ready: list[tuple[Socket, int]]
    waiter: Any
    items: list[tuple[Socket, int]]
    remaining: float | None


def poll(items: Iterable[tuple[Socket, int]], timeout: float | None = None) -> list[tuple[Socket, int]]:
    """One-shot :meth:`Poller.poll`.

    Args:
        items: ``[(socket, flags), ...]`` to watch.
        timeout: seconds to wait; ``None`` waits forever, ``0`` just looks.

    Returns:
        ``[(socket, flags), ...]`` for the ready sockets; ``[]`` on timeout.

    Raises:
        Closed: one of the sockets is (or gets) closed.
    """
    poller = Poller()
    for sock, flags in items:
        poller.register(sock, flags)
    return poller.poll(timeout)
