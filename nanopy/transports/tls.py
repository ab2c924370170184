"""``tls+tcp://host:port`` -- the SP TCP mapping inside TLS, and the TLS layer ``wss://`` uses.

Endpoint option ``ssl_context``: an :class:`ssl.SSLContext`. A dialer without one
uses :func:`ssl.create_default_context` (system CAs, host name checked against the
URL); a listener must be given one (it needs a certificate). For mutual TLS give
the listener a context with ``verify_mode = ssl.CERT_REQUIRED`` and CA locations,
and the dialer a context with ``load_cert_chain``.

The TLS handshake runs in :meth:`Connection.handshake`, so the socket's
``handshake_timeout`` bounds it; a peer that fails verification is closed (and
counted in ``stats().protocol_errors``) before any message passes.

This module also holds the byte channels the ws transport runs on: a plain
non-blocking socket (fast path, with a thread-safe non-blocking write) and a trio
stream (:class:`trio.SSLStream`).
"""

from __future__ import annotations

import errno
import socket
import ssl
from typing import Any

import trio

from .._errors import AddressError, RemoteProtocolError
from .._wire import HEADER_SIZE, FrameDecoder, encode_frames, encode_header, parse_header
from ._base import Connection, Listener, PipeContext, Transport
from ._stream import RECV_SIZE
from .tcp import bind_tcp_socket, bound_url, dial_tcp_socket, peer_text, set_nodelay, split_host_port

# How long aclose() waits to say goodbye (TLS close_notify, WebSocket CLOSE).
CLOSE_TIMEOUT = 0.5


# -- byte channels -----------------------------------------------------------------
class SocketChannel:
    """A connected stdlib socket in non-blocking mode, driven by trio readiness waits."""

    secure = False

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.closed = False

    async def start(self) -> None:
        """Nothing to negotiate on a plain socket."""

    async def recv(self, size: int) -> bytes:
        sock = self.sock
        waited = False
        while True:
            try:
                data = sock.recv(size)
            except (BlockingIOError, InterruptedError):
                await trio.lowlevel.wait_readable(sock)
                waited = True
                continue
            if not waited:
                await trio.lowlevel.checkpoint()  # data was there already: still yield once
            return data

    def send_nowait(self, data: bytes | memoryview) -> int:
        """Write what the kernel takes now (any thread); returns the byte count."""
        try:
            return self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            return 0

    async def send_all(self, data: bytes | memoryview) -> None:
        sock = self.sock
        view = memoryview(data)
        while view:
            try:
                n = sock.send(view)
            except (BlockingIOError, InterruptedError):
                await trio.lowlevel.wait_writable(sock)
                continue
            view = view[n:]
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            trio.lowlevel.notify_closing(self.sock)
        except Exception:
            pass
        self.sock.close()


class StreamChannel:
    """A trio stream (here a :class:`trio.SSLStream`) behind the channel interface."""

    secure = True
    send_nowait = None  # no thread-safe direct writes on a TLS stream

    def __init__(self, stream: trio.SSLStream, describe: str) -> None:
        self.stream = stream
        self.closed = False
        self._describe = describe

    async def start(self) -> None:
        """Run the TLS handshake; a verification failure becomes RemoteProtocolError."""
        try:
            await self.stream.do_handshake()
        except trio.BrokenResourceError as exc:
            cause = exc.__cause__ or exc
            raise RemoteProtocolError(f"TLS handshake with {self._describe} failed: {cause}") from None

    async def recv(self, size: int) -> bytes:
        try:
            return await self.stream.receive_some(size)
        except trio.BrokenResourceError as exc:
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


Channel = SocketChannel | StreamChannel


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


def tls_client(sock: socket.socket, ctx: ssl.SSLContext, hostname: str, describe: str) -> StreamChannel:
    """Wrap a connected socket as the TLS client side (handshake in ``start()``)."""
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    tls = trio.SSLStream(stream, ctx, server_hostname=hostname or None, https_compatible=True)
    return StreamChannel(tls, describe)


def tls_server(sock: socket.socket, ctx: ssl.SSLContext, describe: str) -> StreamChannel:
    """Wrap an accepted socket as the TLS server side (handshake in ``start()``)."""
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    tls = trio.SSLStream(stream, ctx, server_side=True, https_compatible=True)
    return StreamChannel(tls, describe)


# -- tls+tcp ------------------------------------------------------------------------
class TlsConnection(Connection):
    """SP over TCP framing (8-byte header, u64 lengths) inside a TLS session."""

    def __init__(self, channel: StreamChannel, ctx: PipeContext, remote_address: str) -> None:
        self._chan = channel
        self._ctx = ctx
        self._decoder = FrameDecoder(False, ctx.recv_max_size)
        self.remote_address = remote_address

    async def handshake(self) -> None:
        await self._chan.start()
        await self._chan.send_all(encode_header(self._ctx.protocol_id))
        header = b""
        while len(header) < HEADER_SIZE:
            chunk = await self._chan.recv(HEADER_SIZE - len(header))
            if not chunk:
                raise RemoteProtocolError("peer closed during the SP handshake")
            header += chunk
        parse_header(header, self._ctx.peer_id)

    async def send(self, payloads: list[bytes]) -> None:
        if payloads:
            await self._chan.send_all(encode_frames(payloads))
        else:
            await trio.lowlevel.checkpoint()

    async def receive(self) -> list[bytes]:
        while True:
            chunk = await self._chan.recv(RECV_SIZE)
            if not chunk:
                if self._decoder.pending:
                    raise RemoteProtocolError("peer closed in the middle of a message")
                raise EOFError("peer closed the connection")
            msgs = self._decoder.feed(chunk)
            if msgs:
                return msgs

    async def aclose(self) -> None:
        await self._chan.aclose()


class TlsListener(Listener):
    def __init__(self, sock: socket.socket, url: str, ctx: PipeContext, ssl_ctx: ssl.SSLContext) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._ctx = ctx
        self._ssl = ssl_ctx
        self.url = url
        self._closed = False

    async def accept(self) -> Connection:
        while True:
            try:
                conn, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                await trio.lowlevel.wait_readable(self._sock)
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    await trio.sleep(0.1)  # out of descriptors: back off, keep listening
                    continue
                raise
            set_nodelay(conn, self._ctx)
            peer = peer_text(addr)
            return TlsConnection(tls_server(conn, self._ssl, peer), self._ctx, peer)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            trio.lowlevel.notify_closing(self._sock)
        except Exception:
            pass
        self._sock.close()


class TlsTransport(Transport):
    """``tls+tcp://`` (NNG's TLS transport)."""

    schemes = ("tls+tcp",)
    endpoint_options = ("ssl_context",)

    def check_url(self, url: str) -> None:
        split_host_port(url, "tls+tcp", bind=True)

    def check_dial_url(self, url: str) -> None:
        split_host_port(url, "tls+tcp", bind=False)

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
