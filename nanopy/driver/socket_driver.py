"""The socket driver: the one owner of a socket's lock, core, waiters and actions.

:class:`SocketDriver` is put together from parts, each in its own module with a
header that says what it owns and what it may call:

=====================  ==================================================================
``nanopy/driver/round.py``   :class:`~nanopy.driver.round.Round`: the lock, folding credit due, the
                       drain and wake pass, ``execute``; ``feed``/``inspect``/``_attempt``;
                       the engine's inputs (``deliver``, ``credit``, ``timer_fired``)
``nanopy/driver/lanes.py``   :class:`~nanopy.driver.lanes.SendLanes`: the sole-pipe and fan-out send
                       lanes, the flush round, the send fast path ``try_send``
``nanopy/driver/endings.py`` :class:`~nanopy.driver.endings.PipeEndings`: a pipe found dead
                       leaves the core at once; what it never wrote goes back first
``nanopy/driver/runs.py``    :class:`~nanopy.driver.runs.ReceiveRuns`: receive runs and the receive
                       fast path ``try_recv_body``
``nanopy/driver/direct.py``  :class:`~nanopy.driver.direct.DirectRead`: a receiver reads the only
                       pipe in its own thread (nanopy.platform's waker and ready wait)
``nanopy/driver/waiting.py`` :class:`~nanopy.driver.waiting.Waiting`: blocking and async calls, their
                       checkpoints and timeouts
``nanopy/driver/ids.py``     :class:`~nanopy.driver.ids.PerIds`: one wait queue per request/survey id
this module            state set-up, pipes coming and going, the synchronous half of close
=====================  ==================================================================

The parts are mixins of one object rather than helper objects: the fast paths
read a dozen attributes of the driver per message, and one instance keeps each
of them one ``self.x`` away (a helper object would add an attribute hop, or
copies that must be kept in step). Every part derives from ``Round`` and
declares the attributes it owns; only ``Round`` takes the lock around a call
into the core, the others go through its rounds or hold the lock the same way.

Only these modules touch ``core`` and ``lock``; the socket, the REQ/SURVEYOR
conveniences, devices and Spark go through the methods here.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._seam import PipeT
from ..core.base import CANCEL_TIMER, Core, PipeInfo
from ..core.callers import CallerWaitQueue
from ..core.drops import DEAD_PIPE
from .direct import DirectRead
from .endings import PipeEndings
from .ids import PerIds
from .lanes import FAN_MIN, LANE_MAX, SendLanes
from .round import BLOCKED, FANOUT_GAP, Round, _Blocked, _credit_is_bookkeeping
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


class SocketDriver(PipeEndings[PipeT], ReceiveRuns[PipeT], Waiting[PipeT], PerIds[PipeT]):
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
        self.pipes = {}
        self._lanes = core.send_lane
        self.lane = None  # the sole pipe holding lane credit
        # The fan-out lane (see the module docstring), all under ``lock``.
        self._fans = core.fan_lane
        self._fan_credit = 0  # sends the lane may still take
        self._fan_pipes = []  # its member pipes
        self._fan_out = []  # bodies taken, not yet handed to the pipes
        self._fan_bytes = 0
        self.send_q = WaitQueue(self.writable if self._lanes or self._fans else core.can_send)
        # Per-caller classic calls: a cooked REQ's recv() waits for *its caller's*
        # reply, so its waiters are keyed by caller (nanopy.core.callers).
        self.caller_q = CallerWaitQueue() if core.per_caller_recv else None
        # Runs: cores whose receive is a plain ordered pop of bodies (body_queue).
        body_queue = self._body_queue = core.body_queue
        self.run = body_queue.run if body_queue is not None else deque()
        self.run_token = None  # the pipe token of the bodies in ``run`` (recv_msg)
        self.held = deque()  # a multipart message a plain recv() refused, first in line (runs.py)
        readable = self.readable if body_queue is not None else core.can_recv
        self.recv_q = self.caller_q or WaitQueue(readable)  # type: ignore[assignment]
        self.queues = [self.send_q, self.recv_q]
        self.watchers = []  # blocked polls, woken after any change (nanopy.socket.poller)
        self.id_queues = {}
        self.timers = None
        # Starts an engine task in the socket's task tree (set by the Socket).
        self.spawn_task = None
        self._waker_box = [None]  # wakes a thread that reads a pipe directly
        self._direct_users = 0  # threads and tasks inside a direct receive
        self._wait_cache = None  # (pid, ready wait) of the direct reader
        self._due = deque()
        self._lazy_credit = _credit_is_bookkeeping(core)
        self._relazy = False  # _lazy_credit is off while the core holds requeued payloads
        self.fanout_end = 0.0  # when the last round that wrote to several pipes ended
        # Pipes holding what a fan-out burst queued, written by one flush round.
        self._flush_lock = threading.Lock()
        self._flush_pipes = []
        self._flush_armed = False
        self._flush_due = 0.0  # when the armed round's oldest payload has waited MAX_HOLD
        # counters (stats); drops are counted by reason in ``core.drops``, under the lock
        self.sent = self.received = self.bytes_sent = self.bytes_received = 0
        self.requeued = self.resent = 0

    # -- engine inputs ---------------------------------------------------------------
    def add_pipe(self, driver: PipeT, info: PipeInfo, credit: int, multipart: bool = False) -> bool:
        """A pipe is up; False if the socket closed meanwhile. ``multipart``: its
        transport carries multipart messages (``Transport.carries_multipart``)."""
        with self.lock:
            if self.closed:
                return False
            self.pipes[info.id] = driver
            if multipart and self._body_queue is not None:
                self._body_queue.stops.add(info.id)  # (its runs end before a multipart message)
            self._revoke_lane()  # (two pipes share sends message by message)
            self.core.add_pipe(info, credit)
            if driver.closed:
                self._end_pipe(driver)  # (closed while it was being added)
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
            if (self.lane is not None and self.lane.pid == pid) or self._fan_pipes:
                self._revoke_lane()
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
            return self._take_back(orphans or [], pid, resent)

        return self.feed(remove, check_open=False)

    # -- closing (the synchronous half) ---------------------------------------------------------
    def close_core(self) -> bool:
        """Mark closed, close the core, wake every waiter. False if already closed."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            self._due.clear()
            self.run.clear()
            self.held.clear()
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
        """In a forked child: the engine serving this socket is gone, and every waiter
        is a parent's thread or loop. Closed for good without waking anyone, the parent's
        pipes forgotten (this process's copies of their sockets are closed by
        nanopy/_fork.py), the direct-read descriptors' copies closed, locks new."""
        self.closed = True
        self.fork_closed = True
        self.lock = threading.Lock()
        self._flush_lock = threading.Lock()
        for queue in (*self.queues, *self.id_queues.values()):
            queue.forget_all()
        self.id_queues = {}
        self.watchers = []
        self.timers = None
        self.pipes = {}
        self.lane = None
        self._fan_pipes, self._fan_out, self._flush_pipes = [], [], []
        self.run.clear()
        self.held.clear()
        self._due.clear()
        self._direct_users = 0
        self._close_direct_fds()
