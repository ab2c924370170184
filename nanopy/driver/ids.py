"""Per-id queues: the waiters of one request or survey id.

Owns: the entries of ``id_queues`` (one WaitQueue per REQ request / SURVEYOR
survey id, woken by the core's ``(READY, id)`` actions in the round's drain).

May call: the round (``feed``); the core only through the callables the
request/survey conveniences (nanopy/socket/requests.py) pass in.
"""

from __future__ import annotations

from collections.abc import Callable

from .._seam import PipeT
from ..core.message import Message
from .round import Round
from .waiters import WaitQueue


class PerIds(Round[PipeT]):
    """Request and survey ids' wait queues (see the module docstring)."""

    # -- requests and surveys (per-id waiters) -----------------------------------------------
    def start_id(
        self, start: Callable[[], int], ready: Callable[[int], bool], body_len: int
    ) -> tuple[int, WaitQueue]:
        """Start a request/survey with ``start()``; its id and the id's own wait queue."""

        def op() -> tuple[int, WaitQueue]:
            key = start()
            self.sent += 1
            self.bytes_sent += body_len
            queue = self.id_queues[key] = WaitQueue(lambda: ready(key))
            return key, queue

        return self.feed(op)

    def forget_id(self, key: int, cancel: Callable[[int], None] | None = None) -> None:
        """Drop an id's wait queue, and cancel it in the core if ``cancel`` is given."""
        if cancel is None:
            # No lock: this may run from a generator finalizer (GC) on a thread that
            # already holds it; a single dict.pop is atomic anyway.
            self.id_queues.pop(key, None)
            return

        def op() -> None:
            self.id_queues.pop(key, None)
            cancel(key)

        self.feed(op, check_open=False)

    def take_attempt(
        self, key: int, take: Callable[[int], Message | None], one_shot: bool
    ) -> Callable[[], Message | None]:
        """An attempt taking the reply (``one_shot``) or next answer of ``key``.

        The id's wait queue goes with the reply, or when ``take`` returns None (over).
        """
        queues = self.id_queues

        def attempt() -> Message | None:
            msg = take(key)
            if msg is None:
                queues.pop(key, None)
            else:
                self.received += 1
                self.bytes_received += len(msg.body)
                if one_shot:
                    queues.pop(key, None)
            return msg

        return attempt
