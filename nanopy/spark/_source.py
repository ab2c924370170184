"""The ``"nanopy"`` PySpark data source: streaming and batch readers, and the writers.

Where things run (PySpark 4.x, see docs/spark.md): ``NanopyDataSource`` and the
reader objects are created in Spark's Python helper processes and *pickled*, so
they hold only option values. The streaming reader's socket and receiving thread
are made on first use inside ``python_streaming_source_runner`` (one long-lived
process per source per query, on the driver host). ``partitions()`` runs there too
and ships each micro-batch to the executors inside its input partitions -- or, for
rows no longer in memory (a replay, a restart), as spool ranges the executors read.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from . import _options as opt
from ._receiver import Receiver, make_batch, open_socket
from ._sink import NanopyBatchWriter, NanopyStreamWriter
from ._spool import Spool

log = logging.getLogger("nanopy.spark")

SCHEMA = "payload binary, topic string, received timestamp, seq long"
PARTITION_ROWS = 50_000  # rows per input partition of a micro-batch


def arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _source_schema() -> StructType:
    from pyspark.sql.types import (
        BinaryType,
        LongType,
        StringType,
        StructField,
        TimestampType,
    )

    return StructType([StructField("payload", BinaryType()), StructField("topic", StringType()),
                       StructField("received", TimestampType()), StructField("seq", LongType())])


def check_schema(schema: StructType) -> None:
    """The source's schema is fixed: refuse any other one when the query is defined."""
    ours = [(f.name, f.dataType) for f in _source_schema().fields]
    theirs = [(f.name, f.dataType) for f in schema.fields]
    if theirs != ours:
        raise opt.SourceOptionError(
            f"the nanopy source has a fixed schema ({SCHEMA}); got {schema.simpleString()}: "
            "drop .schema(...) and select or cast columns after load()"
        )


def check_values(opts: dict[str, str]) -> None:
    """Parse every option that is present, whatever the role (errors at definition)."""
    for key in ("maxRecordsPerBatch", "maxOffsetsPerTrigger", "maxBuffered", "recvBuffer",
                "count", "sendBuffer"):
        opt.integer(opts, key, 1, 1)
    opt.integer(opts, "recvMaxSize", 0, 0)
    for key in ("pollTimeoutMs", "connectTimeout", "duration", "sendTimeout", "flushTimeout",
                "peerTimeout"):
        opt.number(opts, key, 0.0)
    opt.boolean(opts, "tag", True)
    opt.choice(opts, "mode", ("connect", "bind"), "connect")
    opt.choice(opts, "protocol", ("pull", "sub", "push", "pub"), "pull")
    if "url" in opts or "urls" in opts:
        opt.urls(opts)


class NanopyDataSource(DataSource):
    """``format("nanopy")``: streaming and batch reads (PULL or SUB), sinks (PUSH or PUB)."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        # Spark makes this object at load() for reads and at save() (or the first
        # micro-batch) for writes, without saying which: check what holds for both.
        opts = opt.lower(options)
        opt.check_names(opts)
        check_values(opts)

    @classmethod
    def name(cls) -> str:
        return "nanopy"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return NanopyStreamReader(opt.lower(self.options), schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return NanopyBatchReader(opt.lower(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        return NanopyBatchWriter(opt.lower(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        return NanopyStreamWriter(opt.lower(self.options), schema, False)


# -- input partitions (pickled: runner -> JVM -> executor) -----------------------------
class RowsPartition(InputPartition):
    """Rows carried in the partition itself, as an Arrow IPC stream."""

    def __init__(self, after: int, last: int, data: bytes) -> None:
        super().__init__((after, last))
        self.data = data


class SpoolPartition(InputPartition):
    """Rows ``after+1 .. last`` that the executor reads from the spool."""

    def __init__(self, uri: str, after: int, last: int) -> None:
        super().__init__((after, last))
        self.uri = uri


def _ipc(batches: list[pa.RecordBatch], schema: pa.Schema) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


class _ReaderOptions:
    """The plain values :func:`_check_reader` keeps on a reader (for type checkers)."""

    options: dict[str, str]
    schema: StructType
    urls: list[str]
    protocol: str
    mode: str


def _check_reader(reader: Any, options: dict[str, str], schema: StructType, role: str) -> None:
    """Check a reader's options and schema; keep the plain values it needs."""
    opt.check_names(options, role)
    check_values(options)
    check_schema(schema)
    reader.options = options
    reader.schema = schema
    reader.urls = opt.urls(options)
    reader.protocol = opt.choice(options, "protocol", opt.PROTOCOLS[role], "pull")
    reader.mode = opt.choice(options, "mode", ("connect", "bind"), "connect")


_receivers: dict[tuple[Any, ...], Receiver] = {}
_receivers_lock = threading.Lock()


