"""The per-port HTTP server of the ws transports: one listening socket per host:port,
upgrade requests routed by path to the :class:`WsListener` bound there.

Every ``bind`` on one host:port joins one server (``/a`` also answers ``/a/`` and
``/a?x``; an empty request target is ``/``); an unknown path gets 404, a listener
whose backlog is full 503.
"""

from __future__ import annotations

import logging
import socket
import ssl
from typing import Any

import trio
from websockets.exceptions import HeaderLineTooLong, RequestLineTooLong, TooManyHeaders
from websockets.http11 import Request
from websockets.server import ServerProtocol

from .. import _fork
from ..core.errors import AddressInUse, RemoteProtocolError
from ._base import Connection, Listener, PipeContext
from ._stream import SocketChannel, accept_socket, close_socket
from ._table import ProcessTable
from ._ws_conn import (
    HTTP_REASONS,
    MAX_FRAME_LENGTH,
    HeadTooLarge,
    SpServerProtocol,
    WsConnection,
    http_error,
    read_head,
    ws_log,
)
from .tcp import bind_tcp_socket, configure_tcp_socket, format_host_port, peer_text
from .tls import CLOSE_TIMEOUT, StreamChannel, tls_server

log = logging.getLogger("nanopy")

#: time for TLS and the upgrade request when no listener says otherwise (each
#: socket's handshake_timeout applies; the shortest on a shared port wins)
REQUEST_TIMEOUT = 10.0
#: accepted upgrades waiting for Listener.accept() before new ones are refused (503)
BACKLOG = 128


def normalize_path(target: str) -> str:
    """Routing key of a request target: no query or fragment, no trailing ``/``, ``''`` -> ``/``."""
    path = target.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith("/"):
        path = "/" + path
    if len(path) > 1:
        path = path.rstrip("/") or "/"
    return path


