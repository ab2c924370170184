"""The nanopy sink: ``df.write.format("nanopy")`` and ``df.writeStream.format("nanopy")``.

``write()`` runs in the executors' Python workers. Each worker process keeps one
socket per (URLs, protocol, options), found again by every later task and
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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, DataType, StringType, StructType

from .. import _fork
from ..core.message import Multipart
from ..transports._registry import carries_multipart
from . import _options as opt
from ._tags import make_tag

try:  # Arrow writers hand us whole column batches (PySpark >= 4.1)
    from pyspark.sql.datasource import DataSourceArrowWriter as _BatchBase
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamBase
except ImportError:  # pragma: no cover - older PySpark: rows
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamBase  # type: ignore[assignment, unused-ignore]
    from pyspark.sql.datasource import DataSourceWriter as _BatchBase  # type: ignore[assignment, unused-ignore]

log = logging.getLogger("nanopy.spark")

_cache: dict[tuple[Any, ...], Any] = {}
_cache_pid = 0
_cache_lock = _fork.process_lock()


def _is_bytes(kind: DataType) -> bool:
    return isinstance(kind, (BinaryType, StringType))


def _is_frames(kind: DataType) -> bool:
    return isinstance(kind, ArrayType) and _is_bytes(kind.elementType)


def _columns(schema: StructType, column: str | None, urls: list[str]) -> tuple[str | None, str | None]:
    """``(payload column, frames column)`` to send (see docs/spark.md, "Sink").

    A frames column (``array<binary>``, as the source's ``parts``) is sent as
    multipart messages, which only ``zmtp+`` URLs carry: refused here otherwise,
    so ``save()``/``start()`` fails before any row is sent."""
    names = schema.fieldNames()
    kinds = {f.name: f.dataType for f in schema.fields}
    frames: str | None = None
    if column is not None:
        if column not in names:
            raise opt.SourceOptionError(
                f"column {column!r} is not a column of the DataFrame; columns are {names}")
        if _is_bytes(kinds[column]):
            return column, None
        if not _is_frames(kinds[column]):
            raise opt.SourceOptionError(
                f"column {column!r} is {kinds[column].simpleString()}; the nanopy sink sends binary or "
                "string columns, and array<binary> ones as multipart messages: cast it first, e.g. "
                f".selectExpr(\"cast({column} as string) as payload\")")
        frames = column
    elif "parts" in names and _is_frames(kinds["parts"]):
        frames = "parts"
    found: str | None = next((c for c in ("payload", "value", "data") if c in names
                              and _is_bytes(kinds[c])), None)
    if found is None:
        found = next((f.name for f in schema.fields if _is_bytes(f.dataType)), None)
    if found is None and frames is None:
        raise opt.SourceOptionError(
            f"the nanopy sink needs a binary or string column to send; columns are {names} "
            '(cast one, and name it "payload" or pass .option("column", name))')
    sp = next((u for u in urls if not carries_multipart(u)), None)
    if frames is not None and sp is not None:
        how = (f'.option("column", {frames!r}) sends' if column is not None
               else f"the DataFrame's {frames!r} column (ZeroMQ frames, as the nanopy source reads them) is sent as")
        raise opt.SourceOptionError(
            f"{how} multipart messages, and {sp} is an SP address, which carries one frame per message; "
            "send to zmtp+tcp:// or zmtp+ipc:// URLs, or send one column: "
            f'.option("column", {found or "payload"!r}) (a multipart row\'s payload is its frames '
            f'joined) or .drop({frames!r})')
    return found, frames


@dataclass
class NanopyCommit(WriterCommitMessage):
    """What one task reports: rows sent from which partition."""

    partition: int
    count: int
    nulls: int


class _Writer:
    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool = False) -> None:
        # Plain values only: the writer is pickled to the executors. Every check runs
        # here, on the driver, so a bad option fails save()/start() with one line.
        opt.check_names(options, "sink")
        if overwrite:
            raise opt.SourceOptionError(
                'the nanopy sink cannot overwrite: messages already sent cannot be taken back; '
                'use .mode("append")'
            )
        self.options = options
        self.urls = opt.urls(options)
        self.protocol = opt.choice(options, "protocol", ("push", "pub"), "push")
        self.mode = opt.choice(options, "mode", ("connect", "bind"), "connect")
        if self.mode == "bind":
            raise opt.SourceOptionError(
                "the nanopy sink cannot bind: write() runs in every executor's Python workers, "
                "which would all bind the same address. Bind the receiving socket (PULL or SUB) "
                "and let the sink connect (the default mode), or put a nanopy device in between"
            )
        self.column, self.frames = _columns(schema, options.get("column"), self.urls)
        names = schema.fieldNames()
        topic_column = options.get("topiccolumn") or None
        if topic_column is not None and topic_column not in names:
            raise opt.SourceOptionError(
                f"topicColumn {topic_column!r} is not a column of the DataFrame; columns are {names}")
        if topic_column is not None and self.protocol != "pub":
            raise opt.SourceOptionError('topicColumn needs .option("protocol", "pub")')
        self.topic_column = topic_column
        self.tag = opt.boolean(options, "tag", True)
        self.send_timeout = opt.number(options, "sendTimeout", 30.0)
        self.flush_timeout = opt.number(options, "flushTimeout", 30.0)
        self.peer_timeout = opt.number(options, "peerTimeout", 10.0)
        self.send_buffer = opt.integer(options, "sendBuffer", 8192, 1)
        self.run_id = secrets.randbits(64)
        opt.check_reachable(self.urls, self.mode, "sink")

    # -- executor side ----------------------------------------------------------
    def _socket(self) -> Any:
        global _cache_pid
        key = (tuple(self.urls), self.protocol, self.send_buffer, self.send_timeout)
        with _cache_lock:
            if _cache_pid != os.getpid():
                _cache.clear()  # sockets of a parent process are unusable here
                _cache_pid = os.getpid()
            sock = _cache.get(key)
            if sock is not None and not sock.closed:
                return sock
            from ..socket.socket import Socket

            sock = Socket(self.protocol, name="nanopy-spark-sink", send_buffer=self.send_buffer,
                          send_timeout=self.send_timeout, linger=self.flush_timeout)
            for url in self.urls:
                sock.connect(url)
            _cache[key] = sock
        # Fail fast (PUSH) or warn (PUB, which drops while nobody listens) when no
        # peer is there, naming the address, instead of blocking for sendTimeout.
        try:
            sock.wait_for_pipes(1, self.peer_timeout)
        except TimeoutError:
            where = ",".join(self.urls)
            if self.protocol == "pub":
                log.warning("nanopy sink: no subscriber at %s within peerTimeout=%.1fs; PUB drops "
                            "messages nobody receives", where, self.peer_timeout)
            else:
                raise TimeoutError(
                    f"nanopy sink: no peer at {where} within peerTimeout={self.peer_timeout}s; "
                    "is the receiving socket bound there and reachable from this executor?"
                ) from None
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
        from ..core.errors import Timeout

        sock = self._socket()
        send = sock.send
        tag = self.tag
        column, frames_column, topic_column = self.column, self.frames, self.topic_column
        index = nulls = 0
        for chunk in iterator:
            payloads = _values(chunk, column)
            topics = _values(chunk, topic_column) if topic_column else None
            frame_lists = _values(chunk, frames_column) if frames_column else None
            for i, payload in enumerate(payloads):
                frames = frame_lists[i] if frame_lists is not None else None
                if frames:  # a multipart message: topic in front of its first frame, tag after its last
                    parts = [f.encode() if isinstance(f, str) else bytes(f or b"") for f in frames]
                    if topics is not None and topics[i] is not None:
                        parts[0] = _as_bytes(topics[i]) + parts[0]
                    if tag:
                        parts.append(make_tag(run_id, batch_id, partition, index))
                    payload = Multipart(parts)
                elif payload is None:
                    nulls += 1
                    continue
                else:
                    payload = _as_bytes(payload)
                    if topics is not None and topics[i] is not None:
                        payload = _as_bytes(topics[i]) + payload
                    if tag:
                        payload = payload + make_tag(run_id, batch_id, partition, index)
                try:
                    send(payload)
                except Timeout:
                    raise Timeout(
                        f"nanopy sink: no room to send to {','.join(self.urls)} within "
                        f"sendTimeout={self.send_timeout}s ({index} rows of partition {partition} "
                        "sent); the receiver is not keeping up or has gone"
                    ) from None
                index += 1
        self._flush(sock)
        return NanopyCommit(partition, index, nulls)

    def _flush(self, sock: Any) -> None:
        """Wait until every queued message of this socket is written (or fail)."""
        try:
            sock.flush(self.flush_timeout)
        except TimeoutError:
            raise TimeoutError(f"nanopy sink: messages to {','.join(self.urls)} still queued after "
                               f"flushTimeout={self.flush_timeout}s") from None

def _values(chunk: Any, column: str | None) -> list[Any]:
    """A column's values in a chunk: a pyarrow.RecordBatch, or a Row."""
    if hasattr(chunk, "column"):
        return chunk.column(column).to_pylist() if column else [None] * chunk.num_rows
    return [chunk[column] if column else None]


def _as_bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


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
