"""The Linux backend: eventfd, epoll, Linux's TCP options and counters, interface ioctls.

The one module of nanopy that may use what only Linux has (tests/test_platform.py
holds every other module to that). Each function is the code nanopy ran before the
platform layer existed, moved here unchanged: the fast paths keep their speed.
"""

from __future__ import annotations

import fcntl
import os
import select
import socket
import struct
import sys
import termios
from collections.abc import Callable
from typing import IO, Any

from ._common import Capabilities, Ipv4Interface, ReadyWait, Waker, broadcast_of, prefix_of
from ._common import fsync_directory as fsync_directory  # (POSIX's: the portable backend's too)

# nanopy.platform.load imports this module on Linux only; the assertion tells mypy, so that
# checking nanopy for another system (mypy --platform darwin) skips the rest of this module.
assert sys.platform.startswith("linux"), "nanopy.platform.linux runs on Linux only"

NAME = "linux"
CAPABILITIES = Capabilities(unacked_bytes=True, user_timeout=True, fork=True, unix_sockets=True)
UNIX_PATH_MAX = 107  # sun_path is 108 bytes, including the NUL


# -- waking a blocked thread, and its wait --------------------------------------------------------
class EventWaker:
    """An eventfd: one descriptor, written to wake, read to clear."""

    __slots__ = ("_woken", "fd")

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._woken = False  # set after each write: a clear with nothing written reads nothing

    def wake(self) -> None:
        try:
            os.eventfd_write(self.fd, 1)
        except (OSError, ValueError):  # closed meanwhile: nobody left to wake
            pass
        self._woken = True  # (after the write: see clear)

    def clear(self) -> None:
        # A direct receive clears after every wait, and most waits end on the pipe's
        # bytes: skip the read (a syscall raising BlockingIOError) when no wake wrote.
        # The flag is set after the write and reset before the read, so a write the
        # read misses leaves the flag set (the next clear reads it): at worst one
        # stray wake-up, never an eventfd left readable for good.
        if self._woken:
            self._woken = False
            try:
                os.eventfd_read(self.fd)
            except BlockingIOError:
                pass

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def new_waker() -> Waker:
    """A wake for a thread blocked in a :func:`ready_wait` (an eventfd)."""
    return EventWaker()


class EpollWait:
    """An epoll descriptor readable when the pipe's descriptor or the waker is:
    a thread blocks in it (``wait``), an event loop waits for its one descriptor."""

    __slots__ = ("_epoll", "fds", "wait")

    def __init__(self, fd: int, waker: Waker) -> None:
        epoll = select.epoll()
        try:
            epoll.register(fd, select.EPOLLIN)
        except OSError:  # the descriptor was closed meanwhile
            epoll.close()
            raise
        epoll.register(waker.fd, select.EPOLLIN)
        self._epoll = epoll
        self.fds = (epoll.fileno(),)
        self.wait: Callable[[float | None], object] = epoll.poll

    def close(self) -> None:
        self._epoll.close()


def ready_wait(fd: int, waker: Waker) -> ReadyWait:
    """A wait for ``fd`` or ``waker`` (raises OSError when ``fd`` is closed)."""
    return EpollWait(fd, waker)


# -- addresses ------------------------------------------------------------------------------------
def reuse_listen_address(sock: socket.socket) -> None:
    """Before a TCP listener binds: the port of a listener that closed a moment ago may be
    bound again (its connections in TIME_WAIT), while one that listens still refuses."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)


def share_datagram_port(sock: socket.socket) -> None:
    """Before a UDP socket binds: every process on the host listening on the port gets
    its own copy of each broadcast."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)


# -- TCP: dead-peer detection and the kernel's counters -------------------------------------------
def set_keepalive(sock: socket.socket, idle: int, interval: int, count: int) -> None:
    """Keepalive probes after ``idle`` s of silence, every ``interval`` s, ``count`` of them."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)


def set_user_timeout(sock: socket.socket, milliseconds: int) -> bool:
    """TCP_USER_TIMEOUT: unacknowledged data (and keepalive) give up after this long; 0 lifts it."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, milliseconds)
    return True


def user_timeout(sock: socket.socket) -> int | None:
    """The socket's TCP_USER_TIMEOUT in ms (0: none set); None when it cannot be read."""
    try:
        return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))
    except OSError:
        return None