class NanopyStreamReader(_ReaderOptions, DataSourceStreamReader):
    """Micro-batches from a nanopy PULL or SUB socket, through a write-ahead spool.

    Offsets are ``{"seq": N}``: positions in the log of received messages
    (numbered 1, 2, ... in arrival order; the numbering continues across restarts).
    """

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        # Plain values only: this object is pickled to other processes.
        _check_reader(self, options, schema, "source")
        self.max_records = opt.integer(options, "maxRecordsPerBatch", 100_000, 1)
        self.max_per_trigger = opt.integer(options, "maxOffsetsPerTrigger", 0, 1) or None
        self.max_buffered = opt.integer(options, "maxBuffered", 1_000_000, 1)
        self.wait = opt.number(options, "pollTimeoutMs", 20.0) / 1000.0
        spool = options.get("spoolpath") or None
        self.spool = Spool(spool) if spool else None
        self.skipped_batches = 0
        self.skipped_messages = 0
        self._checked = False

    # -- runner process -------------------------------------------------------
    def _receiver(self, start: int | None) -> Receiver | None:
        key = (os.getpid(), tuple(sorted(self.options.items())))
        with _receivers_lock:
            rx = _receivers.get(key)
            if rx is None and start is not None:
                base = start
                if self.spool is not None:
                    self.spool.prepare()
                    base = max(start, self.spool.end())
                rx = _receivers[key] = Receiver(self.options, base, self.spool,
                                                arrow_schema(self.schema), self.max_buffered)
        return rx

    def initialOffset(self) -> dict[str, Any]:
        if not self._checked:  # a bad spool or address shows up when the query starts
            self._checked = True
            opt.check_reachable(self.urls, self.mode, "source")
            if self.spool is not None:
                self.spool.prepare()
        return {"seq": 0}

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:
        first = int(start["seq"])
        rx = self._receiver(first)
        assert rx is not None
        cap = self.max_records
        rows = getattr(limit, "max_rows", None)
        if rows:
            cap = min(cap, int(rows))
        end = min(rx.wait_past(first, self.wait), first + cap)
        return {"seq": end} if end > first else start

    def reportLatestOffset(self) -> dict[str, Any] | None:
        rx = self._receiver(None)
        if rx is None:
            return None
        out = rx.metrics()
        out["skippedBatches"] = self.skipped_batches
        out["skippedMessages"] = self.skipped_messages
        return out

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        after, last = int(start["seq"]), int(end["seq"])
        if last <= after:
            return []
        rx = self._receiver(None)
        in_memory = rx.memory_start() if rx is not None else None
        split = last if in_memory is None else max(after, min(last, in_memory))
        parts: list[InputPartition] = []
        if split > after:  # rows not in memory: a replay, or read ahead by a previous run
            if self.spool is not None:
                parts += [SpoolPartition(self.spool.uri, a, min(a + PARTITION_ROWS, split))
                          for a in range(after, split, PARTITION_ROWS)]
            else:
                self.skipped_batches += 1
                self.skipped_messages += split - after
                log.warning("nanopy source %s: messages %d..%d cannot be replayed without a "
                            "spoolPath (at-most-once): this batch skips them; %d batch(es) "
                            "skipped so far", ",".join(self.urls), after + 1, split,
                            self.skipped_batches)
        if last > split and rx is not None:
            schema = arrow_schema(self.schema)
            for a in range(split, last, PARTITION_ROWS):
                b = min(a + PARTITION_ROWS, last)
                parts.append(RowsPartition(a, b, _ipc(rx.slice(a, b), schema)))
        return parts

    def commit(self, end: dict[str, Any]) -> None:
        last = int(end["seq"])
        rx = self._receiver(None)
        if rx is not None:
            done = rx.drop_upto(last)
            if self.spool is not None:
                self.spool.trim(last, done)
        elif self.spool is not None:
            self.spool.trim(last)

    # -- executor process -----------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, RowsPartition):
            yield from pa.ipc.open_stream(partition.data).read_all().to_batches()
            return
        assert isinstance(partition, SpoolPartition)
        after, last = partition.value
        yield from Spool(partition.uri).read(after, last, arrow_schema(self.schema))


class NanopyBatchReader(_ReaderOptions, DataSourceReader):
    """``spark.read.format("nanopy")``: receive until ``count`` messages or ``duration`` s.

    One task on an executor opens the socket, receives, and returns the rows.
    """

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        _check_reader(self, options, schema, "batch read")
        self.count = opt.integer(options, "count", 0, 1) or None
        self.duration = opt.number(options, "duration", 0.0) or None
        if self.count is None and self.duration is None:
            raise opt.SourceOptionError(
                'a batch read needs a bound: .option("count", N) messages and/or '
                '.option("duration", seconds)'
            )
        opt.check_reachable(self.urls, self.mode, "batch read")

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from .._errors import Timeout

        max_size = opt.integer(self.options, "recvMaxSize", 1 << 20, 0)
        subs = opt.topics(self.options) if self.protocol == "sub" else []
        schema = arrow_schema(self.schema)
        deadline = None if self.duration is None else time.monotonic() + self.duration
        got = 0
        with open_socket(self.options, self.protocol, self.mode, "nanopy-spark-read") as sock:
            while self.count is None or got < self.count:
                left = 0.5 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    break
                want = 65536 if self.count is None else min(65536, self.count - got)
                try:
                    msgs = sock.recv_batch(want, timeout=min(left, 0.5))
                except Timeout:
                    continue
                if max_size:
                    msgs = [m for m in msgs if len(m) <= max_size]
                if msgs:
                    yield make_batch(got, msgs, time.time(), subs, schema)
                    got += len(msgs)
