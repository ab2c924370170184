"""The nanopy sink: ``df.write.format("nanopy")`` and ``df.writeStream.format("nanopy")``.

``write()`` runs in the executors' Python workers. Each worker process keeps one
socket per (URLs, protocol, mode, options), found again by every later task and
micro-batch while PySpark reuses the worker; the cache is keyed by ``os.getpid()``
so a forked child never touches its parent's socket. Before ``write()`` returns,
every message sent is written to the connection (the task's rows are flushed),
so a task that reports success has handed all its rows to the kernel.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from . import _options as opt
from ._tags import make_tag

try:  # Arrow writers hand us whole column batches (PySpark >= 4.1)
    from pyspark.sql.datasource import DataSourceArrowWriter as _BatchBase
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamBase
except ImportError:  # pragma: no cover - older PySpark: rows
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamBase  # type: ignore[assignment]
    from pyspark.sql.datasource import DataSourceWriter as _BatchBase  # type: ignore[assignment]

log = logging.getLogger("nanopy.spark")

_cache: dict[tuple[Any, ...], Any] = {}
_cache_pid = 0
_cache_lock = threading.Lock()


@dataclass
class NanopyCommit(WriterCommitMessage):
    """What one task reports: rows sent from which partition."""

    partition: int
    count: int
    nulls: int


class _Writer:
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        # Plain values only: the writer is pickled to the executors.
        self.options = options
        self.urls = opt.urls(options)
        self.protocol = opt.choice(options, "protocol", ("push", "pub"), "push")
        self.mode = opt.choice(options, "mode", ("connect", "bind"), "connect")
        names = schema.fieldNames()
        column = options.get("column")
        if column is None:
            column = next((c for c in ("payload", "value", "data") if c in names), None)
        if column is None:
            column = next((f.name for f in schema.fields
                           if isinstance(f.dataType, (BinaryType, StringType))), None)
        if column is None or column not in names:
            raise opt.SourceOptionError(
                f"the nanopy sink needs a binary or string payload column; columns are {names} "
                '(name it "payload" or pass .option("column", name))'
            )
        self.column = column
        topic_column = options.get("topiccolumn") or None
        if topic_column is not None and topic_column not in names:
            raise opt.SourceOptionError(f"topicColumn {topic_column!r} is not a column of {names}")
        self.topic_column = topic_column
        self.tag = opt.boolean(options, "tag", True)
        self.send_timeout = opt.number(options, "sendTimeout", 30.0)
        self.flush_timeout = opt.number(options, "flushTimeout", 30.0)
        self.peer_timeout = opt.number(options, "peerTimeout", 10.0)
        self.send_buffer = opt.integer(options, "sendBuffer", 8192, 1)
        self.run_id = secrets.randbits(64)

    # -- executor side ----------------------------------------------------------
    def _socket(self) -> Any:
        global _cache_pid
        key = (tuple(self.urls), self.protocol, self.mode, self.send_buffer, self.send_timeout)
        with _cache_lock:
            if _cache_pid != os.getpid():
                _cache.clear()  # sockets of a parent process are unusable here
                _cache_pid = os.getpid()
            sock = _cache.get(key)
            if sock is not None and not sock.closed:
                return sock
            from .._socket import Socket

            sock = Socket(self.protocol, name="nanopy-spark-sink", send_buffer=self.send_buffer,
                          send_timeout=self.send_timeout, linger=self.flush_timeout)
            for url in self.urls:
                (sock.bind if self.mode == "bind" else sock.connect)(url)
            _cache[key] = sock
        if self.protocol == "pub":
            # PUB drops messages while nobody listens: wait for the first subscriber.
            from ..testing import wait_pipes

            try:
                wait_pipes(sock, 1, self.peer_timeout)
            except TimeoutError:
                log.warning("nanopy sink: no subscriber within %.1fs on %s", self.peer_timeout, self.urls)
        return sock

    def _write(self, iterator: Iterator[Any], batch_id: int) -> NanopyCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        run_id = self.run_id
        if ctx is not None:
            query = ctx.getLocalProperty("sql.streaming.queryId")
            if query:  # stable across restarts of the same checkpoint
                run_id = int.from_bytes(hashlib.blake2b(query.encode(), digest_size=8).digest(), "big")
            if batch_id < 0:
                text = ctx.getLocalProperty("streaming.sql.batchId")
                if text:
                    batch_id = int(text)
        sock = self._socket()
        send = sock.send
        tag = self.tag
        column, topic_column = self.column, self.topic_column
        index = nulls = 0
        for chunk in iterator:
            if hasattr(chunk, "column"):  # a pyarrow.RecordBatch
                payloads = chunk.column(column).to_pylist()
                topics = chunk.column(topic_column).to_pylist() if topic_column else None
            else:  # a Row
                payloads = [chunk[column]]
                topics = [chunk[topic_column]] if topic_column else None
            for i, payload in enumerate(payloads):
                if payload is None:
                    nulls += 1
                    continue
                if isinstance(payload, str):
                    payload = payload.encode()
                if topics is not None and topics[i] is not None:
                    t = topics[i]
                    payload = (t.encode() if isinstance(t, str) else bytes(t)) + payload
                if tag:
                    payload = payload + make_tag(run_id, batch_id, partition, index)
                send(payload)
                index += 1
        self._flush(sock)
        return NanopyCommit(partition, index, nulls)

    def _flush(self, sock: Any) -> None:
        """Wait until every queued message of this socket is written (or fail)."""
        drivers = list(sock._pipes.values())
        if not drivers or all(d.flushed() for d in drivers):
            return
        deadline = time.monotonic() + self.flush_timeout
        sock._engine.run(sock._flush, self.flush_timeout, timeout=self.flush_timeout + 5)
        if not all(d.flushed() for d in list(sock._pipes.values())) and time.monotonic() >= deadline:
            raise TimeoutError(f"nanopy sink: messages still queued after {self.flush_timeout}s")


def _total(messages: list[Any]) -> int:
    return sum(m.count for m in messages if isinstance(m, NanopyCommit))


class NanopyBatchWriter(_Writer, _BatchBase):
    """``df.write.format("nanopy")``: batch id -1 in the tags."""

    def write(self, iterator: Iterator[Any]) -> NanopyCommit:
        return self._write(iterator, -1)

    def commit(self, messages: list[Any]) -> None:
        log.info("nanopy sink: wrote %d rows", _total(messages))

    def abort(self, messages: list[Any]) -> None:
        log.info("nanopy sink: write aborted after %d rows were sent", _total(messages))


class NanopyStreamWriter(_Writer, _StreamBase):
    """``df.writeStream.format("nanopy")``: the micro-batch id goes into the tags."""

    def write(self, iterator: Iterator[Any]) -> NanopyCommit:
        return self._write(iterator, -1)

    def commit(self, messages: list[Any], batchId: int) -> None:
        log.info("nanopy sink: batch %d wrote %d rows", batchId, _total(messages))

    def abort(self, messages: list[Any], batchId: int) -> None:
        log.info("nanopy sink: batch %d aborted after %d rows were sent", batchId, _total(messages))
