"""Pipe drivers: move one connection's messages between the wire and the core.

Each pipe has a reader task and a writer task in the engine. The driver is the
connection's only writer and owns everything not written yet: one outbox of
payloads, the unwritten rest of a chunk a non-blocking write left (``tail``) and
one control frame (``control``, a WebSocket PONG) that goes out before queued
payloads. Whoever writes -- a sending thread or the writer task -- first claims
the channel (``writing``), so writes never overlap; a claim never blocks. The
connection is a :class:`~nanopy.transports.ChannelConnection` (``frame``,
``write_nowait``, ``write_all``); a plug-in that only implements ``send`` is
wrapped in an adapter whose writes all go through the writer task
(``write_loop``, nanopy/pipe/writer.py).

Sending is designed so a busy sender rarely needs the engine and an idle one
never waits for it:

* ``transmit`` (any thread) writes straight to the channel when the pipe is idle
  (nothing queued, no write in progress, and nothing sent in the last
  ``DIRECT_IDLE`` seconds or the socket received a message since: an answer is
  not a burst) -- the low-latency path;
* a burst of sends collects in the outbox; the sending thread itself writes the
  outbox as one chunk whenever it holds ``CALLER_BATCH`` messages and
  ``CALLER_BYTES`` bytes (at most ``CALLER_BATCH_MAX`` messages) -- the
  high-throughput path, with no engine wake-up per batch;
* the writer task flushes what a burst leaves behind: woken by the first queued
  message, it waits while the burst goes on (``FLUSH_DELAY``, doubling, never
  holding a message longer than ``MAX_HOLD``), then writes what is left; it also
  takes over whenever the channel cannot take a write at once (a full kernel
  buffer or inproc inbox, a TLS stream).

A payload's credit goes back to the socket when the channel has taken its whole
chunk: at once for a direct write (the sending thread's ``transmit`` returns it,
or, for a send on the socket's lane, puts it back on the lane: ``lane_kept``),
after ``write_all`` for the writer task. So a peer that reads nothing stops the
sender after its send buffer, the chunk in flight and what the channel holds.

Receiving has a direct path too. A connection that can be read without
blocking from any thread (tcp, ipc: ``read_nowait``) has a *read role*: the
engine's reader task holds it normally, but a thread blocked in ``recv`` on a
socket whose only pipe is idle takes it, reads and parses the bytes itself and
feeds them to the core in the same round that takes its message -- no engine
hop, no GIL hand-over. While a thread holds the role, and for ``READ_LEASE``
seconds after it lets go (it usually comes straight back), the reader task
stands aside, looking again after sleeps that double up to ``STAND_ASIDE_MAX``
(taking and releasing the role never wakes the engine). ``read_lock`` makes a
read and the delivery of what it parsed one step, whoever reads, so messages
reach the core in order, and keeps the socket from being closed under a reading
thread.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from .._seam import CALLER_BATCH_MAX, CALLER_BYTES
from ..core.errors import MessageTooLarge, RemoteProtocolError
from ..transports._base import ChannelConnection, PeerWatching, ReportsWriteWait, SinkAttachable, WriteWindow
from .fanout import queue_fan_out
from .liveness import Liveness, kernel_unacked
from .outbox import UNCUT, WRITE_CHUNK_BYTES, Outbox, SendAdapter
from .reading import PipeReader, handed_over
from .resend import Resend, sent_log_for
from .writer import CALLER_BATCH, write_loop
from .writer import payload_bytes as _payload_bytes

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._seam import Framed, PipeHandle, PipeHost
    from ..core.actions import Action
    from ..core.message import Pipe
    from ..engine.engine import Engine
    from ..transports._base import Connection
    from .sent_log import SentLog


#: what a non-blocking write may raise: the writer task meets (and reports) it again
_WRITE_ERRORS = (OSError, EOFError, RemoteProtocolError)

# Sends closer together than this count as a burst: they are batched, not written one by one.
DIRECT_IDLE = 50e-6
# A sending thread writes the outbox itself once it holds ``CALLER_BATCH`` messages
# (nanopy/pipe/writer.py) and ``CALLER_BYTES`` of payload (looked at every
# ``CALLER_BATCH`` messages), or ``CALLER_BATCH_MAX`` messages (both in nanopy/_seam.py:
# the socket's fan-out lane batches alike): small messages go out in chunks of a useful size.
# ... or once its oldest message waited this long: a slow sender (one trio schedule
# point per send) writes before the writer task's MAX_HOLD flush wakes the engine.
CALLER_HOLD = 400e-6


class PipeDriver(Outbox):
    """One pipe: the connection's only writer (the write side is :class:`Outbox`,
    its base), composed with the parts that own the rest: ``reader``
    (:class:`PipeReader`), ``liveness`` (:class:`Liveness`) and ``resend``
    (:class:`Resend`). It sees its socket as a ``PipeHost``; the socket sees it as a
    ``PipeHandle`` (nanopy/_seam.py) and changes its state only through those calls."""

    def __init__(
        self,
        sock: PipeHost,
        name: str,
        conn: Connection,
        pipe: Pipe,
        engine: Engine,
        note_protocol_error: Callable[[Pipe, BaseException], None],
        resends: bool = False,
    ) -> None:
        """``resends``: the socket's protocol sends a dead pipe's unacknowledged
        messages again (PUSH, raw REQ: nanopy/pipe/resend.py), so the pipe keeps a
        sent log if its connection can count what its peer has not acknowledged."""
        self.sock = sock  # the socket's driver, seen through PipeHost (nanopy/_seam.py)
        self.name = name
        self.conn = conn
        self.pipe = pipe
        self.pid = pipe.id
        self.engine = engine
        self.lock = threading.Lock()
        self.closed = False
        Outbox.__init__(self)  # the write side (see the module docstring); all of it under ``lock``
        self.channel: ChannelConnection | SendAdapter
        if isinstance(conn, ChannelConnection):
            self.channel = conn
            self.writes_directly = True
            conn.attach_control(self.send_control)
            if isinstance(conn, WriteWindow) and conn.watch_window(self.window_moved):
                self.window = conn.window  # (a window shuts and opens: see Outbox.window_moved)
        else:
            self.channel = SendAdapter(conn)
            self.writes_directly = False
        self.now = engine.now
        self.last_tx = 0.0  # when this pipe last sent (engine clock)
        self.appended = 0  # messages handed to transmit off the send lane (writer.py)
        self.flush_at = CALLER_BATCH  # the outbox size at which a sender looks at writing it
        self.received_mark = 0  # the socket's receive count at our last idle-path send
        # Credit the socket granted this pipe for sends that skip its round (the
        # socket's send lane, see nanopy/driver/socket_driver.py), and the bytes they carried.
        self.lane_credit = 0
        self.lane_bytes = 0
        # A lane send written directly and whole keeps its credit on the lane (no
        # socket round to give it back): counted here as sent, reset by each revoke
        # (``lane_epoch`` tells a write that began before a revoke).
        self.lane_kept = 0
        self.lane_epoch = 0
        self._writer_event: trio.Event | None = None
        # In-memory connections (inproc) take every payload at once, in order.
        self.hands_over = isinstance(conn, SinkAttachable)
        if self.hands_over or not self.writes_directly:
            self.write_step = UNCUT  # its chunk is the batch itself, not a framed copy
        if isinstance(self.channel, ReportsWriteWait):
            self.reports_wait = True
        # Pipes with equal framing share a fan-out batch's chunk (ChannelConnection.framing).
        self.framing = self.channel.framing if isinstance(self.channel, ChannelConnection) else None
        # SP-over-stream framing adds the same prefix to every payload: a chunk's
        # payload bytes are its length less one prefix per message (no sum needed).
        overhead = self.channel.frame_overhead if isinstance(self.channel, ChannelConnection) else None
        self.frame_prefix = -1 if overhead is None else overhead
        #: the pipe's recent writes (nanopy/pipe/sent_log.py; None: not kept, see
        #: ``sent_log_for``); only the channel's writer notes in it
        self.sent_log: SentLog | None = sent_log_for(conn) if resends else None
        #: the socket took this pipe out of its load balancing (``withdraw``, once)
        self.withdrawn = False
        # The parts (each makes its own fields; see their modules).
        self.liveness = Liveness(conn, self.lock, name, pipe, note_protocol_error)
        self.reader = PipeReader(self, conn, pipe.id, sock.deliver, engine.run_soon, self.liveness.note_failure)
        self.resend = Resend(self)
        self._scope = trio.CancelScope()
        pipe._driver = self

    # -- any thread ------------------------------------------------------------
    def transmit(
        self,
        payload: bytes,
        idle: bool | None = None,
        framed: Framed | None = None,
        lane: bool = False,
    ) -> int:
        """Send or queue ``payload``; returns how many credits may be returned now.

        ``idle=False``: the socket's driver judged the whole round a burst (a PUB's
        fan-out to many pipes, see ``FANOUT_GAP`` in nanopy/driver/socket_driver.py): queue it.
        None: this pipe judges by itself. ``framed``: see ``_write_shared``.
        ``lane``: spend one of ``lane_credit`` on it; -1 (nothing sent) if none is left.
        -1 also when the pipe is closed: the caller hands the payload back to the
        socket (``SocketDriver.hand_back``), which sends it on another pipe.
        """
        lock = self.lock
        lock.acquire()  # (not ``with``: measurably dearer on this path)
        try:
            if lane:
                if self.lane_credit <= 0 or self.closed:
                    return -1
                self.lane_credit -= 1  # (also the writer's sign that a burst goes on)
                self.lane_bytes += len(payload)
            else:
                if self.closed:
                    return -1
                self.appended += 1
            outbox = self.outbox
            if outbox:
                # A burst goes on: ``queue`` written out, its per-message cost
                # (docs/architecture.md, "Deliberate exceptions"). ``first_at`` is
                # stamped already, and ``flush_at`` (>= CALLER_BATCH) ends most sends here.
                outbox.append(payload)
                n = len(outbox)
                if n < self.flush_at or self.writing or self.tail is not None or not self.writes_directly:
                    return 0
                if (
                    n < CALLER_BATCH_MAX
                    and sum(map(len, outbox)) < CALLER_BYTES
                    and self.now() - self.first_at < CALLER_HOLD
                ):
                    self.flush_at = n + CALLER_BATCH  # small messages: gather more first
                    return 0
                # Due: this thread writes the outbox itself.
                self.flush_at = CALLER_BATCH
                self.writing = True
                batch = self.take_batch()
                size = epoch = -1
            elif self.writing or self.tail is not None or self.control is not None:
                # A write is in progress: the first message queued behind it (one is
                # below any ``flush_at``, so nothing falls due yet).
                self.first_at = self.now()
                outbox.append(payload)
                return 0
            else:
                now = self.now()
                # Idle: nothing sent lately, or the socket received since our last send
                # (an answer in a request/reply or ping-pong exchange, not a burst).
                received = self.sock.received
                if idle is None:
                    idle = now - self.last_tx > DIRECT_IDLE or received != self.received_mark
                    fanout = False
                else:
                    fanout = idle is False and self.writes_directly
                self.last_tx = now
                self.received_mark = received
                if fanout or not (idle and self.writes_directly):
                    self.queue([payload], now)
                    if not fanout:  # a burst begins: the writer task takes it from here
                        self._kick_writer()
                        return 0
                    # A fan-out burst: the socket's one flush round writes what the
                    # burst leaves on every pipe (one engine wake-up per round, not
                    # one per pipe).
                    batch = None
                else:
                    self.writing = True
                    batch = [payload]
                    size = len(payload)  # (its payload bytes, known: no payload_bytes call)
                    epoch = self.lane_epoch if lane else -1
        finally:
            lock.release()
        if batch is None:
            self.sock.flush_later(self)
            return 0
        if framed is None:  # (an idle send: no fan-out chunk to share, one call fewer)
            return self._write_claimed(batch, None, size, epoch)
        return self._write_shared(batch, framed)

    # -- the socket's calls on its pipe (socket's lock held; once per batch) ----
    def grant_lane(self, n: int) -> None:
        """The socket grants ``n`` credits to its send lane on this pipe."""
        with self.lock:
            self.lane_credit += n

    def revoke_lane(self) -> tuple[int, int, int]:
        """Take the lane back: ``(unspent credit, bytes the spent credit carried,
        messages sent on credit the lane kept)``."""
        with self.lock:
            n, self.lane_credit = self.lane_credit, 0
            spent, self.lane_bytes = self.lane_bytes, 0
            kept, self.lane_kept = self.lane_kept, 0
            self.lane_epoch += 1  # (a direct write under way gives its credit to the socket)
        return n, spent, kept

    def withdraw(self, resend: bool) -> tuple[list[bytes], int] | None:
        """The socket withdraws this pipe (its lock held; see ``PipeHandle.withdraw``):
        closed to sends, what it never wrote handed back -- with ``resend`` (and a sent
        log) the unacknowledged messages its kernel holds first -- or, while a write is
        under way, None: the rest and any resend come when the pipe is removed."""
        self.withdrawn = True
        resend = resend and self.sent_log is not None
        with self.lock:
            self.closed = True
            if self.writing:
                if resend:
                    self.resend.mark_due()
                return None
            orphans = self.take_unwritten()
            resent = self.resend.take_unacked_now() if resend else []
        return resent + orphans, len(resent)

    def refuse_sends(self) -> None:
        """Refuse every later send (a socket closing, or a pipe it has not added yet)."""
        with self.lock:
            self.closed = True

    def fan_out(
        self, pipes: Mapping[int, PipeHandle], actions: list[Action], start: int
    ) -> tuple[int, list[bytes], list[tuple[int, int]]]:
        """The TRANSMITs of a fan-out burst on ``pipes`` (:func:`queue_fan_out`)."""
        return queue_fan_out(pipes, actions, start)

    def queue_batch(self, batch: list[bytes], kick: bool) -> bool:
        """Queue a batch the fan-out lane (under the socket lock: batches reach every pipe
        in the order taken) or a batch send took; False if closed (nothing queued).
        Whoever queued it then writes it (``flush_queued``), or ``kick``: the writer task does."""
        lock = self.lock
        lock.acquire()
        try:
            if self.closed:
                return False
            self.appended += len(batch)
            self.queue(batch)
            if kick and not self.writing:
                self._kick_writer()
        finally:
            lock.release()
        return True

    def flush_queued(self, framed: Framed) -> int:
        """Write the outbox now if nobody else is writing (the socket's flush round,
        engine thread); returns the credit to give back. ``framed`` holds the last
        chunk framed per ``framing``: a batch equal to its payloads reuses it."""
        lock = self.lock
        lock.acquire()
        try:
            if self.closed or self.writing or self.tail is not None or self.control is not None or not self.outbox:
                return 0  # the writer task holds (or was woken for) the channel, or nothing is left
            batch = self.take_batch()
            self.flush_at = CALLER_BATCH
            self.writing = True
        finally:
            lock.release()
        return self._write_shared(batch, framed)

    def _write_shared(self, batch: list[bytes], framed: Framed | None) -> int:
        """``_write_claimed(batch)``, reusing the chunk (and the payload bytes, for
        the pipe view) in ``framed`` when the last batch of this pipe's ``framing``
        holds the same payloads (a fan-out fills every pipe's outbox alike)."""
        if framed is None:
            return self._write_claimed(batch)
        key = self.framing
        last = framed.get(key)
        if last is not None and last[0] == batch:  # (payloads compared by identity first)
            chunk, size = last[1]
            return self._write_claimed(batch, chunk, size)
        chunk = self.channel.frame(batch) if key is not None else None  # (None: each pipe frames its own)
        size = _payload_bytes(batch, chunk, self.frame_prefix) if chunk is not None else sum(map(len, batch))
        framed[key] = (batch, (chunk, size))
        return self._write_claimed(batch, chunk, size)

    def _write_claimed(self, batch: list[bytes], chunk: Any = None, size: int = -1, epoch: int = -1) -> int:
        """Write ``batch`` (already framed as ``chunk`` if given; ``size``: its
        payload bytes, if known; ``epoch``: a lane send's ``lane_epoch``, -1 for
        any other) without blocking
        from this thread, which claimed the channel (``writing``) with the pipe lock
        released -- an in-memory channel may deliver into a socket that sends
        straight back on this thread.
        Returns the credit to give back now; the writer task takes over a rest."""
        channel = self.channel
        counted = False
        try:
            if chunk is None:
                chunk = channel.frame(batch)
            if size < 0:
                size = _payload_bytes(batch, chunk, self.frame_prefix)
            count = len(batch)
            if count >= self.write_step or size > WRITE_CHUNK_BYTES:  # (else note_write learns nothing)
                self.note_write(count, size)
            # Counted as sent before the peer can have it (see Outbox); taken back
            # below if the channel comes up short. (Only the claim holder writes these.)
            self.tx_msgs += count
            self.tx_bytes += size
            counted = True
            if self.hands_over:
                handed_over[0] = (chunk, size)
                n = channel.write_nowait(chunk)
                handed_over[0] = None  # (pins no payloads)
            else:
                n = channel.write_nowait(chunk)
        except _WRITE_ERRORS:
            n = 0
        except BaseException:
            # Interrupted (Ctrl-C) inside the write: how much of the chunk went out
            # is unknown, so this pipe's stream cannot go on. Give the claim back
            # (a closing pipe waits for it) and end the pipe.
            with self.lock:
                self.writing = False
                if counted:
                    self.tx_msgs -= len(batch)
                    self.tx_bytes -= size
                    sent_log = self.sent_log
                    if sent_log is not None:  # (how much went is unknown: in doubt)
                        sent_log.wrote(batch, len(chunk), len(chunk))
                        sent_log.doubt(len(chunk))
            self.close_soon()
            raise
        sent_log = self.sent_log
        if sent_log is not None:  # (still the channel's only writer)
            sent_log.wrote(batch, len(chunk), n)
        lock = self.lock
        lock.acquire()
        try:
            self.writing = False
            self.last_tx = self.now()  # a long write is not a pause in the burst
            if n >= len(chunk):
                if epoch == self.lane_epoch:
                    # A lane send written whole while its lane is still open: the credit
                    # stays with the lane (``lane_kept`` counts the send), not a socket
                    # round to give back now and another to fold it in.
                    self.lane_credit += 1
                    self.lane_kept += 1
                    done = 0
                else:
                    done = count
                # (``tail`` is None: this claim's write left no rest, and only a claim
                # holder sets it)
                if self.outbox or self.control is not None or self._idle_event is not None:
                    self._kick_writer()  # something is left (or a flush waits): the writer task goes on
            else:
                if counted:  # (counted again when the writer task writes the rest)
                    self.tx_msgs -= len(batch)
                    self.tx_bytes -= size
                self.tail = memoryview(chunk)[n:] if isinstance(chunk, bytes) else chunk[n:]
                self.tail_credit = len(batch)
                self._tail_batch = batch
                self.tail_bytes = size  # (counted as sent once the writer task wrote the rest)
                done = 0
                self._kick_writer()  # the rest is the writer task's
        finally:
            lock.release()
        return done

    def send_control(self, frame: bytes, append: bool = False) -> bool:
        """Queue a control frame ahead of every payload (reader task; see
        ChannelConnection.attach_control); True if one not yet written was there:
        replaced, or with ``append`` kept and ``frame`` written after it (ZMTP commands).
        An empty ``frame`` only asks (queues nothing)."""
        with self.lock:
            if self.closed:
                return False
            control = self.control
            if not frame:
                return control is not None
            self.control = control + frame if append and control is not None else frame
            if not self.writing:
                self._kick_writer()
        return control is not None

    def _kick_writer(self) -> None:
        event = self._writer_event
        if event is not None:
            self._writer_event = None
            self.engine.run_soon(event.set)

    def close_soon(self) -> None:
        """Close this pipe (from any thread holding neither the socket's nor this
        pipe's lock); the reader and writer stop."""
        self.sock.pipe_ending(self)  # (sets ``closed``; what it never wrote goes back)
        self.engine.run_soon(self._scope.cancel)

    # -- engine thread ---------------------------------------------------------
    async def run(self) -> None:
        """Drive the pipe until it fails, the peer leaves, or it is closed."""
        try:
            with self._scope:
                if not self.closed:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_until_failure, self, partial(write_loop, self), nursery.cancel_scope)
                        conn = self.conn
                        reader, liveness = self.reader, self.liveness
                        keepalive = conn.keepalive if isinstance(conn, PeerWatching) else None
                        if keepalive is not None:
                            # Silence from the peer proves nothing now: we read nothing (a
                            # full queue) or our data waits for the peer's window (the
                            # window guard judges that case).
                            busy = lambda: reader.paused or liveness.in_write  # noqa: E731
                            nursery.start_soon(_until_failure, self, partial(keepalive, busy), nursery.cancel_scope)
                        guard = liveness.guard_for()
                        if guard is not None:
                            nursery.start_soon(_until_failure, self, guard, nursery.cancel_scope)
                        await _until_failure(self, reader.run, nursery.cancel_scope)
        finally:  # also when the socket's task tree is cancelled around it
            await self._stopped()

    async def _stopped(self) -> None:
        """The pipe's tasks are over: no thread may read or write it any more
        (its waits are shielded: it also runs while being cancelled)."""
        reader = self.reader
        with reader.read_lock:  # no thread reads the connection from now on
            with self.lock:
                self.closed = True
                waker = reader.role_waker
                claimed = self.writing
        while claimed:
            # A sending thread is inside a non-blocking write: let it finish before
            # the connection (and its descriptor) may be closed. It never blocks.
            with trio.CancelScope(shield=True):
                await trio.lowlevel.checkpoint()
            with self.lock:
                claimed = self.writing
        with self.lock:  # (after any write: the rest it left is unwritten too)
            orphans = self.take_unwritten()
        if waker is not None:
            waker.wake()  # the role holder stops waiting on this pipe
        unacked = kernel_unacked(self.conn)  # (before the connection is closed)
        with self.lock:
            self.orphans = self.resend.settle(orphans, unacked)
        self.notify_idle()

    def notify_idle(self) -> None:
        event, self._idle_event = self._idle_event, None
        if event is not None:
            event.set()


async def _until_failure(pipe: PipeDriver, loop: Any, scope: trio.CancelScope) -> None:
    """Run one of ``pipe``'s loops (reader, writer, watches); when it fails, end the whole pipe."""
    try:
        await loop()
    except (
        EOFError,
        OSError,
        RemoteProtocolError,
        MessageTooLarge,
        trio.BrokenResourceError,
        trio.ClosedResourceError,
    ) as exc:
        pipe.liveness.note_failure(exc)
    finally:
        pipe.sock.pipe_ending(pipe)  # (the first loop to end: at once, before any later send)
        scope.cancel()


if TYPE_CHECKING:

    def _a_pipe_is_a_handle(pipe: PipeDriver) -> PipeHandle:
        return pipe  # (mypy checks PipeDriver against the seam's protocol here)
