"""SP over WebSocket below the connection: the subprotocol rules, the HTTP upgrade's
head, and the frame encoder (RFC 6455 framing written by hand for the hot path).

May call: the websockets protocol objects (handshake and parsing) and the channel
a head is read from; nothing of nanopy's sockets.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
from collections.abc import Sequence
from typing import Any

from websockets.client import ClientProtocol
from websockets.exceptions import PayloadTooBig
from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - pure-Python build of websockets
    from websockets.utils import apply_mask

from ..core.errors import RemoteProtocolError
from ._stream import SocketChannel
from .tls import StreamChannel

#: the websockets protocol objects log here (handshakes at INFO, frames at DEBUG)
ws_log = logging.getLogger("nanopy.ws")

#: outgoing messages are split into frames of at most this many bytes (NNG drops > 1 MiB frames)
FRAGMENT_SIZE = 1 << 16
RECV_SIZE = 1 << 16
SUBPROTOCOL_SUFFIX = ".sp.nanomsg.org"
#: largest legal 64-bit frame length (RFC 6455: the most significant bit must be 0)
MAX_FRAME_LENGTH = (1 << 63) - 1
#: fragments one message may have before its average fragment size matters; past
#: this each message must bring ``MIN_FRAGMENT_AVERAGE`` bytes per further fragment
FREE_FRAGMENTS = 1024
MIN_FRAGMENT_AVERAGE = 1024
#: incoming bytes are parsed this many at a time (one socket read; bounds the frame objects
#: alive at once when a peer sends a long run of tiny frames)
PARSE_SLICE = 64 * 1024
#: largest HTTP head (request or response line plus headers) of an upgrade
MAX_HTTP_HEAD = 64 * 1024

_U16 = struct.Struct("!BBH")
_U64 = struct.Struct("!BBQ")


def _subprotocol(name: str) -> str:
    return name + SUBPROTOCOL_SUFFIX


def _pick(offered: Sequence[str], own: str) -> str | None:
    """NNG compares the subprotocol case-insensitively and echoes the client's spelling."""
    for name in offered:
        if name.lower() == own:
            return name
    return None


# -- the Sans-I/O protocol objects -------------------------------------------------------
class _SpRules:
    """What SP changes in websockets' protocol objects (mixed into both sides).

    * PINGs are not answered one by one: the latest payload waits in ``ping`` and the
      connection writes one PONG for all that came since its last (RFC 6455 allows
      answering only the most recent PING), so a PING flood cannot queue replies.
    * A 64-bit length with its top bit set is a framing error (CLOSE 1002), not a
      message that is too big (1009).
    """

    ping: bytes | None = None
    pings = 0

    def recv_frame(self, frame: Frame) -> None:
        if frame.opcode is Opcode.PING and self.state is State.OPEN:  # type: ignore[attr-defined]
            self.ping = bytes(frame.data)
            self.pings += 1
            return
        super().recv_frame(frame)  # type: ignore[misc]

    def fail(self, code: int, reason: str = "") -> None:
        if _is_bad_length(sys.exception()):  # fail() runs inside websockets' except clause
            code, reason = CloseCode.PROTOCOL_ERROR, "frame length has its most significant bit set"
        super().fail(code, reason)  # type: ignore[misc]


class SpClientProtocol(_SpRules, ClientProtocol):
    """The dialer's protocol object."""


class SpServerProtocol(_SpRules, ServerProtocol):
    """The listener's protocol object (made by the port server for each request)."""


def _is_bad_length(exc: BaseException | None) -> bool:
    return isinstance(exc, PayloadTooBig) and (exc.size or 0) > MAX_FRAME_LENGTH


def _ws_size(exc: PayloadTooBig) -> int | str:
    """The size of the message websockets refused (its frame and the fragments
    before it), or "over <limit>" where it does not say."""
    size = getattr(exc, "size", None)
    if size is None:
        return f"over {getattr(exc, 'max_size', '?')}"
    return int(size) + int(getattr(exc, "current_size", None) or 0)


# -- HTTP heads --------------------------------------------------------------------------
class HeadTooLarge(RemoteProtocolError):
    """An HTTP head over :data:`MAX_HTTP_HEAD` (a server answers 431)."""


async def read_head(chan: SocketChannel | StreamChannel, what: str) -> tuple[bytes, bytes]:
    """Read up to the blank line that ends an HTTP head: ``(head, bytes after it)``.

    Raises EOFError if the peer left without sending a byte (a port probe),
    RemoteProtocolError if it left in the middle, :class:`HeadTooLarge` past the limit.
    The bytes after the head are not parsed here: they belong to the WebSocket
    stream and go through ``receive`` like every later read.
    """
    buf = b""
    while True:
        data = await chan.recv(RECV_SIZE)
        if not data:
            if not buf:
                raise EOFError(f"{what}: peer closed before sending anything")
            raise RemoteProtocolError(f"{what}: peer closed in the middle of the HTTP head")
        start = max(len(buf) - 3, 0)
        buf += data
        end = buf.find(b"\r\n\r\n", start)
        if end >= 0:
            return buf[: end + 4], buf[end + 4 :]
        if len(buf) > MAX_HTTP_HEAD:
            raise HeadTooLarge(f"{what}: HTTP head over {MAX_HTTP_HEAD} bytes")


HTTP_REASONS = {
    400: "Bad Request",
    404: "Not Found",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def http_error(status: int, text: str) -> bytes:
    """A complete HTTP error response that closes the connection."""
    body = (text + "\n").encode()
    head = (
        f"HTTP/1.1 {status} {HTTP_REASONS.get(status, text)}\r\nConnection: close\r\n"
        f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


# -- frames -------------------------------------------------------------------------
def _header(first: int, size: int, masked: bool) -> bytes:
    bit = 0x80 if masked else 0
    if size < 126:
        return bytes((first, bit | size))
    if size < 65536:
        return _U16.pack(first, bit | 126, size)
    return _U64.pack(first, bit | 127, size)


def encode_message(payload: bytes, masked: bool, out: list[Any]) -> None:
    """Append the frames of one binary message to ``out`` (fragmented at 64 KiB)."""
    size = len(payload)
    if size <= FRAGMENT_SIZE:
        if masked:
            key = os.urandom(4)
            out.append(_header(0x82, size, True) + key)
            out.append(apply_mask(payload, key))
        else:
            out.append(_header(0x82, size, False))
            out.append(payload)
        return
    view = memoryview(payload)
    opcode = 0x02
    for start in range(0, size, FRAGMENT_SIZE):
        chunk = view[start : start + FRAGMENT_SIZE]
        first = opcode | (0x80 if start + FRAGMENT_SIZE >= size else 0)
        if masked:
            key = os.urandom(4)
            out.append(_header(first, len(chunk), True) + key)
            out.append(apply_mask(chunk, key))
        else:
            out.append(_header(first, len(chunk), False))
            out.append(chunk)
        opcode = 0x00


# -- the connection ---------------------------------------------------------------------
