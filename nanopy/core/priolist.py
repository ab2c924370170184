"""Priority lists: nanomsg's priolist, the basis of load balancing and fair queueing.

Sixteen slots (priority 1 = most preferred ... 16). Each slot keeps its *active*
pipes in round-robin order. ``current()`` is the next pipe of the most preferred
non-empty slot; ``advance()`` moves that slot's cursor on. Used by

* load balancing (PUSH, REQ): active = the pipe can take a message now;
* fair queueing (PULL, REP, ...): active = the pipe has a message waiting.

Pure data structure: no I/O, no locks.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

NUM_PRIORITIES = 16
DEFAULT_PRIORITY = 8


class PrioList(Generic[K]):
    __slots__ = ("_slots", "_cursor", "_where", "best")

    def __init__(self) -> None:
        self._slots: list[list[K]] = [[] for _ in range(NUM_PRIORITIES + 1)]
        self._cursor = [0] * (NUM_PRIORITIES + 1)
        self._where: dict[K, int] = {}  # active pipe -> its priority
        # Most preferred non-empty priority; 0 = none active. Public: a receive's hot
        # path tests ``best`` for "anything queued?" without a __bool__ call.
        self.best = 0

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, pid: K) -> bool:
        return pid in self._where

    def __bool__(self) -> bool:
        return self.best != 0

    def activate(self, pid: K, priority: int) -> None:
        """Make ``pid`` eligible (no-op if it already is)."""
        if pid in self._where:
            return
        self._where[pid] = priority
        slot = self._slots[priority]
        # Insert just before the cursor so it is served after the others in turn.
        cur = self._cursor[priority]
        slot.insert(cur, pid)
        if len(slot) > 1:
            self._cursor[priority] = cur + 1
        else:
            self._cursor[priority] = 0
        if self.best == 0 or priority < self.best:
            self.best = priority

    def deactivate(self, pid: K) -> None:
        """Make ``pid`` ineligible (no-op if it is not active)."""
        priority = self._where.pop(pid, None)
        if priority is None:
            return
        slot = self._slots[priority]
        i = slot.index(pid)
        del slot[i]
        cur = self._cursor[priority]
        if i < cur:
            cur -= 1
        if cur >= len(slot):
            cur = 0
        self._cursor[priority] = cur
        if not slot and priority == self.best:
            # (none active at all: no slot to scan for -- a sole pipe's queue emptying)
            self.best = self._next_best(priority) if self._where else 0

    def current(self) -> K | None:
        """The pipe to use now, or ``None`` when no pipe is active."""
        best = self.best
        if not best:
            return None
        return self._slots[best][self._cursor[best]]

    def take(self) -> K | None:
        """``current()`` then ``advance()`` in one call (the load balancer's hot path)."""
        best = self.best
        if not best:
            return None
        slot = self._slots[best]
        cursor = self._cursor
        c = cursor[best]
        pid = slot[c]
        c += 1
        cursor[best] = c if c < len(slot) else 0
        return pid

    def advance(self) -> None:
        """Move the current slot's round-robin cursor to its next pipe."""
        best = self.best
        if best:
            n = len(self._slots[best])
            c = self._cursor[best] + 1
            self._cursor[best] = c if c < n else 0

    def active(self) -> list[K]:
        return list(self._where)

    def _next_best(self, after: int) -> int:
        slots = self._slots
        for p in range(after + 1, NUM_PRIORITIES + 1):
            if slots[p]:
                return p
        for p in range(1, after):
            if slots[p]:
                return p
        return 0
