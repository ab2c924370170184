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
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from .. import _fork, platform
from ..transports._registry import carries_multipart
from . import _options as opt
from ._logfmt import use_spark_format
from ._receiver import Limits, Receiver, open_socket
from ._rows import DropLog, build_or_drop, full_rows, make_batch, to_kafka
from ._sink import NanopyBatchWriter, NanopyStreamWriter
from ._spool import DefaultSpool, Segment, Spool

log = logging.getLogger("nanopy.spark")

SCHEMA = "payload binary, topic string, received timestamp, seq long, parts array<binary>"
KAFKA_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
                "timestamp timestamp, timestampType int")


def arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _source_schema(kind: str = "nanopy") -> StructType:
    """The source's columns: ``nanopy`` (default) or ``kafka`` (as Spark's Kafka source)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        TimestampType,
    )

    if kind == "kafka":
        return StructType([StructField("key", BinaryType()), StructField("value", BinaryType()),
                           StructField("topic", StringType()), StructField("partition", IntegerType()),
                           StructField("offset", LongType()), StructField("timestamp", TimestampType()),
                           StructField("timestampType", IntegerType())])
    return StructType([StructField("payload", BinaryType()), StructField("topic", StringType()),
                       StructField("received", TimestampType()), StructField("seq", LongType()),
                       StructField("parts", ArrayType(BinaryType()))])


def schema_kind(opts: dict[str, str]) -> str:
    return opt.choice(opts, "schema", ("nanopy", "kafka"), "nanopy")


def check_schema(schema: StructType, kind: str = "nanopy") -> None:
    """The source's schema is fixed: refuse any other one when the query is defined."""
    ours = [(f.name, f.dataType) for f in _source_schema(kind).fields]
    theirs = [(f.name, f.dataType) for f in schema.fields]
    if theirs != ours:
        raise opt.SourceOptionError(
            f"the nanopy source has a fixed schema ({_source_schema(kind).simpleString()}); got "
            f"{schema.simpleString()}: drop .schema(...) and select or cast columns after load()"
            + ('' if kind == "kafka" else ', or use .option("schema", "kafka") for Kafka\'s columns')
        )


def check_values(opts: dict[str, str], given: dict[str, str] | None = None) -> None:
    """Parse every option that is present, whatever the role (errors at definition):
    numbers, choices, options of another protocol, URL shape and a resolvable host."""
    for key in ("maxRecordsPerBatch", "maxOffsetsPerTrigger", "maxBytesPerTrigger", "minPartitions",
                "maxPartitionBytes",
                "maxBuffered", "maxBufferedBytes", "recvBuffer", "recvBufferBytes", "count",
                "sendBuffer"):
        opt.integer(opts, key, 1, 1)
    opt.integer(opts, "recvMaxSize", 0, 0)
    for key in ("pollTimeoutMs", "connectTimeout", "duration", "sendTimeout", "flushTimeout",
                "peerTimeout"):
        opt.number(opts, key, 0.0)
    opt.boolean(opts, "tag", True)
    mode = opt.choice(opts, "mode", ("connect", "bind"), "connect")
    opt.choice(opts, "protocol", ("pull", "sub", "push", "pub"), "pull")
    schema_kind(opts)
    opt.check_protocol_options(opts, given)
    opt.check_addresses(opt.urls(opts), mode, "nanopy data source")


