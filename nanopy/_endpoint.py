"""Endpoints: a socket's binds (listeners) and connects (dialers).

Each endpoint runs as one task tree in the engine. A dialer connects, completes
the handshake, runs the pipe until it ends, then redials after an exponential,
jittered back-off (``reconnect_interval`` doubling up to ``reconnect_interval_max``,
reset after a pipe that lived). A listener accepts and hands each connection to
its own task, so a peer stalling in the handshake holds up nobody else.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any

import trio

from ._errors import Closed, MessageTooLarge, RemoteProtocolError
from .transports._base import Connection, Listener, PipeContext, Transport

if TYPE_CHECKING:
    from ._socket import Socket

log = logging.getLogger("nanopy")

# A pipe that lived at least this long resets the dialer's back-off.
HEALTHY_PIPE_SECONDS = 1.0
# One endpoint logs at most one protocol-error WARNING per this many seconds; the
# repeats go to DEBUG and the next WARNING says how many there were.
LOG_INTERVAL = 10.0


class RepeatLimiter:
    """Rate-limits one endpoint's WARNINGs (docs/transports.md, "Errors, reconnects and logs")."""

    __slots__ = ("interval", "_next", "_quiet")

    def __init__(self, interval: float = LOG_INTERVAL) -> None:
        self.interval = interval
        self._next = 0.0
        self._quiet = 0

    def warning(self, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now < self._next:
            self._quiet += 1
            log.debug(msg, *args)
            return
        if self._quiet:
            msg += " (and %d more since the last warning, logged at DEBUG)"
            args = (*args, self._quiet)
        self._quiet = 0
        self._next = now + self.interval
        log.warning(msg, *args)


def backoff_delay(current: float) -> float:
    """Jittered delay: uniform in [current/2, current] so peers spread out."""
    return current * (0.5 + random.random() / 2)


class Endpoint:
    """A bind or connect of one socket.

    Attributes:
        url: the address; for a bind, with the real port after ``tcp://...:0``.
        dialer: True for ``connect``, False for ``bind``.
        priority, recv_priority: send and receive priority (1 = highest ... 16).
        options: the endpoint's other options (e.g. ``ssl_context``).
    """

    def __init__(
        self,
        sock: Socket,
        url: str,
        transport: Transport,
        dialer: bool,
        priority: int,
        recv_priority: int,
        options: dict[str, Any],
    ) -> None:
        self.socket = sock
        self.url = url
        self.transport = transport
        self.dialer = dialer
        self.priority = priority
        self.recv_priority = recv_priority
        self.options = options
        self._scope = trio.CancelScope()
        self._closed = False
        self._listener: Listener | None = None
        self._warnings = RepeatLimiter()

    def __repr__(self) -> str:
        kind = "connect" if self.dialer else "bind"
        return f"<nanopy.Endpoint {kind} {self.url}>"

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def close(self) -> None:
        """Stop this endpoint only: its listener or dialer and the pipes it made."""
        if self._closed:
            return
        self._closed = True
        self.socket._forget_endpoint(self)
        engine = self.socket._engine
        if engine.in_engine_thread():
            self._scope.cancel()
        else:
            engine.call_soon(self._scope.cancel)

    def _context(self) -> PipeContext:
        return self.socket._pipe_context(self)

    def _log_protocol_error(self, where: str, exc: BaseException) -> None:
        """Log a peer that broke the wire rules (WARNING, rate-limited per endpoint)."""
        self._warnings.warning("%s: closing %s on %s: %s", self.socket.name, where, self.url, exc)

    # -- engine side -----------------------------------------------------------
    async def open_listener(self) -> str:
        """Engine side: bind (run in the engine by ``Socket.bind``).

        Returns:
            The bound URL, with the real port.
        """
        self._listener = await self.transport.listen(self.url, self._context())
        self.url = self._listener.url
        return self.url

    async def run_listener(self) -> None:
        """Engine side: accept connections until closed (started by ``Socket.bind``)."""
        listener = self._listener
        assert listener is not None
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    while True:
                        try:
                            conn = await listener.accept()
                        except OSError as exc:
                            log.warning("%s: accept on %s failed: %s", self.socket.name, self.url, exc)
                            return
                        nursery.start_soon(self._handshake_and_run, conn)
        finally:
            with trio.CancelScope(shield=True):
                await listener.aclose()

    async def run_dialer(self) -> None:
        """Engine side: dial, run the pipe, back off and dial again until closed."""
        opts = self.socket._options
        delay = opts.reconnect_interval
        with self._scope:
            while True:
                started = time.monotonic()
                try:
                    conn = await self.transport.dial(self.url, self._context())
                except (OSError, RemoteProtocolError) as exc:
                    log.debug("%s: connect %s failed: %s", self.socket.name, self.url, exc)
                    self.socket._count_reconnect()
                else:
                    ran = await self._handshake_and_run(conn)
                    if ran and time.monotonic() - started >= HEALTHY_PIPE_SECONDS:
                        delay = opts.reconnect_interval
                    if not ran:
                        self.socket._count_reconnect()
                await trio.sleep(backoff_delay(delay))
                delay = min(delay * 2, max(opts.reconnect_interval_max, opts.reconnect_interval))

    async def _handshake_and_run(self, conn: Connection) -> bool:
        """Handshake (bounded by handshake_timeout), then run the pipe. False if it never ran."""
        sock = self.socket
        try:
            with trio.fail_after(sock._options.handshake_timeout):
                await conn.handshake()
        except trio.TooSlowError:
            error = RemoteProtocolError(f"handshake with {conn.remote_address or 'peer'} timed out")
            sock._note_protocol_error(None, error, self)
            await conn.aclose()
            return False
        except (RemoteProtocolError, MessageTooLarge) as exc:
            sock._note_protocol_error(None, exc, self)
            await conn.aclose()
            return False
        except (OSError, EOFError) as exc:
            log.debug("%s: handshake with %s failed: %s", sock.name, self.url, exc)
            await conn.aclose()
            return False
        except BaseException:
            with trio.CancelScope(shield=True):
                await conn.aclose()
            raise
        try:
            await sock._run_pipe(conn, self)
        except Closed:
            pass
        return True
