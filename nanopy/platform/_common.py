"""What every backend offers (:class:`Backend`), and the parts the backends share.

A backend is a module (``linux.py``, ``portable.py``) whose functions and constants
match :class:`Backend`: mypy checks each one against it where ``__init__`` picks
it, and tests/test_platform.py checks that both offer the same names with the
same signatures and behave alike on Linux, where both run.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, Protocol


class Waker(Protocol):
    """Wakes a thread (or task) blocked on :attr:`fd`, from any thread, never blocking.

    ``wake`` makes ``fd`` readable until ``clear``; several wakes before a
    ``clear`` are one. ``close`` frees the descriptor(s); a wake after it is ignored.
    """

    @property
    def fd(self) -> int: ...

    def wake(self) -> None: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...


class ReadyWait(Protocol):
    """A wait for one descriptor (a pipe's socket) or a :class:`Waker`, whichever is first.

    ``wait`` blocks the calling thread until one of them is readable or ``timeout``
    seconds pass (None: no limit); it says nothing about which (look at both).
    The pipe's descriptor closed under it (by another thread) ends the wait at
    once or never, depending on the system, but never raises: the waker's wake
    (which whoever closes a pipe sends) always ends it.
    An event loop waits instead until any descriptor of :attr:`fds` is readable:
    one descriptor that stands for both where the system has one (Linux's epoll),
    else the two themselves.
    """

    @property
    def fds(self) -> tuple[int, ...]: ...

    def wait(self, timeout: float | None) -> object: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do on this system; where one is False the behaviour
    degrades as docs/architecture.md ("The platform layer") says."""

    #: the kernel counts a TCP socket's unacknowledged bytes (``unacked_bytes``);
    #: without it ``lost_unacked_bytes`` stays 0 and ``resend_unacked`` has no log
    unacked_bytes: bool
    #: a user timeout for unacknowledged data (``set_user_timeout``) and the
    #: window state that guards it (``send_window_state``)
    user_timeout: bool
    #: ``os.fork`` exists, and nanopy's at-fork hooks are registered
    fork: bool
    #: Unix domain sockets (``ipc://``, ``zmtp+ipc://``)
    unix_sockets: bool


@dataclass(frozen=True)
class Ipv4Interface:
    """One IPv4 address of an up, non-loopback interface.

    Attributes:
        name: the interface (``eth0``, ``en0``, ``Ethernet``).
        address: its IPv4 address.
        prefix_len: the netmask as a prefix length (24 for 255.255.255.0).
        broadcast: the broadcast address as set on the interface, or, where none
            is set (an address added without ``brd``, or a system that does not
            say), computed from the address and the netmask.
    """

    name: str
    address: str
    prefix_len: int
    broadcast: str


def broadcast_of(address: str, prefix_len: int) -> str:
    """The directed broadcast address of ``address/prefix_len`` (its host bits all set)."""
    return str(ipaddress.IPv4Network(f"{address}/{prefix_len}", strict=False).broadcast_address)


def fsync_directory(path: str) -> None:
    """Make a rename in directory ``path`` durable (POSIX: fsync the directory itself)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prefix_of(netmask: str) -> int:
    """The prefix length of a dotted netmask (``255.255.255.0`` -> 24)."""
    return ipaddress.IPv4Network(f"0.0.0.0/{netmask}").prefixlen


class Backend(Protocol):
    """The OS-specific operations nanopy uses (see the package docstring)."""

    NAME: str
    CAPABILITIES: Capabilities
    #: the longest ``ipc://`` path in bytes (the system's ``sun_path`` less its NUL)
    UNIX_PATH_MAX: int

    def new_waker(self) -> Waker: ...

    def ready_wait(self, fd: int, waker: Waker) -> ReadyWait: ...

    def reuse_listen_address(self, sock: socket.socket) -> None: ...

    def share_datagram_port(self, sock: socket.socket) -> None: ...

    def set_keepalive(self, sock: socket.socket, idle: int, interval: int, count: int) -> None: ...

    def set_user_timeout(self, sock: socket.socket, milliseconds: int) -> bool: ...

    def user_timeout(self, sock: socket.socket) -> int | None: ...

    def unacked_bytes(self, sock: Any) -> int | None: ...

    def unread_bytes(self, sock: Any) -> int: ...

    def send_window_state(self, sock: Any) -> tuple[bool, bool] | None: ...

    def send_buffer_ceiling(self) -> int | None: ...

    def ipv4_interfaces(self) -> list[Ipv4Interface]: ...

    def ipv6_link_interfaces(self) -> list[tuple[str, int]]: ...

    def register_at_fork(
        self, *, before: Callable[[], None], after_in_parent: Callable[[], None], after_in_child: Callable[[], None]
    ) -> bool: ...

    def lock_file(self, file: IO[Any], *, wait: bool) -> None: ...

    def fsync_directory(self, path: str) -> None: ...

    def user_tag(self) -> str: ...

    def is_unix_socket(self, sock: socket.socket) -> bool: ...
