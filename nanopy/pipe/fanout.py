"""A fan-out round's queueing: the TRANSMITs of a publisher's burst, on all its pipes.

Owns: ``queue_fan_out`` (the publisher's per-pipe, per-message cost in a fan-out
burst round: one loop over the round's pipes, not a method call per pipe). The
socket's round reaches it as ``fan_out`` of any of its pipes (``PipeHandle`` in
nanopy/_seam.py); the wait of a burst (``wait_out_burst``, ``MAX_HOLD``) lives in
the seam, shared by the pipe's writer task and the socket's flush round.

May call: the pipe drivers' ``lock``/``outbox``/``transmit``.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, cast

from .._seam import FLUSH_DELAY, MAX_HOLD, wait_out_burst
from ..core.base import TRANSMIT

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._seam import PipeHandle
    from ..core.base import Action
    from .driver import PipeDriver

__all__ = ["FLUSH_DELAY", "MAX_HOLD", "queue_fan_out", "wait_out_burst"]


def queue_fan_out(
    handles: Mapping[int, PipeHandle], actions: list[Action], start: int = 0
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
    # The socket's driver holds its pipes as handles (nanopy/_seam.py); every one
    # of them is a PipeDriver, whose outbox this loop reads under its lock.
    pipes = cast("Mapping[int, PipeDriver]", handles)
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
                # ``queue`` written out: the publisher's per-pipe, per-message cost
                # (docs/architecture.md, "Deliberate exceptions").
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
