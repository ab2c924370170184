"""A pipe's sent log: which of its messages the peer's kernel may not have acknowledged.

Owns: :class:`SentLog` (the recent writes of one pipe and the bytes its kernel
took), the mapping of the kernel's unacknowledged byte count to messages
(``SentLog.unacked``) and its bounds. Which pipes keep one, and what becomes of
the messages it names: nanopy/pipe/resend.py.

Why: SP has no acknowledgements, but TCP has. When a pipe ends, Linux still says
how many of the bytes written to the connection the peer never acknowledged
(SIOCOUTQ: the last ``unacked`` bytes of the stream). A load-balancing sender
(PUSH, raw REQ) knows which messages those bytes carried, if it noted where each
write ended in the stream: it sends them again on its other pipes
(``resend_unacked``) or counts them lost (``stats().lost_unacked_messages``).

How: each write the kernel takes (all or part of a chunk) is noted as one entry
``(start, end, batch)`` in stream offsets -- never anything per message; a chunk's
rest and control frames only move the offset (``advance``). Offsets count the
bytes this pipe wrote since it started, so the handshake is not in them; the
kernel's count may include bytes this log never saw (a TLS record's overhead, a
frame written around the pipe), which only makes the mapping send more, never
less. At the end, the messages whose frames end in the unacknowledged bytes and
began in what the kernel took (``unacked``) are found by framing only the writes
that reach into them.

Bounds (memory): every ``TRIM_BYTES`` taken, the log asks the kernel how much is
still unacknowledged and forgets the writes wholly before it. So it holds about
what the kernel's send buffer holds unacknowledged, plus ``TRIM_BYTES``, plus
one write; at most ``limit`` bytes of stream (the largest send buffer the kernel
may grow to, plus 512 KiB: more than it can hold unacknowledged) plus those.

Sans-I/O: it calls only the ``kernel_unacked`` function it is given.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from .outbox import WRITE_CHUNK_BYTES

#: how many stream bytes the kernel takes between two looks at its unacknowledged count
TRIM_BYTES = WRITE_CHUNK_BYTES

#: ``sizes(batch)``: the wire size of each message of ``batch`` framed alone
Sizes = Callable[[list[bytes]], list[int]]


class SentLog:
    """The recent writes of one pipe (see the module docstring). Only the pipe's
    writer -- whoever holds its channel -- calls ``wrote``/``advance``/``doubt``;
    ``unacked`` runs once the pipe writes no more."""

    __slots__ = ("writes", "taken", "unsure", "slack", "check_at", "limit", "_kernel_unacked")

    def __init__(self, kernel_unacked: Callable[[], int | None], limit: int, slack: int = 0) -> None:
        #: ``(start, end, batch)`` per write, oldest first, in stream offsets
        self.writes: deque[tuple[int, int, list[bytes]]] = deque()
        #: stream bytes the kernel took
        self.taken = 0
        #: bytes counted as taken though perhaps never written (a failed write of
        #: unknown length): the kernel's count cannot show them
        self.unsure = 0
        #: what the connection may hide behind any unacknowledged byte (TLS: the
        #: rest of a record the peer got part of); nothing when all is acknowledged
        self.slack = slack
        self.check_at = TRIM_BYTES
        self.limit = limit
        self._kernel_unacked = kernel_unacked

    # -- the writer's notes (one call per write, never per message) ---------------------
    def wrote(self, batch: list[bytes], length: int, taken: int) -> None:
        """``batch``, framed as a chunk of ``length`` bytes, was written; the kernel
        took its first ``taken`` bytes (the rest follows through ``advance``)."""
        start = self.taken
        self.writes.append((start, start + length, batch))
        self.taken = start + taken
        if self.taken >= self.check_at:
            self.trim()

    def advance(self, taken: int) -> None:
        """The kernel took ``taken`` more bytes: a chunk's rest or a control frame."""
        self.taken += taken
        if self.taken >= self.check_at:
            self.trim()

    def doubt(self, n: int) -> None:
        """The last ``n`` bytes counted as taken may never have reached the kernel
        (a write failed and the channel cannot say where)."""
        self.unsure += n

    def trim(self) -> None:
        """Forget the writes the peer has certainly acknowledged (the kernel says
        how much it still holds, never more than ``limit``; without an answer,
        keep ``limit`` bytes)."""
        unacked = self._kernel_unacked()
        keep = self.limit if unacked is None else min(self._behind(unacked), self.limit)
        cut = self.taken - keep
        writes = self.writes
        while writes and writes[0][1] <= cut:
            writes.popleft()
        self.check_at = self.taken + TRIM_BYTES

    def _behind(self, unacked: int) -> int:
        """How far behind ``taken`` the peer may be when the kernel counts
        ``unacked`` bytes unacknowledged."""
        return unacked + self.unsure + (self.slack if unacked > 0 else 0)

    def held_bytes(self) -> int:
        """Stream bytes the kept writes span (what the bound is about)."""
        writes = self.writes
        return writes[-1][1] - writes[0][0] if writes else 0

    # -- the end -----------------------------------------------------------------------
    def unacked(self, unacked: int | None, sizes: Sizes) -> list[bytes]:
        """The messages, oldest first, whose frames end in the last ``unacked``
        bytes the kernel took (None: the kernel cannot say, so every message kept)
        and began in what it took: the rest of a chunk it never took is the
        pipe's to hand back (``take_unwritten``), not this log's."""
        taken = self.taken
        acked = -1 if unacked is None else taken - self._behind(unacked)
        reaching: list[tuple[int, int, list[bytes]]] = []
        for entry in reversed(self.writes):
            if entry[1] <= acked:
                break
            reaching.append(entry)
        out: list[bytes] = []
        for start, end, batch in reversed(reaching):
            if start >= acked and end <= taken:
                out += batch  # wholly unacknowledged, wholly taken
                continue
            each = sizes(batch)
            if sum(each) != end - start:
                out += batch  # (framed otherwise than message by message: all of it)
                continue
            pos = start
            for payload, size in zip(batch, each, strict=True):
                if pos + size > acked and pos < taken:
                    out.append(payload)
                pos += size
        self.writes.clear()
        return out


def frame_sizes(channel: Any, prefix: int) -> Sizes:
    """``sizes`` for a channel: ``prefix`` added to every payload (SP over a
    stream), or each payload framed alone (paid only when a pipe ends)."""
    if prefix >= 0:
        return lambda batch: [len(p) + prefix for p in batch]
    return lambda batch: [len(channel.frame([p])) for p in batch]
