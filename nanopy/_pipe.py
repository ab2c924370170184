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
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import trio

from ._errors import MessageTooLarge, RemoteProtocolError

if TYPE_CHECKING:
    from ._message import Pipe
    from ._socket import Socket
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


class PipeDriver:
    def __init__(self, sock: Socket, conn: Connection, pipe: Pipe, engine: Any) -> None:
        self.sock = sock
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
        self._resume_pending = False
        self._idle_event: trio.Event | None = None
        self._scope = trio.CancelScope()
        pipe._driver = self

    # -- any thread ------------------------------------------------------------
    def transmit(self, payload: bytes) -> int:
        """Send or queue ``payload``; returns how many credits may be returned now."""
        conn = self.conn
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
            event, self._reader_event = self._reader_event, None
            if event is None:
                self._resume_pending = True
        if event is not None:
            self._set(event)

    def close_soon(self) -> None:
        """Close this pipe (from any thread); the reader and writer stop."""
        with self.lock:
            self.closed = True
        if self.engine.in_engine_thread():
            self._scope.cancel()
        else:
            self.engine.call_soon(self._scope.cancel)

    def release_credit(self, n: int) -> None:
        self.sock._pipe_credit(self.pid, n)

    # -- engine thread ---------------------------------------------------------
    async def run(self) -> None:
        """Drive the pipe until it fails, the peer leaves, or it is closed."""
        if self.conn.manages_credit:
            self.conn.release_credit = self.release_credit
        with self._scope:
            if not self.closed:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._until_failure, self._writer, nursery.cancel_scope)
                    await self._until_failure(self._reader, nursery.cancel_scope)
        with self.lock:
            self.closed = True
            self.outbox.clear()
        self._notify_idle()

    async def _until_failure(self, loop: Any, scope: trio.CancelScope) -> None:
        """Run the reader or writer loop; when it fails, end the whole pipe."""
        try:
            await loop()
        except (RemoteProtocolError, MessageTooLarge) as exc:
            self.sock._note_protocol_error(self.pipe, exc)
        except (EOFError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("%s: pipe %d closed: %s", self.sock.name, self.pid, exc)
        finally:
            scope.cancel()

    async def _reader(self) -> None:
        conn = self.conn
        deliver = self.sock._deliver
        pid = self.pid
        while True:
            payloads = await conn.receive()
            if payloads and payloads[0].__class__ is not bytes:
                # A plug-in transport broke the payload contract (Connection.receive):
                # cores get bytes, never a buffer that may change or cannot be hashed.
                payloads = [bytes(p) for p in payloads]
            if not deliver(pid, payloads):
                # The core's queue for this pipe is full: wait until it drains.
                with self.lock:
                    if self._resume_pending:
                        self._resume_pending = False
                        continue
                    event = self._reader_event = trio.Event()
                await event.wait()

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
                self.sock._pipe_credit(self.pid, len(batch))
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
