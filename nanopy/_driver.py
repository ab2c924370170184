"""The socket driver: the one owner of a socket's lock, core, waiters and actions.

Every input to a protocol core -- a user send or receive, bytes from a pipe,
credit coming back, a timer, a pipe coming or going -- takes the same round:

1. take the socket lock; fold in credit returned since the last round;
2. feed the core;
3. drain the core's actions: readiness (``READY``) wakes the waiters of that
   request or survey at once, and one waiter of each condition that now holds
   is woken;
4. release the lock, then carry out the remaining actions (``TRANSMIT``,
   ``CLOSE_PIPE``, ``RESUME_READ``, timers) from a local work queue.

Carrying out a TRANSMIT may give credit back (the pipe wrote the payload at
once). That credit goes into a queue the next round folds in, so an idle-pipe
send costs one lock round; when somebody could be waiting for that credit right
now (a parked sender, a core that sends queued work on credit), the executing
thread runs the round itself and appends what it yields to its work queue --
never by recursion, however many queued requests one credit releases.

A receive takes a *run* when it can: several bodies of the one pipe with any
queued, in order, counted as received in that round (``FairQueue.take_run``).
The rest wait in ``run``, which receivers pop without the lock (a deque's
``popleft`` is atomic) until it is empty; every locked receive serves it first,
so order holds, and readiness, ``recv_msg`` and close see it too.

Sending has the mirror image, the *lane*: when a core whose send just spends a
credit (PUSH, PAIR v0, PUB) has one pipe, a send round takes several of its
credits at once (``Core.take_sole``) and hands them to that pipe
(``PipeDriver.lane_credit``); sends then spend them in ``transmit`` under the
pipe's lock alone, with no socket round, until they run out. A pipe coming or
going, or close, gives unspent lane credit back to the core.

A publisher in a burst to several pipes has a lane of its own, the *fan-out
lane*: a send round takes the same number of credits from every pipe at once
(``Core.take_all``), and the sends that follow only append the body to one list
(``_fan_out``) in a short round that never calls the core. A full list -- or the
socket's flush round, within ``MAX_HOLD`` -- is queued on every member pipe under
the socket lock (``PipeDriver.queue_batch``, so batches reach every pipe in the
order they were taken) and then written (``flush_queued``: one framing shared by
all stream pipes). What the lane has taken always reaches the pipes before
anything a later round sends them.

Only this module touches ``core`` and ``lock``; the socket, the REQ/SURVEYOR
conveniences, devices and Spark go through the methods here.
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import threading
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import sniffio
import trio

from ._callers import CallerWaitQueue
from ._core import (
    ARM_TIMER,
    CANCEL_TIMER,
    CLOSE_PIPE,
    READY,
    READY_CALLER,
    RESUME_READ,
    TRANSMIT,
    Action,
    Core,
    Distributing,
    LoadBalancing,
    PipeInfo,
)
from ._drops import DEAD_PIPE
from ._errors import Closed, MessageTooLarge, RemoteProtocolError, Timeout, WouldBlock
from ._message import Message
from ._pipe import CALLER_BATCH_MAX, CALLER_BYTES, MAX_HOLD, handed_over, queue_fan_out, wait_out_burst
from ._timers import Timers
from ._waiters import ThreadWaiter, WaitQueue, async_waiter

if TYPE_CHECKING:
    from ._engine import Engine
    from ._pipe import PipeDriver

log = logging.getLogger("nanopy")

T = TypeVar("T")

# A round that transmits within this time of the end of a round that wrote to
# several pipes (a PUB's fan-out) is a burst: its payloads are queued and batched.
# Left to each pipe's own judgement (nanopy._pipe.DIRECT_IDLE, measured from the
# start of its last write), a fan-out that writes each of many pipes directly
# takes long enough to make every pipe look idle again at the next send, and
# never batches. A lone pipe keeps its own judgement (ping-pong latency).
FANOUT_GAP = 50e-6

# The most bodies one receive takes out of the core at once (see the docstring):
# the lock round is paid once per run, not per message.
RUN_MAX = 256
# The most credits one send round hands to the lane (see the docstring).
LANE_MAX = 256
# The fan-out lane takes at least this many credits of every pipe, else none.
FAN_MIN = 16


class _Blocked:
    """The marker of an attempt that would block."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "BLOCKED"


BLOCKED = _Blocked()
# What one direct read found besides messages (see SocketDriver._direct_read).
_NOTHING = object()
_PARTIAL = object()
_FAILED = object()


def _credit_is_bookkeeping(core: Core) -> bool:
    """Whether ``core.pipe_credit`` only records credit (emits nothing, wakes nobody
    but senders), so returned credit may wait for the next round."""
    declared = getattr(core, "credit_only", None)
    if declared is not None:
        return bool(declared)
    method = type(core).pipe_credit
    return method is LoadBalancing.pipe_credit or method is Distributing.pipe_credit


