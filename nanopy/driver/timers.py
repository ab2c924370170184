"""Per-socket timers for protocol cores (ARM_TIMER / CANCEL_TIMER actions).

``arm`` and ``cancel`` may be called from any thread. One engine task sleeps until
the earliest deadline; it is woken only when a new deadline comes before the one
it sleeps for, so arming a later timer (the usual case) costs no trio hop.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from typing import Any

import trio


class Timers:
    def __init__(self, engine: Any, fire: Callable[[Any], None], spawn: Callable[..., None] | None = None) -> None:
        self._engine = engine
        self._spawn = spawn or engine.spawn  # the socket's task tree, where there is one
        self._fire = fire
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, Any]] = []
        self._deadline: dict[Any, float] = {}
        self._seq = itertools.count()
        self._sleeping_until = float("inf")
        self._event: trio.Event | None = None
        self._started = False
        self._stopped = False

    def arm(self, key: Any, delay: float) -> None:
        deadline = self._engine.now() + delay
        with self._lock:
            if self._stopped:
                return
            self._deadline[key] = deadline
            heapq.heappush(self._heap, (deadline, next(self._seq), key))
            start = not self._started
            self._started = True
            wake = self._event if deadline < self._sleeping_until else None
            if wake is not None:
                self._event = None
        if start:
            self._spawn(self._run)
        elif wake is not None:
            self._engine.run_soon(wake.set)

    def cancel(self, key: Any) -> None:
        with self._lock:
            self._deadline.pop(key, None)  # the heap entry is skipped when it surfaces

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._heap.clear()
            self._deadline.clear()
            event, self._event = self._event, None
        if event is not None:
            self._engine.call_soon(event.set)

    def _due(self) -> tuple[list[Any], float]:
        now = self._engine.now()
        due = []
        with self._lock:
            heap = self._heap
            while heap and heap[0][0] <= now:
                deadline, _, key = heapq.heappop(heap)
                if self._deadline.get(key) == deadline:
                    del self._deadline[key]
                    due.append(key)
            while heap and self._deadline.get(heap[0][2]) != heap[0][0]:
                heapq.heappop(heap)  # drop cancelled or re-armed entries
            nxt = heap[0][0] if heap else float("inf")
            self._sleeping_until = nxt
            self._event = trio.Event()
        return due, nxt

    async def _run(self) -> None:
        while not self._stopped:
            due, nxt = self._due()
            for key in due:
                self._fire(key)
            if due:
                continue
            event = self._event
            with trio.move_on_at(trio.current_time() + max(0.0, nxt - self._engine.now())):
                await event.wait()  # type: ignore[union-attr]
