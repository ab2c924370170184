"""``tcp://host:port`` -- SP over TCP (IPv4 and IPv6).

Bind accepts ``*`` or an empty host for all IPv4 interfaces and port 0 for "any
free port" (the endpoint's url then names the real port). IPv6 literals go in
brackets: ``tcp://[::1]:5555``. Host names are resolved (connect and bind).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import Any

import trio

from .. import platform
from ..core.errors import AddressError, AddressInUse
from ._base import Connection, Listener, PipeContext, Transport
from ._stream import StreamConnection, StreamListener, connect_socket


def split_host_port(url: str, scheme: str, *, bind: bool) -> tuple[str, int]:
    """Split ``scheme://host:port`` (IPv6 in brackets); validate the port."""
    rest = url[len(scheme) + 3 :]
    if "/" in rest:
        raise AddressError(f"{url!r}: a {scheme} address has no path (use {scheme}://host:port)")
    if rest.startswith("["):
        host, sep, port = rest[1:].partition("]:")
        if not sep:
            raise AddressError(f"{url!r}: expected {scheme}://[ipv6]:port")
    else:
        host, sep, port = rest.rpartition(":")
        if not sep:
            raise AddressError(f"{url!r}: missing port (expected {scheme}://host:port)")
        if ":" in host:
            raise AddressError(f"{url!r}: put IPv6 addresses in brackets, e.g. {scheme}://[::1]:5555")
    if host == "*":
        host = ""
    if not host and not bind:
        raise AddressError(f"{url!r}: connect needs a host")
    try:
        port_n = int(port)
    except ValueError:
        raise AddressError(f"{url!r}: port {port!r} is not a number") from None
    if not 0 <= port_n <= 65535 or (port_n == 0 and not bind):
        raise AddressError(f"{url!r}: port must be 1..65535 (0 only when binding)")
    return host, port_n


def format_host_port(scheme: str, host: str, port: int) -> str:
    if ":" in host:
        return f"{scheme}://[{host}]:{port}"
    return f"{scheme}://{host}:{port}"


def bound_url(scheme: str, url: str, sock: socket.socket) -> str:
    """``url`` with the port the kernel chose (the host as the user wrote it)."""
    host, port = sock.getsockname()[:2]
    asked_host, _ = split_host_port(url, scheme, bind=True)
    return format_host_port(scheme, asked_host or host, port)


def peer_text(addr: Any) -> str:
    """``host:port`` for a socket address, IPv6 hosts in brackets (link-local ones with ``%interface``)."""
    host, port = sockaddr_host(addr), addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def sockaddr_host(addr: Any) -> str:
    """The host of a socket address as text; an IPv6 scope id becomes ``%interface``."""
    host = str(addr[0])
    if len(addr) == 4 and addr[3] and "%" not in host:
        try:
            host = f"{host}%{socket.if_indextoname(addr[3])}"
        except OSError:  # the interface is gone: its number still names it
            host = f"{host}%{addr[3]}"
    return host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def ipv6_sockaddr(host: str, port: int) -> tuple[str, int, int, int]:
    """The socket address of an IPv6 literal; a link-local ``fe80::1%eth0`` keeps its interface
    (a plain ``(host, port, 0, 0)`` tuple would lose it: the scope id field wins)."""
    if "%" not in host:
        return (host, port, 0, 0)
    address, _, scope = host.partition("%")
    try:
        index = int(scope) if scope.isdigit() else socket.if_nametoindex(scope)
    except OSError:
        raise AddressError(f"{host!r}: no interface {scope!r} on this host") from None
    return (address, port, 0, index)


async def resolve(host: str, port: int) -> list[tuple[Any, ...]]:
    if _is_ip(host):
        if ":" in host:
            return [(socket.AF_INET6, ipv6_sockaddr(host, port))]
        return [(socket.AF_INET, (host, port))]
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [(fam, addr) for fam, _, _, _, addr in infos]


