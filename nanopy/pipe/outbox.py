"""A pipe's outbox: what is queued and not yet written, and how much one write takes.

Owns: the write side's state, made by ``Outbox.__init__``: the outbox of payloads
(appended by ``queue``; ``first_at``: when its oldest was queued), a chunk's
unwritten rest (``tail``), the control frame, the channel's claim (``writing``),
the sent counters; the batch a write takes from the outbox
(``take_batch``), the size of that batch (``write_step``, learned by
``note_write``), the questions asked of what is left unwritten (``queued_out``,
``flushed``, ``wait_flushed``) and what an ending pipe hands back
(``take_unwritten``: see nanopy/driver/endings.py). Also the channel a plug-in's
connection that only implements ``send`` is seen as (``SendAdapter``).

``Outbox`` is the one base class of :class:`~nanopy.pipe.driver.PipeDriver`, not a
part reached through an attribute: ``transmit``, the writer task and the fan-out
loop read and write these fields per message, and on the pipe itself each is one
``self.x`` away.

A write frames its batch into one chunk -- a copy of every payload plus its
header -- and holds that chunk until the connection has taken all of it. A peer
that stops reading leaves the pipe holding its whole send window (``send_buffer``
messages) queued; if one write took it all, the pipe would also hold a framed copy
of all of it, doubling what a stalled peer costs. So a write takes at most
``write_step`` messages, about ``WRITE_CHUNK_BYTES`` of payload. The step is
learned from the writes before it (one division per write, no sum per message);
a pipe's first write judges by its oldest message. The rest stays queued, in
order, for the next write.

A channel with a write window (``WriteWindow``: a ZMTP REQ pipe takes one
request until its reply) caps every batch at ``window()`` messages; the rest wait
here like any queued message. While the window is ``shut`` the pipe writes
nothing directly and the writer task waits (``window_moved`` reopens both).

May call: nothing outside the pipe but the channel's ``window()`` (all of it
under the pipe's lock, except ``wait_flushed``, which takes it).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import trio

from .liveness import unwritten

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..transports._base import Connection

#: about how many payload bytes one write frames at most (see the module docstring)
WRITE_CHUNK_BYTES = 256 * 1024
#: ``write_step`` of a pipe whose chunk is its batch itself (inproc, a plug-in's
#: ``send``): nothing is framed, so nothing is gained by cutting
UNCUT = sys.maxsize
#: what each message is assumed to add to a chunk in framing (a header), so an
#: empty payload still counts
FRAME_ALLOWANCE = 16


class Outbox:
    """The write side of :class:`~nanopy.pipe.driver.PipeDriver` (see the module docstring)."""

    # the pipe's, declared for the methods below (PipeDriver.__init__ makes them)
    lock: Any
    closed: bool
    channel: Any
    writes_directly: bool
    _kick_writer: Callable[[], None]
    now: Callable[[], float]

    def __init__(self) -> None:
        self.outbox: list[bytes] = []
        self.first_at = 0.0  # when the outbox's oldest payload was queued (engine clock)
        self.tail: Any = None  # the unwritten rest of a chunk
        self.tail_credit = 0  # messages of that chunk, credited once it is written
        self.tail_bytes = 0  # their payload bytes (counted as sent then)
        self._tail_batch: list[bytes] = []  # the messages of the chunk ``tail`` ends
        self.control: bytes | None = None  # a control frame to write before the outbox
        self.writing = False  # a thread or the writer task holds the channel
        # Counters of the pipe view (Socket.pipes()), counted per write, never per
        # message (under the pipe lock; see the note above ``claim_write``).
        self.tx_msgs = self.tx_bytes = 0
        #: messages the writer task is writing now (taken from the outbox or a rest),
        #: and their payload bytes once framed
        self.in_write = self.in_write_bytes = 0
        #: the channel says when a write waits for room (ReportsWriteWait): ``in_write``
        #: counts only then; otherwise until the write returns
        self.reports_wait = False
        #: the most messages one write takes from the outbox (0: not known before the
        #: first write, which judges by the size of its oldest message)
        self.write_step = 0
        #: what a failed write never handed to the kernel (taken by ``take_unwritten``)
        self.orphans: list[bytes] = []
        self._idle_event: trio.Event | None = None  # wakes ``wait_flushed``
        #: the channel's write window (``WriteWindow.window``), or None: no limit
        self.window: Callable[[], int] | None = None
        #: the window is shut: what is queued waits for ``window_moved``
        self.shut = False

    def take_unwritten(self) -> list[bytes]:
        """Take everything this pipe will never write, in order (its lock held, no
        write under way): what a failed write left (``orphans``), the whole
        messages of a chunk's unwritten rest, then the queue. Leaves nothing queued."""
        out = self.orphans
        self.orphans = []
        if self.tail is not None:
            out += unwritten(self.channel, self._tail_batch, len(self.tail))
        out += self.outbox
        self.outbox = []
        self.tail = self.control = None
        return out

    def queue(self, batch: list[bytes], now: float = -1.0) -> int:
        """Append ``batch`` to the outbox, in order (pipe lock held): the one way
        payloads are queued, but for the two per-message appends written out in
        place (docs/architecture.md, "Deliberate exceptions"). The first payload of
        an empty outbox stamps ``first_at`` (``now``, if the caller read the clock).
        Returns the outbox's length."""
        outbox = self.outbox
        if not outbox:
            self.first_at = now if now >= 0 else self.now()
        outbox += batch
        return len(outbox)

    def take_batch(self) -> list[bytes]:
        """Take the next batch to write (pipe lock held): the whole outbox, or its
        oldest ``write_step`` messages when it holds more; the rest stays queued."""
        outbox = self.outbox
        step = self.write_step
        if not step and outbox:  # nothing written yet: judge by the oldest message
            self.write_step = step = max(1, WRITE_CHUNK_BYTES // (len(outbox[0]) + FRAME_ALLOWANCE))
        window = self.window
        if window is not None:
            step = min(step, window())
        if len(outbox) <= step:
            self.outbox = []
            return outbox
        self.outbox = outbox[step:]
        del outbox[step:]
        return outbox

    def window_moved(self) -> None:
        """The channel's write window moved (``WriteWindow``; any thread holding
        none of the pipe's locks). Shut, it keeps sends in the outbox (no direct
        write) and the writer task waiting; open, the writer task takes what waits."""
        window = self.window
        if window is None:
            return
        with self.lock:
            shut = self.shut = not window()
            self.writes_directly = not shut
            if not shut and self.outbox and not self.writing and not self.closed:
                self._kick_writer()

    def note_write(self, n: int, size: int) -> None:
        """A write framed ``n`` messages of ``size`` payload bytes: if it was too big,
        or took a full step, learn from it how many messages make
        ``WRITE_CHUNK_BYTES``. A plain store, without the lock: a stale step only
        sizes one write."""
        step = self.write_step
        if (size > WRITE_CHUNK_BYTES or n >= step) and step != UNCUT:
            self.write_step = max(1, n * WRITE_CHUNK_BYTES // (size + n * FRAME_ALLOWANCE))

    # A write is counted as sent (``tx_msgs``, ``tx_bytes``) from the moment it is
    # handed to the channel, and taken back if the channel comes up short: inside
    # that call a peer may already receive it, and must never find its sender
    # still counting it as queued. While a write waits for room (a peer reading
    # nothing, see ReportsWriteWait) it counts as queued instead.
    def claim_write(self) -> tuple[Any, int, bytes | None, list[bytes]]:
        """The writer task takes the channel (pipe lock held), and with it a chunk's
        rest (and its message count), the control frame and the next batch; the
        rest and the batch count as sent from now (their bytes once framed)."""
        self.writing = True
        tail, credit, control, batch = self.tail, self.tail_credit, self.control, self.take_batch()
        self.in_write = credit + len(batch)
        self.in_write_bytes = self.tail_bytes
        self.tx_msgs += self.in_write
        self.tx_bytes += self.tail_bytes
        self.tail = self.control = None
        self.tail_credit = self.tail_bytes = 0
        return tail, credit, control, batch

    def wrote(self, n: int, size: int) -> None:
        """The writer task's channel took ``n`` messages of ``size`` bytes of its write."""
        with self.lock:
            self.in_write -= n
            self.in_write_bytes -= size

    def end_write(self) -> None:
        """The writer task's write ended; what the channel never took is taken back."""
        with self.lock:
            self.writing = False
            self.tx_msgs -= self.in_write
            self.tx_bytes -= self.in_write_bytes
            self.in_write = self.in_write_bytes = 0

    def queued_out(self) -> int:
        """Messages queued on this pipe and not yet written: the outbox, a chunk's
        rest, and a write waiting for room (a stalled peer's window)."""
        with self.lock:
            stalled = self.in_write if _stalled(self) else 0
            return len(self.outbox) + (self.tail_credit if self.tail is not None else 0) + stalled

    def sent_counts(self) -> tuple[int, int]:
        """Messages and payload bytes this pipe wrote (a write under way counts,
        unless it waits for room)."""
        with self.lock:
            if _stalled(self):
                return self.tx_msgs - self.in_write, self.tx_bytes - self.in_write_bytes
            return self.tx_msgs, self.tx_bytes

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


class SendAdapter:
    """A connection that only implements ``send(payloads)`` (a plug-in), seen as a
    channel: a chunk is the batch itself, written by the writer task."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def frame(self, payloads: list[bytes]) -> list[bytes]:
        return payloads

    def write_nowait(self, chunk: Any) -> int:
        return 0

    async def write_all(self, chunk: Any) -> None:
        await self.conn.send(chunk)

    def control_chunk(self, frame: bytes) -> bytes:
        return frame


def _stalled(box: Outbox) -> bool:
    """The writer task's write waits for room (pipe lock held)."""
    return bool(box.in_write) and (not box.reports_wait or box.channel.waiting_for_room)
