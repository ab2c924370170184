"""Endpoints: a socket's binds (listeners) and connects (dialers).

Each endpoint is one task in its socket's task tree (nanopy/socket/lifecycle.py). A
dialer connects, completes the handshake, waits while the pipe runs, then redials
after an exponential, jittered back-off (``reconnect_interval`` doubling up to
``reconnect_interval_max``, reset after a pipe that lived; a failed dial's own wait,
up to ``connect_timeout``, counts toward it). A listener binds, then
accepts and hands each connection to its own handshake task, so a peer stalling
in the handshake holds up nobody else. A pipe that completed its handshake runs
in the socket's pipes nursery, not under its endpoint.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any

import trio

from ..core.errors import MessageTooLarge, Refused, RemoteProtocolError
from ..transports._base import Connection, Listener, PipeContext, Transport

if TYPE_CHECKING:
    from .gate import Gate
    from .socket import Socket

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
        self._handshakes = 0  # handshakes completed (a dialer's after its first are reconnects)
        #: a bind's admission check (``authorize=``, ``allow=``, ``deny=``), or None
        self.gate: Gate | None = None

    def __repr__(self) -> str:
        kind = "connect" if self.dialer else "bind"
        return f"<nanopy.Endpoint {kind} {self.url}>"

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran, or its socket closed."""
        return self._closed

    def close(self) -> None:
        """Stop this endpoint only: its listener or dialer and the pipes it made."""
        if self._closed:
            return
        self._closed = True
        sock = self.socket
        sock._host.forget_endpoint(self)
        if sock._driver.fork_closed:
            return  # inherited across a fork: the engine that ran it is gone
        engine = sock._engine_obj
        if engine is None:
            return  # never started (the socket's engine never ran)
        engine.run_soon(self.cancel)
        # A pipe handed over from a handshake after this point sees ``closed``.
        for pipe in sock._driver.pipe_drivers():
            if pipe.pipe.endpoint is self:
                pipe.close_soon()

    def cancel(self) -> None:
        """Engine side: stop the listener or dialer task and its handshakes (not its pipes)."""
        self._scope.cancel()

    def _context(self) -> PipeContext:
        return self.socket._host.pipe_context(self)

    def _log_protocol_error(self, where: str, exc: BaseException) -> None:
        """Log a peer that broke the wire rules (WARNING, rate-limited per endpoint)."""
        self._warnings.warning("%s: closing %s on %s: %s", self.socket.name, where, self.url, exc)

    # -- engine side -----------------------------------------------------------
    async def open_listener(self) -> Listener:
        """Engine side: bind (``Socket.bind`` runs it, then hands the listener to
        :meth:`run_listener` in the socket's task tree)."""
        listener = self._listener = await self.transport.listen(self.url, self._context())
        self.url = listener.url
        return listener

    async def run_listener(self, listener: Listener) -> None:
        """Engine side: accept connections until stopped; then close the listener, so
        its address is free before the socket's task tree ends."""
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
        now = self.socket._engine.now  # the engine's clock (a test's virtual one too)
        with self._scope:
            while True:
                started = now()
                waited = 0.0  # a failed dial's own wait (connect_timeout) counts as back-off
                try:
                    conn = await self.transport.dial(self.url, self._context())
                except (OSError, RemoteProtocolError) as exc:
                    log.debug("%s: connect %s failed: %s", self.socket.name, self.url, exc)
                    self.socket._host.count_dial_failure()
                    waited = now() - started
                else:
                    ran = await self._handshake_and_run(conn)
                    if ran and now() - started >= HEALTHY_PIPE_SECONDS:
                        delay = opts.reconnect_interval
                    if not ran:
                        self.socket._host.count_reconnect()
                await trio.sleep(max(backoff_delay(delay) - waited, 0.0))
                delay = min(delay * 2, max(opts.reconnect_interval_max, opts.reconnect_interval))

    async def _handshake_and_run(self, conn: Connection) -> bool:
        """Handshake (bounded by handshake_timeout), then run the pipe. False if it never ran."""
        sock = self.socket
        gate = self.gate
        if gate is not None and conn.gates_itself:
            conn.gate = gate  # (ZMTP asks it before its READY; SP streams before their header)
        try:
            with trio.fail_after(sock._options.handshake_timeout):
                if gate is not None and conn.refuses_early:
                    reason = gate.refuse_early(conn)  # (allow=/deny=: no TLS or upgrade for them)
                    if reason is not None:
                        raise Refused(reason)
                await conn.handshake()
                if gate is not None and not conn.gates_itself:
                    reason = await gate(conn)
                    if reason is not None:
                        raise Refused(reason)
        except Refused as exc:  # (the gate logged it, rate-limited per peer host)
            sock._host.count_handshake(self, exc)
            await conn.aclose_refused(str(exc))  # (with the mechanism's error: TLS alert, 403, 1008)
            return False
        except trio.TooSlowError:
            error = RemoteProtocolError(f"handshake with {conn.remote_address or 'peer'} timed out")
            sock._host.note_protocol_error(None, error, self)
            sock._host.count_handshake(self, error)
            await conn.aclose()
            return False
        except (RemoteProtocolError, MessageTooLarge) as exc:
            sock._host.note_protocol_error(None, exc, self)
            sock._host.count_handshake(self, exc)
            await conn.aclose()
            return False
        except (OSError, EOFError) as exc:
            log.debug("%s: handshake with %s failed: %s", sock.name, self.url, exc)
            sock._host.count_handshake(self, exc)
            await conn.aclose()
            return False
        except BaseException:
            with trio.CancelScope(shield=True):
                await conn.aclose()
            raise
        sock._host.count_handshake(self, None)
        # The pipe runs in the socket's pipes nursery: stopping this endpoint at
        # close does not cut it off before its queued messages are written. A
        # dialer waits for it to end before dialing again; a listener does not.
        ended = sock._tasks.start_pipe(sock._host.run_pipe, conn, self)
        if self.dialer:
            await ended.wait()
        return True
