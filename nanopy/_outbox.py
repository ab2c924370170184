"""A pipe's outbox: what is queued and not yet written, and how much one write takes.

Owns: the batch a write takes from the outbox (``take_batch``), the size of
that batch (``write_step``, learned by ``note_write``), and the questions asked of
what is left unwritten (``queued_out``, ``flushed``, ``wait_flushed``).

A write frames its batch into one chunk -- a copy of every payload plus its
header -- and holds that chunk until the connection has taken all of it. A peer
that stops reading leaves the pipe holding its whole send window (``send_buffer``
messages) queued; if one write took it all, the pipe would also hold a framed copy
of all of it, doubling what a stalled peer costs. So a write takes at most
``write_step`` messages, about ``WRITE_CHUNK_BYTES`` of payload. The step is
learned from the writes before it (one division per write, no sum per message);
a pipe's first write judges by its oldest message. The rest stays queued, in
order, for the next write.

May call: nothing outside the pipe (all of it under the pipe's lock, except
``wait_flushed``, which takes it).
"""

from __future__ import annotations

import sys
from typing import Any

import trio

#: about how many payload bytes one write frames at most (see the module docstring)
WRITE_CHUNK_BYTES = 256 * 1024
#: ``write_step`` of a pipe whose chunk is its batch itself (inproc, a plug-in's
#: ``send``): nothing is framed, so nothing is gained by cutting
UNCUT = sys.maxsize
#: what each message is assumed to add to a chunk in framing (a header), so an
#: empty payload still counts
FRAME_ALLOWANCE = 16


class Outbox:
    """The outbox side of :class:`~nanopy._pipe.PipeDriver` (see the module docstring)."""

    lock: Any
    outbox: list[bytes]
    tail: Any
    tail_credit: int
    control: bytes | None
    writing: bool
    closed: bool
    _idle_event: trio.Event | None
    #: messages the writer task is writing now (taken from the outbox or a rest)
    in_write = 0
    #: the most messages one write takes from the outbox (0: not known before the
    #: first write, which judges by the size of its oldest message)
    write_step = 0

    def take_batch(self) -> list[bytes]:
        """Take the next batch to write (pipe lock held): the whole outbox, or its
        oldest ``write_step`` messages when it holds more; the rest stays queued."""
        outbox = self.outbox
        step = self.write_step
        if not step and outbox:  # nothing written yet: judge by the oldest message
            self.write_step = step = max(1, WRITE_CHUNK_BYTES // (len(outbox[0]) + FRAME_ALLOWANCE))
        if len(outbox) <= step:
            self.outbox = []
            return outbox
        self.outbox = outbox[step:]
        del outbox[step:]
        return outbox

    def note_write(self, n: int, size: int) -> None:
        """A write framed ``n`` messages of ``size`` payload bytes: if it was too big,
        or took a full step, learn from it how many messages make
        ``WRITE_CHUNK_BYTES``. A plain store, without the lock: a stale step only
        sizes one write."""
        step = self.write_step
        if (size > WRITE_CHUNK_BYTES or n >= step) and step != UNCUT:
            self.write_step = max(1, n * WRITE_CHUNK_BYTES // (size + n * FRAME_ALLOWANCE))

    def queued_out(self) -> int:
        """Messages queued on this pipe and not yet written: the outbox, a chunk's
        rest, and what the writer task is writing (a stalled peer's window)."""
        with self.lock:
            return len(self.outbox) + (self.tail_credit if self.tail is not None else 0) + self.in_write

    def flushed(self) -> bool:
        return self.closed or not (self.outbox or self.writing or self.tail is not None or self.control is not None)

    async def wait_flushed(self) -> None:
        """Return once everything queued on this pipe has been written."""
        while True:
            with self.lock:  # a sending thread ending its write sees the event
                if self.flushed():
                    return
                self._idle_event = event = trio.Event()
            await event.wait()
