"""The streaming source's receiver: one socket, one thread, the write-ahead spool.

It lives in Spark's ``python_streaming_source_runner`` process on the driver host.
The thread takes messages off the socket in groups (``Socket.recv_batch``), numbers
them and appends each group to the spool (one durable write per group); only then
does the group count as received. No message is kept in memory after that: the
receiver holds an index of spool files, and executors read the rows from the
spool themselves. Memory stays bounded in bytes:

* a group is cut at ``GROUP_BYTES`` (and ``GROUP_MAX`` messages);
* the socket's per-pipe queue (``recv_buffer``, counted in messages by nanopy) is
  re-sized after every group to ``recvBufferBytes`` / the largest recent message,
  capped by ``recvBuffer``;
* the spooled but uncommitted backlog (on disk) stops the receiver at
  ``maxBufferedBytes`` or ``maxBuffered`` messages, and TCP pushes back on producers.

A ZeroMQ multipart message is spooled with its frames (nanopy/spark/_rows.py); a
message no row can hold is dropped and counted by reason, and the receiver goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import pyarrow as pa

from ..transports._registry import carries_multipart
from . import _options as opt
from ._rows import DropLog, build_or_drop, file_slices, is_multipart, make_batch, spool_form
from ._spool import Segment, Spool

log = logging.getLogger("nanopy.spark")

GROUP_MAX = 65536  # messages per spool file at most
GROUP_BYTES = 8 << 20  # payload bytes per spool file, about
FIRST_GUESS = 16 << 10  # message size assumed before the first one arrives
SMALLEST = 256  # message size assumed for the queue bound when messages are tiny


def hard_limit(max_size: int) -> int:
    """The socket's own ``recv_max_size``: above it nanopy closes the connection.

    Between ``recvMaxSize`` and this the receiver drops the message (counted) and
    keeps the connection and the messages behind it."""
    return 0 if max_size == 0 else max_size * 4


def open_socket(options: dict[str, str], protocol: str, mode: str, name: str,
                recv_buffer: int | None = None) -> Any:
    """The receiving PULL or SUB socket, subscribed and bound or connected."""
    from ..socket.socket import Socket

    max_size = opt.integer(options, "recvMaxSize", 1 << 20, 0)
    buffer = recv_buffer or opt.integer(options, "recvBuffer", 65536, 1)
    sock = Socket(protocol, recv_buffer=buffer, recv_max_size=hard_limit(max_size), name=name)
    if protocol == "sub":
        for topic in opt.topics(options):
            sock.subscribe(topic)
    for url in opt.urls(options):
        (sock.bind if mode == "bind" else sock.connect)(url)
    return sock


class Limits:
    """The receiver's bounds, from the options (plain values)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.max_size = opt.integer(options, "recvMaxSize", 1 << 20, 0)
        self.queue_bytes = opt.integer(options, "recvBufferBytes", 32 << 20, 1)
        self.queue_max = opt.integer(options, "recvBuffer", 65536, 1)
        self.backlog_bytes = opt.integer(options, "maxBufferedBytes", 512 << 20, 1)
        self.backlog_max = opt.integer(options, "maxBuffered", 1_000_000, 1)

    def queue_for(self, biggest: int) -> int:
        """Per-pipe queue length (messages) that holds about ``queue_bytes``."""
        return max(2, min(self.queue_max, self.queue_bytes // max(biggest, SMALLEST)))


class Receiver:
    """Socket + receiving thread + the index of spooled, uncommitted groups."""

    def __init__(self, options: dict[str, str], start: int, spool: Spool, schema: pa.Schema,
                 limits: Limits, durable: bool = True) -> None:
        self.protocol = opt.choice(options, "protocol", ("pull", "sub"), "pull")
        self.mode = opt.choice(options, "mode", ("connect", "bind"), "connect")
        self.urls = opt.urls(options)
        self.subscriptions = opt.topics(options) if self.protocol == "sub" else []
        self.connect_timeout = opt.number(options, "connectTimeout", 10.0)
        self.limits = limits
        self.spool = spool
        self.schema = schema
        self.cond = threading.Condition()
        # Spooled and not yet committed, in order: a previous run's files first.
        self.segments: deque[Segment] = deque(s for s in spool.segments() if s.last > start)
        self.committed = start
        self.end = max([start] + [s.last for s in self.segments])  # the last seq spooled
        self.backlog_bytes = sum(s.size for s in self.segments)
        self.received = 0
        self.received_bytes = 0
        self.multipart = 0  # messages of several frames (zmtp+ URLs)
        # Only zmtp+ pipes (transports that carry multipart) do: without one, messages are not inspected.
        self.frames = any(map(carries_multipart, self.urls))
        self.drops = DropLog(",".join(self.urls))
        self.too_large_seen = 0
        self.spool_errors = 0
        self.closed = False
        self.error: BaseException | None = None
        self.waits = 0  # times the backlog bound stopped the receiver
        # Until a message arrives, assume fairly large ones: the queue starts at
        # recvBufferBytes / 16 KiB (2048 messages by default) and adapts at once.
        self.recent_biggest = min(limits.max_size or FIRST_GUESS, FIRST_GUESS)
        buffer = limits.queue_for(self.recent_biggest)
        self.sock = open_socket(options, self.protocol, self.mode, "nanopy-spark-source", buffer)
        if not durable:
            log.warning("nanopy source %s: no spoolPath, so delivery is at-most-once across driver "
                        "restarts: a crash loses the messages received and not yet committed (up "
                        "to maxBufferedBytes=%d bytes / maxBuffered=%d messages, spooled in %s) "
                        "and the socket's queue", ",".join(self.urls), limits.backlog_bytes,
                        limits.backlog_max, spool.display)
        self.thread = threading.Thread(target=self._run, name="nanopy-spark-receiver", daemon=True)
        self.thread.start()

    # -- the receiving thread ----------------------------------------------------
    def _run(self) -> None:
        try:
            self._receive()
        except BaseException as exc:
            # The query must fail with the reason, not wait for messages forever.
            log.exception("nanopy source %s: the receiver stopped", ",".join(self.urls))
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"nanopy source {','.join(self.urls)}: the receiver stopped: "
                               f"{self.error!r}") from self.error

    def _receive(self) -> None:
        from ..core.errors import Closed, Timeout

        started = time.monotonic()
        warned = False
        want = GROUP_MAX
        while True:
            try:
                got = self.sock.recv_batch(want, timeout=0.5)
                size = sum(map(len, got))
                while size < GROUP_BYTES and len(got) < GROUP_MAX:  # fill the group
                    try:
                        more = self.sock.recv_batch(GROUP_MAX - len(got), timeout=0)
                    except Timeout:
                        break
                    got += more
                    size += sum(map(len, more))
            except Timeout:
                if not warned and self.mode == "connect" and not self.sock.pipes \
                        and time.monotonic() - started > self.connect_timeout:
                    warned = True
                    log.warning("nanopy source: no peer connected at %s after %.0fs; still retrying",
                                ",".join(self.urls), self.connect_timeout)
                self._check_too_large()
                continue
            except Closed:
                return
            except Exception:  # noqa: BLE001 - a receiver that dies silently hangs the query
                if self.closed:
                    return
                log.exception("nanopy source %s: receiving failed; retrying", ",".join(self.urls))
                time.sleep(0.5)
                continue
            biggest = max(map(len, got))
            self._resize_queue(biggest)
            self._check_too_large()
            kept = self.drops.keep(got, self.limits.max_size, biggest)
            if kept is not got:
                size = sum(map(len, kept))
            if size <= GROUP_BYTES:
                self._append(kept, size)
            else:  # (one spool file's columns must stay under Arrow's 2 GiB)
                for part in file_slices(kept):
                    self._append(part, sum(map(len, part)))

    def _resize_queue(self, biggest: int) -> None:
        """Keep the socket's queue near ``recvBufferBytes`` for the sizes seen lately."""
        self.recent_biggest = max(biggest, self.recent_biggest // 2)
        want = self.limits.queue_for(self.recent_biggest)
        if want != self.sock.recv_buffer:
            self.sock.recv_buffer = want

    def _check_too_large(self) -> None:
        """Messages above the hard limit closed their connection (nanopy counts them)."""
        n = self.sock.stats().messages_too_large
        if n > self.too_large_seen:
            log.warning("nanopy source %s: %d message(s) above %d bytes (4 x recvMaxSize) closed their "
                        "connection; the producer loses what it had queued on it", ",".join(self.urls),
                        n - self.too_large_seen, hard_limit(self.limits.max_size))
            self.too_large_seen = n

    def _append(self, payloads: list[bytes], size: int) -> None:
        """Number ``payloads`` (``size`` bytes) and write them to the spool as one file
        (a message no row can hold is dropped, counted and logged instead)."""
        if not payloads:
            return
        after = self.end
        stamp = time.time()

        def build(group: list[bytes]) -> pa.RecordBatch:
            return make_batch(after, group, stamp, self.subscriptions, self.schema, self.frames)

        kept, batch = build_or_drop(payloads, build, self.drops)
        if batch is None:
            return
        batch = spool_form(batch)
        if kept is not payloads:
            size = sum(map(len, kept))
        payloads = kept
        last = after + len(payloads)
        multipart = sum(map(is_multipart, payloads)) if self.frames else 0
        del payloads
        segment = self._spool_write(after, last, batch)
        del batch
        with self.cond:
            self.segments.append(segment)
            self.end = last
            self.backlog_bytes += segment.size
            self.received += last - after
            self.received_bytes += size
            self.multipart += multipart
            self.cond.notify_all()
            if self._full():
                self.waits += 1
                # Back-pressure: the socket's queue fills, then TCP pushes back.
                self.cond.wait_for(lambda: not self._full())

    def _full(self) -> bool:
        return self.end - self.committed >= self.limits.backlog_max or self.backlog_bytes >= self.limits.backlog_bytes

    def _spool_write(self, after: int, last: int, batch: pa.RecordBatch) -> Segment:
        delay = 0.1
        while True:  # a message counts as received only once it is durable
            try:
                return self.spool.write(after, last, batch)
            except Exception as exc:  # noqa: BLE001 - keep retrying, loudly
                self.spool_errors += 1
                log.error("nanopy source: cannot write the spool %s (%s); retrying in %.1fs",
                          self.spool.display, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    # -- called by the reader (runner thread) ------------------------------------------
    def wait_past(self, seq: int, wait: float) -> int:
        """The log end, after waiting up to ``wait`` seconds for it to pass ``seq``."""
        with self.cond:
            if self.end <= seq and wait > 0:
                self.cond.wait_for(lambda: self.end > seq or self.error is not None, wait)
            self._raise_if_failed()
            return self.end

    def wait_quiet(self, quiet: float, longest: float) -> int:
        """Wait until no message arrived for ``quiet`` seconds (at most ``longest``
        seconds in all, and at least until a peer connects); returns the log end."""
        deadline = time.monotonic() + longest
        with self.cond:
            while time.monotonic() < deadline:
                before = self.end
                self.cond.wait(min(quiet, max(0.0, deadline - time.monotonic())))
                if self.end == before and (self.sock.pipes or self.mode == "bind"):
                    break
            return self.end

    def files(self, after: int, last: int) -> list[Segment]:
        """The spool files holding messages ``after+1 .. last`` (in this receiver's index)."""
        with self.cond:
            return [s for s in self.segments if s.last > after and s.after < last]

    def upto_bytes(self, after: int, cap_rows: int, cap_bytes: int) -> int:
        """The end of a batch from ``after``: at most ``cap_rows`` messages and, past
        its first file, ``cap_bytes`` bytes of spool files."""
        end, size = after, 0
        with self.cond:
            for seg in self.segments:
                if seg.last <= after:
                    continue
                if end > after and size + seg.size > cap_bytes:
                    break
                end = seg.last
                size += seg.size
                if end - after >= cap_rows:
                    break
        return min(end, after + cap_rows)

    def commit(self, seq: int) -> list[Segment]:
        """Rows <= ``seq`` are done; returns the spool files that are now all committed."""
        with self.cond:
            self.committed = max(self.committed, seq)
            done = []
            while self.segments and self.segments[0].last <= seq:
                seg = self.segments.popleft()
                done.append(seg)
                self.backlog_bytes -= seg.size
            self.cond.notify_all()
        return done

    def close(self) -> None:
        self.closed = True
        self.sock.close(linger=0)

    def metrics(self) -> dict[str, Any]:
        stats = self.sock.stats()
        with self.cond:
            return {
                "seq": self.end, "committed": self.committed,
                "received": self.received, "receivedBytes": self.received_bytes,
                "backlog": self.end - self.committed, "backlogBytes": self.backlog_bytes,
                "spoolFiles": len(self.segments),
                "socketQueueLimit": self.sock.recv_buffer,
                "backpressureWaits": self.waits,
                "oversized": self.drops.counts.get("oversized", 0),
                "droppedByReason": self.drops.snapshot(), "multipart": self.multipart,
                "connectionsClosedTooLarge": stats.messages_too_large,
                "dropped": stats.messages_dropped, "spoolErrors": self.spool_errors,
                "peers": stats.pipes,
            }
