"""The socket driver: the one owner of a socket's lock, core, waiters and actions.

:class:`SocketDriver` is the round (its one base) holding the other parts, each
an object of its own in its own module, whose header says what it owns and what
it may call:

=====================  ==================================================================
``nanopy/driver/round.py``   :class:`~nanopy.driver.round.Round` (the base): the lock, the core,
                       the counters, folding credit due, the drain and wake pass,
                       ``execute``; ``feed``/``inspect``/``_attempt``; the engine's inputs
                       (``deliver``, ``credit``, ``timer_fired``)
``nanopy/driver/lanes.py``   ``lanes``, :class:`~nanopy.driver.lanes.SendLanes`: the sole-pipe
                       and fan-out send lanes, the flush round, the send fast path ``try_send``
``nanopy/driver/endings.py`` ``endings``, :class:`~nanopy.driver.endings.PipeEndings`: a pipe
                       found dead leaves the core at once; what it never wrote goes back first
``nanopy/driver/runs.py``    ``runs``, :class:`~nanopy.driver.runs.ReceiveRuns`: receive runs and
                       the receive fast path ``try_recv_body``
``nanopy/driver/direct.py``  ``direct``, :class:`~nanopy.driver.direct.DirectRead`: a receiver
                       reads the only pipe in its own thread (nanopy.platform's waker and wait)
``nanopy/driver/waiting.py`` ``waiting``, :class:`~nanopy.driver.waiting.Waiting`: blocking and
                       async calls, their checkpoints and timeouts
``nanopy/driver/ids.py``     ``ids``, :class:`~nanopy.driver.ids.PerIds`: one wait queue per
                       request/survey id
this module            putting them together, pipes coming and going, the synchronous half of close
=====================  ==================================================================

Each part creates its own fields in its own ``__init__`` and is given what it
reaches: the round (this driver, typed as :class:`~nanopy.driver.round.Round`) and,
for two of them, one other part (``endings`` the lanes, ``waiting`` the direct
read). The round knows none of them; the one call it makes into a part
(``hand_back``) it is given here. The calls the socket makes of a part are that
part's bound methods stored on the driver once (``driver.try_send`` is
``driver.lanes.try_send``): a call costs what a method of the driver did.

Only these modules touch ``core`` and ``lock``; the socket, the REQ/SURVEYOR
conveniences, devices and Spark go through the methods here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._seam import PipeT
from ..core.base import CANCEL_TIMER, Core, PipeInfo
from ..core.drops import DEAD_PIPE
from .direct import DirectRead
from .endings import PipeEndings
from .ids import PerIds
from .lanes import FAN_MIN, LANE_MAX, SendLanes
from .round import BLOCKED, FANOUT_GAP, Round, _Blocked
from .runs import RUN_MAX, ReceiveRuns
from .waiters import WaitQueue
from .waiting import Waiting, cancellation_point, checkpoint_after, checkpoint_before, in_trio

if TYPE_CHECKING:
    from ..engine.engine import Engine

__all__ = [
    "BLOCKED",
    "FANOUT_GAP",
    "FAN_MIN",
    "LANE_MAX",
    "RUN_MAX",
    "DirectRead",
    "ReceiveRuns",
    "Round",
    "SendLanes",
    "SocketDriver",
    "Waiting",
    "_Blocked",
    "cancellation_point",
    "checkpoint_after",
    "checkpoint_before",
    "in_trio",
]


class SocketDriver(Round[PipeT]):
    """Owns one socket's protocol core and everything that touches it: the round
    (its base) and the parts ``lanes``, ``runs``, ``endings``, ``direct``,
    ``waiting`` and ``ids`` (see the module docstring).

    Attributes:
        lock: the socket lock (held only inside a round).
        core: the Sans-I/O protocol core.
        closed: set once by :meth:`close_core`.
        pipes: live pipe drivers by pipe id.
        send_q, recv_q: waiters for ``core.can_send()`` / ``core.can_recv()``.
        id_queues: waiters of one request or survey id (woken by READY actions).
        run, held: the runs part's deques (``Socket.recv`` pops ``run`` itself).
    """

    def __init__(self, core: Core, name: Callable[[], str], engine: Callable[[], Engine]) -> None:
        super().__init__(core, name, engine)
        lanes = self.lanes = SendLanes(self)
        runs = self.runs = ReceiveRuns(self)
        endings = self.endings = PipeEndings(self, lanes)
        self.recv_body_attempt = runs.recv_body_attempt  # (one bound method: the direct read knows it)
        direct = self.direct = DirectRead(self, runs)
        waiting = self.waiting = Waiting(self, direct)
        ids = self.ids = PerIds(self)
        self.hand_back = endings.hand_back
        self.send_q = WaitQueue(lanes.send_ready)
        self.recv_q = self.caller_q or WaitQueue(runs.recv_ready)  # type: ignore[assignment]
        self.queues = [self.send_q, self.recv_q]
        # The same objects as the runs part's (never rebound): Socket.recv pops ``run``.
        self.run = runs.run
        self.held = runs.held
        self.nothing_queued = runs.nothing_queued  # (Socket.recv's idle look, without the lock)
        # What the socket, its pipes and the engine call of the parts, bound once.
        self.try_send = lanes.try_send
        self.send_batch = lanes.send_batch
        self.send_attempt = lanes.send_attempt
        self.room_attempt = lanes.room_attempt
        self.writable = lanes.writable
        self.sent_counts = lanes.sent_counts
        self.queued_out = lanes.queued_out
        self.flush_later = lanes.flush_later
        self.try_recv_body = runs.try_recv_body
        self.recv_attempt = runs.recv_attempt
        self.recv_bodies = runs.recv_bodies
        self.bodies_attempt = runs.bodies_attempt
        self.readable = runs.readable
        self.received_counts = runs.received_counts
        self.pipe_ending = endings.pipe_ending
        self.call = waiting.call
        self.acall = waiting.acall
        self.start_id = ids.start_id
        self.forget_id = ids.forget_id
        self.take_attempt = ids.take_attempt

    # -- engine inputs ---------------------------------------------------------------
    def add_pipe(self, driver: PipeT, info: PipeInfo, credit: int, multipart: bool = False) -> bool:
        """A pipe is up; False if the socket closed meanwhile. ``multipart``: its
        transport carries multipart messages (``Transport.carries_multipart``)."""
        with self.lock:
            if self.closed:
                return False
            self.pipes[info.id] = driver
            if multipart:
                self.runs.stop_at_multipart(info.id)
            self.lanes.revoke_lane()  # (two pipes share sends message by message)
            self.core.add_pipe(info, credit)
            if driver.closed:
                self.endings.end_pipe(driver)  # (closed while it was being added)
            actions = self._drain()
        if actions:
            self.execute(actions)
        return True

    def remove_pipe(self, pid: int, orphans: list[bytes] | None = None, resent: int = 0, lost: int = 0) -> int:
        """Pipe ``pid`` is gone (``pipe_ending`` came first); ``orphans``: payloads
        it never wrote that its end did not hand back yet (a write was under way
        then), which a core that can (``Core.requeue``) sends on its other pipes,
        ahead of what waited for them; the rest count as ``dead_pipe`` drops (but
        a REQ's, which it resends itself). The first ``resent`` orphans had reached
        its kernel unacknowledged (nanopy/pipe/resend.py); ``lost`` more did and
        are not sent again: ``dead_pipe`` drops. Returns how many it took."""

        def remove() -> int:
            self.lanes.revoke_for(pid)
            del self.pipes[pid]
            core = self.core
            if lost:
                core.count_drop(DEAD_PIPE, lost, pid)
            core.remove_pipe(pid)  # credit still due to it is ignored by the core
            if self.recv_q.waiters:
                self.recv_q.wake_all()  # a thread reading this pipe directly looks again
            if self.closed:
                if orphans:
                    core.count_drop(DEAD_PIPE, len(orphans))
                return 0
            # (what it does not take, it counts as dropped; with none, a core that
            # held sends for this pipe's rest lets them go)
            return self.endings.take_back(orphans or [], pid, resent)

        return self.feed(remove, check_open=False)

    # -- closing (the synchronous half) ---------------------------------------------------------
    def close_core(self) -> bool:
        """Mark closed, close the core, wake every waiter. False if already closed."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            self._due.clear()
            self.runs.forget()
            self.lanes.revoke_lane()
            self.core.close()
            actions = self.core.actions.copy()
            self.core.actions.clear()
            for queue in self.queues:
                queue.wake_all()
            for queue in list(self.id_queues.values()):
                queue.wake_all()
            self.notify_watchers()  # a blocked poll raises Closed
            if not self.direct.users:
                self.direct.close_fds()
        # Only timer cancellations matter now; pipes are closed by the caller.
        for action in actions:
            if action[0] == CANCEL_TIMER and self.timers is not None:
                self.timers.cancel(action[1])
        if self.timers is not None:
            self.timers.stop()
        return True

    def forked(self) -> None:
        """In a forked child: the engine serving this socket is gone, and every waiter
        is a parent's thread or loop. Closed for good without waking anyone, the parent's
        pipes forgotten (this process's copies of their sockets are closed by
        nanopy/_fork.py), the direct-read descriptors' copies closed, locks new."""
        self.closed = True
        self.fork_closed = True
        self.lock = threading.Lock()
        for queue in (*self.queues, *self.id_queues.values()):
            queue.forget_all()
        self.id_queues = {}
        self.watchers = []
        self.timers = None
        self.pipes = {}
        self.lane = None
        self.lanes.forked()
        self.runs.forget()
        self._due.clear()
        self.direct.users = 0
        self.direct.close_fds()
