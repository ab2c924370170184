"""How received messages become the source's rows, and which ones cannot.

The default schema's ``payload`` is the message as bytes and ``parts`` its frames:
null for a message of one frame, every frame for a ZeroMQ multipart message (a
:class:`~nanopy.zmtp.Multipart`, from ``zmtp+`` URLs), whose ``payload`` is then
the frames joined, as the ``Multipart`` itself is. The spool stores a multipart
message's frames only (``payload`` null there, so its bytes are not written
twice), and a file without multipart messages has no ``parts`` column at all
(:func:`spool_form`); :func:`full_rows` joins them again when an executor reads
the rows.

With ``schema=kafka`` (:func:`to_kafka`) a single-frame message is the ``value``
(``key`` null) and a multipart message gives its first frame as the ``key`` and
its last as the ``value``.

A message that no row can hold is dropped and counted by reason
(:class:`DropLog`), never retried: a source that stopped on it would stop for good.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger("nanopy.spark")

PARTS_TYPE = pa.list_(pa.binary())
# The largest value of a Spark binary column (a JVM array: Integer.MAX_VALUE - 15).
SPARK_BINARY_MAX = (1 << 31) - 1 - 15
# A spool file's payload bytes at most, so each Arrow column stays under its 2 GiB offsets.
FILE_BYTES_MAX = 1 << 30

# Drop reasons, as counted in the source's ``droppedByReason``.
OVERSIZED = "oversized"  # above recvMaxSize
TOO_LARGE_FOR_SPARK = "tooLargeForSpark"  # above what a Spark binary value holds
UNREPRESENTABLE = "unrepresentable"  # an Arrow row could not be built from it


def is_multipart(message: bytes) -> bool:
    return message.__class__ is not bytes and getattr(message, "parts", None) is not None


def topic_column(payloads: list[bytes], subscriptions: list[bytes]) -> pa.Array:
    """The longest subscription each payload starts with (null without subscriptions).

    A multipart message is matched as its frames joined, as the SUB socket filters it."""
    if not subscriptions or subscriptions == [b""]:
        return pa.nulls(len(payloads), pa.string())
    ordered = sorted(subscriptions, key=len, reverse=True)
    return pa.array(
        [next((t.decode("utf-8", "replace") for t in ordered if p.startswith(t)), None) for p in payloads],
        pa.string())


def frame_columns(payloads: list[bytes], multipart: bool,
                  parts_type: pa.DataType = PARTS_TYPE) -> tuple[pa.Array, pa.Array]:
    """``payload`` and ``parts`` as the spool stores them (see the module docstring).

    ``multipart`` False says no message can have several frames (no ``zmtp+`` URL):
    the messages are then not looked at one by one."""
    n = len(payloads)
    if not multipart or not any(map(is_multipart, payloads)):
        return pa.array(payloads, pa.binary()), pa.nulls(n, parts_type)
    single = [None if is_multipart(p) else p for p in payloads]
    parts = [list(p.parts) if is_multipart(p) else None for p in payloads]  # type: ignore[attr-defined]
    return pa.array(single, pa.binary()), pa.array(parts, parts_type)


def make_batch(after: int, payloads: list[bytes], stamp: float, subscriptions: list[bytes],
               schema: pa.Schema, multipart: bool = True) -> pa.RecordBatch:
    """Rows ``after+1 .. after+len(payloads)`` as an Arrow batch of ``schema``, as the
    spool stores them (a schema without ``parts`` gets the payloads alone)."""
    n = len(payloads)
    names = schema.names
    parts_type = schema.field("parts").type if "parts" in names else PARTS_TYPE
    payload, parts = frame_columns(payloads, multipart and "parts" in names, parts_type)
    received = pa.array([int(stamp * 1e6)] * n, pa.int64()).cast(schema.field("received").type)
    columns = {"payload": payload, "topic": topic_column(payloads, subscriptions), "received": received,
               "seq": pa.array(range(after + 1, after + n + 1), pa.int64()), "parts": parts}
    return pa.RecordBatch.from_arrays([columns[name] for name in names], schema=schema)


def spool_form(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` as a spool file stores it: without ``parts`` when no row has frames
    (an SP stream's files are as before; reading fills the column with nulls)."""
    if "parts" in batch.schema.names and batch.column("parts").null_count == batch.num_rows:
        return batch.drop_columns(["parts"])
    return batch


