"""One SP-over-WebSocket connection (client or server side) and its frame encoder.

Data frames are encoded here (``frame``), and written by the pipe's driver, the
connection's only writer while the pipe runs; the Sans-I/O protocol objects of
``websockets`` parse incoming bytes, run the HTTP upgrade and produce control
frames. The per-port HTTP server that accepts connections is in
:mod:`nanopy.transports._ws_server`; URLs and the transport in :mod:`nanopy.transports.ws`.

Hostile peers are bounded here: a partial message costs its payload and no more
(fragments are appended to one buffer), a message cannot be cut into endless tiny
fragments, PINGs get one coalesced PONG, and a peer that floods PINGs while it leaves
our frames unread (our PONG cannot be written for a second) is closed. Bytes that
arrive together with the HTTP head of the upgrade are parsed by ``receive`` with the
same rules as any later read.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio
from websockets.client import ClientProtocol
from websockets.exceptions import InvalidStatus, PayloadTooBig
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from ..core.errors import RemoteProtocolError, too_large
from ..platform import unread_bytes
from ._base import ChannelConnection, PipeContext
from ._keepalive import MAX_UNANSWERED_PINGS, PONG_PATIENCE, PeerWatch
from ._stream import SocketChannel
from ._ws_proto import (
    FRAGMENT_SIZE,
    FREE_FRAGMENTS,
    HTTP_REASONS,
    MAX_FRAME_LENGTH,
    MAX_HTTP_HEAD,
    MIN_FRAGMENT_AVERAGE,
    PARSE_SLICE,
    RECV_SIZE,
    HeadTooLarge,
    SpClientProtocol,
    SpServerProtocol,
    _is_bad_length,
    _pick,
    _subprotocol,
    _ws_size,
    encode_message,
    http_error,
    read_head,
    ws_log,
)
from .tls import CLOSE_TIMEOUT, TLS_RECORD_PLAINTEXT, StreamChannel

__all__ = [
    "FRAGMENT_SIZE",
    "FREE_FRAGMENTS",
    "HTTP_REASONS",
    "MAX_FRAME_LENGTH",
    "MAX_HTTP_HEAD",
    "MAX_UNANSWERED_PINGS",
    "HeadTooLarge",
    "SpServerProtocol",
    "WsConnection",
    "http_error",
    "read_head",
    "ws_log",
]


class WsConnection(ChannelConnection):
    """One WebSocket connection carrying SP messages.

    A channel (see :class:`ChannelConnection`): ``frame`` encodes data frames,
    ``write_nowait`` writes from any thread on ``ws://`` (a TLS stream cannot:
    ``wss://`` pipes write from the writer task). The ``websockets`` protocol object
    parses incoming bytes and produces the CLOSE frames; PONGs are coalesced here.

    One writer at a time, without locks: the handshake writes before the pipe
    runs; while it runs the pipe's driver is the only writer, and the reader hands
    it the PONG it owes (``attach_control``: ahead of queued data, replacing one
    not written yet). A CLOSE the reader produces ends the pipe, so it waits in
    ``_unsent`` for ``aclose``, which writes it once the pipe's writer has stopped.
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
        early: bytes = b"",
        deadline: float | None = None,
    ) -> None:
        self._chan = channel
        self._ctx = ctx
        self._client = proto is None
        self._url = url
        self._proto: ClientProtocol | ServerProtocol | None = proto
        self._request = request
        self._deadline = deadline  # the server's handshake ends by then (TLS + upgrade together)
        self.remote_address = remote_address
        self._early = early  # bytes that came after the HTTP head: parsed by receive()
        self._message: bytearray | None = None  # the fragmented message being collected
        self._fragments = 0
        self._error: Exception | None = None  # found after messages we returned first
        self._peer_closed = False
        self._closed = False
        self._unsent: list[bytes] = []  # protocol output (CLOSE, EOF) left for aclose
        self._control: Callable[[bytes], bool] | None = None  # the pipe's control-frame writer
        self._unanswered = 0  # PINGs that arrived while our oldest unwritten PONG waited
        self._pong_since = 0.0  # when that PONG was queued (trio clock)
        self._broken = False  # a write was cut short: no more frames on this stream
        self._direct = channel.send_nowait
        # Dead-peer detection (docs/partitions.md): PING a silent peer, give up on one
        # silent for dead_peer_timeout. ``keepalive`` is the pipe's extra task, or None.
        timeout = ctx.options.get("dead_peer_timeout")
        self.keepalive: Callable[[Callable[[], bool]], Awaitable[None]] | None = None
        if timeout is not None:
            watch = PeerWatch(timeout, lambda: self._heard, self._send_ping, "WebSocket frame", remote_address,
                              unread=lambda: unread_bytes(self.kernel_socket()) > 0)
            self.keepalive = watch.run
        self._heard = 0.0  # when bytes last came from the peer (time.monotonic())
        self._ping: bytes | None = None  # our PING, until the peer is heard again
        self._pong: bytes | None = None  # the last PONG we handed the pipe
        self._pings_sent = 0
        if channel.secure:  # (wss: the kernel's count is of TLS records)
            self.unacked_slack = TLS_RECORD_PLAINTEXT

    def kernel_socket(self) -> Any:
        return self._chan.kernel_socket()

    def peer_details(self) -> dict[str, Any]:
        certificate = getattr(self._chan, "certificate", None)  # (wss: a TLS StreamChannel)
        return {} if certificate is None else {"mechanism": "tls", "certificate": certificate()}

    def unwritten_bytes(self) -> int | None:
        counted = getattr(self._chan, "unwritten_bytes", None)
        return None if counted is None else counted()

    @property
    def waiting_for_room(self) -> bool:
        return self._chan.waiting_for_room

    @property
    def subprotocol(self) -> str | None:
        return None if self._proto is None else self._proto.subprotocol

    # -- handshake ---------------------------------------------------------------
    async def handshake(self) -> None:
        if self._client:
            await self._client_handshake()
        elif self._deadline is not None:
            with trio.fail_at(self._deadline):
                await self._server_handshake()
        else:
            await self._server_handshake()

    async def _client_handshake(self) -> None:
        await self._chan.start()
        ctx = self._ctx
        wanted = _subprotocol(ctx.peer_name)
        assert self._url is not None
        proto = SpClientProtocol(
            parse_uri(self._url),
            subprotocols=[Subprotocol(wanted)],
            max_size=ctx.recv_max_size or MAX_FRAME_LENGTH,
            logger=ws_log,
        )
        self._proto = proto
        proto.send_request(proto.connect())
        await self._flush_proto()
        what = f"{self._url}: WebSocket upgrade"
        head, rest = await read_head(self._chan, what)
        proto.receive_data(head)
        events = proto.events_received()
        while not events and proto.handshake_exc is None:
            # Only a refusal has a body (a 101 ends at its head): read it, then report.
            proto.receive_data(rest)
            events = proto.events_received()
            if events or proto.handshake_exc is not None:
                break
            rest = await self._chan.recv(RECV_SIZE)  # type: ignore[assignment]  # a view is parsed alike
            if not rest:
                raise EOFError(f"{what}: peer closed in the middle of its answer")
        response = events[0] if events and isinstance(events[0], Response) else None
        exc = proto.handshake_exc
        if response is not None and response.status_code != 101:
            status = f"HTTP {response.status_code} {response.reason_phrase}"
            if response.status_code == 400:
                # Our request or protocol is wrong for this server (NNG and nanopy answer
                # 400 to a subprotocol they do not serve): a protocol error, as a wrong
                # SP header is on tcp.
                body = response.body.decode("utf-8", "replace").strip()
                raise RemoteProtocolError(f"{what} refused: {status}" + (f": {body}" if body else ""))
            # Like a refused TCP connection: the server is up but serves no SP here.
            # The dialer retries quietly and counts a reconnect attempt.
            raise ConnectionRefusedError(f"{what} refused: {status}")
        if exc is not None and not isinstance(exc, InvalidStatus):
            raise RemoteProtocolError(f"{what} failed: {exc}")
        got = proto.subprotocol
        if got is None or got.lower() != wanted:
            raise RemoteProtocolError(f"{what}: server answered subprotocol {got!r}, expected {wanted!r}")
        self._early = rest

    async def _server_handshake(self) -> None:
        proto = self._proto
        request = self._request
        assert isinstance(proto, ServerProtocol) and request is not None
        own = _subprotocol(self._ctx.protocol_name)
        offered = [v.strip() for v in request.headers.get_all("Sec-WebSocket-Protocol")]
        chosen = _pick(offered, own)
        proto.max_message_size = self._ctx.recv_max_size or MAX_FRAME_LENGTH
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

    async def refuse(self, status: int, text: str) -> None:
        """Answer an upgrade that was never accepted with an HTTP error (best effort)."""
        proto = self._proto
        if self._client or proto is None or proto.state is not State.CONNECTING:
            return
        with trio.move_on_after(CLOSE_TIMEOUT):
            try:
                await self._chan.send_all(http_error(status, text))
                await self._chan.send_eof()
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def aclose_refused(self, reason: str) -> None:
        """A bind's gate refused the peer: before the upgrade (``allow=``/``deny=``)
        HTTP 403, after it (``authorize=``) CLOSE 1008 (policy violation) with the
        reason; on wss both inside TLS, which then ends with a close_notify."""
        proto = self._proto
        with trio.CancelScope(shield=True):
            if proto is not None and proto.state is State.CONNECTING:
                await self.refuse(403, "Forbidden")
                end_tls = getattr(self._chan, "refuse", None)  # (wss: TLS's close_notify)
                if end_tls is not None:
                    await end_tls()
            elif proto is not None and proto.state is State.OPEN:
                # A CLOSE reason holds 123 bytes (RFC 6455 5.5); the close handshake
                # runs in aclose, bounded by CLOSE_TIMEOUT.
                proto.send_close(CloseCode.POLICY_VIOLATION,
                                 reason.encode()[:123].decode("utf-8", "ignore"))
            await self.aclose()

    # -- writing (the pipe's driver; see ChannelConnection) ----------------------------
    def frame(self, payloads: list[bytes]) -> bytes:
        parts: list[Any] = []
        masked = self._client
        for payload in payloads:
            encode_message(payload, masked, parts)
        return b"".join(parts)

    def write_nowait(self, chunk: bytes | memoryview) -> int:
        direct = self._direct
        if direct is None or self._closed:
            return 0
        try:
            n = direct(chunk)
        except OSError:
            return 0  # write_all meets (and reports) the error
        if n and n < len(chunk):
            self._broken = True  # in the middle of a frame until write_all writes the rest
        return n

    async def write_all(self, chunk: bytes | memoryview) -> None:
        self._broken = True  # until the whole chunk is written: a cancelled write cuts a frame
        await self._chan.send_all(chunk)
        self._broken = False

    def attach_control(self, send_control: Callable[[bytes], bool]) -> None:
        self._control = send_control

    async def _flush_proto(self) -> None:
        """Write what the protocol object produced (handshake, CLOSE, EOF) -- only
        while nobody else writes (handshake, aclose)."""
        proto = self._proto
        assert proto is not None
        out = self._unsent + proto.data_to_send()
        self._unsent = []
        if not out:
            return
        data = b"".join(out)
        if data:
            await self._chan.send_all(data)
        if b"" in out:
            await self._chan.send_eof()

    def _owe_pong(self, proto: ClientProtocol | ServerProtocol) -> None:
        """Answer the latest PING with one PONG, replacing one not yet written."""
        ping = proto.ping  # type: ignore[union-attr]
        if ping is None:
            return
        count = proto.pings  # type: ignore[union-attr]
        proto.ping, proto.pings = None, 0  # type: ignore[union-attr]
        pong = Frame(Opcode.PONG, ping).serialize(mask=self._client)
        if self._control is None:  # no pipe runs this connection: aclose writes it
            self._unsent.append(pong)
            return
        self._pong = pong
        now = trio.current_time()
        # (our own PING goes along while unanswered: a control frame replaces an unwritten one)
        if not self._control(pong + self._ping if self._ping is not None else pong):
            self._unanswered, self._pong_since = 0, now  # the previous PONG went out: a fresh wait
            return
        self._unanswered += count  # our oldest unwritten PONG still waits
        waited = now - self._pong_since
        if waited >= PONG_PATIENCE and self._unanswered > MAX_UNANSWERED_PINGS and self._error is None:
            self._fail(CloseCode.POLICY_VIOLATION, "PING flood")
            self._error = RemoteProtocolError(
                f"{self.remote_address} sent {self._unanswered} PINGs in {waited:.1f} s while leaving our frames unread"
            )

    # -- dead-peer detection (the pipe runs a PeerWatch) ---------------------------------
    def _send_ping(self) -> None:
        control = self._control
        if control is None:
            return
        self._pings_sent += 1
        ping = self._ping = Frame(Opcode.PING, b"np%d" % self._pings_sent).serialize(mask=self._client)
        if control(ping) and self._pong is not None:
            control(self._pong + ping)  # it replaced an unwritten PONG: keep that too

    # -- reading --------------------------------------------------------------------
    async def receive(self) -> list[bytes]:
        if self._early:
            # What came with the handshake, under the same rules as any read.
            data, self._early = self._early, b""
            msgs = await self._take(data)
            if msgs:
                return msgs
        while True:
            if self._error is not None:
                raise self._error
            if self._peer_closed:
                proto = self._proto
                assert proto is not None
                raise EOFError(f"peer closed the WebSocket ({proto.close_rcvd or 'no close frame'})")
            try:
                data = await self._chan.recv(RECV_SIZE)  # type: ignore[assignment]  # a view is parsed alike
            except OSError as exc:
                if self._mid_message():  # a reset cuts a message as an EOF does
                    raise RemoteProtocolError(f"connection reset in the middle of a message: {exc}") from None
                raise
            msgs = await self._take(data)
            if msgs:
                return msgs

    def _mid_message(self) -> bool:
        """True while a frame or a fragmented message is incomplete."""
        proto = self._proto
        if self._message is not None or proto is None:
            return self._message is not None
        if proto.reader.buffer:
            return True
        # Between frames the parser waits in the reader's at_eof(); within a frame, in
        # read_exact(). Find the innermost generator it is suspended in.
        gen = proto.parser
        while getattr(gen, "gi_yieldfrom", None) is not None:
            gen = gen.gi_yieldfrom  # type: ignore[attr-defined]
        return getattr(gen, "__name__", "at_eof") != "at_eof"

    async def _take(self, data: bytes) -> list[bytes]:
        """Parse ``data`` (``b""``: end of stream); answer PINGs and CLOSEs; return the
        complete messages. An error found after them is raised by the next receive."""
        proto = self._proto
        assert proto is not None
        cut = False
        msgs: list[bytes] = []
        if data:
            self._heard = time.monotonic()
            self._ping = None  # the peer is alive: no PING owed
            # In slices: websockets makes an object per frame, so a read full of
            # tiny frames would cost ~30x its size at once if parsed in one go.
            view = memoryview(data)
            for start in range(0, len(data), PARSE_SLICE):
                proto.receive_data(view[start : start + PARSE_SLICE])  # type: ignore[arg-type]
                msgs += self._collect(proto.events_received())
                if self._error is not None or proto.parser_exc is not None:
                    break
        else:
            cut = self._mid_message()
            proto.receive_eof()
            self._peer_closed = True
            msgs = self._collect(proto.events_received())
        self._owe_pong(proto)
        if self._error is None:
            self._error = self._parser_error(proto, cut)
        # A CLOSE (an echo, or ours failing the connection) ends the pipe: aclose writes it.
        self._unsent += proto.data_to_send()
        if self._error is not None:
            self._peer_closed = True
            if not msgs:
                raise self._error
        return msgs

    def _parser_error(self, proto: ClientProtocol | ServerProtocol, cut: bool) -> Exception | None:
        exc = proto.parser_exc
        if exc is not None and not isinstance(exc, EOFError):
            if isinstance(exc, PayloadTooBig) and not _is_bad_length(exc):
                return too_large(_ws_size(exc), self._ctx.recv_max_size)
            return RemoteProtocolError(f"WebSocket protocol error from {self.remote_address}: {exc}")
        if cut:
            return RemoteProtocolError("peer closed in the middle of a message")
        return None

    def _collect(self, events: Sequence[Any]) -> list[bytes]:
        """Complete messages from ``events``; fragments go into one growing buffer,
        so a partial message costs its payload, however it is cut."""
        msgs: list[bytes] = []
        for frame in events:
            op = frame.opcode
            if op is Opcode.BINARY or op is Opcode.CONT:
                message = self._message
                if message is None:  # BINARY (websockets refuses a CONT that starts nothing)
                    if frame.fin:
                        data = frame.data
                        msgs.append(data if type(data) is bytes else bytes(data))
                        continue
                    message = self._message = bytearray(frame.data)
                    self._fragments = 1
                    continue
                message += frame.data
                if frame.fin:
                    msgs.append(bytes(message))
                    self._message = None
                    continue
                self._fragments += 1
                if self._fragments > FREE_FRAGMENTS + len(message) // MIN_FRAGMENT_AVERAGE:
                    self._fail(CloseCode.POLICY_VIOLATION, "too many fragments for the payload")
                    self._error = RemoteProtocolError(
                        f"{self.remote_address} cut one message into {self._fragments} fragments "
                        f"carrying {len(message)} bytes"
                    )
                    break
            elif op is Opcode.TEXT:
                self._fail(CloseCode.UNSUPPORTED_DATA, "SP over WebSocket takes binary frames only")
                self._error = RemoteProtocolError(f"{self.remote_address} sent a text frame")
                break
            elif op is Opcode.CLOSE:
                self._peer_closed = True
            # PINGs wait in the protocol object (see _owe_pong); a PONG needs nothing.
        return msgs

    def _fail(self, code: int, reason: str) -> None:
        proto = self._proto
        if proto is not None and proto.state is State.OPEN:
            proto.fail(code, reason)
            self._peer_closed = True

    # -- closing ------------------------------------------------------------------------
    async def aclose(self) -> None:
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
        """Close handshake: send CLOSE (unless done) and flush; then the server closes
        the connection as soon as the handshake is complete, and the client waits
        (bounded by the caller) for the server to do so (RFC 6455 section 7.1.1).

        After a complete handshake neither end waits for an EOF the other sends only
        after its own: TLS cannot half-close, so on wss both would wait out the timeout.
        """
        if proto.state is State.OPEN:
            proto.send_close(CloseCode.NORMAL_CLOSURE)
        await self._flush_proto()
        if not self._client:
            if proto.close_rcvd is None and self._peer_closed:
                # We failed the connection (or the peer left): a lingering close.
                await self._linger()
                return
            # Read (and discard) up to the peer's CLOSE; past it a peer sends nothing,
            # so closing now cannot meet unread data and reset the connection.
            while proto.close_rcvd is None and await self._receive_closing(proto):
                pass
            return
        while proto.state is not State.CLOSED and await self._receive_closing(proto):
            pass

    async def _receive_closing(self, proto: ClientProtocol | ServerProtocol) -> bool:
        """One read during the close handshake; False at the peer's EOF."""
        data = await self._chan.recv(RECV_SIZE)
        if not data:
            proto.receive_eof()
            return False
        proto.receive_data(data)  # type: ignore[arg-type]  # a view is parsed alike
        proto.events_received()
        await self._flush_proto()
        return True

    async def _linger(self) -> None:
        """Stop writing, then read and discard whatever the peer still sends, so our
        kernel does not answer unread data with a reset that would destroy our CLOSE
        frame (and its code) on the way out. Ends at the peer's EOF (or the caller's
        timeout: a wss peer that waits for us to close first never sends one)."""
        await self._chan.send_eof()
        while await self._chan.recv(RECV_SIZE):
            pass
