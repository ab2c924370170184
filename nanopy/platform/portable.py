"""The portable backend: the standard library's portable parts (macOS, Windows, the BSDs).

A socketpair wakes a blocked thread and ``selectors`` waits; TCP keepalive takes the
options the running system has; interfaces come from ``ifaddr`` (a small pure-Python
package, installed with nanopy on every system but Linux; see docs/architecture.md,
"The platform layer"). What the standard library cannot say portably -- the
kernel's unacknowledged bytes, a TCP user timeout and the window state that guards
it -- is reported as unknown, never guessed.

On Linux, ``NANOPY_BACKEND=portable`` runs nanopy on this backend for debugging
and so that the suite can exercise it there (docs/contributing.md).
"""

from __future__ import annotations

import logging
import os
import select
import selectors
import socket
import sys
from collections.abc import Callable
from typing import IO, Any

from . import _common
from ._common import Capabilities, Ipv4Interface, ReadyWait, Waker, broadcast_of

log = logging.getLogger("nanopy")

NAME = "portable"
_AF_UNIX: int | None = getattr(socket, "AF_UNIX", None)
CAPABILITIES = Capabilities(
    unacked_bytes=False,
    user_timeout=False,
    fork=hasattr(os, "register_at_fork"),
    unix_sockets=_AF_UNIX is not None,
)
#: sun_path holds 104 bytes on macOS and the BSDs, 108 on Linux and Windows (each with its NUL)
UNIX_PATH_MAX = 103 if sys.platform == "darwin" or "bsd" in sys.platform else 107


# -- waking a blocked thread, and its wait --------------------------------------------------------
class SocketPairWaker:
    """A connected socket pair: a byte written to one end wakes whoever waits on the other."""

    __slots__ = ("_reader", "_woken", "_writer", "fd")

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self.fd = self._reader.fileno()
        self._woken = False  # set after each send: a clear with nothing sent reads nothing

    def wake(self) -> None:
        try:
            self._writer.send(b"\x01")
        except OSError:  # full (then it is readable already), or closed: nobody left to wake
            pass
        self._woken = True  # (after the send; the same order as the Linux waker's)

    def clear(self) -> None:
        if not self._woken:  # no wake since the last clear: nothing to read
            return
        self._woken = False
        try:
            while self._reader.recv(4096):
                pass
        except OSError:  # drained (BlockingIOError), or closed
            pass

    def close(self) -> None:
        self.fd = -1
        self._reader.close()
        self._writer.close()


def new_waker() -> Waker:
    """A wake for a thread blocked in a :func:`ready_wait` (a socket pair)."""
    return SocketPairWaker()


class SelectorWait:
    """A selector watching the pipe's descriptor and the waker. ``fds`` is what an
    event loop waits on: the selector's own descriptor where it has one (epoll,
    kqueue), else both (Windows' ``select`` has none)."""

    __slots__ = ("_selector", "fds")

    def __init__(self, fd: int, waker: Waker) -> None:
        selector = selectors.DefaultSelector()
        try:
            selector.register(fd, selectors.EVENT_READ)
            selector.register(waker.fd, selectors.EVENT_READ)
        except (OSError, ValueError) as exc:  # the descriptor was closed meanwhile
            selector.close()
            raise OSError(f"cannot wait on descriptor {fd}: {exc}") from None
        self._selector = selector
        # An event loop waits on one descriptor where the selector has one (epoll on Linux,
        # kqueue on macOS: readable while either watched descriptor is), as the linux
        # backend's wait does; only a selector without one (Windows' select) leaves the
        # loop to wait on both, which costs a trio task a nursery per wait.
        own = getattr(selector, "fileno", None)
        self.fds: tuple[int, ...] = (own(),) if own is not None else (fd, waker.fd)

    def wait(self, timeout: float | None) -> object:
        try:
            return self._selector.select(timeout)
        except (OSError, ValueError):  # the pipe's descriptor was closed under the wait
            return ()  # (Windows' select says so; the caller looks again and finds the pipe gone)

    def close(self) -> None:
        self._selector.close()


def ready_wait(fd: int, waker: Waker) -> ReadyWait:
    """A wait for ``fd`` or ``waker`` (raises OSError when ``fd`` is closed)."""
    return SelectorWait(fd, waker)


# -- addresses ------------------------------------------------------------------------------------
def reuse_listen_address(sock: socket.socket) -> None:
    """Before a TCP listener binds: the port of a listener that closed a moment ago may be
    bound again, while one that listens still refuses. SO_REUSEADDR on POSIX systems;
    on Windows it would let a second listener take a port in use, so Windows gets
    SO_EXCLUSIVEADDRUSE (its default already lets a closed listener's port be bound)."""
    if sys.platform == "win32":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)
    else:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)


def share_datagram_port(sock: socket.socket) -> None:
    """Before a UDP socket binds: every process on the host listening on the port gets
    its own copy of each broadcast (SO_REUSEADDR; macOS and the BSDs also want
    SO_REUSEPORT for a second bind of the same port)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sys.platform != "win32" and not sys.platform.startswith("linux"):  # (macOS, the BSDs)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)


# -- TCP: dead-peer detection and the kernel's counters -------------------------------------------
#: the option that sets the idle time before the first keepalive probe: TCP_KEEPIDLE
#: (Linux, Windows 10 and later, the BSDs), TCP_KEEPALIVE (macOS)
_KEEPIDLE: int | None = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
_KEEPINTVL: int | None = getattr(socket, "TCP_KEEPINTVL", None)
_KEEPCNT: int | None = getattr(socket, "TCP_KEEPCNT", None)


def set_keepalive(sock: socket.socket, idle: int, interval: int, count: int) -> None:
    """Keepalive probes after ``idle`` s of silence, every ``interval`` s, ``count`` of
    them, with the options this system has; Windows before 10 (no TCP_KEEPIDLE) takes
    idle and interval through SIO_KEEPALIVE_VALS and keeps its own count."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    timed = False
    for option, value in ((_KEEPIDLE, idle), (_KEEPINTVL, interval), (_KEEPCNT, count)):
        if option is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
                timed = timed or option == _KEEPIDLE
            except OSError:  # (an older system than the one Python was built for)
                pass
    if not timed and sys.platform == "win32":
        sock.ioctl(socket.SIO_KEEPALIVE_VALS, (1, idle * 1000, interval * 1000))


