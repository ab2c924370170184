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
from websockets.http11 import Request
from websockets.server import ServerProtocol

from .._errors import AddressInUse, RemoteProtocolError
from ._base import Connection, Listener, PipeContext
from ._stream import SocketChannel, close_socket
from ._table import ProcessTable
from ._ws_conn import RECV_SIZE, WsConnection, ws_log
from .tcp import bind_tcp_socket, format_host_port, peer_text, set_nodelay
from .tls import StreamChannel, tls_server

log = logging.getLogger("nanopy")

#: a new HTTP connection must send its upgrade request (and finish TLS) within this time
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
        self.sock = sock
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

    async def _serve(self) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    while True:
                        try:
                            conn, addr = self.sock.accept()
                        except (BlockingIOError, InterruptedError):
                            try:
                                await trio.lowlevel.wait_readable(self.sock)
                            except trio.ClosedResourceError:
                                return  # close() from the last listener
                            continue
                        except OSError as exc:
                            if self._closed:
                                return
                            log.warning("ws server %s: accept failed: %s", self.key[1:], exc)
                            await trio.sleep(0.1)
                            continue
                        nursery.start_soon(self._route, conn, addr)
        except Exception:  # a system task must never raise
            log.exception("ws server %s failed", self.key[1:])
        finally:
            self.close()

    async def _route(self, sock: socket.socket, addr: Any) -> None:
        """Read the upgrade request, then hand the connection to the listener of its path."""
        peer = peer_text(addr)
        chan: SocketChannel | StreamChannel
        chan = tls_server(sock, self.ssl_ctx, peer) if self.secure else SocketChannel(sock)  # type: ignore[arg-type]
        proto = ServerProtocol(max_size=None, logger=ws_log)
        handed_over = False
        try:
            with trio.move_on_after(REQUEST_TIMEOUT):
                await chan.start()
                request = await _read_request(chan, proto)
                if request is None:
                    return
                listener = self.routes.get(normalize_path(request.path))
                if listener is None:
                    await _answer(chan, proto, 404, "Not Found")
                    return
                set_nodelay(sock, listener.ctx)
                conn = WsConnection(chan, listener.ctx, peer, proto=proto, request=request)
                if listener.offer(conn):
                    handed_over = True
                else:
                    await _answer(chan, proto, 503, "Service Unavailable")
        except (OSError, EOFError, RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("ws server %s: connection from %s dropped: %s", self.key[1:], peer, exc)
        except Exception:  # one bad request must not take the port's server down
            log.exception("ws server %s: connection from %s failed", self.key[1:], peer)
        finally:
            if not handed_over:
                with trio.CancelScope(shield=True):
                    await chan.aclose()


async def _read_request(chan: SocketChannel | StreamChannel, proto: ServerProtocol) -> Request | None:
    while True:
        data = await chan.recv(RECV_SIZE)
        if data:
            proto.receive_data(data)
        else:
            proto.receive_eof()
        for event in proto.events_received():
            if isinstance(event, Request):
                return event
        if proto.handshake_exc is not None or not data:
            return None


async def _answer(chan: SocketChannel | StreamChannel, proto: ServerProtocol, status: int, text: str) -> None:
    proto.send_response(proto.reject(status, text + "\n"))
    data = b"".join(proto.data_to_send())
    await chan.send_all(data)
    await chan.send_eof()


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
        self._send, self._recv = trio.open_memory_channel[WsConnection](BACKLOG)
        self._closed = False

    def offer(self, conn: WsConnection) -> bool:
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
