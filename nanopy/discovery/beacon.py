"""Discovery beacons: the datagram format, where beacons are sent, and the listener.

A :class:`~nanopy.discovery.Discovery` created with ``beacon=True`` sends a small UDP
datagram every interval: "a discovery service of group G listens on port P". An
:class:`~nanopy.discovery.Announcer` created with ``beacon=True`` listens for those
datagrams and dials each discovery service at the *source address* of its beacon,
so nobody configures an address. The format is documented in ``docs/discovery.md``.

This module does no SP messaging itself: it encodes and parses beacons, lists the
broadcast addresses of this host's interfaces (from the kernel), sends, and runs a
listener thread whose memory and CPU stay bounded whatever arrives.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .. import _fork, platform
from ..transports.tcp import sockaddr_host

log = logging.getLogger("nanopy.discovery")

MAGIC = b"SPDB"  # "SP discovery beacon"
BEACON_VERSION = 1
DEFAULT_BEACON_PORT = 5606
"""UDP port beacons are sent to when ``beacon_port`` is not given."""

FLAG_BYE = 0x01  # the discovery service is closing: forget it now
MAX_BEACON_SIZE = 1024  # longer datagrams are not beacons
MAX_TEXT = 255  # group and path are length-prefixed by one byte
_HEAD = struct.Struct("!4sBBHI8s")  # magic, version, flags, port, interval (ms), instance id
_SCHEMES = ("tcp", "ws", "wss", "tls+tcp")  # transports a beacon can point at (they have a port)
IPV6_ALL_NODES = "ff02::1"  # link-local multicast every IPv6 host has joined


@dataclass(frozen=True)
class Beacon:
    """One parsed beacon.

    Attributes:
        instance: 8 random bytes naming one Discovery (the same on every interface).
        port: the discovery service's port.
        interval: seconds between two beacons of this discovery service.
        scheme: ``tcp``, ``ws``, ``wss`` or ``tls+tcp``.
        group: the system this discovery service belongs to ("" by default).
        path: the URL path (``ws``/``wss`` only; "" otherwise).
        bye: the discovery service is closing.
    """

    instance: bytes
    port: int
    interval: float
    scheme: str = "tcp"
    group: str = ""
    path: str = ""
    bye: bool = False

    def url(self, host: str) -> str:
        """The URL to dial when this beacon came from ``host``."""
        where = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{where}:{self.port}{self.path}"


def _text(label: str, value: str, limit: int = MAX_TEXT) -> bytes:
    data = value.encode()
    if len(data) > limit:
        raise ValueError(f"the beacon {label} is {len(data)} bytes in UTF-8; the limit is {limit}")
    return bytes([len(data)]) + data


def encode_beacon(beacon: Beacon) -> bytes:
    """The datagram for ``beacon`` (see docs/discovery.md, "Beacon format")."""
    if beacon.scheme not in _SCHEMES:
        raise ValueError(f"beacons point at tcp, ws, wss or tls+tcp addresses, not {beacon.scheme!r}")
    if not 1 <= beacon.port <= 65535:
        raise ValueError(f"beacon port must be 1..65535, got {beacon.port}")
    interval_ms = round(beacon.interval * 1000)
    if not 1 <= interval_ms <= 0xFFFFFFFF:
        raise ValueError(f"beacon interval must be 1 ms .. 49 days, got {beacon.interval} s")
    if len(beacon.instance) != 8:
        raise ValueError("the instance id is 8 bytes")
    head = _HEAD.pack(MAGIC, BEACON_VERSION, FLAG_BYE if beacon.bye else 0, beacon.port, interval_ms,
                      beacon.instance)
    return head + _text("scheme", beacon.scheme) + _text("group", beacon.group) + _text("path", beacon.path)


def _take_text(data: bytes, at: int, label: str) -> tuple[str, int]:
    if at >= len(data):
        raise ValueError(f"truncated before the {label}")
    end = at + 1 + data[at]
    if end > len(data):
        raise ValueError(f"the {label} runs past the end")
    try:
        return data[at + 1 : end].decode(), end
    except UnicodeDecodeError:
        raise ValueError(f"the {label} is not UTF-8") from None


def decode_beacon(data: bytes) -> Beacon:
    """Parse a datagram; bytes after the last field are ignored (room for additions).

    Raises:
        ValueError: not a version-1 beacon (wrong magic or version, truncated,
            too long, port or interval 0, unknown scheme, text not UTF-8).
    """
    if len(data) > MAX_BEACON_SIZE:
        raise ValueError("too long for a beacon")
    if len(data) < _HEAD.size:
        raise ValueError("too short for a beacon")
    magic, version, flags, port, interval_ms, instance = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("not a beacon (wrong magic)")
    if version != BEACON_VERSION:
        raise ValueError(f"unsupported beacon version {version}")
    if port == 0 or interval_ms == 0:
        raise ValueError("port and interval must not be 0")
    scheme, at = _take_text(data, _HEAD.size, "scheme")
    group, at = _take_text(data, at, "group")
    path, at = _take_text(data, at, "path")
    if scheme not in _SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}")
    if path and (not path.startswith("/") or scheme not in ("ws", "wss")):
        raise ValueError("a path must start with '/' and belong to a ws/wss address")
    return Beacon(instance, port, interval_ms / 1000, scheme, group, path, bool(flags & FLAG_BYE))


def new_instance_id() -> bytes:
    return os.urandom(8)


# -- where beacons go: this host's interfaces (nanopy.platform) -----------------------------------

def interface_broadcasts() -> list[tuple[str, str]]:
    """``(interface, IPv4 broadcast address)`` of every up, non-loopback interface with an
    IPv4 address (nanopy.platform); an interface with no broadcast address set (an
    address added without ``brd``) gets the one its address and netmask imply.
    Empty when none is found: callers fall back to 255.255.255.255."""
    found: dict[tuple[str, str], None] = {}  # (in order, each once: two addresses of one subnet share it)
    for interface in platform.ipv4_interfaces():
        found[(interface.name, interface.broadcast)] = None
    return list(found)


def ipv6_link_interfaces() -> list[tuple[str, int]]:
    """``(interface, index)`` of every non-loopback interface with an IPv6 link-local address."""
    return platform.ipv6_link_interfaces()


def beacon_targets(port: int, to: Iterable[str] | None, ipv6: bool = False) -> list[tuple[Any, ...]]:
    """Socket addresses for one round of beacons.

    ``to`` lists explicit hosts (e.g. ``127.255.255.255`` to stay on loopback);
    ``None`` means every interface's IPv4 broadcast address, plus (with ``ipv6``)
    IPv6 all-nodes link-local multicast on every interface that has IPv6.
    """
    if to is not None:
        out: list[tuple[Any, ...]] = []
        for host in to:
            out.append((host, port, 0, 0) if ":" in host else (host, port))
        return out
    targets: list[tuple[Any, ...]] = [(address, port) for _, address in interface_broadcasts()]
    if not targets:
        targets.append(("255.255.255.255", port))
    if ipv6:
        targets += [(IPV6_ALL_NODES, port, 0, index) for _, index in ipv6_link_interfaces()]
    return targets


class BeaconSender:
    """Sends one datagram to every target; errors (an interface going away) are logged, not raised."""

    def __init__(self, port: int, to: Iterable[str] | None, *, ipv6: bool = False) -> None:
        self.port = port
        self.to = None if to is None else list(to)
        self.ipv6 = ipv6
        self.sent = 0  #: datagrams sent
        self._sockets: dict[int, socket.socket] = {}
        self._closed = False

    def _socket(self, family: int) -> socket.socket:
        sock = self._sockets.get(family)
        if sock is None:
            sock = socket.socket(family, socket.SOCK_DGRAM)
            if family == socket.AF_INET:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
                if self.to is None:  # broadcasts stay on the link, even where routers forward them
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 1)
            else:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 1)  # never routed
            sock.setblocking(False)
            self._sockets[family] = _fork.own(sock)
        return sock

    def send(self, datagram: bytes) -> int:
        """Send ``datagram`` to this round's targets; returns how many were sent (0 once closed)."""
        count = 0
        if self._closed:
            return count
        for target in beacon_targets(self.port, self.to, self.ipv6):
            family = socket.AF_INET6 if len(target) == 4 else socket.AF_INET
            try:
                self._socket(family).sendto(datagram, target)
                count += 1
            except OSError as exc:  # e.g. an IPv6 address still tentative, a full send buffer
                log.debug("beacon to %s not sent: %s", target[0], exc)
        self.sent += count
        return count

    def close(self) -> None:
        self._closed = True
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()