class NanopyDataSource(DataSource):
    """``format("nanopy")``: streaming and batch reads (PULL or SUB), sinks (PUSH or PUB)."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        # Spark makes this object at load() for reads and at save() (or the first
        # micro-batch) for writes, without saying which: check what holds for both.
        opts = opt.lower(options)
        opt.check_names(opts)
        check_values(opts, opt.spelled(options))

    @classmethod
    def name(cls) -> str:
        return "nanopy"

    def schema(self) -> str:
        return KAFKA_SCHEMA if schema_kind(opt.lower(self.options)) == "kafka" else SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return NanopyStreamReader(opt.lower(self.options), schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return NanopyBatchReader(opt.lower(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        return NanopyBatchWriter(opt.lower(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        return NanopyStreamWriter(opt.lower(self.options), schema, False)


# -- input partitions (pickled: runner -> JVM -> executor) -----------------------------
class SpoolPartition(InputPartition):
    """Rows ``after+1 .. last``, which the executor reads from the spool files ``files``.

    A partition is a few hundred bytes whatever the message sizes: the rows never
    travel inside the Spark task."""

    def __init__(self, uri: str, after: int, last: int, files: list[Segment] | None = None) -> None:
        super().__init__((after, last))
        self.uri = uri
        self.files = files


def plan_ranges(after: int, last: int, files: list[Segment], part_bytes: int, min_parts: int,
                min_rows: int = 2000) -> list[tuple[int, int]]:
    """Cut ``(after, last]`` into ranges of about equal bytes.

    There are ``ceil(bytes / part_bytes)`` ranges, or ``min_parts`` when that is more
    (but no range under ``min_rows`` rows, unless the batch has fewer). Sizes come
    from the spool files, assumed even within a file."""
    pieces = []
    for seg in files:
        lo, hi = max(after, seg.after), min(last, seg.last)
        if hi > lo:
            pieces.append((lo, hi, seg.size * (hi - lo) / max(1, seg.last - seg.after)))
    rows = last - after
    total = sum(b for _, _, b in pieces)
    n = max(-(-int(total) // part_bytes), min(min_parts, max(1, rows // min_rows)), 1)
    if n == 1 or not pieces or total <= 0:
        return [(after, last)]
    bounds, k, acc = [after], 1, 0.0
    for lo, hi, size in pieces:
        per = size / (hi - lo)
        while k < n and acc + size >= k * total / n:
            cut = min(hi, max(lo + 1, lo + int((k * total / n - acc) / per + 0.5)))
            if cut > bounds[-1] and cut < last:
                bounds.append(cut)
            k += 1
        acc += size
    bounds.append(last)
    return list(zip(bounds, bounds[1:], strict=False))


class _ReaderOptions:
    """The plain values :func:`_check_reader` keeps on a reader (for type checkers)."""

    options: dict[str, str]
    schema: StructType
    urls: list[str]
    protocol: str
    mode: str
    kafka: bool


def _check_reader(reader: Any, options: dict[str, str], schema: StructType, role: str) -> None:
    """Check a reader's options and schema; keep the plain values it needs."""
    opt.check_names(options, role)
    check_values(options)
    reader.kafka = schema_kind(options) == "kafka"
    check_schema(schema, "kafka" if reader.kafka else "nanopy")
    reader.options = options
    reader.schema = schema
    reader.urls = opt.urls(options)
    reader.protocol = opt.choice(options, "protocol", opt.PROTOCOLS[role], "pull")
    reader.mode = opt.choice(options, "mode", ("connect", "bind"), "connect")


def _lock_dir() -> str:
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"nanopy-spark-sources-{platform.user_tag()}")
    os.makedirs(path, exist_ok=True)
    return path


def claim_pull_source(urls: list[str], mode: str, wait: float) -> Any:
    """Refuse a second query (on this host) on the same PULL source.

    PUSH spreads messages over its peers, so two queries each connecting a PULL
    socket to the same producers would each get part of the stream. A lock file
    per address list, held by the receiving process, tells the second query; it
    is freed by the kernel when the first query's process ends, and a restarting
    query waits ``wait`` seconds for its predecessor to go."""
    import hashlib

    key = hashlib.blake2b(("|".join(sorted(urls)) + "|" + mode).encode(), digest_size=8).hexdigest()
    lock = open(os.path.join(_lock_dir(), f"{key}.lock"), "a+")  # noqa: SIM115 - held for life
    deadline = time.monotonic() + wait
    while True:
        try:
            platform.lock_file(lock, wait=False)
            lock.seek(0)
            lock.truncate()
            lock.write(f"{os.getpid()}\n")
            lock.flush()
            return lock
        except OSError:
            if time.monotonic() >= deadline:
                lock.seek(0)
                holder = lock.read().strip() or "?"
                lock.close()
                raise opt.SourceOptionError(
                    f"another streaming query (source process {holder}) already reads the PULL "
                    f"source {','.join(urls)}: PUSH would split the messages between the two "
                    "queries. Read it once and fan out in foreachBatch, or have the producers "
                    'PUB and read with .option("protocol", "sub") (each query gets every message)'
                ) from None
            time.sleep(0.2)  # the previous run of this query may still be exiting


_receivers: dict[tuple[Any, ...], Receiver] = {}
_receivers_lock = _fork.process_lock()
PARTITION_BYTES = 32 << 20  # spool bytes one executor task reads, about
QUIET = 1.0  # first trigger: the stream counts as drained after this many idle seconds


