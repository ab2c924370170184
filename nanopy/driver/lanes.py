"""Send lanes: sends that skip the core while it has nothing to decide.

Owns: the sole-pipe lane (the round's ``lane``, written here only, read by
``Socket.send``: the pipe holding credit taken with ``Core.take_sole``), the
fan-out lane (``_fan_*``: credit of every pipe taken with ``Core.take_all`` and
the bodies sent on it), the socket's flush round (``flush_later``) and the send
fast path ``try_send``.

When a core whose send just spends a credit (PUSH, PAIR v0, PUB) has one pipe,
a send round takes several of its credits at once and hands them to that pipe
(``PipeHandle.grant_lane``); sends then spend them in ``transmit`` under the
pipe's lock alone, with no socket round, until they run out. A pipe coming or
going, or close, gives unspent lane credit back to the core.

A publisher in a burst to several pipes has the *fan-out lane*: a send round
takes the same number of credits from every pipe at once, and the sends that
follow only append the body to one list (``_fan_out``) in a short round that
never calls the core. A full list -- or the socket's flush round, within
``MAX_HOLD`` -- is queued on every member pipe under the socket lock
(``PipeHandle.queue_batch``, so batches reach every pipe in the order they were
taken) and then written (``flush_queued``: one framing shared by all stream
pipes). What the lane has taken always reaches the pipes before anything a later
round sends them.

May call: the round (:class:`~nanopy.driver.round.Round`), the core's ``take_sole``/
``take_all``/``send``/``pipe_credit`` inside a round, the pipes as ``PipeHandle``s
(nanopy/_seam.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic

from .._seam import CALLER_BATCH_MAX, CALLER_BYTES, MAX_HOLD, PipeT, wait_out_burst
from ..core.base import TRANSMIT
from ..core.errors import WouldBlock
from .round import FANOUT_GAP

if TYPE_CHECKING:
    from .._seam import Framed
    from .round import Round

# The most credits one send round hands to the lane (see the docstring).
LANE_MAX = 256
# The fan-out lane takes at least this many credits of every pipe, else none.
FAN_MIN = 16


class SendLanes(Generic[PipeT]):
    """The send lanes and the send fast path (see the module docstring)."""

    def __init__(self, driver: Round[PipeT]) -> None:
        self.round = driver  # the lock, the core, the counters and the round's calls
        core = driver.core
        self._lanes = core.send_lane
        # The fan-out lane (see the module docstring), all under the socket lock.
        self._fans = core.fan_lane
        self._fan_credit = 0  # sends the lane may still take
        self._fan_pipes: list[PipeT] = []  # its member pipes
        self._fan_out: list[bytes] = []  # bodies taken, not yet handed to the pipes
        self._fan_bytes = 0
        # Pipes holding what a fan-out burst queued, written by one flush round.
        self._flush_lock = threading.Lock()
        self._flush_pipes: list[PipeT] = []
        self._flush_armed = False
        self._flush_due = 0.0  # when the armed round's oldest payload has waited MAX_HOLD
        # The condition of the send wait queue: a core without lanes is asked alone.
        self.send_ready: Callable[[], bool] = self.writable if self._lanes or self._fans else core.can_send

    def forked(self) -> None:
        """In a forked child (``SocketDriver.forked``): a new flush lock, no lane members."""
        self._flush_lock = threading.Lock()
        self._fan_pipes, self._fan_out, self._flush_pipes = [], [], []

    def revoke_for(self, pid: int) -> None:
        """Pipe ``pid`` is going: close a lane it is in (lock held)."""
        r = self.round
        lane = r.lane
        if (lane is not None and lane.pid == pid) or self._fan_pipes:
            self.revoke_lane()

    def sent_counts(self) -> tuple[int, int]:
        """(messages, bytes) sent: lane credit is counted when granted, so what the
        lane has not spent is not sent yet (but for the sends whose credit it kept,
        ``lane_kept``), while its bytes are counted as it goes."""
        r = self.round
        with r.lock:
            lane = r.lane
            if lane is None:
                return r.sent, r.bytes_sent
            return r.sent - lane.lane_credit + lane.lane_kept, r.bytes_sent + lane.lane_bytes

    def queued_out(self) -> int:
        """Messages sent and not yet written, on every pipe (one look at each)."""
        r = self.round
        with r.lock:
            fan = len(self._fan_out) * len(self._fan_pipes)
        return fan + sum(pipe.queued_out() for pipe in r.pipe_drivers())

    def writable(self) -> bool:
        """Whether a send would go out now (lock held)."""
        r = self.round
        lane = r.lane
        return (lane is not None and lane.lane_credit > 0) or self._fan_credit > 0 or r.core.can_send()

    def revoke_lane(self) -> None:
        """Take unspent lane credit back into the core (lock held)."""
        r = self.round
        if self._fan_pipes:
            self._revoke_fan()
        pipe = r.lane
        if pipe is None:
            return
        r.lane = None
        n, spent_bytes, kept = pipe.revoke_lane()
        r.sent -= n - kept  # (kept: sent on credit the lane got back, see PipeDriver.lane_kept)
        r.bytes_sent += spent_bytes
        if n:
            r.core.pipe_credit(pipe.pid, n)

    def _grant_fan(self) -> None:
        """Open the fan-out lane with the same credit of every pipe (lock held)."""
        r = self.round
        grant = r.core.take_all(LANE_MAX, FAN_MIN)
        if grant is None:
            return
        pids, n = grant
        members = [r.pipes.get(pid) for pid in pids]
        if None in members:  # (not all live pipes: leave the credit where it was)
            for pid in pids:
                r.core.pipe_credit(pid, n)
            return
        self._fan_pipes = members  # type: ignore[assignment]
        self._fan_credit = n

    def _hand_out_fan(self, kick: bool = False) -> list[PipeT]:
        """Queue the fan-out lane's bodies on its member pipes and empty the list
        (lock held: batches reach every pipe in the order they were taken).
        Returns the members, for :meth:`_write_fan` once the lock is released
        (``kick``: their writer tasks write instead)."""
        batch, self._fan_out = self._fan_out, []
        self._fan_bytes = 0
        members = self._fan_pipes
        if batch:
            for pipe in members:
                pipe.queue_batch(batch, kick)
        return members

    def _revoke_fan(self, kick: bool = True) -> list[PipeT]:
        """Close the fan-out lane (lock held): what it took is queued on its
        pipes, unspent credit goes back to the core. Returns the members, as
        :meth:`_hand_out_fan` (``kick=False``: the caller writes them)."""
        r = self.round
        members = self._hand_out_fan(kick)
        n, self._fan_credit = self._fan_credit, 0
        self._fan_pipes = []
        if n:
            for pipe in members:
                r.core.pipe_credit(pipe.pid, n)
        return members

    def _write_fan(self, members: list[PipeT]) -> None:
        """Write what the fan-out lane queued on each member (lock not held); a
        pipe already being written is left to that writer."""
        r = self.round
        framed: Framed = {}  # framed once for all stream pipes
        for pipe in members:
            done = pipe.flush_queued(framed)
            if done:
                r.credit(pipe.pid, done)

    def _grant_lane(self) -> None:
        """Hand the sole pipe's credit to the lane (lock held)."""
        r = self.round
        grant = r.core.take_sole(LANE_MAX)
        if grant is None:
            return
        pid, n = grant
        pipe = r.pipes.get(pid)
        if pipe is None:  # (not a live pipe: leave the credit where it was)
            r.core.pipe_credit(pid, n)
            return
        if r.lane is not pipe:
            self.revoke_lane()
            r.lane = pipe
        pipe.grant_lane(n)
        r.sent += n

    def flush_later(self, pipe: PipeT | None) -> None:
        """``pipe`` queued a fan-out burst's first payload (any thread): the socket's
        flush round will write it, unless a sender writes the outbox first. None:
        the fan-out lane took its first body; the round hands the lane's bodies out.

        One engine task per burst flushes every such pipe, instead of each pipe
        waking its own writer task (a cross-thread wake-up and a GIL hand-over
        each, per pipe).
        """
        r = self.round
        with self._flush_lock:
            if pipe is not None:
                self._flush_pipes.append(pipe)
            if self._flush_armed:
                return
            self._flush_armed = True
            first_at = pipe.first_at if pipe is not None else r._engine().now()
            self._flush_due = first_at + MAX_HOLD  # the round's oldest payload
        r._engine().spawn(self._flush_round)

    async def _flush_round(self) -> None:
        """Wait while the burst goes on (:func:`~nanopy._seam.wait_out_burst`: no
        payload waits past ``MAX_HOLD``), then write what it left on each pipe.

        A pipe whose channel is busy, or cannot take the whole chunk, is left to
        its own writer task.
        """
        r = self.round
        await wait_out_burst(lambda: r.sent, lambda: self._flush_due, r._engine().now)
        with self._flush_lock:
            self._flush_armed = False  # (before taking the list: a later pipe arms anew)
            pipes, self._flush_pipes = self._flush_pipes, []
        if self._fan_out:
            with r.lock:
                members = self._hand_out_fan()
            self._write_fan(members)
        framed: Framed = {}  # a batch equal on many pipes is framed once
        for pipe in pipes:
            done = pipe.flush_queued(framed)
            if done:
                r.credit(pipe.pid, done)

    # ``feed`` written out for the two hottest calls in nanopy: one lock round,
    # acquire/release rather than ``with`` (measurably cheaper), no closures.
    def try_send(self, body: bytes, header: bytes) -> bool:
        """Send if the core can take it now; False if it would block."""
        r = self.round
        lane = r.lane
        if lane is not None:  # (closed: no lane, see close_core; the lock checks below)
            done = lane.transmit(body, None, None, True)  # (positional: cheaper)
            if done >= 0:
                if done:
                    r.credit(lane.pid, done)
                return True
        members: list[PipeT] | None = None  # pipes the fan-out lane queued a batch on
        arm = blocked = False
        action = rest = None
        lock = r.lock
        lock.acquire()
        try:
            if r.closed:
                raise r.closed_error()
            if self._fan_credit:
                # The fan-out lane: every member pipe takes this body, as the core
                # would have decided; it goes out with the lane's next batch.
                self._fan_credit -= 1
                fan = self._fan_out
                fan.append(body)
                size = len(body)
                r.sent += 1
                r.bytes_sent += size
                self._fan_bytes += size
                if len(fan) >= CALLER_BATCH_MAX or self._fan_bytes >= CALLER_BYTES:
                    members = self._hand_out_fan()
                elif len(fan) == 1:
                    arm = True  # the first: the flush round must come
                else:
                    return True
            else:
                if self._fan_pipes:  # the lane ran dry: close it, its bodies go first
                    members = self._revoke_fan(kick=False)
                if r._due:
                    r._fold_due()
                core = r.core
                try:
                    core.send(body, header)
                except WouldBlock:
                    blocked = True
                else:
                    r.sent += 1
                    r.bytes_sent += len(body)
                    actions = core.actions
                    if (
                        len(actions) == 1
                        and actions[0][0] is TRANSMIT
                        and not (r.send_q.waiters or r.recv_q.waiters or r.watchers)
                    ):
                        # The usual outcome (one TRANSMIT, nobody to wake) taken here
                        # rather than through _drain() and execute().
                        action = actions.pop()
                        if self._lanes:
                            self._grant_lane()
                    else:
                        if self._fans and len(actions) > 1 and time.monotonic() - r.fanout_end < FANOUT_GAP:
                            self._grant_fan()  # a burst of fan-outs: later sends take the lane
                        rest = r._drain()
        finally:
            lock.release()
        if members:
            self._write_fan(members)
        elif arm:
            self.flush_later(None)
        if blocked:
            return False
        if action is not None:
            pid = action[1]
            driver = r.pipes.get(pid)
            if driver is None:
                r.hand_back([action[2]])  # (removed since this round)
                return True
            done = driver.transmit(action[2])
            if done:
                if done > 0:
                    r.credit(pid, done)
                else:
                    r.hand_back([action[2]])  # (closed since this round)
        elif rest:
            r.execute(rest)  # (a PUB's send in a burst: every pipe queues it)
        return True

    # -- batch send (Socket.send_batch) ---------------------------------------------------
    def send_batch(self, bodies: list[bytes], headers: list[bytes] | None, start: int) -> int:
        """One round for many sends: hand the core ``bodies[start:]`` (with their
        ``headers``; None: all empty) until it would block, then write what each
        pipe got as one chunk.
        Returns the index of the first item not sent (``start``: no room now); a
        distributing core (PUB, BUS) bounds a round by its ``batch_room``.

        The lanes are closed first, as a waiting sender's attempt closes them: the
        core then holds every credit and decides each message as ``send`` would."""
        r = self.round
        members: list[PipeT] | None = None
        sole: tuple[PipeT, list[bytes]] | None = None
        lock = r.lock
        lock.acquire()
        try:
            if r.closed:
                raise r.closed_error()
            if self._fan_pipes:  # (what the fan-out lane took goes out first)
                members = self._revoke_fan(kick=False)
            self.revoke_lane()
            if r._due:
                r._fold_due()
            core = r.core
            send = core.send
            i, end, size = start, len(bodies), 0
            room = core.batch_room()
            if room is not None:
                end = min(end, start + room)
            if self._lanes and not core.holding:
                # A send-lane core with one pipe: its credits taken at once are what
                # as many core.send calls would have decided (as the sole-pipe lane).
                grant = core.take_sole(end - i)
                if grant is not None:
                    pipe = r.pipes.get(grant[0])
                    if pipe is None:  # (not a live pipe: leave the credit where it was)
                        core.pipe_credit(*grant)
                    else:
                        taken = bodies[i : i + grant[1]]
                        sole = (pipe, taken)
                        size = sum(map(len, taken))
                        i += grant[1]
            try:
                while i < end:
                    body = bodies[i]
                    send(body, b"" if headers is None else headers[i])
                    size += len(body)
                    i += 1
            except WouldBlock:
                pass
            finally:  # (a ProtocolError part-way: what went before is counted all the same)
                r.sent += i - start
                r.bytes_sent += size
                actions = r._drain()
        finally:
            lock.release()
        if members:
            self._write_fan(members)
        if actions or sole:
            self._execute_batch(actions or [], sole)
        return i

    def _execute_batch(self, actions: list[Any], sole: tuple[PipeT, list[bytes]] | None) -> None:
        """Carry out a batch round's actions: each pipe's TRANSMITs (``sole``: what
        the round gave the only pipe without the core) are queued in one go and
        written as one chunk (framed once for pipes of equal framing); the other
        actions then run as usual."""
        r = self.round
        per_pipe: dict[int, list[bytes]] = {} if sole is None else {sole[0].pid: sole[1]}
        others = []
        for action in actions:
            if action[0] is TRANSMIT:
                batch = per_pipe.get(action[1])
                if batch is None:
                    batch = per_pipe[action[1]] = []
                batch.append(action[2])
            else:
                others.append(action)
        framed: Framed = {}
        for pid, batch in per_pipe.items():
            pipe = r.pipes.get(pid)
            if pipe is None or not pipe.queue_batch(batch, False):
                r.hand_back(batch)  # (the pipe went since the round chose it)
                continue
            done = pipe.flush_queued(framed)
            if done:
                r.credit(pid, done)
        if len(per_pipe) > 1:
            r.fanout_end = time.monotonic()  # (a PUB's batch: what follows at once is a burst)
        if others:
            r.execute(others)

    def room_attempt(self) -> None:
        """The attempt of a batch sender waiting for room (lock held): WouldBlock
        until a send would go out; it sends nothing itself."""
        if not self.writable():
            raise WouldBlock

    # -- attempts: an operation that completes or raises WouldBlock -------------------------
    def send_attempt(self, body: bytes, header: bytes = b"") -> Callable[[], None]:
        r = self.round
        core = r.core

        def attempt() -> None:
            # A sender that has to wait: lane credit granted since its try_send
            # goes back into the core, where this attempt (and every waiter) sees it.
            self.revoke_lane()
            core.send(body, header)
            r.sent += 1
            r.bytes_sent += len(body)

        return attempt
