"""Per-caller state for the classic REQ/REP/RESPONDENT calls.

nanopy has no context objects: threads (and trio/asyncio tasks) that share one
socket through classic ``send``/``recv`` each get their own request state. The
*caller* is the current trio or asyncio task in async code, else the current
thread. Cores read it only while serving a user call (``send``/``recv``), which
runs under the socket lock on the caller's own thread, so the answer is exact.

* :func:`current_caller` names the caller.
* :class:`PerCaller` maps callers to one value each (a REP's pending route, a
  REQ's classic request id); a caller that ends (a finished thread or task)
  drops its entry, so nothing leaks.
* :class:`CallerWaitQueue` parks callers keyed by who they are and wakes exactly
  the one a core names with ``(READY_CALLER, caller)`` (a REQ whose reply
  arrived), where a plain :class:`~nanopy.driver.waiters.WaitQueue` would wake
  whoever waited longest.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from sniffio import thread_local as _sniffio
from trio.lowlevel import current_task as _trio_task

_current_thread = threading.current_thread

T = TypeVar("T")


def current_caller() -> Any:
    """The calling trio/asyncio task in async code, else the calling thread.

    On the hot path of every classic REQ/REP call, so written for speed: trio
    marks its threads in ``sniffio.thread_local``; an asyncio loop can only be
    running if asyncio was imported.
    """
    if _sniffio.name == "trio":
        try:
            return _trio_task()
        except RuntimeError:  # trio's own callbacks, outside any task
            pass
    else:
        aio = sys.modules.get("asyncio")
        if aio is not None and aio._get_running_loop() is not None:
            task = aio.current_task()
            if task is not None:
                return task
    return _current_thread()


class PerCaller(Generic[T]):
    """One value per caller (lock held by the user: the core runs under the socket lock)."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        # Weak keys: the entry of a thread or task that is gone disappears with it.
        self._values: weakref.WeakKeyDictionary[Any, T] = weakref.WeakKeyDictionary()

    def get(self, caller: Any = None) -> T | None:
        return self._values.get(current_caller() if caller is None else caller)

    def set(self, value: T, caller: Any = None) -> None:
        self._values[current_caller() if caller is None else caller] = value

    def pop(self, caller: Any = None) -> T | None:
        return self._values.pop(current_caller() if caller is None else caller, None)

    def discard_value(self, value: T) -> None:
        """Forget ``value`` whichever caller holds it (e.g. answered from elsewhere)."""
        for caller, held in list(self._values.items()):
            if held is value:
                del self._values[caller]

    def items(self) -> Iterator[tuple[Any, T]]:
        return iter(list(self._values.items()))

    def clear(self) -> None:
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)


class CallerWaitQueue:
    """Waiters keyed by caller: a wake reaches exactly the callers the core names.

    Stands where a :class:`~nanopy.driver.waiters.WaitQueue` would (the driver's
    ``recv_q``), but is never woken by the general wake pass (``waiters`` is
    always empty): the driver calls :meth:`wake_caller` for each
    ``(READY_CALLER, caller)`` action. A caller parks at most one waiter at a time.
    """

    __slots__ = ("_parked",)

    #: nobody is woken in turn: wakes are keyed (see :meth:`wake_caller`)
    waiters: tuple[Any, ...] = ()

    def __init__(self) -> None:
        self._parked: dict[Any, Any] = {}

    def park(self, waiter: Any) -> None:
        """Register ``waiter`` for the current caller (lock held, on the caller's thread)."""
        self._parked[current_caller()] = waiter

    def wake_caller(self, caller: Any) -> None:
        """``caller`` can go on: wake its waiter, if it parked one (lock held)."""
        waiter = self._parked.pop(caller, None)
        if waiter is not None:
            waiter.wake()

    def wake_one(self) -> None:
        """Keyed wakes only (:meth:`wake_caller`); nothing to pass on."""

    def wake_all(self) -> None:
        parked, self._parked = self._parked, {}
        for waiter in parked.values():
            waiter.wake()

    def forget_all(self) -> None:
        """Drop every waiter without waking it (a forked child: see WaitQueue.forget_all)."""
        self._parked = {}

    def abandon(self, waiter: Any) -> None:
        """A waiter gives up (timeout, cancel): a keyed wake is never passed on."""
        for caller, held in list(self._parked.items()):
            if held is waiter:
                del self._parked[caller]
