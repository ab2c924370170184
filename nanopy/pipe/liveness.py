"""A pipe's liveness: how it ended, and dead-peer detection beside a full send buffer.

:class:`Liveness` is a part of :class:`~nanopy.pipe.driver.PipeDriver`, reached as
``pipe.liveness``. It owns the judgement of how the pipe ended (``note_failure``:
a bad peer, a dead one -- ``dead`` -- or a plain close), whether the writer task
is inside a write (``in_write``, told by ``write_started``/``write_ended``) and the
TCP window guard (a task that keeps the TCP user timeout from cutting off a peer
that is alive but not reading, and finds a dead one by its unanswered window
probes). The module's helpers count what a pipe that ended never delivered
(``kernel_unacked``, ``write_shortfall``, ``unwritten``: see ``PipeLosses`` in
nanopy/core/stats.py).

May call: the connection's kernel socket (``kernel_socket``), nanopy.platform's
``user_timeout``/``set_user_timeout`` and its counters (``send_window_state``,
``unacked_bytes``, through nanopy/transports/_stream.py); nothing of the socket
but the protocol-error note it is given.
"""

from __future__ import annotations

import errno
import logging
import threading
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from .. import platform
from ..core.errors import MessageTooLarge, RemoteProtocolError
from ..transports._base import CountsUnwritten, JudgesSilence, KernelSocketBacked
from ..transports._keepalive import stall_slack
from ..transports._stream import send_window_state, unacked_bytes

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..core.message import Pipe
    from ..transports._base import Connection

log = logging.getLogger("nanopy")


