"""``tcp+zlib://host:port`` -- SP messages over TCP, zlib-compressed in each direction.

An example of a nanopy transport plug-in (see ``docs/transports.md``). It uses only
nanopy's public plug-in API (:mod:`nanopy.transports`) and plain trio streams.

Wire format: each side first sends an 8-byte header ``00 'S' 'P' 'z' <protocol:u16>
00 01`` (uncompressed; a plain ``tcp://`` peer rejects it, so the two cannot be
mixed up), then one zlib stream: ``<len:u64> payload`` frames, flushed with
``Z_SYNC_FLUSH`` after every batch so the receiver can decode each batch at once.
"""

from __future__ import annotations

import errno
import struct
import zlib

import trio

from nanopy import AddressError, AddressInUse, MessageTooLarge, RemoteProtocolError
from nanopy.transports import Connection, Listener, PipeContext, Transport

SCHEME = "tcp+zlib"
_HEADER = struct.Struct(">4sH2s")
_MAGIC = b"\x00SPz"
_VERSION = b"\x00\x01"
_LEN = struct.Struct(">Q")
READ_SIZE = 64 * 1024
# Inflate at most this much per step, so a tiny "zip bomb" cannot allocate gigabytes:
# we check each length prefix against recv_max_size before buffering its payload.
INFLATE_STEP = 256 * 1024


def parse_url(url: str, *, bind: bool) -> tuple[str, int]:
    """``tcp+zlib://host:port`` -> (host, port); ``*`` or empty host = all interfaces."""
    rest = url[len(SCHEME) + 3 :]
    if rest.startswith("["):
        host, sep, port = rest[1:].partition("]:")
    else:
        host, sep, port = rest.rpartition(":")
    if not sep or "/" in port:
        raise AddressError(f"{url!r}: expected {SCHEME}://host:port")
    host = "" if host == "*" else host
    if not host and not bind:
        raise AddressError(f"{url!r}: connect needs a host")
    if not port.isdigit() or not 0 <= int(port) <= 65535 or (int(port) == 0 and not bind):
        raise AddressError(f"{url!r}: bad port {port!r}")
    return host, int(port)


class ZlibConnection(Connection):
    """One TCP connection; the engine runs ``receive`` and ``send`` in two tasks."""

    def __init__(self, stream: trio.SocketStream, ctx: PipeContext, remote: str) -> None:
        self._stream = stream
        self._ctx = ctx
        self.remote_address = remote
        self._deflate = zlib.compressobj(6)
        self._inflate = zlib.decompressobj()
        self._buf = bytearray()  # inflated bytes not yet parsed into messages

    async def handshake(self) -> None:
        await self._stream.send_all(_HEADER.pack(_MAGIC, self._ctx.protocol_id, _VERSION))
        header = b""
        while len(header) < _HEADER.size:
            chunk = await self._stream.receive_some(_HEADER.size - len(header))
            if not chunk:
                raise RemoteProtocolError("peer closed during the handshake")
            header += chunk
        magic, proto, version = _HEADER.unpack(header)
        if magic != _MAGIC or version != _VERSION:
            raise RemoteProtocolError(f"not a {SCHEME} peer (header {header.hex()})")
        if proto != self._ctx.peer_id:
            raise RemoteProtocolError(f"peer speaks protocol {proto}, expected {self._ctx.peer_id}")

    async def send(self, payloads: list[bytes]) -> None:
        # One compressed write per batch: the engine hands us everything queued.
        parts = []
        for payload in payloads:
            parts.append(_LEN.pack(len(payload)))
            parts.append(payload)
        data = self._deflate.compress(b"".join(parts)) + self._deflate.flush(zlib.Z_SYNC_FLUSH)
        await self._stream.send_all(data)

    async def receive(self) -> list[bytes]:
        while True:
            msgs = self._parse()
            if msgs:
                return msgs
            if self._inflate.unconsumed_tail:
                self._feed(b"")
                continue
            try:
                chunk = await self._stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, OSError) as exc:
                if self._buf:  # a reset cuts a message as an EOF does
                    raise RemoteProtocolError(f"connection reset in the middle of a message: {exc}") from None
                raise
            if not chunk:
                if self._buf or self._inflate.unconsumed_tail:
                    raise RemoteProtocolError("peer closed in the middle of a message")
                raise EOFError("peer closed the connection")
            self._feed(chunk)

    def _feed(self, chunk: bytes) -> None:
        try:
            self._buf += self._inflate.decompress(self._inflate.unconsumed_tail + chunk, INFLATE_STEP)
        except zlib.error as exc:
            raise RemoteProtocolError(f"corrupt zlib stream: {exc}") from None

    def _parse(self) -> list[bytes]:
        buf = self._buf
        limit = self._ctx.recv_max_size
        msgs = []
        pos = 0
        while len(buf) - pos >= 8:
            (size,) = _LEN.unpack_from(buf, pos)
            if limit and size > limit:
                raise MessageTooLarge(f"peer sent {size} bytes; recv_max_size is {limit}")
            if len(buf) - pos - 8 < size:
                break
            msgs.append(bytes(buf[pos + 8 : pos + 8 + size]))
            pos += 8 + size
        if pos:
            del buf[:pos]
        return msgs

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self._stream)


class ZlibListener(Listener):
    def __init__(self, listener: trio.SocketListener, url: str, ctx: PipeContext) -> None:
        self._listener = listener
        self._ctx = ctx
        self.url = url

    async def accept(self) -> Connection:
        stream = await self._listener.accept()  # raises OSError-like errors when closed
        host, port = stream.socket.getpeername()[:2]
        return ZlibConnection(stream, self._ctx, f"{host}:{port}")

    async def aclose(self) -> None:
        await self._listener.aclose()


class ZlibTransport(Transport):
    schemes = (SCHEME,)

    def check_url(self, url: str) -> None:
        parse_url(url, bind=True)

    async def listen(self, url: str, ctx: PipeContext) -> Listener:
        host, port = parse_url(url, bind=True)
        try:
            listeners = await trio.open_tcp_listeners(port, host=host or "0.0.0.0")
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise AddressInUse(exc.errno, f"{url}: address already in use") from None
            raise
        for extra in listeners[1:]:
            await extra.aclose()
        sock_host, real_port = listeners[0].socket.getsockname()[:2]
        shown = f"[{sock_host}]" if ":" in sock_host else sock_host
        return ZlibListener(listeners[0], f"{SCHEME}://{shown}:{real_port}", ctx)

    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        host, port = parse_url(url, bind=False)
        stream = await trio.open_tcp_stream(host.strip("[]"), port)
        return ZlibConnection(stream, ctx, f"{host}:{port}")


#: the object the entry point names
transport = ZlibTransport()
