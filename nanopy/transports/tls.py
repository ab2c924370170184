"""``tls+tcp://host:port`` -- the SP TCP mapping inside TLS, and the TLS layer ``wss://`` uses.

Endpoint option ``ssl_context``: an :class:`ssl.SSLContext`. A dialer without one
uses :func:`ssl.create_default_context` (system CAs, host name checked against the
URL); a listener must be given one (it needs a certificate). For mutual TLS give
the listener a context with ``verify_mode = ssl.CERT_REQUIRED`` and CA locations,
and the dialer a context with ``load_cert_chain``.

The TLS handshake runs in :meth:`Connection.handshake`, so the socket's
``handshake_timeout`` bounds it; a peer that fails verification is closed (and
counted in ``stats().protocol_errors``) before any message passes.

This module also holds the TLS byte channel ``wss://`` runs on (:class:`StreamChannel`;
``ws://`` runs on :class:`nanopy.transports._stream.SocketChannel`). The SP framing
is that of tcp (:class:`nanopy.transports._stream.FramedConnection`) over the channel.
"""

from __future__ import annotations

import errno
import socket
import ssl
from typing import Any

import trio

from ..core.errors import AddressError, AuthenticationFailed, RemoteProtocolError
from ._base import Connection, Listener, PipeContext
from ._stream import FramedConnection, SocketChannel
from .tcp import TcpListener, TcpTransport, bind_tcp_socket, bound_url, dial_tcp_socket, split_host_port

# How long aclose() waits to say goodbye (TLS close_notify, WebSocket CLOSE).
CLOSE_TIMEOUT = 0.5
#: the most plaintext one TLS record carries (ChannelConnection.unacked_slack)
TLS_RECORD_PLAINTEXT = 16 * 1024
#: a plaintext TLS record holding a fatal ``access_denied`` alert (RFC 8446 6.2,
#: description 49): a bind's gate answers a refused address's ClientHello with it,
#: as OpenSSL would from a callback, without the handshake's cost
ACCESS_DENIED_ALERT = bytes([21, 3, 3, 0, 2, 2, ssl.ALERT_DESCRIPTION_ACCESS_DENIED])
#: the most of a ClientHello read before answering it
HELLO_READ = 64 * 1024


