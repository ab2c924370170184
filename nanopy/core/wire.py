"""SP wire codec for byte-stream transports (tcp, ipc, tls): Sans-I/O.

* Connection header: ``00 'S' 'P' 00 <type:u16> 00 00``, sent by both sides at once.
* tcp/tls framing: ``<len:u64> payload``; ipc framing: ``01 <len:u64> payload``.

The decoder parses as many frames as a chunk holds and checks every length against
the receive limit *before* buffering the payload, so a hostile length never makes
us allocate.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import partial
from itertools import chain, repeat
from typing import Any

from .errors import RemoteProtocolError, too_large

HEADER_SIZE = 8
_HEADER = struct.Struct(">4sH2s")
_MAGIC = b"\x00SP\x00"
_U64 = struct.Struct(">Q")
_IPC_PREFIX = struct.Struct(">BQ")
IPC_MSG_NORMAL = 1


def encode_header(protocol_id: int) -> bytes:
    """The 8-byte connection header announcing ``protocol_id``."""
    return _HEADER.pack(_MAGIC, protocol_id, b"\x00\x00")


#: what each wire protocol's first bytes start with, and how a log names it
_FIRST_BYTES = {"SP": b"\x00SP\x00", "ZMTP": b"\xff"}
_SPEAKERS = {"SP": "SP (nanomsg, NNG, mangos, nanopy's {base}://)", "ZMTP": "ZeroMQ (ZMTP)"}


def other_wire(data: bytes, ours: str, ipc: bool = False) -> RemoteProtocolError | None:
    """The error naming the other wire protocol when a peer's first bytes are its --
    a ZMTP signature (0xFF ...) where ``ours`` is "SP", an SP header (``\\x00SP\\x00``)
    where it is "ZMTP" -- with the URL scheme to use for that peer; else None. Both
    ends of such a mismatch log it, dialer and listener alike, also when the peer
    closed or reset the connection right after its first bytes."""
    theirs = "ZMTP" if ours == "SP" else "SP"
    if not data or not data.startswith(_FIRST_BYTES[theirs]):
        return None
    base = "ipc" if ipc else "tcp"
    schemes = {"SP": base, "ZMTP": f"zmtp+{base}"}
    return RemoteProtocolError(
        f"the peer speaks {_SPEAKERS[theirs].format(base=base)}, not {ours} (its first bytes are "
        f"{data[:8].hex()}); use a {schemes[theirs]}:// URL for it on this side, in bind or connect "
        f"({schemes[ours]}:// speaks {ours})"
    )


def parse_header(data: bytes, peer_id: int, ipc: bool = False) -> int:
    """Validate a received connection header; return the peer's protocol id.

    Raises:
        RemoteProtocolError: not an SP header (a ZeroMQ peer is named as such, with
            the ``zmtp+tcp://`` or, ``ipc``, ``zmtp+ipc://`` scheme to use), reserved
            bytes set, or the peer's protocol is not ``peer_id``.
    """
    if len(data) != HEADER_SIZE:
        raise RemoteProtocolError(f"short SP header ({len(data)} bytes)")
    magic, proto, reserved = _HEADER.unpack(data)
    if magic != _MAGIC:
        raise other_wire(data, "SP", ipc) or RemoteProtocolError(f"not an SP peer: header {data.hex()}")
    if reserved != b"\x00\x00":
        raise RemoteProtocolError(f"SP header has reserved bytes set: {data.hex()}")
    if proto != peer_id:
        raise RemoteProtocolError(
            f"incompatible peer protocol 0x{proto:x} (expected 0x{peer_id:x})"
        )
    return int(proto)


def encode_frames(payloads: list[bytes], ipc: bool = False) -> bytes:
    """Frame a batch of payloads into one buffer for a single write.

    No bytecode per payload: the length prefixes are packed by ``map`` and laid
    between the payloads by slice assignment; a batch of one size (every length
    equal to the first) is a join with its one prefix as the separator.
    """
    sizes = list(map(len, payloads))
    if sizes and sizes.count(sizes[0]) == len(sizes):  # (cheaper than a set: no hashing)
        head = _IPC_PREFIX.pack(IPC_MSG_NORMAL, sizes[0]) if ipc else _U64.pack(sizes[0])
        return head + head.join(payloads)
    parts: list[bytes] = [b""] * (2 * len(payloads))
    if ipc:
        parts[0::2] = map(_IPC_PREFIX.pack, repeat(IPC_MSG_NORMAL), sizes)
    else:
        parts[0::2] = map(_U64.pack, sizes)
    parts[1::2] = payloads
    return b"".join(parts)


def encode_frame(payload: bytes, ipc: bool = False) -> bytes:
    return _FRAME_HEADS[ipc](len(payload)) + payload


def frame_head(ipc: bool = False) -> Callable[[int], bytes]:
    """The header of one frame of ``n`` payload bytes, as a C callable: a
    connection keeps it, so framing one payload calls no Python function."""
    return _FRAME_HEADS[ipc]


# One payload's frame header by mapping (index: ipc), made once.
_FRAME_HEADS: tuple[Callable[[int], bytes], Callable[[int], bytes]] = (
    _U64.pack,
    partial(_IPC_PREFIX.pack, IPC_MSG_NORMAL),
)


# The fewest equal frames worth the one-pass cut (below, the loop is as cheap).
_RUN_MIN = 8
_chain = chain.from_iterable


def _equal_heads(chunk: bytes, pos: int, stride: int, count: int, prefix: int) -> bool:
    """Whether the ``count`` frames from ``pos``, ``stride`` bytes apart, all start
    with the ``prefix`` bytes of the first: one strided slice per prefix byte (the
    length's low byte first, where frames of other sizes differ)."""
    last = pos + count * stride
    for j in range(prefix - 1, -1, -1):
        if chunk[pos + j : last : stride] != chunk[pos + j : pos + j + 1] * count:
            return False
    return True


# Equal frames are cut _BLOCK at a time by one struct of _BLOCK "skip the prefix, take
# the payload" codes, kept per (prefix, size) -- a few sizes in practice; the cache is
# emptied when it grows past _BLOCKS_MAX.
_BLOCK = 64
_BLOCKS_MAX = 64
_blocks: dict[tuple[int, int], struct.Struct] = {}


def _cut_equal(chunk: bytes, pos: int, prefix: int, size: int, count: int) -> list[bytes]:
    """The payloads of the ``count`` equal frames (``prefix`` + ``size`` bytes each)
    from ``pos``: struct cuts them in C, with one tuple per block, not per frame."""
    stride = prefix + size
    key = (prefix, size)
    block = _blocks.get(key)
    if block is None:
        if len(_blocks) >= _BLOCKS_MAX:
            _blocks.clear()
        block = _blocks[key] = struct.Struct(f"{prefix}x{size}s" * _BLOCK)
    out: list[bytes] = []
    unpack = block.unpack_from
    step = _BLOCK * stride
    whole = count // _BLOCK
    for _ in range(whole):
        out += unpack(chunk, pos)
        pos += step
    rest = count - whole * _BLOCK
    if rest:  # (the tail: a tuple per frame, fewer than _BLOCK of them)
        out += _chain(struct.iter_unpack(f"{prefix}x{size}s", memoryview(chunk)[pos : pos + rest * stride]))
    return out


def fail_after(decoder: Any, out: list[bytes], exc: Exception) -> list[bytes]:
    """A decoder met ``exc``: raise it now, or -- when frames came before it in the
    same chunk -- hand those over and keep ``exc`` in ``decoder.error`` for the next feed."""
    decoder._buf = b""
    decoder.error = exc
    if not out:
        raise exc
    return out


class FrameDecoder:
    """Incremental frame parser: bytes in, complete payloads out.

    ``feed(chunk)`` returns every payload the data completes (possibly none).
    ``max_size`` of 0 means no limit.
    """

    __slots__ = ("_ipc", "_prefix", "max_size", "_buf", "_parts", "_need", "error")

    def __init__(self, ipc: bool = False, max_size: int = 0) -> None:
        self._ipc = ipc
        self._prefix = 9 if ipc else 8
        self.max_size = max_size
        self._buf = b""  # leftover bytes that start a frame (prefix not yet complete)
        self._parts: list[bytes] = []  # pieces of a large payload being collected
        self._need = 0  # payload bytes still missing for the frame in _parts
        # A violation found after complete frames of the same chunk: those frames
        # are returned first; the error is raised by the next feed (or by the
        # connection, which checks it before reading again).
        self.error: Exception | None = None

    def feed(self, chunk: bytes) -> list[bytes]:
        # The chunk is never re-sliced or joined to a leftover as a whole: a frame
        # cut by the previous read is completed from the front of this one, and
        # parsing goes on at an offset (each copy of a 64 KiB read costs as much
        # as parsing dozens of frames).
        if self.error is not None:
            raise self.error
        out: list[bytes] = []
        pos = 0
        end = len(chunk)
        prefix = self._prefix
        if self._buf:
            # The previous read ended inside a length prefix: complete it, then
            # collect its payload as a payload cut by the read (below).
            pos = prefix - len(self._buf)
            head = self._buf + chunk[:pos]
            if len(head) < prefix:
                self._buf = head
                return out
            self._buf = b""
            size = self._size(head, out)
            if size < 0:
                return out  # (or raised)
            if size:
                self._need = size
            else:
                out.append(b"")
        if self._need:
            # Continue collecting a cut payload without re-copying what we have.
            need = self._need
            if end - pos < need:
                self._parts.append(chunk[pos:])
                self._need = need - (end - pos)
                return out
            self._parts.append(chunk[pos : pos + need])
            out.append(b"".join(self._parts))
            self._parts = []
            self._need = 0
            pos += need
        limit = self.max_size
        ipc = self._ipc
        unpack = _U64.unpack_from
        # A chunk of equal frames (a batch of one size) is cut in one pass, without
        # bytecode per frame; tried once, at the first whole frame after any cut one.
        uniform = chunk.__class__ is bytes
        while end - pos >= prefix:
            if ipc:
                if chunk[pos] != IPC_MSG_NORMAL:
                    return self._fail(out, RemoteProtocolError(f"ipc message type {chunk[pos]} is not 1"))
                (size,) = unpack(chunk, pos + 1)
            else:
                (size,) = unpack(chunk, pos)
            if limit and size > limit:
                return self._fail(
                    out, too_large(size, limit)
                )
            start = pos + prefix
            stop = start + size
            if stop > end:
                # Partial payload: keep what we have, wait for the rest.
                self._parts = [chunk[start:]]
                self._need = stop - end
                return out
            if uniform:
                uniform = False
                stride = prefix + size
                count = (end - pos) // stride
                if count >= _RUN_MIN and _equal_heads(chunk, pos, stride, count, prefix):
                    out += _cut_equal(chunk, pos, prefix, size, count)
                    pos += count * stride
                    continue
            out.append(chunk[start:stop])
            pos = stop
        if pos < end:
            self._buf = chunk[pos:]  # the start of a length prefix
        return out

    def _size(self, head: bytes, out: list[bytes]) -> int:
        """The payload size a complete length prefix announces (checked), or -1
        after :meth:`_fail` kept the error for the next feed."""
        if self._ipc:
            if head[0] != IPC_MSG_NORMAL:
                self._fail(out, RemoteProtocolError(f"ipc message type {head[0]} is not 1"))
                return -1
            (size,) = _U64.unpack_from(head, 1)
        else:
            (size,) = _U64.unpack_from(head, 0)
        limit = self.max_size
        if limit and size > limit:
            self._fail(out, too_large(size, limit))
            return -1
        return int(size)

    def _fail(self, out: list[bytes], exc: Exception) -> list[bytes]:
        return fail_after(self, out, exc)

    @property
    def pending(self) -> int:
        """Bytes buffered for an incomplete frame."""
        return len(self._buf) + sum(len(p) for p in self._parts)