def bind_tcp_socket(url: str, scheme: str) -> socket.socket:
    """A bound, listening TCP socket for ``url`` (shared with tls/ws transports)."""
    host, port = split_host_port(url, scheme, bind=True)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if host and not _is_ip(host):
        try:
            family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        except socket.gaierror as exc:
            raise AddressError(f"{url!r}: cannot resolve {host!r}: {exc}") from None
        host = str(addr[0])
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        platform.reuse_listen_address(sock)  # (not SO_REUSEADDR on Windows: it would share a port in use)
        sock.bind((host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUse(exc.errno, f"{url}: address already in use") from None
        if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            raise AddressError(f"{url!r}: cannot bind: {exc.strerror}") from None
        raise
    return sock


def keepalive_settings(timeout: float) -> tuple[int, int, int, int]:
    """TCP keepalive ``(idle, interval, count)`` in whole seconds and TCP_USER_TIMEOUT
    in milliseconds for ``dead_peer_timeout``.

    Linux closes a connection whose data stays unacknowledged for the user timeout,
    and an idle one at the first keepalive tick (``idle``, then every ``interval``)
    at which the peer has been silent for the user timeout. The kernel's timers are
    coarse, so from 3 s on the user timeout is one interval short of ``timeout``
    and the ticks land on it: a vanished peer is given up on within ``timeout``.
    Without TCP_USER_TIMEOUT (other systems, nanopy.platform's portable backend)
    ``idle + interval * count`` is the same time for an idle connection. The kernel
    counts whole seconds: at least 2 s.
    """
    whole = max(2, int(timeout))
    if whole < 3:
        return 1, 1, 1, int(min(timeout, 2.0) * 1000)  # (an idle pipe: 2 s at best)
    interval = max(1, whole // 6)
    user = whole - interval  # the ticks idle + k * interval land on it
    count = max(1, min(3, (user - 1) // interval))
    return user - count * interval, interval, count, int(timeout * 1000) - interval * 1000


#: TCP_NOTSENT_LOWAT where this Python and system have it (Linux, macOS), else None
NOTSENT_LOWAT: int | None = getattr(socket, "TCP_NOTSENT_LOWAT", None)


def configure_tcp_socket(sock: socket.socket, ctx: PipeContext) -> None:
    """Per-connection options of every TCP-based pipe (tcp, tls+tcp, ws, wss), dialed
    or accepted: TCP_NODELAY, and dead-peer detection (docs/partitions.md) -- keepalive
    probes for an idle connection and TCP_USER_TIMEOUT for data the peer does not
    acknowledge, both from ``dead_peer_timeout``; what the kernel may hold from
    ``kernel_unsent_max`` (TCP_NOTSENT_LOWAT, where the system has it) and
    ``kernel_send_buffer``/``kernel_recv_buffer`` (0: the kernel's own autotuning).
    Nothing changes on the wire."""
    if ctx.options.get("tcp_nodelay", True):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # The queue budget (docs/performance.md, "Queue budget per pipe"): the unsent
    # bytes a burst may leave in the kernel, without capping the window in flight.
    if (unsent := ctx.options.get("kernel_unsent_max")) and NOTSENT_LOWAT is not None:
        sock.setsockopt(socket.IPPROTO_TCP, NOTSENT_LOWAT, unsent)
    # A fixed size turns the kernel's autotuning off for that buffer. Set before
    # connect, so a dialed socket's window scale is chosen for it.
    if size := ctx.options.get("kernel_send_buffer"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
    if size := ctx.options.get("kernel_recv_buffer"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
    timeout = ctx.options.get("dead_peer_timeout")
    if timeout is None:
        return
    idle, interval, count, user_timeout = keepalive_settings(timeout)
    platform.set_keepalive(sock, idle, interval, count)
    platform.set_user_timeout(sock, user_timeout)  # (where the system has one: Linux)


async def dial_tcp_socket(url: str, scheme: str, ctx: PipeContext) -> tuple[socket.socket, str]:
    """A connected TCP socket for ``url`` and the peer's address as text (every
    TCP-based transport dials through here). Each address the host resolves to
    gets ``connect_timeout`` (docs/partitions.md, "Dialing")."""
    host, port = split_host_port(url, scheme, bind=False)
    last: OSError | None = None
    limit = ctx.options.get("connect_timeout")
    for family, addr in await resolve(host, port):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            configure_tcp_socket(sock, ctx)
            await connect_socket(sock, addr, limit, peer_text(addr))
        except OSError as exc:
            sock.close()
            last = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock, peer_text(addr)
    raise last or OSError(f"cannot resolve {host!r}")


class TcpListener(StreamListener):
    """Accepted sockets get TCP_NODELAY and dead-peer detection (per the socket
    options) and a ``host:port`` peer."""

    def configure(self, conn_sock: socket.socket) -> None:
        configure_tcp_socket(conn_sock, self._ctx)

    def describe_peer(self, addr: object) -> str:
        return peer_text(addr)


class TcpTransport(Transport):
    """``tcp://``; tls+tcp subclasses it (same URLs, listen/dial wrapped in TLS)."""

    schemes: tuple[str, ...] = ("tcp",)

    def check_url(self, url: str) -> None:
        split_host_port(url, self.schemes[0], bind=True)

    def check_dial_url(self, url: str) -> None:
        split_host_port(url, self.schemes[0], bind=False)

    async def listen(self, url: str, ctx: PipeContext) -> Listener:
        sock = bind_tcp_socket(url, "tcp")
        return TcpListener(sock, bound_url("tcp", url, sock), ctx, ipc=False)

    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        sock, remote = await dial_tcp_socket(url, "tcp", ctx)
        return StreamConnection(sock, ctx, False, remote)


transport = TcpTransport()
