"""``zmtp+tcp://host:port`` and ``zmtp+ipc:///path``: ZeroMQ peers (ZMTP 3.1).

The addresses, binding and dialing are those of ``tcp://`` and ``ipc://``; only
the connection differs (:class:`ZmtpConnection`). ZMTP over ipc has no extra
type octet per frame (that is SP's ipc framing), so both share one codec.
"""

from __future__ import annotations

import socket

from .._base import Connection, Listener, PipeContext
from ..ipc import IpcTransport, _IpcListener
from ..tcp import TcpListener, TcpTransport, bind_tcp_socket, bound_url, dial_tcp_socket
from ._conn import ZmtpConnection
from ._mechanisms import check_options
from ._roles import check_protocol

#: endpoint keywords of both schemes
ENDPOINT_OPTIONS = (
    "identity", "plain", "plain_auth", "plain_server",
    "curve_secret_key", "curve_public_key", "curve_server_key", "curve_clients",
)


class _ZmtpTcpListener(TcpListener):
    def connection(self, conn_sock: socket.socket, peer: str) -> Connection:
        return ZmtpConnection(conn_sock, self._ctx, peer)


class _ZmtpIpcListener(_IpcListener):
    def connection(self, conn_sock: socket.socket, peer: str) -> Connection:
        return ZmtpConnection(conn_sock, self._ctx, peer)


class ZmtpTcpTransport(TcpTransport):
    """ZMTP over TCP."""

    schemes = ("zmtp+tcp",)
    endpoint_options = ENDPOINT_OPTIONS
    carries_multipart = True  # (ZMTP frames)

    def check_protocol(self, name: str, raw: bool, options: dict[str, object]) -> None:
        """bind/connect: refuse a socket type ZeroMQ has no peer for, or bad security options."""
        check_protocol(self.schemes[0], name, raw)
        check_options(options)

    async def listen(self, url: str, ctx: PipeContext) -> Listener:
        scheme = self.schemes[0]
        sock = bind_tcp_socket(url, scheme)
        return _ZmtpTcpListener(sock, bound_url(scheme, url, sock), ctx, ipc=False)

    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        sock, remote = await dial_tcp_socket(url, self.schemes[0], ctx)
        return ZmtpConnection(sock, ctx, remote)


class ZmtpIpcTransport(IpcTransport):
    """ZMTP over Unix domain sockets (libzmq's ``ipc://``)."""

    schemes = ("zmtp+ipc",)
    endpoint_options = ENDPOINT_OPTIONS
    carries_multipart = True  # (ZMTP frames)
    listener_class = _ZmtpIpcListener
    check_protocol = ZmtpTcpTransport.check_protocol

    def connection(self, sock: socket.socket, ctx: PipeContext, path: str) -> Connection:
        return ZmtpConnection(sock, ctx, path)


tcp_transport = ZmtpTcpTransport()
ipc_transport = ZmtpIpcTransport()