class NanopyStreamReader(_ReaderOptions, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches from a nanopy PULL or SUB socket, through a write-ahead spool.

    Offsets are ``{"seq": N}``: positions in the log of received messages
    (numbered 1, 2, ... in arrival order; the numbering continues across restarts
    with a ``spoolPath``).
    """

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        # Plain values only: this object is pickled to other processes.
        _check_reader(self, options, schema, "source")
        self.max_records = opt.integer(options, "maxRecordsPerBatch", 1_000_000, 1)
        self.max_per_trigger = opt.integer(options, "maxOffsetsPerTrigger", 0, 1) or None
        self.max_bytes = opt.integer(options, "maxBytesPerTrigger", 256 << 20, 1)
        self.min_parts = opt.integer(options, "minPartitions", 2, 1)
        self.part_bytes = opt.integer(options, "maxPartitionBytes", PARTITION_BYTES, 1)
        self.wait = opt.number(options, "pollTimeoutMs", 20.0) / 1000.0
        self.connect_timeout = opt.number(options, "connectTimeout", 10.0)
        spool = options.get("spoolpath") or None
        self.spool = Spool(spool) if spool else None
        self.skipped_batches = 0
        self.skipped_messages = 0
        self.available_now = False
        self.target: int | None = None
        self._checked = False

    # -- runner process -------------------------------------------------------
    def _receiver(self, start: int | None) -> Receiver | None:
        key = (os.getpid(), tuple(sorted(self.options.items())))
        with _receivers_lock:
            rx = _receivers.get(key)
            if rx is None and start is not None:
                use_spark_format()
                claim = None
                if self.protocol == "pull":
                    claim = claim_pull_source(self.urls, self.mode, max(self.connect_timeout, 5.0))
                spool = self.spool
                if spool is None:
                    spool = DefaultSpool()
                else:
                    spool.prepare()
                rx = _receivers[key] = Receiver(self.options, start, spool, arrow_schema(_source_schema()),
                                                Limits(self.options), durable=self.spool is not None)
                rx.claim = claim  # type: ignore[attr-defined]  # held while the receiver lives
                # The first trigger takes what the producers had queued for us, as a
                # Kafka source would (it matters to availableNow and once).
                end = rx.wait_quiet(QUIET, self.connect_timeout)
                if self.available_now:
                    self.target = end
        return rx

    def initialOffset(self) -> dict[str, Any]:
        if not self._checked:  # a bad spool or address shows up when the query starts
            self._checked = True
            opt.check_reachable(self.urls, self.mode, "source")
            if self.spool is not None:
                self.spool.prepare()
        return {"seq": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow: the batches end at what the spool holds plus what arrives
        until the stream is quiet for a second (see docs/spark.md)."""
        self.available_now = True

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
        if self.target is not None:
            end = min(rx.upto_bytes(first, cap, self.max_bytes), self.target)
        else:
            rx.wait_past(first, self.wait)
            end = rx.upto_bytes(first, cap, self.max_bytes)
        return {"seq": end} if end > first else start

    def reportLatestOffset(self) -> dict[str, Any] | None:
        rx = self._receiver(None)
        if rx is None:
            return None
        out: dict[str, Any] = {"source": f"nanopy {self.protocol} {','.join(self.urls)}"}
        out.update(rx.metrics())
        out["spool"] = rx.spool.display
        out["skippedBatches"] = self.skipped_batches
        out["skippedMessages"] = self.skipped_messages
        return out

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        after, last = int(start["seq"]), int(end["seq"])
        if last <= after:
            return []
        rx = self._receiver(None)
        if rx is not None:
            files, uri = rx.files(after, last), rx.spool.uri
        elif self.spool is not None:  # a replay before this run received anything
            files = [s for s in self.spool.segments() if s.last > after and s.after < last]
            uri = self.spool.uri
        else:
            files, uri = [], ""
        have = files[0].after if files else last
        if have > after and self.spool is None:
            # Without a spoolPath a new run cannot serve what an old run received.
            self.skipped_batches += 1
            self.skipped_messages += min(have, last) - after
            log.warning("nanopy source %s: messages %d..%d cannot be replayed without a "
                        "spoolPath (at-most-once): this batch skips them; %d batch(es) "
                        "skipped so far", ",".join(self.urls), after + 1, min(have, last),
                        self.skipped_batches)
            after = min(have, last)
            if after >= last:
                return []
        return [SpoolPartition(uri, a, b, [f for f in files if f.last > a and f.after < b])
                for a, b in plan_ranges(after, last, files, self.part_bytes, self.min_parts)]

    def commit(self, end: dict[str, Any]) -> None:
        last = int(end["seq"])
        rx = self._receiver(None)
        if rx is not None:
            rx.spool.trim(last, rx.commit(last))
        elif self.spool is not None:
            self.spool.trim(last)

    # -- executor process -----------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SpoolPartition)
        after, last = partition.value
        schema = arrow_schema(_source_schema())
        batches = Spool(partition.uri).iter_read(after, last, schema, partition.files)
        yield from (to_kafka(b) if self.kafka else full_rows(b) for b in batches)


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
        from ..core.errors import Timeout

        max_size = opt.integer(self.options, "recvMaxSize", 1 << 20, 0)
        subs = opt.topics(self.options) if self.protocol == "sub" else []
        schema = arrow_schema(_source_schema())
        frames = any(map(carries_multipart, self.urls))
        drops = DropLog(",".join(self.urls))  # (logged by the executor running the read)
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
                rows = partial(make_batch, got, stamp=time.time(), subscriptions=subs, schema=schema,
                               multipart=frames)
                msgs, batch = build_or_drop(drops.keep(msgs, max_size), rows, drops)
                if batch is not None:
                    yield to_kafka(batch) if self.kafka else full_rows(batch)
                    got += len(msgs)
