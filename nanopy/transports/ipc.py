"""``ipc://path`` -- SP over Unix domain sockets (one extra type byte per frame).

Binding over a socket file left by a dead process reclaims it (we try to connect
first; refused means stale); a live listener gives :class:`nanopy.AddressInUse`.
The file is removed when the listener closes.

Where Python offers no Unix domain sockets (``socket.AF_UNIX``: Windows' Python
has none) bind and connect raise :class:`nanopy.AddressError` naming the platform.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import sys

from .. import platform
from ..core.errors import AddressError, AddressInUse
from ._base import Connection, Listener, PipeContext, Transport
from ._stream import StreamConnection, StreamListener, connect_socket

MAX_PATH = platform.UNIX_PATH_MAX  # sun_path less its NUL: 107 bytes on Linux, 103 on macOS


def unix_family(url: str) -> int:
    """``socket.AF_UNIX``; an AddressError where this Python has no Unix domain sockets."""
    family: int | None = getattr(socket, "AF_UNIX", None)
    if family is None:
        scheme = url.partition("://")[0]
        raise AddressError(f"{url!r}: {scheme}:// needs Unix domain sockets, which Python on {sys.platform} "
                           "does not offer (no socket.AF_UNIX); use tcp://127.0.0.1:PORT between processes, "
                           "or inproc:// within one")
    return family


def ipc_path(url: str) -> str:
    scheme, _, path = url.partition("://")
    unix_family(url)
    if not path:
        raise AddressError(f"{url!r}: ipc needs a path, e.g. {scheme}:///tmp/app.ipc")
    if "\x00" in path:
        raise AddressError(f"{url!r}: an ipc path cannot contain NUL")
    if len(os.fsencode(path)) > MAX_PATH:
        raise AddressError(f"{url!r}: ipc path longer than {MAX_PATH} bytes")
    return path


class _IpcListener(StreamListener):
    def __init__(self, sock: socket.socket, url: str, ctx: PipeContext, path: str) -> None:
        super().__init__(sock, url, ctx, ipc=True)
        self._path = path
        self._inode = os.stat(path).st_ino

    def describe_peer(self, addr: object) -> str:
        return self._path

    async def aclose(self) -> None:
        if not self._closed:
            # Remove the file only if it is still ours (not re-bound by someone else).
            try:
                if os.stat(self._path).st_ino == self._inode:
                    os.unlink(self._path)
            except OSError:
                pass
        await super().aclose()


def _reclaim_stale(path: str, url: str) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise AddressInUse(errno.EADDRINUSE, f"{url}: {path} exists and is not a socket")
    probe = socket.socket(unix_family(url), socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)  # nobody listens: left over from a dead process
        return
    except OSError:
        return
    finally:
        probe.close()
    raise AddressInUse(errno.EADDRINUSE, f"{url}: a live socket is listening on {path}")


class IpcTransport(Transport):
    schemes: tuple[str, ...] = ("ipc",)
    #: what accepts connections on a bound path (zmtp+ipc accepts ZMTP connections)
    listener_class = _IpcListener

    def check_url(self, url: str) -> None:
        ipc_path(url)

    async def listen(self, url: str, ctx: PipeContext) -> Listener:
        path = ipc_path(url)
        _reclaim_stale(path, url)
        sock = socket.socket(unix_family(url), socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise AddressInUse(exc.errno, f"{url}: address already in use") from None
            if exc.errno in (errno.ENOENT, errno.EACCES, errno.ENOTDIR):
                raise AddressError(f"{url!r}: cannot bind: {exc.strerror}") from None
            raise
        return self.listener_class(sock, url, ctx, path)

    async def dial(self, url: str, ctx: PipeContext) -> Connection:
        path = ipc_path(url)
        sock = socket.socket(unix_family(url), socket.SOCK_STREAM)
        try:
            await connect_socket(sock, path, ctx.options.get("connect_timeout"))
        except BaseException:
            sock.close()
            raise
        return self.connection(sock, ctx, path)

    def connection(self, sock: socket.socket, ctx: PipeContext, path: str) -> Connection:
        """The connection for a dialed socket."""
        return StreamConnection(sock, ctx, True, path)


transport = IpcTransport()