# -- the TLS byte channel ----------------------------------------------------------
def _tls_failure(exc: trio.BrokenResourceError) -> ssl.SSLError | None:
    """The TLS-level reason a stream broke (bad certificate, an alert from the peer,
    a corrupt record), or None if the connection itself went away (EOF, reset)."""
    cause = exc.__cause__
    if isinstance(cause, ssl.SSLError) and not isinstance(cause, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return cause
    return None


def _refused_certificate(failure: ssl.SSLError) -> bool:
    """This side refused the peer's certificate (or its lack of one): an
    authentication failure, not a broken peer."""
    return isinstance(failure, ssl.SSLCertVerificationError) or failure.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE"


class StreamChannel:
    """A trio stream (here a :class:`trio.SSLStream`) behind the channel interface.

    Failures are reported by the rules of docs/transports.md: a TLS-level failure
    (verification, an alert, a corrupt record) is a RemoteProtocolError; a peer that
    connected and left without sending a byte is an EOFError (a port probe); a
    connection cut in the middle of the TLS handshake is a RemoteProtocolError.
    """

    secure = True
    send_nowait = None  # no thread-safe direct writes on a TLS stream (ws checks this)

    def __init__(self, stream: trio.SSLStream[Any], describe: str, server_side: bool = False) -> None:
        self.stream = stream
        self.closed = False
        self._describe = describe
        self._server_side = server_side
        self._handshook = False  # the TLS handshake completed (a refusal then ends with close_notify)

    @property
    def waiting_for_room(self) -> bool:
        """A write waits for the kernel to take more (ReportsWriteWait)."""
        return bool(self.stream.transport_stream.waiting_for_room)

    def certificate(self) -> dict[str, Any] | None:
        """The peer's certificate as ``getpeercert()`` gives it once TLS verified one
        (None: no certificate, or one nobody verified)."""
        try:
            cert = self.stream.getpeercert()
        except (ValueError, AttributeError):  # (no handshake yet)
            return None
        return dict(cert) if cert else None

    async def start(self) -> None:
        """Run the TLS handshake; a verification failure becomes RemoteProtocolError."""
        if self._server_side:
            await self._wait_first_byte()
        try:
            await self.stream.do_handshake()
            self._handshook = True
        except trio.BrokenResourceError as exc:
            failure = _tls_failure(exc)
            if failure is None and not self._server_side:
                # The server hung up (or reset) without a word: a dial failure, retried.
                raise ConnectionResetError(f"{self._describe} closed the connection during TLS") from None
            if failure is None:
                raise RemoteProtocolError(f"{self._describe} left in the middle of the TLS handshake") from None
            if self._server_side:
                await self._send_alert()
            refused = AuthenticationFailed if _refused_certificate(failure) else RemoteProtocolError
            raise refused(f"TLS handshake with {self._describe} failed: {failure}") from None

    async def _wait_first_byte(self) -> None:
        """EOFError for a client that connects and leaves without a byte (a probe)."""
        sock = self.stream.transport_stream.socket
        if not await sock.recv(1, socket.MSG_PEEK):
            raise EOFError(f"{self._describe} closed before the TLS handshake")

    async def _send_alert(self) -> None:
        """Send the alert that says why we refused (trio leaves it unsent on failure),
        so the client's socket can count a refusal rather than a reset."""
        outgoing = getattr(self.stream, "_outgoing", None)
        data = outgoing.read() if outgoing is not None else b""
        # trio holds the handshake's last records (TLS 1.3 session tickets) back to
        # send with the first data; without them the alert's record fails its MAC.
        delayed = getattr(self.stream, "_delayed_outgoing", None)
        if delayed:
            self.stream._delayed_outgoing = None
            data = delayed + data
        if data:
            with trio.move_on_after(CLOSE_TIMEOUT):
                try:
                    await self.stream.transport_stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass

    async def refuse(self) -> None:
        """Tell a peer a bind's gate refused why the connection ends (best effort,
        bounded by CLOSE_TIMEOUT; the caller closes): before the TLS handshake a fatal
        ``access_denied`` alert (the dialer's handshake fails with
        ``TLSV1_ALERT_ACCESS_DENIED``), after it a close_notify (a clean end of the
        session, which trio's https-compatible close leaves out)."""
        with trio.move_on_after(CLOSE_TIMEOUT):
            try:
                if self._handshook:
                    await self._close_notify()
                elif self._server_side:
                    await self._deny_hello()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
                pass

    async def _deny_hello(self) -> None:
        """Read the ClientHello (so that closing with it unread does not reset the
        connection and destroy the alert), then answer it with ``access_denied``."""
        sock = self.stream.transport_stream.socket
        if await sock.recv(HELLO_READ):
            await sock.send(ACCESS_DENIED_ALERT)

    async def _close_notify(self) -> None:
        obj = getattr(self.stream, "_ssl_object", None)  # (trio keeps its ssl.SSLObject here)
        if obj is None:
            return
        try:
            obj.unwrap()  # writes our close_notify; the peer's is not awaited
        except ssl.SSLWantReadError:
            pass
        await self._send_alert()  # (what is outgoing: the close_notify record)

    def kernel_socket(self) -> Any:
        """The TCP socket under the TLS session, for the kernel's counters."""
        return self.stream.transport_stream.socket

    async def recv(self, size: int) -> bytes:
        try:
            return bytes(await self.stream.receive_some(size))
        except trio.BrokenResourceError as exc:
            failure = _tls_failure(exc)
            if failure is not None:  # e.g. the server's alert refusing our certificate (TLS 1.3)
                raise RemoteProtocolError(f"TLS error from {self._describe}: {failure}") from None
            incoming = getattr(self.stream, "_incoming", None)  # (trio keeps a record's start here)
            if incoming is not None and incoming.pending:  # a reset cuts a record as an EOF does
                raise RemoteProtocolError(f"connection reset in the middle of a TLS record from "
                                          f"{self._describe}: {exc.__cause__ or exc}") from None
            raise ConnectionResetError(f"TLS stream broken: {exc.__cause__ or exc}") from None

    async def send_all(self, data: bytes | memoryview) -> None:
        try:
            await self.stream.send_all(data)
        except trio.BrokenResourceError as exc:
            raise ConnectionResetError(f"TLS stream broken: {exc.__cause__ or exc}") from None

    async def send_eof(self) -> None:
        # TLS has no half-close: the close handshake ends with aclose().
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        with trio.move_on_after(CLOSE_TIMEOUT) as scope:
            scope.shield = True
            try:
                await self.stream.aclose()
                return
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        await trio.aclose_forcefully(self.stream.transport_stream)


# -- SSL contexts ---------------------------------------------------------------------
def client_context(options: Any) -> ssl.SSLContext:
    """The dialer's context: ``ssl_context`` or a verifying default."""
    ctx = options.get("ssl_context")
    if ctx is None:
        return ssl.create_default_context()
    return _check_context(ctx)


def server_context(options: Any, url: str) -> ssl.SSLContext:
    """The listener's context; there is no sensible default (a certificate is needed)."""
    ctx = options.get("ssl_context")
    if ctx is None:
        raise AddressError(
            f"{url}: a TLS listener needs a certificate; pass ssl_context=<ssl.SSLContext with "
            "load_cert_chain(...)> to bind()"
        )
    return _check_context(ctx)


def _check_context(ctx: Any) -> ssl.SSLContext:
    if not isinstance(ctx, ssl.SSLContext):
        raise TypeError(f"ssl_context must be an ssl.SSLContext, not {type(ctx).__name__}")
    return ctx


class _ReportingSocketStream(trio.abc.HalfCloseableStream):
    """A :class:`trio.SocketStream` (its socket options, reads, EOF and close) whose
    writes are a :class:`SocketChannel`'s, which say when they wait for room: how a
    TLS pipe counts a stalled write as queued (``waiting_for_room``)."""

    def __init__(self, sock: socket.socket) -> None:
        self._inner = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        self.socket = self._inner.socket
        self._chan = SocketChannel(sock)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        if not view:
            await self._inner.send_all(view)
            return
        try:
            await self._chan.send_all(view)
        except OSError as exc:  # (as trio.SocketStream reports it)
            if exc.errno in (errno.EBADF, errno.ENOTSOCK):
                raise trio.ClosedResourceError("this socket was already closed") from None
            raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc

    @property
    def waiting_for_room(self) -> bool:
        return self._chan.waiting_for_room

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self._inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self._inner.aclose()


def tls_client(sock: socket.socket, ctx: ssl.SSLContext, hostname: str, describe: str) -> StreamChannel:
    """Wrap a connected socket as the TLS client side (handshake in ``start()``)."""
    stream = _ReportingSocketStream(sock)
    tls = trio.SSLStream(stream, ctx, server_hostname=hostname or None, https_compatible=True)
    return StreamChannel(tls, describe)


def tls_server(sock: socket.socket, ctx: ssl.SSLContext, describe: str) -> StreamChannel:
    """Wrap an accepted socket as the TLS server side (handshake in ``start()``)."""
    stream = _ReportingSocketStream(sock)
    tls = trio.SSLStream(stream, ctx, server_side=True, https_compatible=True)
    return StreamChannel(tls, describe, server_side=True)


# -- tls+tcp ------------------------------------------------------------------------
class TlsConnection(FramedConnection):
    """SP over TCP framing (8-byte header, u64 lengths) inside a TLS session."""

    unacked_slack = TLS_RECORD_PLAINTEXT

    def __init__(self, channel: StreamChannel, ctx: PipeContext, remote_address: str) -> None:
        super().__init__(ctx, False, remote_address)
        self._chan = channel

    def kernel_socket(self) -> Any:
        return self._chan.kernel_socket()

    @property
    def waiting_for_room(self) -> bool:
        return self._chan.waiting_for_room

    async def handshake(self) -> None:
        await self._chan.start()  # TLS first, then the SP header exchange inside it
        await super().handshake()

    def peer_details(self) -> dict[str, Any]:
        return {"mechanism": "tls", "certificate": self._chan.certificate()}

    async def _send_all(self, data: bytes | memoryview) -> None:
        await self._chan.send_all(data)

    async def _recv_some(self, size: int) -> bytes:
        return await self._chan.recv(size)

    async def aclose(self) -> None:
        await self._chan.aclose()

    async def aclose_refused(self, reason: str) -> None:
        """A refused address gets the TLS alert ``access_denied`` (its TLS handshake
        never ran); a peer ``authorize`` refused after the handshake a close_notify."""
        with trio.CancelScope(shield=True):
            await self._chan.refuse()
            await self.aclose()


class TlsListener(TcpListener):
    """A TCP listener whose accepted sockets are wrapped as TLS servers."""

    def __init__(self, sock: socket.socket, url: str, ctx: PipeContext, ssl_ctx: ssl.SSLContext) -> None:
        super().__init__(sock, url, ctx, ipc=False)
        self._ssl = ssl_ctx

    def connection(self, conn_sock: socket.socket, peer: str) -> Connection:
        return TlsConnection(tls_server(conn_sock, self._ssl, peer), self._ctx, peer)


class TlsTransport(TcpTransport):
    """``tls+tcp://`` (NNG's TLS transport)."""

    schemes = ("tls+tcp",)
    endpoint_options = ("ssl_context",)

    async def listen(self, url: str, ctx: PipeContext) -> Listener:
        ssl_ctx = server_context(ctx.options, url)
        sock = bind_tcp_socket(url, "tls+tcp")
        return TlsListener(sock, bound_url("tls+tcp", url, sock), ctx, ssl_ctx)

    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        ssl_ctx = client_context(ctx.options)
        host, _ = split_host_port(url, "tls+tcp", bind=False)
        sock, remote = await dial_tcp_socket(url, "tls+tcp", ctx)
        return TlsConnection(tls_client(sock, ssl_ctx, host, remote), ctx, remote)


transport = TlsTransport()