class SocketDriver:
    """Owns one socket's protocol core and everything that touches it.

    Attributes:
        lock: the socket lock (held only inside a round).
        core: the Sans-I/O protocol core.
        closed: set once by :meth:`close_core`.
        pipes: live pipe drivers by pipe id.
        send_q, recv_q: waiters for ``core.can_send()`` / ``core.can_recv()``.
        id_queues: waiters of one request or survey id (woken by READY actions).
    """

    def __init__(self, core: Core, name: Callable[[], str], engine: Callable[[], Engine]) -> None:
        self.lock = threading.Lock()
        self.core = core
        self.closed = False
        self.fork_closed = False
        self._name = name
        self._engine = engine
        self.pipes: dict[int, PipeDriver] = {}
        self._lanes = core.send_lane
        self.lane: PipeDriver | None = None  # the sole pipe holding lane credit
        # The fan-out lane (see the module docstring), all under ``lock``.
        self._fans = core.fan_lane
        self._fan_credit = 0  # sends the lane may still take
        self._fan_pipes: list[PipeDriver] = []  # its member pipes
        self._fan_out: list[bytes] = []  # bodies taken, not yet handed to the pipes
        self._fan_bytes = 0
        self.send_q = WaitQueue(self.writable if self._lanes or self._fans else core.can_send)
        # Per-caller classic calls: a cooked REQ's recv() waits for *its caller's*
        # reply, so its waiters are keyed by caller (nanopy._callers).
        self.caller_q = CallerWaitQueue() if core.per_caller_recv else None
        # Runs: cores whose receive is a plain ordered pop of bodies (body_queue).
        body_queue = self._body_queue = core.body_queue
        self.run: deque[bytes] = body_queue.run if body_queue is not None else deque()
        self.run_token: Any = None  # the pipe token of the bodies in ``run`` (recv_msg)
        readable = self.readable if body_queue is not None else core.can_recv
        self.recv_q: WaitQueue = self.caller_q or WaitQueue(readable)  # type: ignore[assignment]
        self.queues: list[WaitQueue] = [self.send_q, self.recv_q]
        self.watchers: list[Any] = []  # blocked polls, woken after any change (nanopy._poller)
        self.id_queues: dict[int, WaitQueue] = {}
        self.timers: Timers | None = None
        # Starts an engine task in the socket's task tree (set by the Socket).
        self.spawn_task: Callable[..., None] | None = None
        self._wake_fd_box = [-1]  # eventfd waking a thread that reads a pipe directly
        self._direct_users = 0  # threads and tasks inside a direct receive
        self._epoll_cache: tuple[int, Any] | None = None  # (pid, epoll) of the direct reader
        self._due: deque[tuple[int, int]] = deque()
        self._lazy_credit = _credit_is_bookkeeping(core)
        self._relazy = False  # _lazy_credit is off while the core holds requeued payloads
        self.fanout_end = 0.0  # when the last round that wrote to several pipes ended
        # Pipes holding what a fan-out burst queued, written by one flush round.
        self._flush_lock = threading.Lock()
        self._flush_pipes: list[PipeDriver] = []
        self._flush_armed = False
        self._flush_due = 0.0  # when the armed round's oldest payload has waited MAX_HOLD
        # counters (stats); drops are counted by reason in ``core.drops``, under the lock
        self.sent = self.received = self.bytes_sent = self.bytes_received = 0

    # -- errors ------------------------------------------------------------------
    def closed_error(self) -> Closed:
        if self.fork_closed:
            return Closed(
                f"{self._name()}: this socket was created before os.fork(); create a new socket in the child process"
            )
        return Closed(f"{self._name()}: socket is closed")

    def check_open(self) -> None:
        if self.closed:
            raise self.closed_error()

    # -- the round -----------------------------------------------------------------
    def _fold_due(self) -> None:
        """Hand the core the credit returned since the last round (lock held)."""
        due = self._due
        credit = self.core.pipe_credit
        while due:
            pid, n = due.popleft()
            credit(pid, n)

    def _drain(self) -> list[Action] | None:
        """Take the core's actions and wake who can go on now (lock held)."""
        actions = self.core.actions
        if actions:
            out = actions.copy()
            actions.clear()
            if self.id_queues or self.caller_q is not None:
                for action in out:
                    kind = action[0]
                    if kind == READY:
                        queue = self.id_queues.get(action[1])
                        if queue is not None:
                            queue.wake_one()
                    elif kind == READY_CALLER:
                        self.caller_q.wake_caller(action[1])  # type: ignore[union-attr]
        else:
            out = None
        for queue in self.queues:
            if queue.waiters:
                queue.wake_one()
        if self.watchers:
            self.notify_watchers()
        return out

    def received_counts(self) -> tuple[int, int]:
        """(messages, bytes) the user has received: a run's bodies are counted when
        it is taken, so what it still holds is not received yet."""
        with self.lock:
            queue = self._body_queue
            if queue is None:  # (no runs)
                return self.received, self.bytes_received
            held = list(self.run)
            # (a run's bodies given back to their queue are counted again when taken)
            return (
                self.received - len(held) - queue.given_back,
                self.bytes_received - sum(map(len, held)) - queue.given_back_bytes,
            )

    def sent_counts(self) -> tuple[int, int]:
        """(messages, bytes) sent: lane credit is counted when granted, so what the
        lane has not spent is not sent yet, while its bytes are counted as it goes."""
        with self.lock:
            lane = self.lane
            if lane is None:
                return self.sent, self.bytes_sent
            return self.sent - lane.lane_credit, self.bytes_sent + lane.lane_bytes

    def count_drop(self, reason: str, n: int = 1, pid: int | None = None) -> None:
        """Count ``n`` messages dropped for ``reason`` (a name of nanopy._drops), on
        pipe ``pid`` if given: the engine side's drops (a pipe found dead, a message
        too large). Takes the socket lock: call it holding neither that lock nor a
        pipe's (the lock order is socket, then pipe)."""
        if n > 0:
            with self.lock:
                self.core.count_drop(reason, n, pid)

    def queued_out(self) -> int:
        """Messages sent and not yet written, on every pipe (one look at each)."""
        with self.lock:
            fan = len(self._fan_out) * len(self._fan_pipes)
        return fan + sum(pipe.queued_out() for pipe in self.pipe_drivers())

    def writable(self) -> bool:
        """Whether a send would go out now (lock held)."""
        lane = self.lane
        return (lane is not None and lane.lane_credit > 0) or self._fan_credit > 0 or self.core.can_send()

    def _revoke_lane(self) -> None:
        """Take unspent lane credit back into the core (lock held)."""
        if self._fan_pipes:
            self._revoke_fan()
        pipe = self.lane
        if pipe is None:
            return
        self.lane = None
        with pipe.lock:
            n, pipe.lane_credit = pipe.lane_credit, 0
            spent_bytes, pipe.lane_bytes = pipe.lane_bytes, 0
        self.sent -= n
        self.bytes_sent += spent_bytes
        if n:
            self.core.pipe_credit(pipe.pid, n)

    def _grant_fan(self) -> None:
        """Open the fan-out lane with the same credit of every pipe (lock held)."""
        grant = self.core.take_all(LANE_MAX, FAN_MIN)
        if grant is None:
            return
        pids, n = grant
        members = [self.pipes.get(pid) for pid in pids]
        if None in members:  # (not all live pipes: leave the credit where it was)
            for pid in pids:
                self.core.pipe_credit(pid, n)
            return
        self._fan_pipes = members  # type: ignore[assignment]
        self._fan_credit = n

    def _hand_out_fan(self, kick: bool = False) -> list[PipeDriver]:
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

    def _revoke_fan(self, kick: bool = True) -> list[PipeDriver]:
        """Close the fan-out lane (lock held): what it took is queued on its
        pipes, unspent credit goes back to the core. Returns the members, as
        :meth:`_hand_out_fan` (``kick=False``: the caller writes them)."""
        members = self._hand_out_fan(kick)
        n, self._fan_credit = self._fan_credit, 0
        self._fan_pipes = []
        if n:
            for pipe in members:
                self.core.pipe_credit(pipe.pid, n)
        return members

    def _write_fan(self, members: list[PipeDriver]) -> None:
        """Write what the fan-out lane queued on each member (lock not held); a
        pipe already being written is left to that writer."""
        framed: dict[Any, tuple[list[bytes], Any]] = {}  # framed once for all stream pipes
        for pipe in members:
            done = pipe.flush_queued(framed)
            if done:
                self.credit(pipe.pid, done)

    def _grant_lane(self) -> None:
        """Hand the sole pipe's credit to the lane (lock held)."""
        grant = self.core.take_sole(LANE_MAX)
        if grant is None:
            return
        pid, n = grant
        pipe = self.pipes.get(pid)
        if pipe is None:  # (not a live pipe: leave the credit where it was)
            self.core.pipe_credit(pid, n)
            return
        if self.lane is not pipe:
            self._revoke_lane()
            self.lane = pipe
        with pipe.lock:
            pipe.lane_credit += n
        self.sent += n

    def readable(self) -> bool:
        """Whether a receive would take a body now (lock held)."""
        return bool(self.run) or self.core.can_recv()

    def notify_watchers(self) -> None:
        """Wake every blocked poll on this socket (lock held); each re-registers."""
        watchers = self.watchers
        for waiter in watchers:
            waiter.wake()
        watchers.clear()

    def feed(self, op: Callable[..., T], *args: Any, check_open: bool = True) -> T:
        """One round: feed the core through ``op(*args)`` under the lock, then act.

        With ``check_open`` a closed socket raises :class:`Closed` instead.
        """
        with self.lock:
            if check_open and self.closed:
                raise self.closed_error()
            if self._due:
                self._fold_due()
            try:
                result = op(*args)
            finally:
                actions = self._drain()
        if actions:
            self.execute(actions)
        return result

    def inspect(self, op: Callable[..., T], *args: Any, check_open: bool = True) -> T:
        """A round that only queries the core (or registers a poll): nothing to
        drain, nobody to wake -- waking here would wake the poll being registered."""
        with self.lock:
            if check_open and self.closed:
                raise self.closed_error()
            if self._due:
                self._fold_due()  # credit only records: no actions, and can_send is current
            return op(*args)

    def execute(self, actions: list[Action]) -> None:
        """Carry out actions (lock *not* held), in order, as a work queue.

        ``actions`` is this call's own list: actions that returned credit yields
        are appended to it and carried out by the same loop.
        """
        pipes = self.pipes
        burst: bool | None = None  # judged at the first TRANSMIT (see FANOUT_GAP)
        transmits = 0
        i = 0
        while i < len(actions):
            action = actions[i]
            i += 1
            kind = action[0]
            if kind == TRANSMIT:
                if burst is None:
                    burst = time.monotonic() - self.fanout_end < FANOUT_GAP
                if burst:
                    # A fan-out burst: this and the TRANSMITs after it are queued
                    # (and batched) in one tight loop.
                    handled, gone, credit = queue_fan_out(pipes, actions, i - 1)
                    i += handled - 1
                    transmits += handled - gone
                    if gone:
                        self.count_drop(DEAD_PIPE, gone)
                    for pid, n in credit:
                        more = self._credit_back(pid, n)
                        if more:
                            actions.extend(more)
                    continue
                driver = pipes.get(action[1])
                if driver is None:
                    self.count_drop(DEAD_PIPE)  # (removed since the round that chose it)
                    continue
                transmits += 1
                # Not a burst: the pipe judges idle vs burst by itself (a lone
                # pipe's ping-pong is written directly).
                done = driver.transmit(action[2])
                if done:
                    more = self._credit_back(action[1], done)
                    if more:
                        actions.extend(more)
            elif kind == RESUME_READ:
                driver = pipes.get(action[1])
                if driver is not None:
                    driver.resume_read()
            elif kind == CLOSE_PIPE:
                driver = pipes.get(action[1])
                if driver is not None:
                    log.info("%s: closing pipe %d: %s", self._name(), action[1], action[2])
                    driver.close_soon()
            elif kind == ARM_TIMER:
                if self.timers is None:
                    self.timers = Timers(self._engine(), self.timer_fired, self.spawn_task)
                self.timers.arm(action[1], action[2])
            elif kind == CANCEL_TIMER:
                if self.timers is not None:
                    self.timers.cancel(action[1])
            # READY and READY_CALLER were handled when the actions were drained.
        if transmits > 1:
            self.fanout_end = time.monotonic()

    def flush_later(self, pipe: PipeDriver | None) -> None:
        """``pipe`` queued a fan-out burst's first payload (any thread): the socket's
        flush round will write it, unless a sender writes the outbox first. None:
        the fan-out lane took its first body; the round hands the lane's bodies out.

        One engine task per burst flushes every such pipe, instead of each pipe
        waking its own writer task (a cross-thread wake-up and a GIL hand-over
        each, per pipe).
        """
        with self._flush_lock:
            if pipe is not None:
                self._flush_pipes.append(pipe)
            if self._flush_armed:
                return
            self._flush_armed = True
            first_at = pipe.first_at if pipe is not None else self._engine().now()
            self._flush_due = first_at + MAX_HOLD  # the round's oldest payload
        self._engine().spawn(self._flush_round)

    async def _flush_round(self) -> None:
        """Wait while the burst goes on (:func:`~nanopy._pipe.wait_out_burst`: no
        payload waits past ``MAX_HOLD``), then write what it left on each pipe.

        A pipe whose channel is busy, or cannot take the whole chunk, is left to
        its own writer task.
        """
        await wait_out_burst(lambda: self.sent, lambda: self._flush_due, self._engine().now)
        with self._flush_lock:
            self._flush_armed = False  # (before taking the list: a later pipe arms anew)
            pipes, self._flush_pipes = self._flush_pipes, []
        if self._fan_out:
            with self.lock:
                members = self._hand_out_fan()
            self._write_fan(members)
        framed: dict[Any, tuple[list[bytes], Any]] = {}  # a batch equal on many pipes is framed once
        for pipe in pipes:
            done = pipe.flush_queued(framed)
            if done:
                self.credit(pipe.pid, done)

    def _credit_back(self, pid: int, n: int) -> list[Action] | None:
        """``n`` messages left pipe ``pid``: give the credit back; returns new actions."""
        if self._lazy_credit:
            self._due.append((pid, n))
            # Checked in this order (lock, then waiters) so a sender about to park
            # either saw the credit or is seen here; see the module docstring.
            if not self.lock.locked() and not self.send_q.waiters and not self.watchers:
                return None
        else:
            self._due.append((pid, n))
        with self.lock:
            if self._due:
                self._fold_due()
            if self._relazy and not self.core.holding:
                self._relazy = False  # the requeued payloads went out (remove_pipe)
                self._lazy_credit = True
            return self._drain()

    def credit(self, pid: int, n: int) -> None:
        """Credit from the engine side (a writer flushed, an inproc peer read)."""
        actions = self._credit_back(pid, n)
        if actions:
            self.execute(actions)

    # -- engine inputs ---------------------------------------------------------------
    def add_pipe(self, driver: PipeDriver, info: PipeInfo, credit: int) -> bool:
        """A pipe is up; False if the socket closed meanwhile."""
        with self.lock:
            if self.closed:
                return False
            self.pipes[info.id] = driver
            self._revoke_lane()  # (two pipes share sends message by message)
            self.core.add_pipe(info, credit)
            actions = self._drain()
        if actions:
            self.execute(actions)
        return True

    def remove_pipe(self, pid: int, orphans: list[bytes] | None = None) -> int:
        """Pipe ``pid`` is gone; ``orphans``: payloads it never wrote, which a core
        that can (``Core.requeue``) sends on its other pipes; the rest count as
        ``dead_pipe`` drops (but a REQ's, which it resends itself). Returns how many it took."""

        def remove() -> int:
            if (self.lane is not None and self.lane.pid == pid) or self._fan_pipes:
                self._revoke_lane()
            del self.pipes[pid]
            core = self.core
            core.remove_pipe(pid)  # credit still due to it is ignored by the core
            if self.recv_q.waiters:
                self.recv_q.wake_all()  # a thread reading this pipe directly looks again
            if not orphans:
                return 0
            if self.closed:
                core.count_drop(DEAD_PIPE, len(orphans))
                return 0
            taken = core.requeue(orphans)  # (what it does not take, it counts as dropped)
            if core.holding and self._lazy_credit:
                # Some wait for credit: returned credit must reach the core at once.
                self._lazy_credit = False
                self._relazy = True
            return taken

        return self.feed(remove, check_open=False)

    def deliver(self, pid: int, payloads: list[bytes]) -> bool:
        """Payloads read from pipe ``pid``; False = stop reading it for now.

        A full queue pauses the pipe (``PipeDriver.paused``) in this same round,
        so the RESUME_READ of any later round comes after it.
        """
        # (outside the lock; an in-memory sender handing them over has summed them already)
        handed = handed_over[0]
        size = handed[1] if handed is not None and handed[0] is payloads else sum(map(len, payloads))
        with self.lock:
            keep = self.core.messages_received(pid, payloads)
            pipe = self.pipes.get(pid)
            if pipe is not None:
                pipe.rx_msgs += len(payloads)
                pipe.rx_bytes += size
                if not keep:
                    pipe.paused = True
            actions = self._drain()
        if actions:
            self.execute(actions)
        return keep

    def timer_fired(self, key: Any) -> None:
        with self.lock:
            if self.closed:
                return
            if self._due:
                self._fold_due()
            self.core.timer_fired(key)
            actions = self._drain()
        if actions:
            self.execute(actions)

    # -- user operations: fast paths ------------------------------------------------------
    # ``feed`` written out for the two hottest calls in nanopy: one lock round,
    # acquire/release rather than ``with`` (measurably cheaper), no closures.
    def try_send(self, body: bytes, header: bytes) -> bool:
        """Send if the core can take it now; False if it would block."""
        lane = self.lane
        if lane is not None and not self.closed:
            done = lane.transmit(body, None, None, True)  # (positional: cheaper)
            if done >= 0:
                if done:
                    self.credit(lane.pid, done)
                return True
        members: list[PipeDriver] | None = None  # pipes the fan-out lane queued a batch on
        arm = blocked = False
        action = rest = None
        lock = self.lock
        lock.acquire()
        try:
            if self.closed:
                raise self.closed_error()
            if self._fan_credit:
                # The fan-out lane: every member pipe takes this body, as the core
                # would have decided; it goes out with the lane's next batch.
                self._fan_credit -= 1
                fan = self._fan_out
                fan.append(body)
                size = len(body)
                self.sent += 1
                self.bytes_sent += size
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
                if self._due:
                    self._fold_due()
                core = self.core
                try:
                    core.send(body, header)
                except WouldBlock:
                    blocked = True
                else:
                    self.sent += 1
                    self.bytes_sent += len(body)
                    actions = core.actions
                    if (
                        len(actions) == 1
                        and actions[0][0] is TRANSMIT
                        and not (self.send_q.waiters or self.recv_q.waiters or self.watchers)
                    ):
                        # The usual outcome (one TRANSMIT, nobody to wake) taken here
                        # rather than through _drain() and execute().
                        action = actions.pop()
                        if self._lanes:
                            self._grant_lane()
                    else:
                        if self._fans and len(actions) > 1 and time.monotonic() - self.fanout_end < FANOUT_GAP:
                            self._grant_fan()  # a burst of fan-outs: later sends take the lane
                        rest = self._drain()
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
            driver = self.pipes.get(pid)
            if driver is None:
                self.count_drop(DEAD_PIPE)
                return True
            done = driver.transmit(action[2])
            if done:
                self.credit(pid, done)
        elif rest:
            self.execute(rest)  # (a PUB's send in a burst: every pipe queues it)
        return True

    def try_recv_body(self) -> bytes | None:
        """The next body if one is queued now, else None."""
        run = self.run
        if run and not self.closed:
            try:
                return run.popleft()  # the rest of a run: no lock (see the docstring)
            except IndexError:
                pass
        lock = self.lock
        lock.acquire()
        try:
            if self.closed:
                raise self.closed_error()
            try:
                body = self._pop_body()
            except WouldBlock:
                return None
            # The drain written out: most receives emit nothing and find nobody
            # waiting, and then cost no call at all.
            if self.core.actions or self.send_q.waiters or self.recv_q.waiters or self.watchers:
                actions = self._drain()
            else:
                actions = None
        finally:
            lock.release()
        if actions:
            self.execute(actions)
        return body

    def _pop_body(self) -> bytes:
        """The next body (lock held): the run's next, else the first of a new run
        (counted as received here, all of it); WouldBlock if nothing is queued."""
        run = self.run
        if run:
            try:
                return run.popleft()
            except IndexError:  # (emptied by a receiver without the lock)
                pass
        queue = self._body_queue
        if queue is None:
            body: bytes = self.core.recv_body()
            self.received += 1
            self.bytes_received += len(body)
            return body
        bodies: list[bytes] = queue.take_run(RUN_MAX)
        body = bodies[0]
        if len(bodies) == 1:  # (several pipes have messages: one each in turn)
            self.received += 1
            self.bytes_received += len(body)
            return body
        self.received += len(bodies)
        self.bytes_received += sum(map(len, bodies))
        info = self.core.pipes.get(queue.run_pid)
        self.run_token = info.token if info is not None else None
        run.extend(itertools.islice(bodies, 1, None))
        return body

    def recv_bodies(self, limit: int) -> list[bytes]:
        """Up to ``limit`` queued bodies in one round (never waits)."""

        def take() -> list[bytes]:
            out: list[bytes] = []
            append = out.append
            pop = self._pop_body
            try:
                for _ in range(limit):
                    append(pop())
            except WouldBlock:
                pass
            return out

        return self.feed(take)

    # -- attempts: an operation that completes or raises WouldBlock -------------------------
    def send_attempt(self, body: bytes, header: bytes = b"") -> Callable[[], None]:
        core = self.core

        def attempt() -> None:
            # A sender that has to wait: lane credit granted since its try_send
            # goes back into the core, where this attempt (and every waiter) sees it.
            self._revoke_lane()
            core.send(body, header)
            self.sent += 1
            self.bytes_sent += len(body)

        return attempt

    recv_body_attempt = _pop_body

    def recv_attempt(self) -> Message:
        run = self.run
        if run:
            try:
                return Message(run.popleft(), self.run_token)  # (counted when the run was taken)
            except IndexError:
                pass
        msg = self.core.recv()
        self.received += 1
        self.bytes_received += len(msg.body)
        return msg

    def _attempt(self, attempt: Callable[[], T], park: Callable[[], Any] | None) -> tuple[T | _Blocked, Any]:
        """One try of ``attempt`` in a round.

        Returns ``(result, None)``, or ``(BLOCKED, park())`` when it would block:
        ``park`` runs under the lock, so a waiter it registers misses no wake-up.
        """
        with self.lock:
            if self.closed:
                raise self.closed_error()
            if self._due:
                self._fold_due()
            try:
                result = attempt()
            except WouldBlock:
                return BLOCKED, (park() if park is not None else None)
            actions = self._drain()
        if actions:
            self.execute(actions)
        return result, None

    def try_once(self, attempt: Callable[[], T]) -> T | _Blocked:
        return self._attempt(attempt, None)[0]

    def _abandon(self, queue: WaitQueue, waiter: Any) -> None:
        with self.lock:
            queue.abandon(waiter)

    # -- waiting -------------------------------------------------------------------------
    def _timed_out(self, what: str) -> Timeout:
        """The Timeout for ``what``; it says so when no peer was connected to wait for."""
        if self.pipes:
            return Timeout(f"{self._name()}: {what} timed out")
        return Timeout(
            f"{self._name()}: {what} timed out: no peer connected "
            "(check that a peer is running at the connected address, or connected to the bound one)"
        )

    def call(self, attempt: Callable[[], T], queue: WaitQueue, timeout: float | None, what: str) -> T:
        """Run ``attempt`` until it stops raising WouldBlock, parking this thread between tries."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def park() -> ThreadWaiter | None:
            waiter: ThreadWaiter | None = _park(queue, deadline, ThreadWaiter)
            return waiter

        engine_checked = False
        if queue is self.recv_q and len(self.pipes) == 1:
            result = self._direct_recv(attempt, deadline)
            if not isinstance(result, _Blocked):
                return result
        while True:
            result, waiter = self._attempt(attempt, park)
            if not isinstance(result, _Blocked):
                return result
            if waiter is None:
                raise self._timed_out(what)
            if not engine_checked:
                engine_checked = True
                if self._engine().in_engine_thread():
                    self._abandon(queue, waiter)
                    raise RuntimeError(
                        f"{self._name()}: a blocking {what} on the nanopy engine thread would "
                        "deadlock; pass timeout=0 in pipe callbacks"
                    )
            try:
                woken = waiter.wait(None if deadline is None else deadline - time.monotonic())
            except BaseException:  # Ctrl-C: the call took nothing
                self._abandon(queue, waiter)
                raise
            if not woken:
                self._abandon(queue, waiter)
                # One last try: the condition may have turned true as we timed out.
                result = self.try_once(attempt)
                if not isinstance(result, _Blocked):
                    return result
                raise self._timed_out(what)

    # -- direct receive -----------------------------------------------------------------
    def _wake_fd(self) -> int:
        """The eventfd that wakes a thread receiving directly (lock held; made once)."""
        box = self._wake_fd_box
        if box[0] < 0:
            box[0] = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            weakref.finalize(self, _close_fd_box, box)
        return box[0]

    def _direct_recv(self, attempt: Callable[[], T], deadline: float | None) -> T | _Blocked:
        """Receive on the socket's only pipe by reading it from this thread.

        Runs :meth:`_direct_steps`, blocking in ``epoll`` (the connection and the
        wake eventfd) whenever they must wait. Returns BLOCKED when the read role
        is not available or the pipe stops being readable here; the caller then
        waits the ordinary way.
        """
        begun = self._direct_begin(deadline)
        if begun is None:
            return BLOCKED
        pipe, state = begun
        steps = self._direct_steps(pipe, state, attempt)
        try:
            left = next(steps)
            while True:
                epoll = self._direct_epoll(pipe.pid, pipe.conn, state.wake_fd)
                if epoll is None:
                    return BLOCKED
                epoll.poll(left)
                left = next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            steps.close()
            self._direct_end(pipe, state)

    async def _adirect_recv(
        self, attempt: Callable[[], T], deadline: float | None, wait: Callable[[int, float | None], Awaitable[None]]
    ) -> tuple[T | _Blocked, bool]:
        """The async twin of :meth:`_direct_recv`: this task reads the socket's only pipe.

        A trio task (of a loop other than the engine's) or an asyncio task runs
        :meth:`_direct_steps` in its own thread, so the bytes reach it without the
        engine thread, a GIL hand-over or a cross-thread wake. It waits in its own
        loop (``wait``: trio's ``wait_readable``, asyncio's ``add_reader``) on the
        epoll descriptor, so a wake (close, a message handed in by another path,
        the pipe ending) interrupts it exactly as it does a thread.
        Returns ``(result, waited)``; ``waited`` says whether the task yielded
        (then the call already had its schedule point). A cancellation can only
        arrive in that wait, before the attempt succeeded: the call took nothing.
        """
        begun = self._direct_begin(deadline)
        if begun is None:
            return BLOCKED, False
        pipe, state = begun
        steps = self._direct_steps(pipe, state, attempt)
        waited = False
        try:
            left = next(steps)
            while True:
                epoll = self._direct_epoll(pipe.pid, pipe.conn, state.wake_fd)
                if epoll is None:
                    return BLOCKED, waited
                waited = True
                await wait(epoll.fileno(), left)
                left = next(steps)
        except StopIteration as done:
            return done.value, waited
        finally:
            steps.close()
            self._direct_end(pipe, state)

    def _direct_begin(self, deadline: float | None) -> tuple[PipeDriver, _DirectState] | None:
        """Take the read role of the socket's only pipe (see nanopy/_pipe.py) for a
        direct receive; None when that is not possible now."""
        if self.recv_q.waiters or type(self.recv_q) is not WaitQueue or self._engine().in_engine_thread():
            return None  # (other receivers waiting: the engine shares messages out fairly)
        try:
            (pipe,) = self.pipes.values()
        except ValueError:  # the pipe went (or another came) meanwhile
            return None
        if not pipe.direct:
            return None
        with self.lock:
            if self.closed:
                raise self.closed_error()
            wake_fd = self._wake_fd()
            self._direct_users += 1
        if not pipe.take_role(wake_fd):
            self._direct_done()
            return None
        return pipe, _DirectState(pipe.pid, wake_fd, deadline)

    def _direct_end(self, pipe: PipeDriver, state: _DirectState) -> None:
        if state.waiter is not None:
            self._abandon(self.recv_q, state.waiter)
        pipe.release_role()
        self._direct_done()

    def _direct_steps(
        self, pipe: PipeDriver, state: _DirectState, attempt: Callable[[], T]
    ) -> Generator[float | None, None, T | _Blocked]:
        """The loop of a direct receive, without its waits (threads and tasks share it).

        Reads first: a busy pipe has bytes waiting, and then no waiter is parked
        and nobody waits. What a read completes is taken in the same round that
        feeds it to the core (a busy receiver pays one round per read). Otherwise:
        a round that tries ``attempt`` and parks a waiter that writes the eventfd
        if it would block, then a wait -- the generator yields the seconds left
        (None: no deadline) and its driver waits until the connection or the
        eventfd is readable, or that time passes. Returns the result, or BLOCKED
        at the deadline or when the pipe stops being readable here.
        """
        result: T | _Blocked = BLOCKED
        tried = False  # a round has tried the attempt
        read = False  # read since the last wait: wait next, do not read again
        while True:
            if tried:
                if not isinstance(result, _Blocked) or state.waiter is None:
                    return result  # a result, or BLOCKED at the deadline (the caller times out)
                if pipe.paused or pipe.closed or pipe.pid not in self.pipes or len(self.recv_q.waiters) > 1:
                    return BLOCKED  # (more receivers now: let the engine share messages out)
            if not read:
                outcome = self._direct_read(pipe, state, attempt)
                if outcome is _FAILED:
                    return BLOCKED
                if outcome is not _NOTHING:
                    if outcome is not _PARTIAL:
                        result, tried = outcome, True
                    continue  # read something (maybe a partial frame): look again at once
                read = True
            if state.waiter is None:
                result = self._direct_round(state, None, attempt)  # try, and park a waiter
                tried = True
                continue
            if not state.waiter.woken:
                left = None if state.deadline is None else state.deadline - time.monotonic()
                if left is None or left > 0:
                    yield left
                    try:
                        os.eventfd_read(state.wake_fd)
                    except BlockingIOError:
                        pass
                    if not state.waiter.woken:
                        read = False
                        continue  # readable (or a stray wake): read it
            read = False
            result = self._direct_round(state, None, attempt)  # woken or timed out: look again

    def _direct_read(self, pipe: PipeDriver, state: _DirectState, attempt: Callable[[], T]) -> Any:
        """One read by the read role's holder: what the kernel holds goes to the core,
        and the attempt is tried, in one round taken before anyone else may read.

        Returns the attempt's result (or BLOCKED) when messages were read,
        ``_PARTIAL`` when only part of a frame was, ``_NOTHING`` when the kernel
        held nothing, ``_FAILED`` when the connection ended (the pipe is closed).
        """
        conn: Any = pipe.conn
        with pipe.read_lock:
            try:
                payloads = None if pipe.closed else conn.read_nowait()
            except (EOFError, OSError, RemoteProtocolError, MessageTooLarge) as exc:
                failure: BaseException = exc
            else:
                if payloads is None:
                    return _NOTHING
                if not payloads:
                    return _PARTIAL
                return self._direct_round(state, payloads, attempt)
        pipe.direct_failed(failure)  # (Timeout, an OSError, never comes from here)
        return _FAILED

    def _direct_epoll(self, pid: int, conn: Any, wake_fd: int) -> Any:
        """An epoll descriptor readable when pipe ``pid`` or the wake eventfd is (a
        thread blocks in it, a task waits for its descriptor; made once per pipe:
        only the read role's holder uses it)."""
        cached = self._epoll_cache
        if cached is not None and cached[0] == pid:
            return cached[1]
        fd = conn.fileno()
        if fd < 0:
            return None
        epoll = select.epoll()
        try:
            epoll.register(fd, select.EPOLLIN)
        except OSError:  # the pipe's connection was closed since fileno(): wait the usual way
            epoll.close()
            return None
        epoll.register(wake_fd, select.EPOLLIN)
        self._epoll_cache = (pid, epoll)
        return epoll

    def _direct_done(self) -> None:
        with self.lock:
            self._direct_users -= 1
            if self.closed and not self._direct_users:
                self._close_direct_fds()  # the last direct receiver of a closed socket

    def _close_direct_fds(self) -> None:
        """Close the wake eventfd and a task's epoll (lock held, no direct receiver left)."""
        _close_fd_box(self._wake_fd_box)
        cached, self._epoll_cache = self._epoll_cache, None
        if cached is not None:
            cached[1].close()

    def _direct_round(
        self, state: _DirectState, payloads: list[bytes] | None, attempt: Callable[[], T]
    ) -> T | _Blocked:
        """One round of a direct receive: feed ``payloads``, try, park a fresh waiter."""
        queue = self.recv_q
        size = sum(map(len, payloads)) if payloads else 0
        with self.lock:
            waiter = state.waiter
            if waiter is not None:
                state.waiter = None
                try:
                    queue.waiters.remove(waiter)
                except ValueError:
                    pass
            if self.closed:
                raise self.closed_error()
            if self._due:
                self._fold_due()
            if payloads:
                keep = self.core.messages_received(state.pid, payloads)
                pipe = self.pipes.get(state.pid)
                if pipe is not None:
                    pipe.rx_msgs += len(payloads)
                    pipe.rx_bytes += size
                    if not keep:
                        pipe.paused = True
            try:
                result: T | _Blocked = attempt()
            except WouldBlock:
                result = BLOCKED
                if state.deadline is None or state.deadline > time.monotonic():
                    state.waiter = _FdWaiter(state.wake_fd)
                    queue.waiters.append(state.waiter)
            actions = self._drain()
        if actions:
            self.execute(actions)
        return result

    async def acall(self, attempt: Callable[[], T], queue: WaitQueue, timeout: float | None, what: str) -> T:
        """Async twin of :meth:`call` for trio and asyncio tasks; a checkpoint.

        A call cancelled before it completes raises Cancelled (CancelledError) and
        took or sent nothing: the attempt runs only after the cancellation check,
        and a message leaves the core only inside a successful attempt.
        """
        trio_task = await checkpoint_before()
        deadline = None if timeout is None else time.monotonic() + timeout

        def park() -> Any:
            return _park(queue, deadline, async_waiter)

        result: T | _Blocked = BLOCKED
        waited = False
        if queue is self.recv_q and len(self.pipes) == 1:
            wait = _trio_wait_readable if trio_task else _asyncio_wait_readable
            result, waited = await self._adirect_recv(attempt, deadline, wait)
        while isinstance(result, _Blocked):
            result, waiter = self._attempt(attempt, park)
            if not isinstance(result, _Blocked):
                break
            if waiter is None:
                raise self._timed_out(what)
            waited = True
            try:
                woken = await waiter.wait(None if deadline is None else deadline - time.monotonic())
            except BaseException:
                self._abandon(queue, waiter)
                raise
            if not woken:
                self._abandon(queue, waiter)
                raise self._timed_out(what)
        if trio_task and not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()  # the call's schedule point
        return result

    # -- requests and surveys (per-id waiters) -----------------------------------------------
    def start_id(self, start: Callable[[], int], ready: Callable[[int], bool], body_len: int) -> int:
        """Start a request/survey with ``start()`` and give its id a wait queue."""

        def op() -> int:
            key = start()
            self.sent += 1
            self.bytes_sent += body_len
            self.id_queues[key] = WaitQueue(lambda: ready(key))
            return key

        return self.feed(op)

    def forget_id(self, key: int, cancel: Callable[[int], None] | None = None) -> None:
        """Drop an id's wait queue, and cancel it in the core if ``cancel`` is given."""
        if cancel is None:
            # No lock: this may run from a generator finalizer (GC) on a thread that
            # already holds it; a single dict.pop is atomic anyway.
            self.id_queues.pop(key, None)
            return

        def op() -> None:
            self.id_queues.pop(key, None)
            cancel(key)

        self.feed(op, check_open=False)

    def take_attempt(
        self, key: int, take: Callable[[int], Message | None], one_shot: bool
    ) -> Callable[[], Message | None]:
        """An attempt taking the reply (``one_shot``) or next answer of ``key``.

        The id's wait queue goes with the reply, or when ``take`` returns None (over).
        """
        queues = self.id_queues

        def attempt() -> Message | None:
            msg = take(key)
            if msg is None:
                queues.pop(key, None)
            else:
                self.received += 1
                self.bytes_received += len(msg.body)
                if one_shot:
                    queues.pop(key, None)
            return msg

        return attempt

    # -- closing (the synchronous half) ---------------------------------------------------------
    def close_core(self) -> bool:
        """Mark closed, close the core, wake every waiter. False if already closed."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            self._due.clear()
            self.run.clear()
            self._revoke_lane()
            self.core.close()
            actions = self.core.actions.copy()
            self.core.actions.clear()
            for queue in self.queues:
                queue.wake_all()
            for queue in list(self.id_queues.values()):
                queue.wake_all()
            self.notify_watchers()  # a blocked poll raises Closed
            if not self._direct_users:
                self._close_direct_fds()
        # Only timer cancellations matter now; pipes are closed by the caller.
        for action in actions:
            if action[0] == CANCEL_TIMER and self.timers is not None:
                self.timers.cancel(action[1])
        if self.timers is not None:
            self.timers.stop()
        return True

    def forked(self) -> None:
        """In a child process: the engine serving this socket is gone."""
        self.closed = True
        self.fork_closed = True
        self.lock = threading.Lock()

    def pipe_drivers(self) -> Iterator[PipeDriver]:
        return iter(list(self.pipes.values()))


def _close_fd_box(box: list[int]) -> None:
    fd, box[0] = box[0], -1
    if fd >= 0:
        os.close(fd)


class _DirectState:
    """What one direct receive carries between its rounds."""

    __slots__ = ("deadline", "pid", "waiter", "wake_fd")

    def __init__(self, pid: int, wake_fd: int, deadline: float | None) -> None:
        self.pid = pid
        self.wake_fd = wake_fd
        self.deadline = deadline
        self.waiter: _FdWaiter | None = None


class _FdWaiter:
    """The waiter of a thread reading a pipe directly: a wake writes its eventfd."""

    __slots__ = ("_fd", "woken")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.woken = False

    def wake(self) -> None:
        if not self.woken:
            self.woken = True
            try:
                os.eventfd_write(self._fd, 1)
            except OSError:
                pass


def _park(queue: WaitQueue, deadline: float | None, make: Callable[[], Any]) -> Any:
    """Register a new waiter on ``queue`` unless the deadline has passed (lock held)."""
    if deadline is not None and deadline <= time.monotonic():
        return None
    waiter = make()
    queue.park(waiter)  # a queue may key the waiter by caller (nanopy._callers)
    return waiter


async def _trio_wait_readable(fd: int, timeout: float | None) -> None:
    """Wait (in this trio loop) until ``fd`` is readable or ``timeout`` passes."""
    with trio.move_on_after(float("inf") if timeout is None else timeout):
        await trio.lowlevel.wait_readable(fd)


async def _asyncio_wait_readable(fd: int, timeout: float | None) -> None:
    """Wait (in this asyncio loop) until ``fd`` is readable or ``timeout`` passes."""
    import asyncio

    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not future.done():
            future.set_result(None)

    loop.add_reader(fd, ready)
    timer = None if timeout is None else loop.call_later(timeout, ready)
    try:
        await future
    finally:
        loop.remove_reader(fd)
        if timer is not None:
            timer.cancel()


def in_trio() -> bool:
    """Whether the calling task runs under trio (else asyncio)."""
    return sniffio.thread_local.name == "trio" or sniffio.current_async_library() == "trio"


def cancellation_point(trio_task: bool) -> Awaitable[None]:
    """The cancellation point at the start of every async call, to be awaited.

    trio: raises Cancelled if the scope is cancelled (the caller must then add a
    schedule point, ``cancel_shielded_checkpoint``, if it completes without
    waiting). asyncio: one loop turn, where a pending cancel raises CancelledError.
    A plain function returning the awaitable: the hot paths (``Socket.asend``,
    ``arecv``) pay no coroutine level of their own for it.
    """
    if trio_task:
        return trio.lowlevel.checkpoint_if_cancelled()  # noqa: ASYNC105 - the caller awaits it
    import asyncio

    return asyncio.sleep(0)


async def checkpoint_before() -> bool:
    """:func:`cancellation_point` in one call; True under trio."""
    trio_task = in_trio()
    await cancellation_point(trio_task)
    return trio_task


async def checkpoint_after(trio_task: bool) -> None:
    """The schedule point ending an async call that completed without waiting."""
    if trio_task:
        await trio.lowlevel.cancel_shielded_checkpoint()
