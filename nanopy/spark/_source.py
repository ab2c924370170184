"""The ``"nanopy"`` PySpark data source: a streaming reader and the writers.

Where things run (PySpark 4.x, see docs/spark.md): ``NanopyDataSource`` and the
reader objects are created in Spark's Python helper processes and *pickled*, so
they hold only option values. The reader's socket and receiving thread are made
on first use inside ``python_streaming_source_runner`` (one long-lived process
per source per query, on the driver host); ``readBetweenOffsets`` -- the replay
path -- runs on an executor with a fresh copy and reads the spool.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.types import StructType

from . import _options as opt
from ._sink import NanopyBatchWriter, NanopyStreamWriter

log = logging.getLogger("nanopy.spark")

_DEBUG = bool(os.environ.get("NANOPY_SPARK_DEBUG"))

SCHEMA = "payload binary, topic string, received timestamp, seq long"


def arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


class NanopyDataSource(DataSource):
    """``format("nanopy")``: a streaming source (PULL or SUB) and a sink (PUSH or PUB)."""

    @classmethod
    def name(cls) -> str:
        return "nanopy"

    def schema(self) -> str:
        return SCHEMA

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return NanopyStreamReader(opt.lower(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        return NanopyBatchWriter(opt.lower(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        return NanopyStreamWriter(opt.lower(self.options), schema)


class _Receiver:
    """The socket plus a thread draining it into time-stamped groups (runner process)."""

    def __init__(self, options: dict[str, str], max_buffered: int) -> None:
        protocol = opt.choice(options, "protocol", ("pull", "sub"), "pull")
        mode = opt.choice(options, "mode", ("connect", "bind"), "connect")
        self.subscriptions = opt.topics(options) if protocol == "sub" else []
        self.protocol = protocol
        self.max_buffered = max_buffered
        self.cond = threading.Condition()
        self.groups: deque[tuple[float, list[bytes]]] = deque()
        self.buffered = 0
        self.pid = os.getpid()
        recv_buffer = opt.integer(options, "recvBuffer", 65536, 1)
        from .._socket import Socket

        max_size = opt.integer(options, "recvMaxSize", 1 << 20, 0)
        sock = Socket(protocol, recv_buffer=recv_buffer, recv_max_size=max_size,
                      name="nanopy-spark-source")
        if protocol == "sub":
            for topic in self.subscriptions:
                sock.subscribe(topic)
        for url in opt.urls(options):
            (sock.bind if mode == "bind" else sock.connect)(url)
        self.sock = sock
        self.thread = threading.Thread(target=self._run, name="nanopy-spark-receiver", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from .._errors import Closed, Timeout

        recv = self.sock.recv
        cond = self.cond
        while True:
            try:
                first = recv(timeout=0.5)
            except Timeout:
                continue
            except Closed:
                return
            group = [first]
            try:
                group += _drain(self.sock, 4095)
            except Closed:
                return
            stamp = time.time()
            with cond:
                self.groups.append((stamp, group))
                self.buffered += len(group)
                cond.notify_all()
                while self.buffered >= self.max_buffered:
                    # Back-pressure: the socket's queue fills, then TCP pushes back.
                    cond.wait()

    def take(self, limit: int, wait: float) -> tuple[list[bytes], list[float], list[int]]:
        """Up to ``limit`` messages, waiting up to ``wait`` seconds for the first."""
        cond = self.cond
        payloads: list[bytes] = []
        stamps: list[float] = []
        sizes: list[int] = []
        with cond:
            if not self.groups and wait > 0:
                cond.wait(wait)
            while self.groups and len(payloads) < limit:
                stamp, group = self.groups[0]
                room = limit - len(payloads)
                if len(group) <= room:
                    self.groups.popleft()
                    part = group
                else:
                    part = group[:room]
                    self.groups[0] = (stamp, group[room:])
                payloads.extend(part)
                stamps.append(stamp)
                sizes.append(len(part))
            self.buffered -= len(payloads)
            cond.notify_all()
        return payloads, stamps, sizes


def _drain(sock: Any, limit: int) -> list[bytes]:
    """Take up to ``limit`` queued message bodies without waiting, in one round of
    the socket's driver (about half the cost of a ``recv(timeout=0)`` per message)."""
    return sock._driver.recv_bodies(limit)  # type: ignore[no-any-return]


_receivers: dict[str, _Receiver] = {}
_receivers_lock = threading.Lock()


