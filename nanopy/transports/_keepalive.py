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

Silence that was our own is not the peer's either: when the watch wakes later than
it asked to by more than :func:`stall_slack` (the process was stopped, a GC pause,
a C call holding the GIL), what the peer sent meanwhile may still wait unread and
our PINGs did not go out, so the peer gets a fresh grace period and a PING at once
(:attr:`PeerWatch.stalls`). Bytes from the peer waiting unread in our kernel are a
sign of life too (``unread``).

A connection that announced a TTL (ZMTP) also passes ``sent`` (when it last wrote
to the peer): the watch then PINGs whenever *we* wrote nothing for half the
timeout, as libzmq does every ``ZMQ_HEARTBEAT_IVL``, so the peer hears from us
well within the TTL we asked it to keep.
"""

from __future__ import annotations

import errno
import logging
import math
import time
from collections.abc import Callable

import trio

log = logging.getLogger("nanopy")

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


#: The least lateness of the watch's timer taken for a stall of our own process
#: (see :func:`stall_slack`).
STALL_MIN = 0.1


def stall_slack(interval: float) -> float:
    """How much later than asked the timer of a watch that PINGs every ``interval``
    seconds may fire before the watch takes it that our own process stood still: a
    tenth of the interval, at least ``STALL_MIN`` (a busy scheduler is later by
    milliseconds, a stopped process or a long GC pause by much more)."""
    return max(STALL_MIN, interval / 10)


class PeerWatch:
    """One connection's dead-peer check (see the module docstring).

    ``heard()`` returns when the peer was last heard (``time.monotonic()``, written
    by whoever reads the connection); ``ping()`` queues a PING (engine thread);
    ``what`` names the traffic in the error (``"WebSocket frame"``).
    ``sent()``: when we last wrote to the peer (``time.monotonic()``); given, the
    watch also PINGs whenever we wrote nothing for half the timeout (a peer that
    times *us* out by the TTL we announced keeps hearing from a pipe that only
    receives, or stopped reading). ``unread()``: whether bytes from the peer wait
    unread in our kernel (a sign of life our reader has not got to yet).

    Attributes:
        stalls: how often the watch found our own process had stood still.
        longest_stall: the longest such stall, in seconds (at least; the watch
            sees only the part after its timer was due).
    """

    def __init__(
        self,
        timeout: float,
        heard: Callable[[], float],
        ping: Callable[[], None],
        what: str,
        remote_address: str,
        *,
        sent: Callable[[], float] | None = None,
        unread: Callable[[], bool] | None = None,
    ) -> None:
        self.timeout = timeout
        self._heard = heard
        self._ping = ping
        self._what = what
        self._remote = remote_address
        self._sent = sent
        self._unread = unread
        self._peer_limit: float | None = None  # the silence the peer asked us to allow at most
        self._token: trio.lowlevel.TrioToken | None = None
        self._wake: trio.Event | None = None
        self.stalls = 0
        self.longest_stall = 0.0
        self._due = math.inf  # when the watch's timer is to fire (time.monotonic())
        self._slack = stall_slack(timeout / 2)

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

    def _why(self, limit: float) -> str:
        asked = " (the peer's PING TTL)" if limit < self.timeout else ""
        return f"no {self._what} from {self._remote} in {limit:g} s{asked} (PINGs unanswered)"

    def stalled_for(self) -> float:
        """The longest stall of our own process seen so far, in seconds (0: none),
        counting one under way that the watch has not woken up to yet (any thread)."""
        late = time.monotonic() - self._due
        return max(self.longest_stall, late if late > self._slack else 0.0)

    def _stalled(self, late: float) -> None:
        self.stalls += 1
        self.longest_stall = max(self.longest_stall, late)
        log.debug("dead-peer watch of %s: our process stood still for %.2f s (at least); "
                  "the peer gets a fresh grace period", self._remote, late)

    async def run(self, busy: Callable[[], bool]) -> None:
        """Watch until the peer is dead (raises TimeoutError with ETIMEDOUT)."""
        self._token = trio.lowlevel.current_trio_token()
        quiet = self.timeout / 2
        slack = self._slack
        sent = self._sent
        pinged = idle_since = time.monotonic()
        due = math.inf  # when the timer below was asked to fire
        while True:
            self._wake = wake = trio.Event()  # (before reading the limit: a change wakes this round)
            now = time.monotonic()
            stalled = now - due > slack
            if stalled:
                # Our own process stood still, not the peer: what it sent meanwhile
                # may wait unread, and our PINGs did not go out. A fresh grace
                # period, and a PING at once (it tells the peer we are back).
                self._stalled(now - due)
                idle_since = now
            # (only now: until the stall is counted, stalled_for() reads it from _due)
            self._due = math.inf
            if busy():
                idle_since = now
            limit = self.limit()
            silent = now - max(self._heard(), idle_since)
            if silent >= limit and self._unread is not None and self._unread():
                idle_since, silent = now, 0.0  # its bytes wait for our reader: it spoke
            if silent >= limit:
                raise TimeoutError(errno.ETIMEDOUT, self._why(limit))
            ours = now - max(sent(), pinged) if sent is not None else 0.0
            if stalled or (now - pinged >= quiet and (silent >= quiet or ours >= quiet)):
                pinged = now
                self._ping()
                ours = 0.0
            # Until the next PING is due (the peer's silence or ours reaches half the
            # timeout, at most one PING per half), or the limit, whichever comes first.
            ping_at = max(pinged + quiet, now + quiet - max(silent, ours))
            wait = max(min(ping_at - now, limit - silent), 0.01)
            due = self._due = now + wait
            with trio.move_on_after(wait):
                await wake.wait()
            if wake.is_set():
                due = math.inf  # (woken early on purpose: not late)
