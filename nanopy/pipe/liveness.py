"""A pipe's end: dead-peer detection beside a full send buffer, and what was lost.

Owns: the TCP window guard (a task that keeps the TCP user timeout from cutting
off a peer that is alive but not reading, and finds a dead one by its unanswered
window probes), ``take_unwritten`` (what an ending pipe hands back to the socket:
see nanopy/driver/endings.py), and the helpers that count what a pipe that ended
never delivered (``kernel_unacked``, ``write_shortfall``, ``unwritten``: see
``PipeLosses`` in nanopy/core/stats.py).

May call: the connection's kernel socket (``kernel_socket``), nanopy.platform's
``user_timeout``/``set_user_timeout`` and its counters (``send_window_state``,
``unacked_bytes``, through nanopy/transports/_stream.py); nothing of the socket.
"""

from __future__ import annotations

import errno
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from .. import platform
from ..transports._base import CountsUnwritten, JudgesSilence, KernelSocketBacked
from ..transports._keepalive import stall_slack
from ..transports._stream import send_window_state, unacked_bytes

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..transports._base import Connection


class PipeLiveness:
    """Dead-peer detection of :class:`~nanopy.pipe.driver.PipeDriver` (see the module docstring)."""

    conn: Connection
    paused: bool
    _in_write: bool  # the writer task is inside write_all (the kernel may be full)
    _guard_event: trio.Event | None  # wakes the window guard
    # The write side (nanopy/pipe/driver.py), read by take_unwritten.
    channel: Any
    outbox: list[bytes]
    tail: Any
    _tail_batch: list[bytes]
    control: bytes | None
    orphans: list[bytes]
    #: the socket took this pipe out of its load balancing (set under the socket's
    #: lock by SocketDriver.pipe_ending, once)
    withdrawn = False

    def take_unwritten(self) -> list[bytes]:
        """Take everything this pipe will never write, in order (its lock held, no
        write under way): what a failed write left (``orphans``), the whole
        messages of a chunk's unwritten rest, then the queue. Leaves nothing queued."""
        out = self.orphans
        self.orphans = []
        if self.tail is not None:
            out += unwritten(self.channel, self._tail_batch, len(self.tail))
        out += self.outbox
        self.outbox = []
        self.tail = self.control = None
        return out

    # -- dead-peer detection beside a full send buffer -----------------------------------
    def _busy(self) -> bool:
        """Silence from the peer proves nothing now: we read nothing (a full queue) or
        our data waits for the peer's window (the window guard judges that case)."""
        return self.paused or self._in_write

    def _window_guard_for(self) -> Callable[[], Awaitable[None]] | None:
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
            if not self._in_write:
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
            state = send_window_state(sock) if self._in_write else (False, False)
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
