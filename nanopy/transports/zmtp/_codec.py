"""ZMTP 3.x wire codec (RFC 23, RFC 37): Sans-I/O, no sockets, no clock.

* Greeting: 64 octets -- signature ``FF 00*8 7F``, version ``03 01``, the
  mechanism name padded with NULs to 20 octets, the as-server octet, 31 NULs.
* Frames: a flags octet (bit 0 MORE, bit 1 LONG, bit 2 COMMAND), then the size
  (one octet, or eight in network order when LONG), then the body.
* Commands: one frame whose body is a 1-octet name length, the name, the data.
* Metadata (READY and friends): properties of a 1-octet name length, the name,
  a 4-octet value length and the value.

The decoder parses as many frames as a chunk holds and checks every size against
the receive limit before buffering a byte of the body, as the SP decoder does.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator

from ...core.errors import MessageTooLarge, RemoteProtocolError, too_large
from ...core.wire import fail_after, other_wire

GREETING_SIZE = 64
SIGNATURE_SIZE = 10
MORE = 0x01
LONG = 0x02
COMMAND = 0x04

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_SHORT = struct.Struct(">BB")
_LONG = struct.Struct(">BQ")
DELIMITER = _SHORT.pack(MORE, 0)  # an empty MORE frame: the REQ/REP envelope's end
# A command may exceed recv_max_size by this much (its name; a CURVE box's overhead).
COMMAND_SLACK = 256


def encode_greeting(mechanism: bytes, as_server: bool, minor: int = 1) -> bytes:
    """Our whole greeting (ZMTP 3.``minor``)."""
    return (
        b"\xff" + bytes(8) + b"\x7f" + bytes((3, minor))
        + mechanism.ljust(20, b"\x00") + (b"\x01" if as_server else b"\x00") + bytes(31)
    )


def check_signature(data: bytes, ipc: bool = False) -> None:
    """The peer's first 10 octets; raises RemoteProtocolError if they are not ZMTP's."""
    mismatch = other_wire(data, "ZMTP", ipc)
    if mismatch is not None:
        raise mismatch
    if data[0] != 0xFF or not data[9] & 0x01:
        raise RemoteProtocolError(f"not a ZMTP peer: greeting starts {data.hex()}")


def parse_version(data: bytes) -> int:
    """The peer's (major, minor) octets; returns the minor version (0 or 1 for 3.x)."""
    major, minor = data[0], data[1]
    if major < 3:
        raise RemoteProtocolError(
            f"the peer speaks ZMTP {major}.x (1.0 or 2.0: libzmq before 4); nanopy speaks 3.0 and 3.1"
        )
    return 1 if major > 3 or minor >= 1 else 0


def parse_mechanism(rest: bytes, expected: bytes) -> bool:
    """The last 52 octets of the peer's greeting; returns its as-server flag."""
    mechanism = rest[:20].rstrip(b"\x00")
    if mechanism != expected:
        raise RemoteProtocolError(
            f"security mechanism mismatch: the peer uses {mechanism.decode('ascii', 'replace')!r}, "
            f"this endpoint {expected.decode()!r}"
        )
    return bool(rest[20] & 0x01)


def frame_header(size: int, flags: int = 0) -> bytes:
    if size < 256:
        return _SHORT.pack(flags, size)
    return _LONG.pack(flags | LONG, size)


def encode_command(name: bytes, data: bytes = b"") -> bytes:
    body = bytes((len(name),)) + name + data
    return frame_header(len(body), COMMAND) + body


def encode_metadata(props: Iterable[tuple[bytes, bytes]]) -> bytes:
    return b"".join(bytes((len(k),)) + k + _U32.pack(len(v)) + v for k, v in props)