class Liveness:
    """How a :class:`~nanopy.pipe.driver.PipeDriver` ended, and its window guard
    (see the module docstring)."""

    def __init__(
        self,
        conn: Connection,
        lock: threading.Lock,
        name: str,
        pipe: Pipe,
        note_protocol_error: Callable[[Pipe, BaseException], None],
    ) -> None:
        self.conn = conn
        self.lock = lock  # the pipe's lock (``note_failure`` is judged once)
        self.name = name
        self.pipe = pipe
        self.note_protocol_error = note_protocol_error
        #: the peer stopped answering (counted by the socket's ``PipeLosses``)
        self.dead = False
        self._failure_noted = False
        self.in_write = False  # the writer task is inside write_all (the kernel may be full)
        self._guard_event: trio.Event | None = None  # wakes the window guard

    def note_failure(self, exc: BaseException) -> None:
        """Note how the pipe ended, once (a reading thread and the reader task may
        both meet the same stored error)."""
        with self.lock:
            if self._failure_noted:
                return
            self._failure_noted = True
        if isinstance(exc, (RemoteProtocolError, MessageTooLarge)):
            self.note_protocol_error(self.pipe, exc)
        elif isinstance(exc, OSError) and exc.errno == errno.ETIMEDOUT:
            # The kernel's keepalive or user timeout, or the ws PINGs, gave up on it.
            self.dead = True
            self._log_dead("the peer stopped answering", exc.strerror or str(exc))
        elif isinstance(exc, (EOFError, OSError)) and (blamed := silence_blamed(self.conn)):
            self.dead = True  # the peer gave up on us (a ZMTP TTL we announced)
            self._log_dead("the peer took us for dead and closed it", blamed)
        else:
            log.debug("%s: pipe %d closed: %s", self.name, self.pipe.id, exc)

    def _log_dead(self, what: str, why: str) -> None:
        """The one INFO line of a pipe ended for silence (docs/partitions.md)."""
        log.info("%s: pipe %d to %s: %s (%s); closing it", self.name, self.pipe.id,
                 self.pipe.remote_address or "?", what, why)

    # -- dead-peer detection beside a full send buffer -----------------------------------
    def write_started(self) -> None:
        """The writer task enters ``write_all``: the window guard watches it."""
        self.in_write = True
        event = self._guard_event
        if event is not None:
            self._guard_event = None
            event.set()

    def write_ended(self) -> None:
        """The writer task's ``write_all`` is over (done or failed)."""
        self.in_write = False

    def guard_for(self) -> Callable[[], Awaitable[None]] | None:
        """The guard task of a TCP connection with a user timeout (dead_peer_timeout), or None."""
        conn = self.conn
        if not isinstance(conn, KernelSocketBacked):
            return None
        sock = conn.kernel_socket()
        if not hasattr(sock, "getsockopt"):
            return None
        # None where the backend has no user timeout (then the kernel's rules stand:
        # nothing cuts off a live peer that is only slow to read)
        user_timeout = platform.user_timeout(sock)
        return partial(self._window_guard, sock, user_timeout) if user_timeout else None

    async def _window_guard(self, sock: Any, user_timeout: int) -> None:
        """Keep the TCP user timeout from cutting off a peer that is alive but not reading.

        Linux ends a connection whose data waits longer than the user timeout even
        when the peer answers every window probe, so a receiver that is only slow
        (its queue full: back-pressure) would lose its pipe and what its kernel held.
        While a write waits on a closed window, the user timeout is lifted and this
        guard judges instead: a window probe unanswered for the user timeout means a
        dead peer (ETIMEDOUT). The kernel backs its window probes off (up to 2
        minutes apart), so a peer that vanishes during a long stall is found later
        than one that vanishes while data flows. The timeout is put back as soon as
        data flows; the guard sleeps while no write waits.
        """
        limit = user_timeout / 1000
        interval = max(limit / 4, 0.25)
        lifted = False
        unanswered: float | None = None  # since when a window probe waits for its answer
        while True:
            if not self.in_write:
                if lifted:
                    platform.set_user_timeout(sock, user_timeout)
                    lifted = False
                event = self._guard_event = trio.Event()
                await event.wait()
                continue
            due = trio.current_time() + interval
            await trio.sleep(interval)
            if trio.current_time() - due > stall_slack(interval):
                unanswered = None  # we stood still, not the peer: the probes get a fresh grace
            state = send_window_state(sock) if self.in_write else (False, False)
            if state is None:
                await trio.sleep_forever()  # (no TCP_INFO: the kernel's rules stand)
            closed, probing = state
            if not closed:
                unanswered = None
                if lifted:
                    platform.set_user_timeout(sock, user_timeout)
                    lifted = False
                continue
            if not lifted:
                platform.set_user_timeout(sock, 0)
                lifted = True
            if not probing:
                unanswered = None
            elif unanswered is None:
                unanswered = trio.current_time()
            elif trio.current_time() - unanswered >= limit:
                raise TimeoutError(errno.ETIMEDOUT, f"window probes unanswered for {limit:g} s")


def kernel_unacked(conn: Any) -> int | None:
    """Bytes the connection's kernel socket holds unacknowledged (None: unknown)."""
    return unacked_bytes(conn.kernel_socket()) if isinstance(conn, KernelSocketBacked) else None


def silence_blamed(conn: Any) -> str | None:
    """Why the peer ended ``conn`` for our own silence, if it did (JudgesSilence)."""
    return conn.silence_blamed() if isinstance(conn, JudgesSilence) else None


def write_shortfall(channel: Any) -> int:
    """Bytes of the chunk whose ``write_all`` failed that never reached the kernel,
    where the connection counts them; 0 where it does not (a TLS stream): its
    messages are then taken as sent, never sent twice."""
    left = channel.unwritten_bytes() if isinstance(channel, CountsUnwritten) else None
    return 0 if left is None else int(left)


def unwritten(channel: Any, batch: list[bytes], left: int) -> list[bytes]:
    """The messages of ``batch`` whose frames lie wholly within the last ``left``
    bytes of its chunk (the part never written), in order. Only a failing pipe pays
    for this: each message is framed once more to learn its size."""
    if left <= 0 or not batch:
        return []
    sizes = [len(channel.frame([p])) for p in batch]
    if sum(sizes) > left:
        total = 0
        first = len(batch)
        for i in range(len(batch) - 1, -1, -1):
            total += sizes[i]
            if total > left:
                break
            first = i
        return batch[first:]
    return list(batch)
