"""``ws://host:port/path`` and ``wss://host:port/path`` -- SP over WebSocket (NNG compatible).

Built on the Sans-I/O protocol objects of the ``websockets`` package
(:class:`~websockets.client.ClientProtocol`, :class:`~websockets.server.ServerProtocol`)
driven by our own trio code; ``wss`` adds the TLS layer of :mod:`nanopy.transports.tls`
(endpoint option ``ssl_context``).

Wire rules (those of NNG): one SP message is one binary WebSocket message, the SP
header at the start of its payload; the subprotocol is
``<listener's protocol>.sp.nanomsg.org`` (a dialer offers its peer's name, a
listener requires its own); messages go out in frames of at most 64 KiB. A text
frame or any framing error closes that pipe only.

Listeners share ports: every ``bind`` on one host:port joins one HTTP server that
routes the upgrade request by path (``/a`` also answers ``/a/`` and ``/a?x``; an
empty request target is ``/``); an unknown path gets 404.

This module holds the URLs and the transports; the connection is in
:mod:`nanopy.transports._ws_conn`, the per-port server in :mod:`nanopy.transports._ws_server`.
"""

from __future__ import annotations

from ..core.errors import AddressError
from ._base import Connection, Listener, PipeContext, Transport
from ._stream import SocketChannel
from ._ws_conn import FRAGMENT_SIZE, WsConnection
from ._ws_server import REQUEST_TIMEOUT, bind_path, normalize_path
from .tcp import dial_tcp_socket, format_host_port, split_host_port
from .tls import StreamChannel, client_context, server_context, tls_client

__all__ = ["FRAGMENT_SIZE", "REQUEST_TIMEOUT", "normalize_path", "parse_ws_url", "secure_transport", "transport"]


# -- URLs ------------------------------------------------------------------------
def parse_ws_url(url: str, scheme: str, *, bind: bool) -> tuple[str, int, str]:
    """``(host, port, path)`` of ``ws[s]://host[:port][/path]``; the path is normalised."""
    rest = url[len(scheme) + 3 :]
    hostport, slash, path = rest.partition("/")
    if not hostport:
        if not bind:
            raise AddressError(f"{url!r}: connect needs a host")
        hostport = "*"
    has_port = hostport.rpartition("]")[2].count(":") == 1 if hostport.startswith("[") else ":" in hostport
    if not has_port:
        hostport += ":443" if scheme == "wss" else ":80"
    host, port = split_host_port(f"{scheme}://{hostport}", scheme, bind=bind)
    return host, port, normalize_path(slash + path)


class WsTransport(Transport):
    """``ws://`` (plain) or ``wss://`` (TLS, endpoint option ``ssl_context``)."""

    endpoint_options: tuple[str, ...] = ()

    def __init__(self, secure: bool = False) -> None:
        self.secure = secure
        self.scheme = "wss" if secure else "ws"
        self.schemes = (self.scheme,)
        if secure:
            self.endpoint_options = ("ssl_context",)

    def check_url(self, url: str) -> None:
        parse_ws_url(url, self.scheme, bind=True)

    def check_dial_url(self, url: str) -> None:
        parse_ws_url(url, self.scheme, bind=False)

    async def listen(self, url: str, ctx: PipeContext) -> Listener:
        host, port, path = parse_ws_url(url, self.scheme, bind=True)
        ssl_ctx = server_context(ctx.options, url) if self.secure else None
        return bind_path(url, self.scheme, host, port, path, ctx, ssl_ctx)

    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        scheme = self.scheme
        host, port, _ = parse_ws_url(url, scheme, bind=False)
        hostport = format_host_port(scheme, host, port)
        sock, remote = await dial_tcp_socket(hostport, scheme, ctx)
        target = url if "/" in url[len(scheme) + 3 :] else url + "/"
        chan: SocketChannel | StreamChannel
        if self.secure:
            chan = tls_client(sock, client_context(ctx.options), host, remote)
        else:
            chan = SocketChannel(sock)
        return WsConnection(chan, ctx, remote, url=target)


transport = WsTransport(secure=False)
secure_transport = WsTransport(secure=True)
