"""The delivery tag the nanopy sink appends to every message it sends.

Layout (a 32-byte *trailer*, so that PUB/SUB topic prefixes at the front of the
message still work)::

    payload ... | run_id u64 | batch_id i64 | partition u32 | index u64 | b"NPT1"

All integers are big-endian. ``run_id`` names the write: for a streaming query it
is derived from the query id (stable across restarts of the same checkpoint), for a
batch ``df.write`` it is random per write. ``batch_id`` is the micro-batch id, or
-1 for a batch write. ``partition`` is the Spark partition id and ``index`` the
row's position within that partition. ``(run_id, batch_id, partition, index)`` is
unique per row and identical when Spark re-runs a task or replays a micro-batch, so
a consumer deduplicates on it.

A multipart message (``zmtp+`` URLs) gets the same 32 bytes as one more frame after
its last, so its own frames arrive as they were.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

MAGIC = b"NPT1"
_TRAILER = struct.Struct("!QqIQ4s")
TAG_SIZE = _TRAILER.size  # 32


class Tag(NamedTuple):
    """Where a sink message came from: unique per row of a write."""

    run_id: int
    batch_id: int
    partition: int
    index: int  # type: ignore[assignment]  # a field named like tuple.index, on purpose


def make_tag(run_id: int, batch_id: int, partition: int, index: int) -> bytes:
    """The 32-byte trailer for one row."""
    return _TRAILER.pack(run_id, batch_id, partition, index, MAGIC)


def split_tag(message: bytes) -> tuple[bytes, Tag]:
    """Split a sink message into ``(payload, Tag)``.

    A multipart message (``zmtp+`` URLs) carries its tag as its last frame: the
    payload is then the frames before it, a :class:`~nanopy.zmtp.Multipart` when
    there are several.

    Raises:
        ValueError: the message carries no nanopy sink tag.
    """
    if len(message) < TAG_SIZE or message[-4:] != MAGIC:
        raise ValueError("message has no nanopy sink tag (was the sink run with tag=false?)")
    run_id, batch_id, partition, index, _ = _TRAILER.unpack_from(message, len(message) - TAG_SIZE)
    tag = Tag(run_id, batch_id, partition, index)
    parts = getattr(message, "parts", None)
    if parts is not None and len(parts) >= 2 and len(parts[-1]) == TAG_SIZE:
        from ..core.message import Multipart

        return (parts[0] if len(parts) == 2 else Multipart(parts[:-1])), tag
    return bytes(message[:-TAG_SIZE]), tag


class Deduplicator:
    """Consumer-side helper: accept each tagged message once.

    ``accept(message)`` returns the payload the first time a tag is seen and
    ``None`` for a repeat. Memory grows with the number of distinct tags; call
    :meth:`forget_batch` once a micro-batch is known complete.
    """

    def __init__(self) -> None:
        self._seen: set[Tag] = set()
        self.duplicates = 0

    def accept(self, message: bytes) -> bytes | None:
        payload, tag = split_tag(message)
        if tag in self._seen:
            self.duplicates += 1
            return None
        self._seen.add(tag)
        return payload

    def forget_batch(self, run_id: int, batch_id: int) -> None:
        self._seen = {t for t in self._seen if (t.run_id, t.batch_id) != (run_id, batch_id)}

    def __len__(self) -> int:
        return len(self._seen)
