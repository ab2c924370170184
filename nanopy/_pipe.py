"""Pipe drivers: move one connection's messages between the wire and the core.

Each pipe has a reader task and a writer task in the engine. Sending is designed
so a busy sender rarely needs the engine and an idle one never waits for it:

* ``transmit`` (any thread) writes straight to the socket when the pipe is idle
  (nothing queued, no write in progress, nothing sent in the last ``DIRECT_IDLE``
  seconds) -- the low-latency path;
* a burst of sends collects in the outbox; the sending thread itself writes the
  outbox as one frame batch whenever it reaches ``CALLER_BATCH`` messages -- the
  high-throughput path, with no engine wake-up per batch;
* the writer task flushes what a burst leaves behind: woken by the first queued
  message, it waits while the burst goes on (``FLUSH_DELAY``, doubling, never
  holding a message longer than ``MAX_HOLD``), then writes what is left; it also
  takes over whenever the socket cannot take a write at once.

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

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import trio

from ._errors import MessageTooLarge, RemoteProtocolError

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._driver import SocketDriver
    from ._engine import Engine
    from ._message import Pipe
    from .transports._base import Connection

log = logging.getLogger("nanopy")

# Sends closer together than this count as a burst: they are batched, not written one by one.
DIRECT_IDLE = 50e-6
# A sending thread writes the outbox itself once it holds this many messages.
CALLER_BATCH = 64
# The writer task's first wait before flushing a partial batch left by a burst.
FLUSH_DELAY = 200e-6
# No queued message waits longer than this for the writer task.
MAX_HOLD = 1e-3
# After a thread gives the read role back, the reader task waits this long for it
# to come back (a receive loop does) before reading again itself.
READ_LEASE = 5e-3
# The longest the reader task waits before looking whether a thread still holds the role.
STAND_ASIDE_MAX = 50e-3


class PipeDriver:
    def __init__(
        self,
        sock: SocketDriver,
        name: str,
        conn: Connection,
        pipe: Pipe,
        engine: Engine,
        note_protocol_error: Callable[[Pipe, BaseException], None],
    ) -> None:
        self.sock = sock  # the socket's driver: every core input goes through it
        self.name = name
        self.note_protocol_error = note_protocol_error
        self.conn = conn
        self.pipe = pipe
        self.pid = pipe.id
        self.engine = engine
        self.lock = threading.Lock()
        self.outbox: list[bytes] = []
        self.writing = False
        self.closed = False
        self.last_tx = 0.0
        self.appended = 0  # messages handed to transmit (tells the writer a burst goes on)
        self.first_queued = 0.0  # when the oldest message in the outbox was queued
        self._writer_event: trio.Event | None = None
        self._reader_event: trio.Event | None = None
        self.paused = False  # the core's queue for this pipe is full: read nothing
        self._idle_event: trio.Event | None = None
        # In-memory connections (inproc) take every payload at once, in order.
        self.hands_over = hasattr(conn, "attach_sink")
        # The read role (see the module docstring).
        self.direct = hasattr(conn, "read_nowait")
        self.read_lock = threading.Lock()
        self.role = False  # a thread holds the read role
        self.lease_until = 0.0
        self.role_wake_fd = -1  # the role holder's wake-up eventfd
        self._failure_noted = False
        self._scope = trio.CancelScope()
        pipe._driver = self

    # -- any thread ------------------------------------------------------------
    def transmit(self, payload: bytes) -> int:
        """Send or queue ``payload``; returns how many credits may be returned now."""
        conn = self.conn
        if self.hands_over and not self.outbox and not self.closed and conn.try_send(payload):
            return 0  # an in-memory hand-over: the connection returns the credit itself
        lock = self.lock
        lock.acquire()
        try:
            if self.closed:
                return 0
            outbox = self.outbox
            self.appended += 1
            if outbox or self.writing:
                outbox.append(payload)
                n = len(outbox)
                if n == 1:
                    self.first_queued = time.monotonic()
                elif n >= CALLER_BATCH and not self.writing:
                    return self._flush_from_caller()
                return 0
            now = time.monotonic()
            idle = now - self.last_tx > DIRECT_IDLE
            self.last_tx = now
            if idle and conn.try_send(payload):
                if conn.has_pending:
                    self._kick_writer()
                return 0 if conn.manages_credit else 1
            outbox.append(payload)
            self.first_queued = now
            self._kick_writer()
            return 0
        finally:
            lock.release()

    def _flush_from_caller(self) -> int:
        """Write the whole outbox from the sending thread (pipe lock held)."""
        batch = self.outbox
        if self.conn.manages_credit or not self.conn.try_send_batch(batch):
            self._kick_writer()
            return 0
        self.outbox = []
        self.last_tx = time.monotonic()
        if self.conn.has_pending:
            self._kick_writer()
        return len(batch)

    def _kick_writer(self) -> None:
        event = self._writer_event
        if event is not None:
            self._writer_event = None
            self._set(event)

    def _set(self, event: trio.Event) -> None:
        if self.engine.in_engine_thread():
            event.set()
        else:
            self.engine.call_soon(event.set)

    def resume_read(self) -> None:
        with self.lock:
            self.paused = False
            event, self._reader_event = self._reader_event, None
        if event is not None:
            self._set(event)

    # -- the read role (any thread) --------------------------------------------
    def take_role(self, wake_fd: int) -> bool:
        """A thread asks for the read role; False if it cannot have it now."""
        with self.lock:
            if self.role or self.closed or self.paused or not self.direct:
                return False
            self.role = True
            self.role_wake_fd = wake_fd
            return True

    def release_role(self) -> None:
        conn: Any = self.conn
        if conn.failed and not self.closed:
            # What we read ended in an error or EOF after good messages: the
            # reader task may never be woken for it, so end the pipe here.
            try:
                self.read_direct()
            except (EOFError, OSError, RemoteProtocolError, MessageTooLarge) as exc:
                self.direct_failed(exc)
        with self.lock:
            self.role = False
            self.role_wake_fd = -1
            self.lease_until = time.monotonic() + READ_LEASE

    def read_direct(self) -> list[bytes] | None:
        """Read what the kernel holds (role holder only); None if nothing or closed."""
        with self.read_lock:
            if self.closed:
                return None
            return self.conn.read_nowait()  # type: ignore[attr-defined, no-any-return]

    def direct_failed(self, exc: BaseException) -> None:
        """The role holder met the end of the connection or a bad peer."""
        self._failed(exc)
        self.close_soon()

    def close_soon(self) -> None:
        """Close this pipe (from any thread); the reader and writer stop."""
        with self.lock:
            self.closed = True
        if self.engine.in_engine_thread():
            self._scope.cancel()
        else:
            self.engine.call_soon(self._scope.cancel)

    def release_credit(self, n: int) -> None:
        self.sock.credit(self.pid, n)

    # -- engine thread ---------------------------------------------------------
    async def run(self) -> None:
        """Drive the pipe until it fails, the peer leaves, or it is closed."""
        if self.conn.manages_credit:
            self.conn.release_credit = self.release_credit
        try:
            with self._scope:
                if not self.closed:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._until_failure, self._writer, nursery.cancel_scope)
                        await self._until_failure(self._reader, nursery.cancel_scope)
        finally:  # also when the socket's task tree is cancelled around it
            self._stopped()

    def _stopped(self) -> None:
        """The pipe's tasks are over: no thread may read or write it any more."""
        with self.read_lock:  # no thread reads the connection from now on
            with self.lock:
                self.closed = True
                self.outbox.clear()
                wake_fd = self.role_wake_fd
        if wake_fd >= 0:
            try:
                os.eventfd_write(wake_fd, 1)  # the role holder stops polling this pipe
            except OSError:
                pass
        self._notify_idle()

    async def _until_failure(self, loop: Any, scope: trio.CancelScope) -> None:
        """Run the reader or writer loop; when it fails, end the whole pipe."""
        try:
            await loop()
        except (EOFError, OSError, RemoteProtocolError, MessageTooLarge, trio.BrokenResourceError,
                trio.ClosedResourceError) as exc:
            self._failed(exc)
        finally:
            scope.cancel()

    def _failed(self, exc: BaseException) -> None:
        """Note how the pipe ended, once (a reading thread and the reader task may
        both meet the same stored error)."""
        with self.lock:
            if self._failure_noted:
                return
            self._failure_noted = True
        if isinstance(exc, (RemoteProtocolError, MessageTooLarge)):
            self.note_protocol_error(self.pipe, exc)
        else:
            log.debug("%s: pipe %d closed: %s", self.name, self.pid, exc)

    async def _reader(self) -> None:
        if self.direct:
            await self._role_reader()
            return
        if self.hands_over:
            await self._sink_reader()
            return
        conn = self.conn
        deliver = self.sock.deliver
        pid = self.pid
        while True:
            await self._until_resumed()
            payloads = await conn.receive()
            if payloads and payloads[0].__class__ is not bytes:
                # A plug-in transport broke the payload contract (Connection.receive):
                # cores get bytes, never a buffer that may change or cannot be hashed.
                payloads = [bytes(p) for p in payloads]
            deliver(pid, payloads)  # a full queue sets self.paused

    async def _sink_reader(self) -> None:
        """An in-memory connection delivers from the sender's thread through a sink;
        this task only drains what queued while the core's queue was full."""
        conn: Any = self.conn
        deliver = self.sock.deliver
        pid = self.pid

        def sink(payloads: list[bytes]) -> None:
            deliver(pid, payloads)  # a full queue sets self.paused

        conn.attach_sink(sink, lambda: self.paused)
        while True:
            await self._until_resumed()
            await conn.drain_to_sink()

    async def _until_resumed(self) -> None:
        """Wait while the core's queue for this pipe is full."""
        while True:
            with self.lock:
                if not self.paused:
                    return
                event = self._reader_event = trio.Event()
            await event.wait()

    async def _role_reader(self) -> None:
        """The reader of a connection with a read role: reads only while it holds it."""
        conn: Any = self.conn
        deliver = self.sock.deliver
        pid = self.pid
        read_lock = self.read_lock
        more = False
        while True:
            if self.role or time.monotonic() < self.lease_until:
                await self._stand_aside()
                more = False
                continue
            await self._until_resumed()
            if self.role:
                continue
            if more or conn.failed:
                await trio.lowlevel.checkpoint()
            else:
                await conn.wait_readable()
            if self.role:
                continue  # a thread took the role while we waited: it reads
            with read_lock:  # read and deliver as one step: reads reach the core in order
                payloads = conn.read_nowait()
                if payloads:
                    deliver(pid, payloads)  # a full queue sets self.paused
            more = conn.read_more

    async def _stand_aside(self) -> None:
        """Wait until no thread holds the read role and its lease has run out.

        Polled with sleeps that double while the role stays taken (nothing wakes
        this task per message): a receive loop costs the engine a few wake-ups a
        second, and a thread that leaves for good hands reading back within
        ``STAND_ASIDE_MAX``.
        """
        delay = READ_LEASE
        while True:
            if self.role:
                await trio.sleep(delay)
                delay = min(delay * 2, STAND_ASIDE_MAX)
                continue
            left = self.lease_until - time.monotonic()
            if left <= 0:
                return
            await trio.sleep(left)

    async def _writer(self) -> None:
        conn = self.conn
        credit_back = not conn.manages_credit
        lingering = False  # a burst is under way: let the sender write its own batches
        while True:
            if lingering:
                await self._linger()
            with self.lock:
                batch = self.outbox
                if batch or conn.has_pending:
                    self.outbox = []
                    self.writing = True
                    event = None
                else:
                    event = self._writer_event = trio.Event()
            if event is not None:
                self._notify_idle()
                await event.wait()
                lingering = True
                continue
            try:
                await conn.send(batch)
            finally:
                with self.lock:
                    self.writing = False
            if batch and credit_back:
                self.sock.credit(self.pid, len(batch))
            # Keep lingering only for small flushes; a full outbox means the
            # sender outruns the socket, so write again at once.
            lingering = len(batch) < CALLER_BATCH

    async def _linger(self) -> None:
        """Wait while a burst goes on, so the sender keeps writing full batches itself.

        Returns once the sender has paused for a whole wait, a full batch is
        waiting, or the oldest queued message has waited ``MAX_HOLD``. The waits
        double while the burst lasts, so a long burst costs few wake-ups.
        """
        delay = FLUSH_DELAY
        while True:
            seen = self.appended
            await trio.sleep(delay)
            outbox = self.outbox
            if (
                not outbox
                or self.appended == seen
                or len(outbox) >= CALLER_BATCH
                or time.monotonic() - self.first_queued >= MAX_HOLD
            ):
                return
            delay = min(delay * 2, MAX_HOLD)

    def _notify_idle(self) -> None:
        event, self._idle_event = self._idle_event, None
        if event is not None:
            event.set()

    def flushed(self) -> bool:
        return self.closed or not (self.outbox or self.writing or self.conn.has_pending)

    async def wait_flushed(self) -> None:
        """Return once everything queued on this pipe has been written."""
        while not self.flushed():
            self._idle_event = event = trio.Event()
            await event.wait()
