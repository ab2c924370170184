"""The round: the one way into a socket's protocol core.

Owns: the socket lock, the core, the queue of credit due (``_due``), the wait
queues' wake pass, the poll watchers, the stats counters, and the execution of
actions. Every input to a core takes the same round:

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

May call: the core, the pipes as ``PipeHandle``s (nanopy/_seam.py: ``transmit``,
``fan_out``, ``reader.resume``/``count_delivery``, ``close_soon``), the timers. Nothing
else in nanopy takes the socket lock or calls the core: the other parts of the driver
(``lanes``, ``runs``, ``direct``, ``waiting``, ``endings``, ``ids``) are objects
of their own, each given this round (the driver) when it is made, and go through
its rounds; :class:`~nanopy.driver.socket_driver.SocketDriver` is this class with
those parts. It knows none of them: what it needs of one (``hand_back``) it is given.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .._seam import PipeT
from ..core.actions import ARM_TIMER, CANCEL_TIMER, CLOSE_PIPE, READY, READY_CALLER, RESUME_READ, TRANSMIT, Action
from ..core.base import Core, Distributing, LoadBalancing
from ..core.callers import CallerWaitQueue
from ..core.errors import Closed, WouldBlock
from .timers import Timers
from .waiters import WaitQueue

if TYPE_CHECKING:
    from .._seam import PipeHandle
    from ..engine.engine import Engine

log = logging.getLogger("nanopy")

T = TypeVar("T")

# A round that transmits within this time of the end of a round that wrote to
# several pipes (a PUB's fan-out) is a burst: its payloads are queued and batched.
# Left to each pipe's own judgement (nanopy.pipe.driver.DIRECT_IDLE, measured from the
# start of its last write), a fan-out that writes each of many pipes directly
# takes long enough to make every pipe look idle again at the next send, and
# never batches. A lone pipe keeps its own judgement (ping-pong latency).
FANOUT_GAP = 50e-6


class _Blocked:
    """The marker of an attempt that would block."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "BLOCKED"


BLOCKED = _Blocked()


def _credit_is_bookkeeping(core: Core) -> bool:
    """Whether ``core.pipe_credit`` only records credit (emits nothing, wakes nobody
    but senders), so returned credit may wait for the next round."""
    declared = core.credit_only
    if declared is not None:
        return bool(declared)
    method = type(core).pipe_credit
    return method is LoadBalancing.pipe_credit or method is Distributing.pipe_credit


