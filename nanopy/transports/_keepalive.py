"""Dead-peer detection by PINGs, for connections whose protocol has a PING of its
own (WebSocket, ZMTP 3.1): the ``keepalive`` task a pipe runs beside its reader
and writer (docs/partitions.md).

The connection tells :class:`PeerWatch` when it last heard the peer (any bytes
count) and how to queue a PING; the watch PINGs a peer silent for half of
``dead_peer_timeout`` (again each half while the silence lasts) and fails the
pipe with ETIMEDOUT -- which the pipe counts as a dead peer -- once the peer was
silent for all of it, or for the shorter time the peer asked for (a ZMTP PING's
TTL). While the pipe is ``busy`` -- it reads nothing because its queue is full,
or waits to write -- silence proves nothing and is not counted.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable

import trio

#: A peer is closed for a PING flood when our PONG has waited unwritten for
#: ``PONG_PATIENCE`` seconds (our writer is stuck: the peer leaves what we send
#: unread) and more than ``MAX_UNANSWERED_PINGS`` PINGs came meanwhile. PINGs parsed
#: from reads while our PONG is merely not written *yet* are no evidence: a reader
#: bursting PINGs gets coalesced PONGs and is never closed for them.
MAX_UNANSWERED_PINGS = 256
PONG_PATIENCE = 1.0


class PongDebt:
    """The PINGs a peer sent while our last PONG waited unwritten (one connection).

    ``owe(joined)`` is told, for each PING answered, whether its PONG joined one
    still unwritten; it returns True once that went on for ``PONG_PATIENCE``
    seconds over more than ``MAX_UNANSWERED_PINGS`` PINGs (a flood: close the
    peer). :attr:`unanswered` and :attr:`since` say how many and since when
    (``time.monotonic()``: the reader may be a user thread).
    """

    __slots__ = ("since", "unanswered")

    def __init__(self) -> None:
        self.unanswered = 0
        self.since = 0.0

    def owe(self, joined: bool, count: int = 1) -> bool:
        now = time.monotonic()
        if not joined:  # the previous PONG went out: a fresh wait starts
            self.unanswered, self.since = 0, now
            return False
        self.unanswered += count
        return self.unanswered > MAX_UNANSWERED_PINGS and now - self.since >= PONG_PATIENCE

    def saturated(self) -> bool:
        """More PONGs wait than a reader could need: answer no more until one is written."""
        return self.unanswered > MAX_UNANSWERED_PINGS


class PeerWatch:
    """One connection's dead-peer check (see the module docstring).

    ``heard()`` returns when the peer was last heard (``time.monotonic()``, written
    by whoever reads the connection); ``ping()`` queues a PING (engine thread);
    ``what`` names the traffic in the error (``"WebSocket frame"``).
    ``ping_while_busy``: keep PINGing every half timeout while the pipe is busy, so
    a peer that times *us* out (ZMTP's TTL) keeps hearing from a pipe that only
    stopped reading.
    """

    def __init__(
        self,
        timeout: float,
        heard: Callable[[], float],
        ping: Callable[[], None],
        what: str,
        remote_address: str,
        *,
        ping_while_busy: bool = False,
    ) -> None:
        self.timeout = timeout
        self._heard = heard
        self._ping = ping
        self._what = what
        self._remote = remote_address
        self._ping_while_busy = ping_while_busy
        self._peer_limit: float | None = None  # the silence the peer asked us to allow at most
        self._token: trio.lowlevel.TrioToken | None = None
        self._wake: trio.Event | None = None

    def peer_limit(self, seconds: float | None) -> None:
        """The peer asks to be given up on after ``seconds`` of silence (None: no
        such wish); any thread. A shorter limit than the one in force wakes the watch."""
        shorter = seconds is not None and seconds < self.limit()
        self._peer_limit = seconds
        token, wake = self._token, self._wake
        if shorter and token is not None and wake is not None:
            try:
                token.run_sync_soon(wake.set)
            except trio.RunFinishedError:  # the engine is gone: so is the pipe
                pass

    def limit(self) -> float:
        """The silence after which the peer is taken for dead."""
        peer = self._peer_limit
        return self.timeout if peer is None else min(self.timeout, peer)

    async def run(self, busy: Callable[[], bool]) -> None:
        """Watch until the peer is dead (raises TimeoutError with ETIMEDOUT)."""
        self._token = trio.lowlevel.current_trio_token()
        quiet = self.timeout / 2
        pinged = idle_since = time.monotonic()
        while True:
            self._wake = wake = trio.Event()  # (before reading the limit: a change wakes this round)
            now = time.monotonic()
            if busy():
                idle_since = now
                if self._ping_while_busy and now - pinged >= quiet:
                    pinged = now
                    self._ping()
            limit = self.limit()
            silent = now - max(self._heard(), idle_since)
            if silent >= limit:
                raise TimeoutError(errno.ETIMEDOUT, f"no {self._what} from {self._remote} in {limit:g} s "
                                   "(PINGs unanswered)")
            if silent >= quiet and now - pinged >= quiet:
                pinged = now
                self._ping()
            # Until the silence reaches half the timeout (the first PING), the next
            # PING, or the limit, whichever comes first.
            wait = quiet - silent if silent < quiet else min(pinged + quiet - now, quiet)
            with trio.move_on_after(max(min(wait, limit - silent), 0.01)):
                await wake.wait()