# -- the listening side ---------------------------------------------------------------------------

BeaconHandler = Callable[[Beacon, str], None]


def _listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        # Every process on the host that listens for beacons gets its own copy of each broadcast.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return _fork.own(sock)


class BeaconListener:
    """A daemon thread that receives beacons on ``port`` and hands valid ones to ``handler``.

    Args:
        hosts: local addresses to listen on (``0.0.0.0`` and ``::`` hear broadcasts
            and IPv6 all-nodes multicast; ``127.255.255.255`` hears loopback broadcasts).
            An address the host lacks (no IPv6) is skipped, unless none is left.
        handler: ``handler(beacon, source_host)`` for each valid beacon.
        tick: ``tick(deaf)`` every ``tick_every`` seconds (expiry checks); ``deaf``
            is True when datagrams were left unread since the last tick (see below),
            so silence proves nothing.

    Bounded cost whatever arrives: memory is constant (one datagram at a time, parsed
    at once, nothing queued) and at most ``MAX_RATE`` datagrams a second are read;
    beyond that the listener stops reading until the next tick and the kernel drops
    the excess from its (fixed-size) receive buffer.
    """

    MAX_RATE = 4000  # datagrams read per second, at most

    def __init__(self, hosts: Iterable[str], port: int, handler: BeaconHandler, tick: Callable[[bool], None],
                 *, tick_every: float = 0.25, name: str = "nanopy-beacons") -> None:
        self.received = 0  #: datagrams read
        self.ignored = 0  #: datagrams that were not valid beacons
        self.deaf_ticks = 0  #: ticks in which the read budget ran out (a flood)
        self._handler, self._tick, self._tick_every = handler, tick, tick_every
        self._budget_per_tick = max(1, int(self.MAX_RATE * tick_every))
        self._sockets = self._open(list(hosts), port)
        # (owned: a child's close must not wake the parent's thread through its copy)
        self._wake_r, self._wake_w = map(_fork.own, socket.socketpair())
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @staticmethod
    def _open(hosts: list[str], port: int) -> list[socket.socket]:
        sockets, errors = [], []
        for host in hosts:
            try:
                sockets.append(_listening_socket(host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    for sock in sockets:
                        sock.close()
                    raise
                errors.append(f"{host}: {exc.strerror or exc}")
        if not sockets:
            raise OSError(f"cannot listen for beacons on UDP port {port}: {'; '.join(errors)}")
        return sockets

    @property
    def port(self) -> int:
        return int(self._sockets[0].getsockname()[1])

    def _run(self) -> None:
        next_tick = time.monotonic() + self._tick_every
        budget = self._budget_per_tick
        while not self._stopping:
            watched = [*self._sockets, self._wake_r] if budget > 0 else [self._wake_r]
            try:
                ready, _, _ = select.select(watched, [], [], max(0.0, next_tick - time.monotonic()))
            except (OSError, ValueError):  # closed under us
                return
            for sock in ready:
                if sock is not self._wake_r:
                    budget = self._drain(sock, budget)
            if time.monotonic() >= next_tick:
                deaf = budget <= 0
                self.deaf_ticks += deaf
                next_tick = time.monotonic() + self._tick_every
                budget = self._budget_per_tick
                self._safely(self._tick, deaf)

    def _drain(self, sock: socket.socket, budget: int) -> int:
        """Read and handle datagrams until none is waiting or the budget is spent; returns what is left."""
        while budget > 0:
            try:
                data, source = sock.recvfrom(MAX_BEACON_SIZE + 1)
            except OSError:  # nothing waiting (BlockingIOError), or an ICMP error reported on the socket
                return budget
            budget -= 1
            self.received += 1
            try:
                beacon = decode_beacon(data)
            except ValueError:
                self.ignored += 1
                continue
            self._safely(self._handler, beacon, sockaddr_host(source))
        return budget

    @staticmethod
    def _safely(fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("beacon listener: %r failed", fn)

    def close(self) -> None:
        """Stop the thread and close the sockets; idempotent."""
        if self._stopping:
            return
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)
        for sock in [*self._sockets, self._wake_r, self._wake_w]:
            sock.close()
