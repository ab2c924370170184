"""Per-id queues: the waiters of one request or survey id.

Owns: the entries of ``id_queues`` (one WaitQueue per REQ request / SURVEYOR
survey id, woken by the core's ``(READY, id)`` actions in the round's drain).

May call: the round (``feed``, through :class:`IdsHost`); the core only through the callables the
request/survey conveniences (nanopy/socket/requests.py) pass in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..core.message import Message
from .waiters import WaitQueue

T = TypeVar("T")


class IdsHost(Protocol):
    """What the per-id part needs of the driver (the round): a round, the id
    queues its drain wakes, and the counters a request or a reply moves."""

    id_queues: dict[int, WaitQueue]
    sent: int
    bytes_sent: int
    received: int
    bytes_received: int

    def feed(self, op: Callable[..., T], *args: Any, check_open: bool = True) -> T: ...


class PerIds:
    """Request and survey ids' wait queues (see the module docstring); the queues
    themselves are the round's (``id_queues``: its drain wakes them)."""

    def __init__(self, driver: IdsHost) -> None:
        self.round = driver

    # -- requests and surveys (per-id waiters) -----------------------------------------------
    def start_id(
        self, start: Callable[[], int], ready: Callable[[int], bool], body_len: int
    ) -> tuple[int, WaitQueue]:
        """Start a request/survey with ``start()``; its id and the id's own wait queue."""
        r = self.round

        def op() -> tuple[int, WaitQueue]:
            key = start()
            r.sent += 1
            r.bytes_sent += body_len
            queue = r.id_queues[key] = WaitQueue(lambda: ready(key))
            return key, queue

        return r.feed(op)

    def forget_id(self, key: int, cancel: Callable[[int], None] | None = None) -> None:
        """Drop an id's wait queue, and cancel it in the core if ``cancel`` is given."""
        r = self.round
        if cancel is None:
            # No lock: this may run from a generator finalizer (GC) on a thread that
            # already holds it; a single dict.pop is atomic anyway.
            r.id_queues.pop(key, None)
            return

        def op() -> None:
            r.id_queues.pop(key, None)
            cancel(key)

        r.feed(op, check_open=False)

    def take_attempt(
        self, key: int, take: Callable[[int], Message | None], one_shot: bool
    ) -> Callable[[], Message | None]:
        """An attempt taking the reply (``one_shot``) or next answer of ``key``.

        The id's wait queue goes with the reply, or when ``take`` returns None (over).
        """
        r = self.round
        queues = r.id_queues

        def attempt() -> Message | None:
            msg = take(key)
            if msg is None:
                queues.pop(key, None)
            else:
                r.received += 1
                r.bytes_received += len(msg.body)
                if one_shot:
                    queues.pop(key, None)
            return msg

        return attempt
