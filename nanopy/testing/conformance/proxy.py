"""A TCP or Unix-socket proxy that cuts a connection where a check wants it.

The kit cannot see inside a transport's wire format, so it cuts from outside:
the dialer connects to the proxy (the same URL with the proxy's port or path),
the proxy forwards both ways, and on request holds the dialer's bytes, lets a
given number through in one write, and ends the listener's side with a FIN or
a RST. Used for "peer EOF" (T14: a cut between messages) and "cut mid-message"
(T15). An address that is neither ``host:port`` nor a file path (inproc) has no
wire to cut.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import tempfile
from dataclasses import dataclass

import trio

from ... import platform

#: Unix domain sockets (None where this Python has none: an ipc path has no wire to cut)
UNIX: int | None = getattr(socket, "AF_UNIX", None)
_HOST_PORT = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<host>\[[^\]]*\]|[^/:\[]*):(?P<port>\d+)(?P<rest>/.*)?$")


@dataclass(frozen=True)
class WireAddress:
    """Where a bound URL's listener is, for a proxy in front of it."""

    family: int
    address: str | tuple[str, int]
    scheme: str
    rest: str = ""  # a ws path after host:port

    def url(self, proxy: str | tuple[str, int]) -> str:
        """The URL that reaches the listener through a proxy at ``proxy``."""
        if self.family == UNIX:
            return f"{self.scheme}://{proxy}"
        host = self.address[0]
        shown = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{shown}:{proxy[1]}{self.rest}"


def wire_address(url: str) -> WireAddress | None:
    """The socket address behind a bound URL: ``host:port`` (TCP) or an absolute
    path (a Unix socket); None for anything else (inproc names)."""
    m = _HOST_PORT.match(url)
    if m:
        host = m.group("host").strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return WireAddress(family, (host, int(m.group("port"))), m.group("scheme"), m.group("rest") or "")
    scheme, sep, path = url.partition("://")
    if sep and path.startswith("/") and UNIX is not None:
        return WireAddress(UNIX, path, scheme)
    return None


class CutProxy:
    """Forwards one connection to ``upstream``; cuts it on request.

    Run :meth:`serve` in a nursery (``await nursery.start(proxy.serve)``), dial
    :attr:`url`. :meth:`hold` keeps the dialer's bytes back; :meth:`release`
    forwards the first ``n`` held bytes in one write; :meth:`cut` ends the
    listener's side with a FIN (``"fin"``) or a RST (``"rst"``).
    """

    def __init__(self, upstream: WireAddress) -> None:
        self.upstream = upstream
        self.url = ""
        self.held = bytearray()
        self._holding = False
        self._grew = trio.Event()
        self._up: trio.socket.SocketType | None = None
        self._path = ""

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        family = self.upstream.family
        with trio.socket.socket(family, socket.SOCK_STREAM) as lsock:
            if family == UNIX:
                self._path = f"{tempfile.gettempdir()}/np-proxy-{os.getpid()}-{id(self)}.sock"
                await lsock.bind(self._path)
            else:
                await lsock.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
            lsock.listen(1)
            self.url = self.upstream.url(self._path or lsock.getsockname()[:2])
            task_status.started()
            try:
                down, _ = await lsock.accept()
            finally:
                if self._path:
                    os.unlink(self._path)
        with down:
            up = self._up = trio.socket.socket(family, socket.SOCK_STREAM)
            with up:
                await up.connect(self.upstream.address)
                if family != UNIX:  # (a released part goes out at once, not after an ACK)
                    for sock in (up, down):
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump_down_to_up, down, up)
                    nursery.start_soon(self._pump, up, down)

    def hold(self) -> None:
        """From now on keep what the dialer sends (nothing reaches the listener)."""
        self._holding = True

    async def wait_held(self, n: int) -> None:
        """Until at least ``n`` bytes are held."""
        while len(self.held) < n:
            await self._grew.wait()

    async def release(self, n: int) -> None:
        """Forward the first ``n`` held bytes to the listener, in one write, and wait
        until its kernel has them (a RST would make it drop what it holds unread)."""
        up = self._up
        assert up is not None
        data, self.held[:n] = bytes(self.held[:n]), b""
        await _send_all(up, data)
        # (the kernel's count has no event to wait for: poll it; unknown counts as 0)
        while (platform.unacked_bytes(up) or 0) > 0:  # noqa: ASYNC110
            await trio.sleep(0.001)

    def cut(self, how: str) -> None:
        """End the listener's side: ``"fin"`` (shutdown) or ``"rst"`` (SO_LINGER 0, close)."""
        up = self._up
        assert up is not None
        if how == "rst":
            up.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            up.close()
        else:
            up.shutdown(socket.SHUT_WR)

    async def _pump_down_to_up(self, down: trio.socket.SocketType, up: trio.socket.SocketType) -> None:
        while True:
            data = await _recv(down)
            if not data:
                return
            if self._holding:
                self.held += data
                self._grew.set()
                self._grew = trio.Event()
            elif not await _send_all(up, data):
                return

    async def _pump(self, src: trio.socket.SocketType, dst: trio.socket.SocketType) -> None:
        while True:
            data = await _recv(src)
            if not data or not await _send_all(dst, data):
                return


async def _recv(sock: trio.socket.SocketType) -> bytes:
    try:
        return await sock.recv(65536)
    except (OSError, trio.ClosedResourceError):
        return b""


async def _send_all(sock: trio.socket.SocketType, data: bytes) -> bool:
    """False when the socket is gone (cut or reset)."""
    view = memoryview(data)
    try:
        while view:
            view = view[await sock.send(view):]
    except (OSError, trio.ClosedResourceError):
        return False
    return True