def set_user_timeout(sock: socket.socket, milliseconds: int) -> bool:
    """False: no portable user timeout (keepalive's ``idle + interval * count`` gives up
    on an idle peer; data in flight is left to the system's retransmission limit)."""
    return False


def user_timeout(sock: socket.socket) -> int | None:
    """None: no portable user timeout."""
    return None


def unacked_bytes(sock: Any) -> int | None:
    """None: unknown (the standard library has no portable count of them)."""
    return None


def unread_bytes(sock: Any) -> int:
    """Bytes the peer sent that wait unread in ``sock``'s kernel buffer (at least; a
    peek never blocks: it is made only when ``select`` says the socket is readable)."""
    if sock is None:
        return 0
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return len(sock.recv(1 << 16, socket.MSG_PEEK)) if readable else 0
    except (OSError, ValueError):  # closed, or reset
        return 0


def send_window_state(sock: Any) -> tuple[bool, bool] | None:
    """None: unknown."""
    return None


def send_buffer_ceiling() -> int | None:
    """None: unknown."""
    return None


# -- interfaces -----------------------------------------------------------------------------------
_warned_no_ifaddr: list[bool] = []


def _adapters() -> list[Any]:
    try:
        import ifaddr
    except ImportError:
        if not _warned_no_ifaddr:
            _warned_no_ifaddr.append(True)
            log.warning("nanopy: the interfaces of this host are unknown without the ifaddr package "
                        "(pip install ifaddr); beacons go to 255.255.255.255 only")
        return []
    return list(ifaddr.get_adapters())


def _is_loopback(adapter: Any) -> bool:
    return any(ip.ip == ("::1", 0, 0) or (isinstance(ip.ip, str) and ip.ip.startswith("127.")) for ip in adapter.ips)


def ipv4_interfaces() -> list[Ipv4Interface]:
    """Every IPv4 address of every non-loopback interface (``ifaddr``), with its
    broadcast address computed from address and netmask; point-to-point links
    (/31, /32) have none and are left out."""
    found = []
    for adapter in _adapters():
        if _is_loopback(adapter):
            continue
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and ip.network_prefix < 31:
                found.append(Ipv4Interface(adapter.name, ip.ip, ip.network_prefix,
                                           broadcast_of(ip.ip, ip.network_prefix)))
    return found


def ipv6_link_interfaces() -> list[tuple[str, int]]:
    """``(interface, index)`` of every non-loopback interface with an IPv6 link-local address."""
    found = {}
    for adapter in _adapters():
        if _is_loopback(adapter):
            continue
        for ip in adapter.ips:
            if isinstance(ip.ip, tuple) and ip.ip[0].lower().startswith("fe80:"):
                found[adapter.name] = int(ip.ip[2] or adapter.index)
    return sorted(found.items())


# -- processes and files --------------------------------------------------------------------------
def register_at_fork(
    *, before: Callable[[], None], after_in_parent: Callable[[], None], after_in_child: Callable[[], None]
) -> bool:
    """Run these around every ``os.fork()`` where the system forks; False where it does not (Windows)."""
    if not hasattr(os, "register_at_fork"):
        return False
    os.register_at_fork(before=before, after_in_parent=after_in_parent, after_in_child=after_in_child)
    return True


#: Windows locks a byte range: one byte far past any content, so the file stays readable
_WINDOWS_LOCK_AT = 1 << 30


def lock_file(file: IO[Any], *, wait: bool) -> None:
    """An exclusive lock on ``file`` for as long as it stays open (flock on POSIX
    systems, a locked byte on Windows); without ``wait``, an OSError when another
    open file holds it."""
    if sys.platform == "win32":
        import msvcrt

        fd = file.fileno()
        here = os.lseek(fd, 0, os.SEEK_CUR)
        os.lseek(fd, _WINDOWS_LOCK_AT, os.SEEK_SET)
        try:  # (LK_LOCK tries for about 10 s, then raises)
            msvcrt.locking(fd, msvcrt.LK_LOCK if wait else msvcrt.LK_NBLCK, 1)
        finally:
            os.lseek(fd, here, os.SEEK_SET)
    else:
        import fcntl

        fcntl.flock(file, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)


def fsync_directory(path: str) -> None:
    """Make a rename in directory ``path`` durable (Windows cannot open a directory:
    NTFS journals the rename itself)."""
    if sys.platform != "win32":
        _common.fsync_directory(path)


def user_tag() -> str:
    """This user, for names of per-user files in the shared temporary directory
    (the uid where there is one, else the login name)."""
    getuid = getattr(os, "getuid", None)
    if getuid is not None:
        return str(getuid())
    import getpass

    return "".join(c if c.isalnum() else "_" for c in getpass.getuser())


def is_unix_socket(sock: socket.socket) -> bool:
    return _AF_UNIX is not None and sock.family == _AF_UNIX