class Round(Generic[PipeT]):
    """The round of :class:`~nanopy.driver.socket_driver.SocketDriver`, its one base
    (see the module docstring): the socket's lock, core and the state every part
    of the driver reaches through it.

    Attributes:
        lock: the socket lock (held only inside a round).
        core: the Sans-I/O protocol core.
        closed: set once by ``close_core``.
        pipes: live pipe drivers by pipe id.
        lane: the sole pipe holding lane credit (written by the lanes part only;
            ``Socket.send`` reads it for its written-out lane send).
        send_q, recv_q: waiters for a send / a receive (the driver makes them once
            its parts exist: their conditions are the lanes' and the runs').
        id_queues: waiters of one request or survey id (woken by READY actions).
        hand_back: the endings part's hand-back of payloads a closed pipe refused.
    """

    # Given by SocketDriver.__init__ once its parts exist (they need the round first).
    send_q: WaitQueue
    recv_q: WaitQueue
    queues: list[WaitQueue]
    hand_back: Callable[[list[bytes]], None]

    def __init__(self, core: Core, name: Callable[[], str], engine: Callable[[], Engine]) -> None:
        self.lock = threading.Lock()
        self.core = core
        self.closed = False
        self.fork_closed = False
        self._name = name
        self._engine = engine
        self.pipes: dict[int, PipeT] = {}
        self.lane: PipeT | None = None
        # Per-caller classic calls: a cooked REQ's recv() waits for *its caller's*
        # reply, so its waiters are keyed by caller (nanopy.core.callers).
        self.caller_q = CallerWaitQueue() if core.per_caller_recv else None
        self.watchers: list[Any] = []  # blocked polls, woken after any change (nanopy.socket.poller)
        self.id_queues: dict[int, WaitQueue] = {}
        self.timers: Timers | None = None
        # Starts an engine task in the socket's task tree (set by the Socket).
        self.spawn_task: Callable[..., None] | None = None
        self._due: deque[tuple[int, int]] = deque()
        self._lazy_credit = _credit_is_bookkeeping(core)
        self._relazy = False  # _lazy_credit is off while the core holds requeued payloads
        self.fanout_end = 0.0  # when the last round that wrote to several pipes ended
        # counters (stats); drops are counted by reason in ``core.drops``, under the lock
        self.sent = self.received = self.bytes_sent = self.bytes_received = 0
        self.requeued = 0  # messages the core took back from ending pipes (never written)
        self.resent = 0  # ... and those it took back that the peer's kernel had not acknowledged

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

    def count_drop(self, reason: str, n: int = 1, pid: int | None = None) -> None:
        """Count ``n`` messages dropped for ``reason`` (a name of nanopy.core.drops), on
        pipe ``pid`` if given: the engine side's drops (a pipe found dead, a message
        too large). Takes the socket lock: call it holding neither that lock nor a
        pipe's (the lock order is socket, then pipe)."""
        if n > 0:
            with self.lock:
                self.core.count_drop(reason, n, pid)

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
                driver = pipes.get(action[1])
                if burst and driver is not None:
                    # A fan-out burst: this and the TRANSMITs after it are queued
                    # (and batched) in one tight loop, on the pipe side (PipeHandle.fan_out).
                    handled, gone, credit = driver.fan_out(pipes, actions, i - 1)
                    i += handled - 1
                    transmits += handled - len(gone)
                    if gone:
                        self.hand_back(gone)
                    for pid, n in credit:
                        more = self._credit_back(pid, n)
                        if more:
                            actions.extend(more)
                    continue
                if driver is None:
                    self.hand_back([action[2]])  # (removed since the round that chose it)
                    continue
                transmits += 1
                # Not a burst: the pipe judges idle vs burst by itself (a lone
                # pipe's ping-pong is written directly).
                done = driver.transmit(action[2])
                if done:
                    if done < 0:  # (closed since the round that chose it)
                        self.hand_back([action[2]])
                        continue
                    more = self._credit_back(action[1], done)
                    if more:
                        actions.extend(more)
            elif kind == RESUME_READ:
                driver = pipes.get(action[1])
                if driver is not None:
                    driver.reader.resume()
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

    def deliver(self, pid: int, payloads: list[bytes], size: int = -1) -> bool:
        """Payloads read from pipe ``pid`` (``size``: their bytes, -1 if not known);
        False = stop reading it for now.

        A full queue pauses the pipe (``PipeReader.paused``) in this same round,
        so the RESUME_READ of any later round comes after it.
        """
        if size < 0:  # (outside the lock; an in-memory pipe knows it from its sender)
            size = sum(map(len, payloads))
        with self.lock:
            keep = self.take_delivery(pid, payloads, size)
            actions = self._drain()
        if actions:
            self.execute(actions)
        return keep

    def take_delivery(self, pid: int, payloads: list[bytes], size: int) -> bool:
        """Hand the core ``payloads`` (``size`` bytes) read from pipe ``pid`` and count
        them on the pipe, pausing it if the core's queue is full (lock held: the
        engine's delivery and a direct read's round alike). False: stop reading."""
        keep = self.core.messages_received(pid, payloads)
        pipe = self.pipes.get(pid)
        if pipe is not None:
            pipe.reader.count_delivery(len(payloads), size, not keep)
        return keep

    def pipe_view(self, pipe: PipeHandle) -> tuple[int, int, int, int]:
        """``(dropped, queued_in, rx_msgs, rx_bytes)`` of one pipe (``PipeHost``), in
        one locked look: what the core dropped and queues for it, what it read."""
        with self.lock:
            info = self.core.pipes.get(pipe.pid)
            reader = pipe.reader
            if info is None:
                return 0, 0, reader.rx_msgs, reader.rx_bytes
            return info.dropped, self.core.queued(pipe.pid), reader.rx_msgs, reader.rx_bytes

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

    def pipe_drivers(self) -> Iterator[PipeT]:
        return iter(list(self.pipes.values()))