# -- the shared per-port HTTP server ------------------------------------------------------
class PortServer:
    """One listening TCP socket serving every ws listener bound on its host:port."""

    def __init__(self, key: tuple[Any, ...], sock: socket.socket, secure: bool, ssl_ctx: ssl.SSLContext | None) -> None:
        sock.setblocking(False)
        self.key = key
        self.sock = _fork.own(sock)
        self.secure = secure
        self.ssl_ctx = ssl_ctx
        self.routes: dict[str, WsListener] = {}
        self._scope = trio.CancelScope()
        self._closed = False

    def start(self) -> None:
        trio.lowlevel.spawn_system_task(self._serve, name=f"nanopy ws server {self.key[1:]}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        servers.remove(self.key, self)
        self._scope.cancel()
        close_socket(self.sock)

    def handshake_timeout(self) -> float:
        """Time a new connection has for TLS and its upgrade request: the shortest
        ``handshake_timeout`` of the sockets bound on this port."""
        return min((lst.ctx.handshake_timeout for lst in self.routes.values()), default=REQUEST_TIMEOUT)

    async def _serve(self) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    while True:
                        try:
                            conn, addr = await accept_socket(self.sock, f"ws server {self.key[1:]}")
                        except (OSError, trio.ClosedResourceError) as exc:
                            if not self._closed:
                                log.warning("ws server %s: accept failed: %s", self.key[1:], exc)
                            return
                        nursery.start_soon(self._route, conn, addr)
        except Exception:  # a system task must never raise
            log.exception("ws server %s failed", self.key[1:])
        finally:
            self.close()

    async def _route(self, sock: socket.socket, addr: Any) -> None:
        """Read the upgrade request, then hand the connection to the listener of its path.

        TLS and the request share the sockets' ``handshake_timeout`` with the rest of
        the handshake. A connection that fails before it has a path (TLS rejected,
        garbage, an oversized head, a stall) is answered when HTTP allows it and
        reported to every listener on the port, whose sockets count it as a
        protocol error; a port probe (no byte sent) is not counted.
        """
        peer = peer_text(addr)
        chan: SocketChannel | StreamChannel
        chan = tls_server(sock, self.ssl_ctx, peer) if self.secure else SocketChannel(sock)  # type: ignore[arg-type]
        proto = SpServerProtocol(max_size=MAX_FRAME_LENGTH, logger=ws_log)
        handed_over = False
        deadline = trio.current_time() + self.handshake_timeout()
        try:
            try:
                with trio.fail_at(deadline):
                    await chan.start()
                    request, early = await _read_request(chan, proto, peer)
            except trio.TooSlowError:
                raise RemoteProtocolError(f"WebSocket handshake from {peer} timed out") from None
            listener = self.routes.get(normalize_path(request.path))
            if listener is None:
                # Like a refused TCP port: the client asked for nothing served here.
                await _answer(chan, 404, "Not Found")
                return
            configure_tcp_socket(sock, listener.ctx)
            conn = WsConnection(
                chan, listener.ctx, peer, proto=proto, request=request, early=early, deadline=deadline
            )
            if listener.offer(conn):
                handed_over = True
            else:
                await _answer(chan, 503, "Service Unavailable")
        except RemoteProtocolError as exc:
            self._report(exc, peer)
            status = 431 if isinstance(exc, HeadTooLarge) else getattr(exc, "http_status", None)
            if status is not None:
                with trio.move_on_after(CLOSE_TIMEOUT):
                    try:
                        await _answer(chan, status, HTTP_REASONS[status])
                    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
        except (OSError, EOFError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("ws server %s: connection from %s dropped: %s", self.key[1:], peer, exc)
        except Exception:  # one bad request must not take the port's server down
            log.exception("ws server %s: connection from %s failed", self.key[1:], peer)
        finally:
            if not handed_over:
                with trio.CancelScope(shield=True):
                    await chan.aclose()

    def _report(self, exc: RemoteProtocolError, peer: str) -> None:
        """Let every socket listening on this port count a connection that failed
        before its request named a path."""
        for listener in list(self.routes.values()):
            listener.offer(FailedConnection(exc, peer))


class BadRequest(RemoteProtocolError):
    """An upgrade request HTTP cannot parse (answered 400, or 431 for oversized lines)."""

    def __init__(self, message: str, http_status: int = 400) -> None:
        super().__init__(message)
        self.http_status = http_status


async def _read_request(
    chan: SocketChannel | StreamChannel, proto: ServerProtocol, peer: str
) -> tuple[Request, bytes]:
    """The upgrade request and the bytes that followed its head (left unparsed: the
    listener's limits are not known yet)."""
    head, early = await read_head(chan, f"WebSocket upgrade request from {peer}")
    proto.receive_data(head)
    for event in proto.events_received():
        if isinstance(event, Request):
            return event, early
    exc = proto.handshake_exc
    oversized = isinstance(exc, (HeaderLineTooLong, TooManyHeaders, RequestLineTooLong))
    cause = exc.__cause__ if exc is not None and exc.__cause__ is not None else exc
    raise BadRequest(f"bad WebSocket upgrade request from {peer}: {cause}", 431 if oversized else 400)


async def _answer(chan: SocketChannel | StreamChannel, status: int, text: str) -> None:
    await chan.send_all(http_error(status, text))
    await chan.send_eof()


class FailedConnection(Connection):
    """A connection the port server already dropped: its ``handshake`` raises the
    reason, so the listener's socket counts and logs it like any failed handshake."""

    def __init__(self, exc: RemoteProtocolError, remote_address: str) -> None:
        self._exc = exc
        self.remote_address = remote_address

    async def handshake(self) -> None:
        raise self._exc

    async def send(self, payloads: list[bytes]) -> None:
        raise EOFError("connection already closed")

    async def receive(self) -> list[bytes]:
        raise EOFError("connection already closed")

    async def aclose(self) -> None:
        pass


#: the process's ws servers by (trio run, host, port)
servers: ProcessTable[tuple[Any, ...], PortServer] = ProcessTable()


def host_key(host: str) -> str:
    """The wildcard host in one spelling, so ``*``, ``0.0.0.0`` and ``""`` share a server."""
    return "" if host in ("", "*", "0.0.0.0") else host


class WsListener(Listener):
    """One path on a shared :class:`PortServer`."""

    def __init__(self, server: PortServer, path: str, url: str, ctx: PipeContext) -> None:
        self.server = server
        self.path = path
        self.url = url
        self.ctx = ctx
        self._send, self._recv = trio.open_memory_channel[Connection](BACKLOG)
        self._closed = False

    def update_context(self, ctx: PipeContext) -> None:
        self.ctx = ctx  # recv_max_size, handshake_timeout... for requests routed from now on

    def offer(self, conn: Connection) -> bool:
        try:
            self._send.send_nowait(conn)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    async def accept(self) -> Connection:
        try:
            return await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise OSError(f"{self.url}: listener closed") from None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        server = self.server
        if server.routes.get(self.path) is self:
            del server.routes[self.path]
        if not server.routes:
            server.close()
        self._send.close()
        with trio.CancelScope(shield=True):
            while True:
                try:
                    conn = self._recv.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
                if isinstance(conn, WsConnection):
                    # Routed here while we closed: its path is no longer served.
                    await conn.refuse(404, "Not Found")
                await conn.aclose()
            self._recv.close()


def bind_path(url: str, scheme: str, host: str, port: int, path: str, ctx: PipeContext,
              ssl_ctx: ssl.SSLContext | None) -> WsListener:
    """Route ``path`` on ``host:port`` to a new listener, joining the port's server or
    starting one (``wss`` when ``ssl_ctx`` is given); raises AddressInUse on a clash."""
    secure = ssl_ctx is not None
    token = trio.lowlevel.current_trio_token()
    server = servers.get((token, host_key(host), port)) if port else None
    if server is not None:
        if server.secure != secure:
            other = "wss" if server.secure else "ws"
            raise AddressInUse(98, f"{url}: the port already serves {other}://")
        if secure and server.ssl_ctx is not ssl_ctx:
            raise AddressInUse(98, f"{url}: the port already serves wss:// with another ssl_context")
        if path in server.routes:
            raise AddressInUse(98, f"{url}: address already in use (path {path!r} is bound)")
    else:
        sock = bind_tcp_socket(format_host_port(scheme, host, port), scheme)
        real_port = sock.getsockname()[1]
        server = PortServer((token, host_key(host), real_port), sock, secure, ssl_ctx)
        servers.add(server.key, server)
        server.start()
        port = real_port
    shown = host or "0.0.0.0"
    listener = WsListener(server, path, format_host_port(scheme, shown, port) + path, ctx)
    server.routes[path] = listener
    return listener
