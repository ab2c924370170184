"""One SP-over-WebSocket connection (client or server side) and its frame encoder.

Data frames are encoded here so ``try_send`` can write from any thread; the Sans-I/O
protocol objects of ``websockets`` parse incoming bytes, run the HTTP upgrade and
produce control frames. The per-port HTTP server that accepts connections is in
:mod:`nanopy.transports._ws_server`; URLs and the transport in :mod:`nanopy.transports.ws`.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from collections.abc import Sequence
from typing import Any

import trio
from websockets.client import ClientProtocol
from websockets.exceptions import PayloadTooBig
from websockets.frames import CloseCode, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - pure-Python build of websockets
    from websockets.utils import apply_mask

from .._errors import MessageTooLarge, RemoteProtocolError
from ._base import Connection, PipeContext
from ._stream import SocketChannel
from .tls import CLOSE_TIMEOUT, StreamChannel

#: the websockets protocol objects log here (handshakes at INFO, frames at DEBUG)
ws_log = logging.getLogger("nanopy.ws")

#: outgoing messages are split into frames of at most this many bytes (NNG drops > 1 MiB frames)
FRAGMENT_SIZE = 1 << 16
RECV_SIZE = 1 << 16
SUBPROTOCOL_SUFFIX = ".sp.nanomsg.org"

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
class WsConnection(Connection):
    """One WebSocket connection carrying SP messages.

    Data frames are encoded here (so ``try_send`` can write from any thread); the
    ``websockets`` protocol object parses incoming bytes and produces control frames
    (PONG, CLOSE). All writes are serialised: at most one async writer at a time,
    and bytes a writer could not take wait in ``_pending`` for the active one.
    """

    def __init__(
        self,
        channel: SocketChannel | StreamChannel,
        ctx: PipeContext,
        remote_address: str,
        *,
        url: str | None = None,
        proto: ServerProtocol | None = None,
        request: Request | None = None,
    ) -> None:
        self._chan = channel
        self._ctx = ctx
        self._client = proto is None
        self._url = url
        self._proto: ClientProtocol | ServerProtocol | None = proto
        self._request = request
        self.remote_address = remote_address
        self._parts: list[Any] = []
        self._early: list[Any] = []  # frames read together with the handshake response
        self._peer_closed = False
        self._closed = False
        self._tlock = threading.Lock()  # guards _pending/_writing against try_send's thread
        self._alock = trio.Lock()  # one async writer at a time
        self._pending: list[bytes | memoryview] = []
        self._writing = False
        self._broken = False  # a write was cut short: no more frames on this stream
        self._direct = channel.send_nowait

    @property
    def subprotocol(self) -> str | None:
        return None if self._proto is None else self._proto.subprotocol

    # -- handshake ---------------------------------------------------------------
    async def handshake(self) -> None:
        if self._client:
            await self._client_handshake()
        else:
            await self._server_handshake()

    async def _client_handshake(self) -> None:
        await self._chan.start()
        ctx = self._ctx
        wanted = _subprotocol(ctx.peer_name)
        assert self._url is not None
        proto = ClientProtocol(
            parse_uri(self._url), subprotocols=[Subprotocol(wanted)], max_size=ctx.recv_max_size or None, logger=ws_log
        )
        self._proto = proto
        proto.send_request(proto.connect())
        await self._flush_proto()
        while True:
            data = await self._chan.recv(RECV_SIZE)
            if data:
                proto.receive_data(data)
            else:
                proto.receive_eof()
            events = proto.events_received()
            if events or not data or proto.handshake_exc is not None:
                break
        if not events and not data:
            raise EOFError(f"{self._url}: connection closed during the WebSocket upgrade")
        if proto.handshake_exc is not None or not events or not isinstance(events[0], Response):
            exc = proto.handshake_exc
            raise RemoteProtocolError(f"{self._url}: WebSocket upgrade refused: {exc or 'connection closed'}")
        got = proto.subprotocol
        if got is None or got.lower() != wanted:
            raise RemoteProtocolError(
                f"{self._url}: server answered subprotocol {got!r}, expected {wanted!r}"
            )
        self._early = events[1:]

    async def _server_handshake(self) -> None:
        proto = self._proto
        request = self._request
        assert isinstance(proto, ServerProtocol) and request is not None
        own = _subprotocol(self._ctx.protocol_name)
        offered = [v.strip() for v in request.headers.get_all("Sec-WebSocket-Protocol")]
        chosen = _pick(offered, own)
        proto.max_message_size = self._ctx.recv_max_size or None
        if chosen is None:
            # NNG answers 400 unless the header holds exactly our own name.
            response = proto.reject(400, f"subprotocol {own} required\n")
        else:
            proto.available_subprotocols = [Subprotocol(chosen)]
            proto.select_subprotocol = lambda offered: Subprotocol(chosen)  # type: ignore[method-assign,assignment]
            response = proto.accept(request)
        proto.send_response(response)
        await self._flush_proto()
        if response.status_code != 101:
            raise RemoteProtocolError(
                f"WebSocket upgrade from {self.remote_address} refused ({response.status_code}): "
                f"subprotocol {', '.join(offered) or 'none'} offered, {own} required"
            )

    # -- writing ------------------------------------------------------------------
    def try_send(self, payload: bytes) -> bool:
        direct = self._direct
        if direct is None:
            return False
        with self._tlock:
            if self._writing or self._pending or self._closed:
                return False
            parts: list[Any] = []
            encode_message(payload, self._client, parts)
            data = b"".join(parts)
            try:
                n = direct(data)
            except OSError:
                return False  # the writer task meets (and reports) the error
            if n < len(data):
                self._pending.append(memoryview(data)[n:])
                self.has_pending = True
        return True

    async def send(self, payloads: list[bytes]) -> None:
        if not payloads:
            await self._write(b"")
            return
        parts: list[Any] = []
        masked = self._client
        for payload in payloads:
            encode_message(payload, masked, parts)
        await self._write(b"".join(parts))

    async def _write(self, data: bytes) -> None:
        """Write ``data`` after everything pending (engine thread; one writer at a time)."""
        async with self._alock:
            with self._tlock:
                chunks = self._pending
                self._pending = []
                self.has_pending = False
                self._writing = True
            try:
                if data:
                    chunks.append(data)
                while chunks:
                    await self._chan.send_all(chunks[0] if len(chunks) == 1 else b"".join(chunks))
                    with self._tlock:
                        chunks = self._pending
                        self._pending = []
                        self.has_pending = False
                        if not chunks:
                            self._writing = False
                if not data:
                    await trio.lowlevel.checkpoint()
            except BaseException:
                self._broken = True
                raise
            finally:
                with self._tlock:
                    self._writing = False

    async def _flush_proto(self) -> None:
        """Write what the protocol object produced (handshake, PONG, CLOSE, EOF)."""
        proto = self._proto
        assert proto is not None
        out = proto.data_to_send()
        if not out:
            return
        eof = b"" in out
        data = b"".join(out)
        if self._alock.locked() and not eof:
            # A writer is busy: it takes our bytes before it lets go (the reader
            # never waits on a slow writer just to answer a PING).
            with self._tlock:
                self._pending.append(data)
                self.has_pending = True
            return
        await self._write(data)
        if eof:
            await self._chan.send_eof()

    # -- reading --------------------------------------------------------------------
    async def receive(self) -> list[bytes]:
        proto = self._proto
        assert proto is not None
        if self._early:
            early, self._early = self._early, []
            msgs = self._collect(early)
            if msgs:
                return msgs
        while True:
            if self._peer_closed:
                raise EOFError(f"peer closed the WebSocket ({proto.close_rcvd or 'no close frame'})")
            data = await self._chan.recv(RECV_SIZE)
            if data:
                proto.receive_data(data)
            else:
                proto.receive_eof()
                self._peer_closed = True
            events = proto.events_received()
            await self._flush_proto()  # PONG, CLOSE echo, failure CLOSE
            exc = proto.parser_exc
            if exc is not None and not isinstance(exc, EOFError):
                self._peer_closed = True
                if isinstance(exc, PayloadTooBig):
                    raise MessageTooLarge(
                        f"peer sent a message over recv_max_size ({self._ctx.recv_max_size}): {exc}"
                    )
                raise RemoteProtocolError(f"WebSocket protocol error from {self.remote_address}: {exc}")
            collected = self._collect(events) if events else None
            if collected:
                return collected
            if not data and self._parts:
                raise RemoteProtocolError("peer closed in the middle of a message")

    def _collect(self, events: Sequence[Any]) -> list[bytes]:
        msgs: list[bytes] = []
        parts = self._parts
        for frame in events:
            op = frame.opcode
            if op is Opcode.BINARY:
                if frame.fin:
                    data = frame.data  # the parser may hand out a bytearray slice
                    msgs.append(data if data.__class__ is bytes else bytes(data))
                else:
                    parts.append(frame.data)
            elif op is Opcode.CONT:
                parts.append(frame.data)
                if frame.fin:
                    msgs.append(b"".join(parts))
                    parts.clear()
            elif op is Opcode.TEXT:
                self._fail(CloseCode.UNSUPPORTED_DATA, "SP over WebSocket takes binary frames only")
                raise RemoteProtocolError(f"{self.remote_address} sent a text frame")
            elif op is Opcode.CLOSE:
                self._peer_closed = True
            # PING is answered by the protocol object; PONG needs nothing.
        return msgs

    def _fail(self, code: int, reason: str) -> None:
        proto = self._proto
        if proto is not None and proto.state is State.OPEN:
            proto.fail(code, reason)
            self._peer_closed = True

    # -- closing ------------------------------------------------------------------------
    async def aclose(self) -> None:
        with self._tlock:
            if self._closed:
                return
            self._closed = True
        proto = self._proto
        with trio.CancelScope(shield=True):
            opened = proto is not None and proto.state in (State.OPEN, State.CLOSING)
            if opened and not self._chan.closed and not self._broken:
                with trio.move_on_after(CLOSE_TIMEOUT):
                    try:
                        await self._goodbye(proto)  # type: ignore[arg-type]
                    except (OSError, EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
            await self._chan.aclose()

    async def _goodbye(self, proto: ClientProtocol | ServerProtocol) -> None:
        """Close handshake: send CLOSE (unless done), flush, then wait for the peer's EOF."""
        if proto.state is State.OPEN:
            proto.send_close(CloseCode.NORMAL_CLOSURE)
        await self._flush_proto()
        if self._peer_closed and not self._client:
            # Lingering close: stop writing, then read and discard whatever the peer
            # still sends, so our kernel does not answer unread data with a reset
            # that would destroy the CLOSE frame (and its code) on the way out.
            await self._chan.send_eof()
            while await self._chan.recv(RECV_SIZE):
                pass
            return
        while proto.state is not State.CLOSED:
            data = await self._chan.recv(RECV_SIZE)
            if not data:
                break
            proto.receive_data(data)
            proto.events_received()
            await self._flush_proto()