def iter_metadata(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(name, value) pairs of ZMTP metadata as written (RFC 37; ZAP's replies use it too)."""
    pos, end = 0, len(data)
    while pos < end:
        n = data[pos]
        pos += 1
        if n == 0 or pos + n + 4 > end:
            raise RemoteProtocolError("malformed ZMTP metadata")
        name = data[pos : pos + n]
        pos += n
        (size,) = _U32.unpack_from(data, pos)
        pos += 4
        if pos + size > end:
            raise RemoteProtocolError("malformed ZMTP metadata (a value runs past the command)")
        yield name, data[pos : pos + size]
        pos += size


def parse_metadata(data: bytes) -> dict[str, bytes]:
    """Properties by lower-cased name (names are case-insensitive, RFC 37)."""
    return {name.decode("ascii", "replace").lower(): value for name, value in iter_metadata(data)}


def split_command(body: bytes) -> tuple[bytes, bytes]:
    """(name, data) of a command frame's body."""
    if not body or body[0] + 1 > len(body):
        raise RemoteProtocolError("malformed ZMTP command frame")
    n = body[0] + 1
    return body[1:n], body[n:]


def encode_message(frames: list[bytes]) -> bytes:
    """One multipart message: every frame but the last with MORE."""
    last = len(frames) - 1
    out = []
    for i, f in enumerate(frames):
        out.append(frame_header(len(f), MORE if i < last else 0))
        out.append(f)
    return b"".join(out)


# The header of every short single frame, made once (indexing beats packing).
_SHORT_HEADERS = [_SHORT.pack(0, n) for n in range(256)]


def encode_single(payload: bytes) -> bytes:
    n = len(payload)
    if n < 256:
        return _SHORT_HEADERS[n] + payload
    return _LONG.pack(LONG, n) + payload


def encode_batch(payloads: list[bytes], multi: Callable[[bytes], bytes]) -> bytes:
    """Messages in one buffer (the hot path of PUSH, PAIR, PUB): a ``bytes`` payload
    is one frame; any other (a multipart message) is encoded by ``multi``."""
    headers = _SHORT_HEADERS
    long_ = _LONG.pack
    parts: list[bytes] = []
    append = parts.append
    for p in payloads:
        if p.__class__ is not bytes:
            append(multi(p))
            continue
        n = len(p)
        append(headers[n] if n < 256 else long_(LONG, n))
        append(p)
    return b"".join(parts)


#: what the decoder does with a complete message (a list of 2+ frames), a
#: single-frame message (None: keep it as it is) and a command (name, data)
MultiHandler = Callable[[list[bytes]], "bytes | None"]
SingleHandler = Callable[[bytes], "bytes | None"]
CommandHandler = Callable[[bytes, bytes], None]


class ZmtpDecoder:
    """Incremental parser of ZMTP traffic after the handshake: bytes in, payloads out.

    Has the interface of the SP :class:`~nanopy.core.wire.FrameDecoder` (``feed``,
    ``pending``, ``error``), so the stream connection reads through it unchanged.
    Single-frame messages come out as they are (or through ``single``); messages
    of several frames go through ``multi``; commands through ``command``. A
    handler returning None consumes the message. ``max_size`` (0 = no limit)
    bounds every frame and every whole message.
    """

    __slots__ = ("max_size", "multi", "single", "command", "unbox", "_buf", "_parts", "_need",
                 "_flags", "_msg", "_msg_size", "error")

    def __init__(
        self,
        max_size: int,
        multi: MultiHandler,
        command: CommandHandler,
        single: SingleHandler | None = None,
    ) -> None:
        self.max_size = max_size
        self.multi = multi
        self.single = single
        self.command = command
        #: a CURVE connection's MESSAGE opener: every frame must then be a MESSAGE
        self.unbox: Callable[[bytes], tuple[int, bytes]] | None = None
        self._buf = b""  # the start of a frame header cut by the last read
        self._parts: list[bytes] = []  # pieces of a frame body cut by reads
        self._need = 0  # body bytes still missing for the frame in _parts
        self._flags = 0  # that frame's flags
        self._msg: list[bytes] = []  # frames of a multipart message so far (MORE seen)
        self._msg_size = 0
        self.error: Exception | None = None

    @property
    def pending(self) -> int:
        return len(self._buf) + sum(map(len, self._parts)) + len(self._msg)

    def _frame(self, flags: int, body: bytes, out: list[bytes]) -> None:
        """One complete frame (not the common short single one, handled inline)."""
        if self.unbox is not None:
            # CURVE: each frame is a MESSAGE box (libzmq sends it as a data frame)
            # holding the real frame's flags and body.
            if flags & MORE:
                raise RemoteProtocolError("a CURVE MESSAGE frame with the MORE flag")
            name, data = split_command(body)
            if name != b"MESSAGE":
                raise RemoteProtocolError(f"a {name!r} frame where a CURVE MESSAGE must be")
            flags, body = self.unbox(data)
        if flags & COMMAND:
            if self._msg:
                raise RemoteProtocolError("ZMTP command frame inside a multipart message")
            if flags & MORE:
                raise RemoteProtocolError("ZMTP command frame with the MORE flag")
            name, data = split_command(body)
            self.command(name, data)
            return
        if self._msg or flags & MORE:
            self._msg_size += len(body)
            if self.max_size and self._msg_size > self.max_size:
                raise too_large(f"over {self._msg_size}", self.max_size, "multipart message")
        if flags & MORE:
            self._msg.append(body)
            return
        if self._msg:
            msg = self._msg
            msg.append(body)
            self._msg = []
            self._msg_size = 0
            got = self.multi(msg)
        elif self.single is not None:
            got = self.single(body)
        else:
            got = body
        if got is not None:
            out.append(got)

    def feed(self, chunk: bytes) -> list[bytes]:
        if self.error is not None:
            raise self.error
        out: list[bytes] = []
        try:
            return self._feed(chunk, out)
        except (RemoteProtocolError, MessageTooLarge) as exc:
            return fail_after(self, out, exc)

    def _feed(self, chunk: bytes, out: list[bytes]) -> list[bytes]:
        pos = 0
        end = len(chunk)
        if self._need:
            # Continue a frame body cut by the last read, without re-copying it.
            need = self._need
            if end < need:
                self._parts.append(chunk)
                self._need = need - end
                return out
            self._parts.append(chunk[:need])
            body = b"".join(self._parts)
            self._parts = []
            self._need = 0
            pos = need
            self._frame(self._flags, body, out)
        elif self._buf:
            # Complete a cut header from the front of this chunk (at most 9 octets).
            chunk = self._buf + chunk
            self._buf = b""
            end = len(chunk)
        limit = self.max_size
        # Short single-frame data messages, the common case, take the inner loop:
        # no handler to call, no limit they could break, no box to open.
        fast = self.unbox is None and self.single is None and (not limit or limit >= 255)
        append = out.append
        unpack = _U64.unpack_from
        while pos < end:
            if fast and not self._msg:
                while pos + 2 <= end:
                    flags = chunk[pos]
                    if not flags:
                        start = pos + 2
                        stop = start + chunk[pos + 1]
                    elif flags == LONG and pos + 9 <= end:
                        start = pos + 9
                        stop = start + unpack(chunk, pos + 1)[0]
                        if limit and stop - start > limit:
                            break  # (refused below)
                    else:
                        break
                    if stop > end:
                        break
                    append(chunk[start:stop])
                    pos = stop
                if pos >= end:
                    break
            flags = chunk[pos]
            if flags & LONG:
                if end - pos < 9:
                    break
                (size,) = _U64.unpack_from(chunk, pos + 1)
                start = pos + 9
            else:
                if end - pos < 2:
                    break
                size = chunk[pos + 1]
                start = pos + 2
            if flags & 0xF8:
                raise RemoteProtocolError(f"ZMTP frame with reserved flag bits set (0x{flags:02x})")
            if limit and size > limit and (not flags & COMMAND or size > limit + COMMAND_SLACK):
                raise too_large(size, limit, "frame")
            stop = start + size
            if stop > end:
                self._parts = [chunk[start:]]
                self._need = stop - end
                self._flags = flags
                return out
            self._frame(flags, chunk[start:stop], out)
            pos = stop
        if pos < end:
            self._buf = chunk[pos:]
        return out