def full_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A spool batch as the default schema shows it: a multipart row's ``payload`` is
    its frames joined again."""
    if "parts" not in batch.schema.names:
        return batch
    parts = batch.column("parts")
    if parts.null_count == len(parts):  # (no multipart message: nothing to do)
        return batch
    joined = pc.coalesce(batch.column("payload"), pc.binary_join(parts, b""))
    at = batch.schema.get_field_index("payload")
    return batch.set_column(at, batch.schema.field(at), joined)


def to_kafka(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A spool batch with Kafka's columns: ``key`` = the first frame of a multipart
    message (else null), ``value`` = its last frame (else the payload), offset = seq,
    timestamp = received, partition 0, timestampType 1 (log append time)."""
    n = batch.num_rows
    payload = batch.column("payload")
    key: pa.Array = pa.nulls(n, pa.binary())
    value: pa.Array = payload
    if "parts" in batch.schema.names:
        parts = batch.column("parts")
        if parts.null_count < n:
            key = pc.list_element(parts, 0)
            offsets = parts.offsets.to_numpy()
            last = pc.max_element_wise(pa.array(offsets[1:] - 1), 0)  # a null row's index is unused
            value = pc.if_else(pc.is_null(parts), payload, parts.values.take(last))
    return pa.RecordBatch.from_arrays(
        [key, value, batch.column("topic"), pa.array([0] * n, pa.int32()),
         batch.column("seq"), batch.column("received"), pa.array([1] * n, pa.int32())],
        names=["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"])


def file_slices(payloads: list[bytes]) -> Iterator[list[bytes]]:
    """``payloads`` cut so that no spool file holds more than :data:`FILE_BYTES_MAX` bytes
    (a message larger than that has a file of its own)."""
    start, size = 0, 0
    for i, p in enumerate(payloads):
        if size and size + len(p) > FILE_BYTES_MAX:
            yield payloads[start:i]
            start, size = i, 0
        size += len(p)
    if start < len(payloads):
        yield payloads[start:]


def build_or_drop(payloads: list[bytes], build: Any, drops: DropLog) -> tuple[list[bytes], Any]:
    """``build(payloads)``; when Arrow refuses the group, build each message alone
    and drop (count, log) the ones it refuses. Returns the kept payloads and what
    ``build`` made of them (None when none is left)."""
    if not payloads:
        return payloads, None
    try:
        return payloads, build(payloads)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    kept = []
    for p in payloads:
        try:
            build([p])
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            size = len(p) if isinstance(p, (bytes, bytearray)) else "?"
            drops.note(UNREPRESENTABLE, 1, f"no row could be built from a message of {size} bytes ({exc})")
        else:
            kept.append(p)
    return kept, (build(kept) if kept else None)


class DropLog:
    """Messages the source dropped, counted by reason and logged at most once per
    reason per ``interval`` seconds (with the count since the last line)."""

    def __init__(self, where: str, interval: float = 60.0) -> None:
        self.where = where
        self.interval = interval
        self.counts: dict[str, int] = {}
        self._unlogged: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}

    def note(self, reason: str, n: int, detail: str) -> None:
        """Count ``n`` messages dropped for ``reason``; ``detail`` says why, for the log."""
        if n <= 0:
            return
        self.counts[reason] = self.counts.get(reason, 0) + n
        self._unlogged[reason] = self._unlogged.get(reason, 0) + n
        now = time.monotonic()
        last = self._logged_at.get(reason)
        if last is not None and now - last < self.interval:
            return
        self._logged_at[reason] = now
        log.warning("nanopy source %s: dropped %d message(s) (%s): %s; %d dropped for this reason so far",
                    self.where, self._unlogged.pop(reason), reason, detail, self.counts[reason])

    def keep(self, payloads: list[bytes], max_size: int, biggest: int | None = None) -> list[bytes]:
        """``payloads`` without those above ``max_size`` (0: no limit) or above what a
        Spark binary value holds; the others are counted and logged here. ``biggest``:
        the largest payload's length, when the caller knows it."""
        limit = min(max_size or SPARK_BINARY_MAX, SPARK_BINARY_MAX)
        if biggest is None:
            biggest = max(map(len, payloads), default=0)
        if biggest <= limit:
            return payloads
        kept = [p for p in payloads if len(p) <= limit]
        if max_size and max_size <= SPARK_BINARY_MAX:
            self.note(OVERSIZED, len(payloads) - len(kept),
                      f"larger than recvMaxSize={max_size} bytes (largest {biggest})")
        else:
            self.note(TOO_LARGE_FOR_SPARK, len(payloads) - len(kept),
                      f"larger than a Spark binary value holds ({SPARK_BINARY_MAX} bytes; largest {biggest})")
        return kept

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)
