"""The queues cores are built from: :class:`FairQueue` (inbound, per pipe) and
:class:`LoadBalancer` (outbound credit, per pipe), both by priority with round
robin within one (nanomsg's fair queue and load balancer).

Sans-I/O like the cores that own them (nanopy/core/base.py): no I/O, no clock. One
exception, stated in :class:`FairQueue`: its ``run`` deque is popped by receivers
without the socket lock, from the other end than this module ever pops it.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

from .actions import RESUME_READ, Action
from .errors import WouldBlock
from .priolist import PrioList


class FairQueue:
    """Per-pipe inbound queues served by priority, round robin within a priority.

    Items are opaque (a core may queue Messages or raw payloads); after ``pop``,
    ``last_pid`` names the pipe the item came from.

    ``run`` holds bodies that :meth:`take_run` took out of pipe ``run_pid``'s queue
    and the engine has not handed to the user yet (it serves them before taking
    again). They still count against that pipe's ``recv_buffer``, and they go
    back to the front of that queue as soon as another pipe has a message, so
    priorities and round robin stay per message (``given_back`` counts them).

    ``stops`` names the pipes whose items may be of another class than ``bytes``
    (multipart messages, on transports that carry them): their runs end before
    such an item, which is handed out alone, so a receiver popping ``run``
    without looking at its items only ever gets ``bytes``. Other pipes pay one
    set test per run, nothing per item.

    ``run`` is the one object here shared beyond the socket lock, and its two ends
    have two owners: receivers (nanopy/driver/runs.py, nanopy/socket/messaging.py) take from
    the *left* with ``popleft``, with or without the lock; this class, always
    under the socket lock (it is a core input), only ever takes from the *right*
    (``give_back_run``) and only fills it while it is empty (``take_run``, whose
    caller extends it). A deque's ``popleft`` and ``pop`` are each atomic, so
    every body goes to exactly one of them: a receiver gets it, or it goes back to
    its pipe's queue -- never both, never lost (tests/test_driver_oracle.py
    checks the orders and the race).
    """

    __slots__ = (
        "_actions",
        "_options",
        "_paused",
        "_priority",
        "_queues",
        "ready",
        "last_pid",
        "run",
        "run_pid",
        "stops",
        "given_back",
        "given_back_bytes",
    )

    def __init__(self, actions: list[Action], options: Any) -> None:
        self._queues: dict[int, deque[Any]] = {}
        self.ready: PrioList[int] = PrioList()
        self._paused: set[int] = set()
        self._actions = actions
        self._options = options
        self._priority: dict[int, int] = {}
        self.last_pid = 0
        self.run: deque[Any] = deque()
        self.run_pid = 0
        self.stops: set[int] = set()  # (see the class docstring)
        self.given_back = self.given_back_bytes = 0  # bodies a run returned to its queue

    def add(self, pid: int, priority: int) -> None:
        self._queues[pid] = deque()
        self._priority[pid] = priority

    def remove(self, pid: int) -> None:
        """Forget the pipe and anything it had queued."""
        self._queues.pop(pid, None)
        self._priority.pop(pid, None)
        self.ready.deactivate(pid)
        self._paused.discard(pid)
        self.stops.discard(pid)

    def retire(self, pid: int) -> bool:
        """The pipe is gone; what it queued stays readable. True if anything is queued.

        The queue is dropped once ``pop`` drains it.
        """
        self._priority.pop(pid, None)
        self._paused.discard(pid)
        if self._queues.get(pid):
            return True  # (it stays in ``stops`` until its queue drains)
        self._queues.pop(pid, None)
        self.ready.deactivate(pid)
        self.stops.discard(pid)
        return False

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` (live or retired) still has a queue here."""
        return pid in self._queues

    def push(self, pid: int, msgs: list[Any]) -> bool:
        """Queue messages from ``pid``; False means stop reading that pipe."""
        q = self._queues.get(pid)
        priority = self._priority.get(pid)
        if q is None or priority is None:  # unknown or retired pipe
            return False
        run = self.run
        if msgs:
            if run and self.run_pid != pid:  # (give_back_run's own test, spared its call)
                self.give_back_run(pid)
            q.extend(msgs)
        if q:
            self.ready.activate(pid, priority)
        if len(q) + (len(run) if pid == self.run_pid else 0) < self._options.recv_buffer:  # (in_run)
            return True  # (the common case: no further call)
        return self.overfilled(pid, q, len(msgs))

    def overfilled(self, pid: int, q: deque[Any], arrived: int) -> bool:
        """``pid``'s queue ``q`` (with its run) holds ``recv_buffer`` items or more,
        ``arrived`` of them new. Here: pause the pipe (False: stop reading it).
        A subclass may trim ``q`` instead and keep reading (and must deactivate
        ``pid`` if it empties ``q``)."""
        self._paused.add(pid)
        return False

    def give_back_run(self, arriving: int) -> None:
        """Pipe ``arriving`` has messages: if the run is another pipe's, put what is
        left of it back at the front of that pipe's queue (fair queueing decides
        per message again). A retired pipe's run stays: its bodies are older than
        anything new."""
        run = self.run
        pid = self.run_pid
        if not run or pid == arriving:
            return
        priority = self._priority.get(pid)
        q = self._queues.get(pid)
        if priority is None or q is None:
            return
        pop, put = run.pop, q.appendleft
        n = size = 0
        while True:
            try:
                body = pop()  # (from the right: a receiver may be popping the left)
            except IndexError:
                break
            put(body)
            n += 1
            size += len(body)
        if q:
            self.ready.activate(pid, priority)
        self.given_back += n
        self.given_back_bytes += size

    def in_run(self, pid: int) -> int:
        """How many of ``pid``'s items wait in ``run``."""
        return len(self.run) if pid == self.run_pid else 0

    def pop(self) -> Any:
        # The hot path of every receive: one PrioList call (take = current +
        # advance; advancing past a pipe whose queue then empties is harmless,
        # deactivate puts the cursor where it belongs), one deque pop.
        pid = self.ready.take()
        if pid is None:
            raise WouldBlock
        q = self._queues[pid]
        msg = q.popleft()
        if not q:
            self.ready.deactivate(pid)
            if pid not in self._priority:  # a retired pipe's queue has drained
                del self._queues[pid]
                self.stops.discard(pid)
        paused = self._paused
        if paused and pid in paused and len(q) <= self._options.recv_buffer // 2:
            paused.discard(pid)
            self._actions.append((RESUME_READ, pid))
        self.last_pid = pid
        return msg

    def hand_over(self, pid: int, msgs: list[Any]) -> Any:
        """``push(pid, msgs)`` then ``take_run`` in one step, when that pair would
        give back exactly the one message of ``msgs`` and leave every queue as it
        found it: nothing queued, no run, a live pipe that is not paused, room for
        one, and a plain ``bytes`` item (never a multipart message). Returns that
        message, or None -- then nothing changed and the caller pushes as usual."""
        if len(msgs) != 1 or self.ready.best or self.run or pid not in self._priority or pid in self._paused:
            return None
        msg = msgs[0]
        if msg.__class__ is not bytes or self._options.recv_buffer < 2:
            return None  # (a buffer of one pauses and resumes the pipe: the long way)
        # (an activate then deactivate of an empty priority slot: the list unchanged)
        self.last_pid = self.run_pid = pid
        return msg

    def take_run(self, limit: int) -> list[Any]:
        """The next items in order: up to ``limit`` at once when one pipe alone has
        any queued, else one (so fair queueing between pipes stays per message).

        The engine serves the rest of a run (``run``, ``run_pid``) before it takes
        again; raises WouldBlock when nothing is queued.
        """
        ready = self.ready
        # (at most half the buffer, so a paused pipe resumes once its run is out)
        limit = min(limit, self._options.recv_buffer // 2)
        if len(ready) != 1 or limit < 2:
            return [self.pop()]
        pid: int = ready.take()  # type: ignore[assignment]  # (the only one)
        q = self._queues[pid]
        if self.stops and pid in self.stops:
            limit = _plain_prefix(q, limit)
        if len(q) <= limit:
            items = list(q)
            q.clear()
            ready.deactivate(pid)
            if pid not in self._priority:  # a retired pipe's queue has drained
                del self._queues[pid]
                self.stops.discard(pid)
        else:
            items = list(map(_POPLEFT, itertools.repeat(q, limit)))  # (no bytecode per item)
        paused = self._paused
        if paused and pid in paused and len(q) <= self._options.recv_buffer // 2:
            paused.discard(pid)
            self._actions.append((RESUME_READ, pid))
        self.last_pid = self.run_pid = pid
        return items

    def __bool__(self) -> bool:
        return self.ready.best != 0  # (the hot paths test ``ready.best`` themselves: no call)

    def queued(self, pid: int | None = None) -> int:
        """Items queued (of pipe ``pid``, or all), a run not handed out included."""
        if pid is not None:
            return len(self._queues.get(pid, ())) + self.in_run(pid)
        return sum(len(q) for q in self._queues.values()) + len(self.run)


class LoadBalancer:
    """Per-pipe send credits; picks the best-priority pipe that can take a message."""

    __slots__ = ("_credit", "_priority", "_ready")

    def __init__(self) -> None:
        self._credit: dict[int, int] = {}
        self._ready: PrioList[int] = PrioList()
        self._priority: dict[int, int] = {}

    def add(self, pid: int, priority: int, credit: int) -> None:
        self._credit[pid] = credit
        self._priority[pid] = priority
        if credit > 0:
            self._ready.activate(pid, priority)

    def remove(self, pid: int) -> None:
        self._credit.pop(pid, None)
        self._priority.pop(pid, None)
        self._ready.deactivate(pid)

    def give(self, pid: int, n: int) -> None:
        c = self._credit.get(pid)
        if c is None:
            return
        self._credit[pid] = c + n
        if c <= 0 < c + n:
            self._ready.activate(pid, self._priority[pid])

    def take(self) -> int | None:
        """Consume one credit of the pipe to use next; None if none can send."""
        pid = self._ready.take()
        if pid is None:
            return None
        c = self._credit[pid] - 1
        self._credit[pid] = c
        if c <= 0:
            self._ready.deactivate(pid)
        return pid

    def take_sole(self, limit: int) -> tuple[int, int] | None:
        """Up to ``limit`` credits of the only pipe at once: ``(pid, n)``; None when
        there are several pipes (round robin stays per message) or no credit."""
        credit = self._credit
        if len(credit) != 1:
            return None
        ((pid, c),) = credit.items()
        if c <= 0:
            return None
        n = min(c, limit)
        credit[pid] = c - n
        if c <= n:
            self._ready.deactivate(pid)
        return pid, n

    def take_other(self, avoid: int | None) -> int | None:
        """Like :meth:`take`, but not pipe ``avoid`` while another pipe can send
        (a resend tries somewhere else: the last pipe may be the problem)."""
        pid = self.take()
        if pid is None or pid != avoid:
            return pid
        others = [p for p in self._ready.active() if p != avoid]
        if not others:
            return pid
        self.give(pid, 1)
        best = min(others, key=self._priority.__getitem__)
        self.take_pipe(best)
        return best

    def take_pipe(self, pid: int) -> bool:
        """Consume one credit of a specific pipe; False if it cannot send now."""
        c = self._credit.get(pid, 0)
        if c <= 0:
            return False
        self._credit[pid] = c - 1
        if c == 1:
            self._ready.deactivate(pid)
        return True

    def ready(self) -> list[int]:
        return self._ready.active()

    def __contains__(self, pid: int) -> bool:
        return pid in self._credit

    def __bool__(self) -> bool:
        return bool(self._ready)


_POPLEFT = deque.popleft


def _plain_prefix(q: deque[Any], limit: int) -> int:
    """How many of ``q``'s first items a run may take: up to ``limit``, stopping
    before the first that is not exactly ``bytes``, which goes alone (at least 1)."""
    for i, item in enumerate(itertools.islice(q, limit)):
        if item.__class__ is not bytes:
            return i or 1
    return limit
