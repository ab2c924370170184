"""The streaming source's receiver: one socket, one thread, the write-ahead spool.

It lives in Spark's ``python_streaming_source_runner`` process on the driver host.
The thread takes messages off the socket in groups (``Socket.recv_batch``), numbers
them, appends each group to the spool (one durable write per group) and only then
adds it to the in-memory read-ahead. So the read-ahead is never the only copy of a
message: with a spool, everything the source took off the wire survives a crash.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import pyarrow as pa

from . import _options as opt
from ._spool import Spool

log = logging.getLogger("nanopy.spark")

GROUP_MAX = 65536  # messages per recv_batch: one spool write each
HARD_MAX_SIZE = 64 << 20  # beyond this a peer is disconnected (defence), see recvMaxSize


def make_batch(after: int, payloads: list[bytes], stamp: float, subscriptions: list[bytes],
               schema: pa.Schema) -> pa.RecordBatch:
    """Rows ``after+1 .. after+len(payloads)`` as an Arrow batch of the source schema."""
    n = len(payloads)
    if subscriptions and subscriptions != [b""]:
        ordered = sorted(subscriptions, key=len, reverse=True)
        topic = pa.array(
            [next((t.decode("utf-8", "replace") for t in ordered if p.startswith(t)), None)
             for p in payloads], pa.string())
    else:
        topic = pa.nulls(n, pa.string())
    received = pa.array([int(stamp * 1e6)] * n, pa.int64()).cast(schema.field("received").type)
    columns = [pa.array(payloads, pa.binary()), topic, received,
               pa.array(range(after + 1, after + n + 1), pa.int64())]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def open_socket(options: dict[str, str], protocol: str, mode: str, name: str) -> Any:
    """The receiving PULL or SUB socket, subscribed and bound or connected.

    Its own size limit only guards against hostile sizes: a message above
    ``recvMaxSize`` is dropped by the caller and counted, so the ones queued
    behind it on the same connection survive.
    """
    from .._socket import Socket

    max_size = opt.integer(options, "recvMaxSize", 1 << 20, 0)
    hard = 0 if max_size == 0 else max(max_size * 4, HARD_MAX_SIZE)
    sock = Socket(protocol, recv_buffer=opt.integer(options, "recvBuffer", 65536, 1),
                  recv_max_size=hard, name=name)
    if protocol == "sub":
        for topic in opt.topics(options):
            sock.subscribe(topic)
    for url in opt.urls(options):
        (sock.bind if mode == "bind" else sock.connect)(url)
    return sock


class Receiver:
    """Socket + receiving thread + read-ahead (``groups``) + optional spool."""

    def __init__(self, options: dict[str, str], base: int, spool: Spool | None,
                 schema: pa.Schema, max_buffered: int) -> None:
        self.protocol = opt.choice(options, "protocol", ("pull", "sub"), "pull")
        self.mode = opt.choice(options, "mode", ("connect", "bind"), "connect")
        self.urls = opt.urls(options)
        self.subscriptions = opt.topics(options) if self.protocol == "sub" else []
        self.max_size = opt.integer(options, "recvMaxSize", 1 << 20, 0)
        self.connect_timeout = opt.number(options, "connectTimeout", 10.0)
        self.spool = spool
        self.schema = schema
        self.max_buffered = max_buffered
        self.cond = threading.Condition()
        self.groups: deque[tuple[int, int, pa.RecordBatch]] = deque()  # (after, last, rows)
        self.segments: list[tuple[int, int, str]] = spool.segments() if spool else []
        self.end = base  # the last sequence number taken (and spooled)
        self.buffered = 0
        self.received = 0
        self.oversized = 0
        self.spool_errors = 0
        self.sock = open_socket(options, self.protocol, self.mode, "nanopy-spark-source")
        if spool is None:
            log.warning("nanopy source %s: no spoolPath, so delivery is at-most-once: a driver crash "
                        "loses the messages read ahead (up to maxBuffered=%d) and a batch replayed "
                        "after a failure is skipped", ",".join(self.urls), max_buffered)
        self.thread = threading.Thread(target=self._run, name="nanopy-spark-receiver", daemon=True)
        self.thread.start()

    # -- the receiving thread ----------------------------------------------------
    def _run(self) -> None:
        from .._errors import Closed, Timeout

        started = time.monotonic()
        warned = False
        while True:
            try:
                got = self.sock.recv_batch(GROUP_MAX, timeout=0.5)
            except Timeout:
                if not warned and self.mode == "connect" and not self.sock.pipes \
                        and time.monotonic() - started > self.connect_timeout:
                    warned = True
                    log.warning("nanopy source: no peer connected at %s after %.0fs; still retrying",
                                ",".join(self.urls), self.connect_timeout)
                continue
            except Closed:
                return
            if self.max_size:
                kept = [m for m in got if len(m) <= self.max_size]
                if len(kept) != len(got):
                    self._note_oversized(len(got) - len(kept), max(map(len, got)))
                    got = kept
                    if not got:
                        continue
            self._append(got)

    def _note_oversized(self, n: int, biggest: int) -> None:
        self.oversized += n
        log.warning("nanopy source %s: dropped %d message(s) larger than recvMaxSize=%d bytes "
                    "(largest %d); %d dropped so far", ",".join(self.urls), n, self.max_size,
                    biggest, self.oversized)

    def _append(self, payloads: list[bytes]) -> None:
        after = self.end
        last = after + len(payloads)
        batch = make_batch(after, payloads, time.time(), self.subscriptions, self.schema)
        if self.spool is not None:
            self._spool_write(after, last, batch)
        with self.cond:
            self.groups.append((after, last, batch))
            self.end = last
            self.buffered += len(payloads)
            self.received += len(payloads)
            self.cond.notify_all()
            while self.buffered >= self.max_buffered:
                # Back-pressure: the socket's queue fills, then TCP pushes back.
                self.cond.wait()

    def _spool_write(self, after: int, last: int, batch: pa.RecordBatch) -> None:
        delay = 0.1
        while True:  # a message counts as received only once it is durable
            try:
                path = self.spool.write(after, last, batch)  # type: ignore[union-attr]
                break
            except Exception as exc:  # noqa: BLE001 - keep retrying, loudly
                self.spool_errors += 1
                log.error("nanopy source: cannot write the spool %s (%s); retrying in %.1fs",
                          self.spool.display, exc, delay)  # type: ignore[union-attr]
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        with self.cond:
            self.segments.append((after, last, path))

    # -- called by the reader (runner thread) ------------------------------------------
    def wait_past(self, seq: int, wait: float) -> int:
        """The log end, after waiting up to ``wait`` seconds for it to pass ``seq``."""
        with self.cond:
            if self.end <= seq and wait > 0:
                self.cond.wait_for(lambda: self.end > seq, wait)
            return self.end

    def memory_start(self) -> int | None:
        """``after`` of the oldest group held in memory, or None."""
        with self.cond:
            return self.groups[0][0] if self.groups else None

    def slice(self, after: int, last: int) -> list[pa.RecordBatch]:
        """Rows ``after+1 .. last`` from memory (they must be there)."""
        out = []
        with self.cond:
            for a, b, batch in self.groups:
                if b <= after or a >= last:
                    continue
                lo = max(after, a) - a
                hi = min(last, b) - a
                out.append(batch.slice(lo, hi - lo))
        return out

    def drop_upto(self, seq: int) -> list[tuple[int, int, str]]:
        """Forget rows <= ``seq``; returns the spool files that are now all committed."""
        with self.cond:
            while self.groups and self.groups[0][1] <= seq:
                a, b, _ = self.groups.popleft()
                self.buffered -= b - a
            if self.groups and self.groups[0][0] < seq:
                a, b, batch = self.groups[0]
                cut = seq - a
                self.groups[0] = (seq, b, batch.slice(cut))
                self.buffered -= cut
            done = [s for s in self.segments if s[1] <= seq]
            self.segments = [s for s in self.segments if s[1] > seq]
            self.cond.notify_all()
        return done

    def close(self) -> None:
        self.sock.close(linger=0)

    def metrics(self) -> dict[str, Any]:
        with self.cond:
            return {"seq": self.end, "received": self.received, "buffered": self.buffered,
                    "oversized": self.oversized, "spoolErrors": self.spool_errors}