class NanopyStreamReader(SimpleDataSourceStreamReader):
    """Micro-batches from a nanopy PULL or SUB socket.

    Offsets are ``{"seq": N}``: ``N`` is the sequence number of the last message
    of the batch; messages are numbered 1, 2, ... in arrival order and the
    numbering carries on from the checkpointed offset after a restart.
    """

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        # Plain values only: this object is pickled to other processes.
        self.options = options
        self.schema = schema
        self.max_records = opt.integer(options, "maxRecordsPerBatch", 100_000, 1)
        self.max_buffered = opt.integer(options, "maxBuffered", 1_000_000, 1)
        self.wait = opt.number(options, "pollTimeoutMs", 20.0) / 1000.0
        self.spool = options.get("spoolpath") or options.get("spool") or None
        opt.urls(options)  # fail early, at query start, on a missing URL
        opt.choice(options, "protocol", ("pull", "sub"), "pull")
        self._served: dict[int, tuple[int, Any]] | None = None

    # -- runner process -------------------------------------------------------
    def _receiver(self) -> _Receiver:
        key = json.dumps(self.options, sort_keys=True)
        with _receivers_lock:
            rx = _receivers.get(key)
            if rx is None or rx.pid != os.getpid():
                rx = _receivers[key] = _Receiver(self.options, self.max_buffered)
        return rx

    def initialOffset(self) -> dict[str, Any]:
        self._receiver()  # start receiving as soon as the query starts
        return {"seq": 0}

    def read(self, start: dict[str, Any]) -> tuple[Iterator[Any], dict[str, Any]]:
        if self._served is None:
            self._served = {}
        first = int(start["seq"])
        again = self._served.get(first)
        if again is not None:  # asked twice for the same batch: same answer
            return iter(again[1]), {"seq": again[0]}
        t0 = time.perf_counter()
        payloads, stamps, sizes = self._receiver().take(self.max_records, self.wait)
        if not payloads:
            return iter([]), start
        last = first + len(payloads)
        t1 = time.perf_counter()
        batch = self._make_batch(first, payloads, stamps, sizes)
        t2 = time.perf_counter()
        if self.spool:
            _spool_write(self.spool, first, last, batch)
        if _DEBUG:
            log.warning("nanopy source read %d..%d: take %.1f ms, arrow %.1f ms, spool %.1f ms",
                        first + 1, last, (t1 - t0) * 1e3, (t2 - t1) * 1e3,
                        (time.perf_counter() - t2) * 1e3)
        self._served[first] = (last, [batch])
        return iter([batch]), {"seq": last}

    def _make_batch(self, first: int, payloads: list[bytes], stamps: list[float],
                    sizes: list[int]) -> pa.RecordBatch:
        schema = arrow_schema(self.schema)
        n = len(payloads)
        micros: list[int] = []
        for stamp, size in zip(stamps, sizes, strict=True):
            micros.extend([int(stamp * 1e6)] * size)
        topic: pa.Array
        subs = self._receiver().subscriptions
        if subs and subs != [b""]:
            ordered = sorted(subs, key=len, reverse=True)
            topic = pa.array(
                [next((t.decode("utf-8", "replace") for t in ordered if p.startswith(t)), None)
                 for p in payloads], pa.string())
        else:
            topic = pa.nulls(n, pa.string())
        columns = [
            pa.array(payloads, pa.binary()),
            topic,
            pa.array(micros, pa.int64()).cast(schema.field("received").type),
            pa.array(range(first + 1, first + n + 1), pa.int64()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=schema)

    def commit(self, end: dict[str, Any]) -> None:
        last = int(end["seq"])
        if self._served:
            for first in [f for f, (e, _) in self._served.items() if e <= last]:
                del self._served[first]
        if self.spool:
            _spool_trim(self.spool, last)

    # -- executor process (replay) ----------------------------------------------
    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[Any]:
        first, last = int(start["seq"]), int(end["seq"])
        if last <= first:
            return iter([])
        if not self.spool:
            log.warning("nanopy source: batch %d..%d cannot be replayed without a spool "
                        "(at-most-once); it is skipped", first + 1, last)
            return iter([])
        return iter(_spool_read(self.spool, first, last, arrow_schema(self.schema)))


# -- the spool: one Arrow IPC file per micro-batch, named by its offsets ---------
def _spool_name(first: int, last: int) -> str:
    return f"{first:020d}-{last:020d}.arrow"


def _spool_files(path: str) -> list[tuple[int, int, str]]:
    out = []
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    for name in names:
        if not name.endswith(".arrow"):
            continue
        a, _, b = name[:-6].partition("-")
        if a.isdigit() and b.isdigit():
            out.append((int(a), int(b), os.path.join(path, name)))
    return sorted(out)


def _spool_write(path: str, first: int, last: int, batch: pa.RecordBatch) -> None:
    """Write a batch durably (write, fsync, rename, fsync the directory)."""
    os.makedirs(path, exist_ok=True)
    final = os.path.join(path, _spool_name(first, last))
    tmp = final + ".tmp"
    with open(tmp, "wb") as f:
        with pa.ipc.new_file(f, batch.schema) as writer:
            writer.write_batch(batch)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _spool_trim(path: str, committed: int) -> None:
    for _, last, name in _spool_files(path):
        if last <= committed:
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass


def _spool_read(path: str, first: int, last: int, schema: pa.Schema) -> list[pa.RecordBatch]:
    import pyarrow.compute as pc

    out: list[pa.RecordBatch] = []
    covered = 0
    for a, b, name in _spool_files(path):
        if b <= first or a >= last:
            continue
        with open(name, "rb") as f:
            table = pa.ipc.open_file(pa.BufferReader(f.read())).read_all()
        seq = table.column("seq")
        mask = pc.and_(pc.greater(seq, first), pc.less_equal(seq, last))
        table = table.filter(mask).select(schema.names)
        covered += table.num_rows
        for batch in table.to_batches():
            out.append(pa.RecordBatch.from_arrays(batch.columns, schema=schema))
    if covered != last - first:
        raise RuntimeError(
            f"nanopy source: the spool {path!r} holds {covered} of the {last - first} messages of "
            f"batch {first + 1}..{last}; was it deleted or shared between queries?"
        )
    return out