def unacked_bytes(sock: Any) -> int | None:
    """Bytes written to ``sock`` that its peer has not acknowledged (SIOCOUTQ; still
    right after the connection failed); None where the kernel does not say."""
    if sock is None:
        return None
    try:
        buf = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")  # (SIOCOUTQ has the same number)
    except (OSError, ValueError):
        return None
    return int.from_bytes(buf, sys.byteorder, signed=True)


def unread_bytes(sock: Any) -> int:
    """Bytes the peer sent that wait unread in ``sock``'s kernel buffer (FIONREAD; 0 when unknown)."""
    if sock is None:
        return 0
    try:
        buf = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return int.from_bytes(buf, sys.byteorder, signed=True)


def send_window_state(sock: Any) -> tuple[bool, bool] | None:
    """``(closed, probing)`` for a TCP socket (TCP_INFO): whether the peer's receive
    window holds our data back (bytes queued, none in flight), and whether a window
    probe is out unanswered; None where the kernel does not say."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except (OSError, AttributeError, ValueError):
        return None
    if len(info) < 28:
        return None
    in_flight = int.from_bytes(info[24:28], sys.byteorder)  # tcpi_unacked (segments)
    return in_flight == 0 and bool(unacked_bytes(sock)), info[3] > 0  # (tcpi_probes)


def send_buffer_ceiling() -> int | None:
    """The largest send buffer the kernel's autotuning grows a TCP socket to
    (net.ipv4.tcp_wmem's third field); None when it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return None


# -- interfaces -----------------------------------------------------------------------------------
_SIOCGIFFLAGS, _SIOCGIFADDR, _SIOCGIFBRDADDR, _SIOCGIFNETMASK = 0x8913, 0x8915, 0x8919, 0x891B
_IFF_UP, _IFF_BROADCAST, _IFF_LOOPBACK = 0x1, 0x2, 0x8


def _ifreq(sock: socket.socket, request: int, name: str) -> bytes:
    return fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()[:15]))


def _ifreq_address(sock: socket.socket, request: int, name: str) -> str:
    return socket.inet_ntoa(_ifreq(sock, request, name)[20:24])


def ipv4_interfaces() -> list[Ipv4Interface]:
    """The IPv4 address of every up, non-loopback broadcast interface (``if_nameindex``
    and the SIOCGIF* ioctls: the interface's primary address)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                flags = struct.unpack_from("H", _ifreq(probe, _SIOCGIFFLAGS, name), 16)[0]
                if flags & _IFF_LOOPBACK or not flags & _IFF_UP or not flags & _IFF_BROADCAST:
                    continue
                address = _ifreq_address(probe, _SIOCGIFADDR, name)
                prefix_len = prefix_of(_ifreq_address(probe, _SIOCGIFNETMASK, name))
                broadcast = _ifreq_address(probe, _SIOCGIFBRDADDR, name)
            except OSError:  # no IPv4 address on it, or it vanished meanwhile
                continue
            if prefix_len >= 31:
                continue  # (a point-to-point link: no broadcast)
            if broadcast == "0.0.0.0":  # added without one (`ip addr add` with no `brd`)
                broadcast = broadcast_of(address, prefix_len)
            found.append(Ipv4Interface(name, address, prefix_len, broadcast))
    return found


def ipv6_link_interfaces() -> list[tuple[str, int]]:
    """``(interface, index)`` of every non-loopback interface with an IPv6 link-local address."""
    try:
        with open("/proc/net/if_inet6") as table:
            rows = [line.split() for line in table]
    except OSError:
        return []
    found = {}
    for row in rows:  # address, index (hex), prefix length, scope, flags, name
        if len(row) == 6 and row[3] == "20" and row[5] != "lo":  # scope 0x20: link
            found[row[5]] = int(row[1], 16)
    return sorted(found.items())


# -- processes and files --------------------------------------------------------------------------
def register_at_fork(
    *, before: Callable[[], None], after_in_parent: Callable[[], None], after_in_child: Callable[[], None]
) -> bool:
    """Run these around every ``os.fork()``; True (registered)."""
    os.register_at_fork(before=before, after_in_parent=after_in_parent, after_in_child=after_in_child)
    return True


def lock_file(file: IO[Any], *, wait: bool) -> None:
    """An exclusive lock on ``file`` for as long as it stays open (flock); without
    ``wait``, BlockingIOError (an OSError) when another open file holds it."""
    fcntl.flock(file, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)


def user_tag() -> str:
    """This user, for names of per-user files in the shared temporary directory (the uid)."""
    return str(os.getuid())


def is_unix_socket(sock: socket.socket) -> bool:
    return sock.family == socket.AF_UNIX
