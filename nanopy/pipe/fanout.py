"""Batching across a burst: waiting out a burst of sends, and a fan-out round's queueing.

Owns: ``wait_out_burst`` (how long a flush waits while sends go on: the pipe's
writer task and the socket's flush round both use it) and ``queue_fan_out`` (the
publisher's per-pipe, per-message cost in a fan-out burst round: a function the
socket's round calls, not a method of one pipe).

May call: the pipe drivers' ``lock``/``outbox``/``transmit``.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import trio

from ..core.base import TRANSMIT

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ..core.base import Action
    from .driver import PipeDriver

# The writer task's first wait before flushing a partial batch left by a burst.
FLUSH_DELAY = 200e-6
# No queued message waits longer than this for the writer task.
MAX_HOLD = 1e-3


async def wait_out_burst(
    progress: Callable[[], int],
    due: Callable[[], float | None],
    now: Callable[[], float],
    write_now: Callable[[], bool] = lambda: False,
) -> None:
    """Wait while a burst of sends goes on, so what it leaves is written in one go.

    Sleeps ``FLUSH_DELAY``, doubling up to ``MAX_HOLD`` (a long burst costs few
    wake-ups), as long as ``progress()`` (a send count) moved during each sleep.
    Returns once it did not, once ``due()`` has come -- when the oldest waiting
    payload has waited ``MAX_HOLD``, on the ``now`` clock (None: nothing waits) --
    or when ``write_now()`` says so after a sleep.
    """
    delay = FLUSH_DELAY
    while True:
        seen = progress()
        wait = delay
        deadline = due()
        if deadline is not None:
            wait = min(delay, deadline - now())
            if wait <= 0:
                return
        await trio.sleep(wait)
        if progress() == seen or write_now():
            return
        delay = min(delay * 2, MAX_HOLD)


def queue_fan_out(
    pipes: Mapping[int, PipeDriver], actions: list[Action], start: int = 0
) -> tuple[int, list[bytes], list[tuple[int, int]]]:
    """Queue the TRANSMITs of a fan-out burst round from ``actions[start]`` on
    their pipes (``SocketDriver.execute``), in one loop.

    A function over all the round's pipes rather than a method of one pipe: one
    loop over them (each pipe touched only under its own lock, as its own methods
    do) saves a Python call per pipe per message, the publisher's hottest cost.

    This is the publisher's cost per pipe per message: a pipe whose outbox holds
    part of the burst and is not due yet only appends, under its lock; others go
    through ``transmit(payload, idle=False)``. Pipes that fall due in this round
    share one framed chunk. Returns how many actions were handled (up to the
    first that is not a TRANSMIT), the payloads of pipes that are gone or closed
    (to hand back), and the credit (pipe id, messages) the writes made here give back.
    """
    credit: list[tuple[int, int]] = []
    framed: dict[Any, tuple[list[bytes], Any]] = {}
    gone: list[bytes] = []
    handled = 0
    for action in itertools.islice(actions, start, None):
        if action[0] is not TRANSMIT:
            break
        handled += 1
        driver = pipes.get(action[1])
        if driver is None:
            gone.append(action[2])
            continue
        lock = driver.lock
        lock.acquire()
        try:
            outbox = driver.outbox
            if outbox and len(outbox) + 1 < driver.flush_at:
                outbox.append(action[2])
                continue  # (the lock is released on the way)
        finally:
            lock.release()
        done = driver.transmit(action[2], False, framed)
        if done:
            if done > 0:
                credit.append((action[1], done))
            else:
                gone.append(action[2])  # (closed)
    return handled, gone, credit
