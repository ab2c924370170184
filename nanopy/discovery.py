"""Service discovery over SURVEYOR/RESPONDENT.

A :class:`Discovery` binds a SURVEYOR and asks "which services are out there?"
every ``interval`` seconds, collecting answers for ``deadline`` seconds. Services
run an :class:`Announcer`: a RESPONDENT that connects to one or more discovery
addresses (reconnecting forever) and answers every survey with its name, address,
priority and optional metadata. A provider that misses ``misses`` consecutive
surveys is dropped, so a dead service is "undiscovered" without any goodbye::

    from nanopy.discovery import Discovery, Announcer

    with Discovery("tcp://0.0.0.0:5600", interval=1.0, deadline=0.5) as disco, \\
         Announcer("echo", "tcp://10.0.0.2:7000", connect="tcp://disco-host:5600"):
        address = disco.resolve("echo", timeout=2.0)

On a LAN nothing needs an address: ``Discovery(beacon=True)`` sends a small UDP
beacon every interval (broadcast on the host's interfaces) and
``Announcer(name, address, beacon=True)`` dials every discovery service of its
``group`` that it hears, at the beacon's source address (see ``nanopy._beacon``)::

    disco = Discovery(beacon=True)                                   # on any host
    Announcer("echo", "tcp://0.0.0.0:7000", beacon=True)             # on each service host

The answer format is JSON (UTF-8), versioned and language-neutral, so any SP
library can announce a service (see ``docs/discovery.md``)::

    {"v": 1, "name": "echo", "address": "tcp://10.0.0.2:7000", "priority": 8,
     "metadata": {"zone": "ny"}}
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Self

from ._beacon import (
    DEFAULT_BEACON_PORT,
    Beacon,
    BeaconListener,
    BeaconSender,
    encode_beacon,
    new_instance_id,
)
from ._errors import Closed, NanopyError
from ._socket import Socket
from ._util import run_in_worker_thread
from ._waiters import async_waiter
from .transports.tcp import ipv6_sockaddr, sockaddr_host

__all__ = [
    "DEFAULT_BEACON_PORT", "FORMAT_VERSION", "SURVEY", "Announcer", "Discovery", "Provider", "decode_answer",
    "encode_answer",
]

log = logging.getLogger("nanopy.discovery")

FORMAT_VERSION = 1
"""Version of the survey/answer format (the ``"v"`` field)."""

SURVEY = b'{"v":1,"survey":"services"}'
"""The survey body a :class:`Discovery` sends (announcers answer any survey body)."""

MAX_ANSWER_SIZE = 65536
DEFAULT_PRIORITY = 8
BEACON_MISSES = 3
"""An announcer forgets a discovery service after this many beacon intervals of silence."""
MAX_SILENCE = 180.0  # ...but after at most this many seconds, whatever interval a beacon claims
MAX_DISCOVERIES = 32  # discovery services one announcer follows by beacon (bounds a flood's cost)
WILDCARD_HOSTS = ("0.0.0.0", "::", "*", "")

ChangeCallback = Callable[[str, str, bool], Any]


# -- the wire format -------------------------------------------------------------------------


@dataclass(frozen=True)
class Provider:
    """One live provider of a service, as last announced.

    Attributes:
        name: the service name.
        address: where the service listens (a URL, as announced).
        priority: 1 (most preferred) ... 16; :meth:`Discovery.resolve` picks among
            the live providers with the smallest number.
        metadata: free-form JSON object announced with the service.
        first_seen, last_seen: ``time.time()`` of the first and latest answers.
    """

    name: str
    address: str
    priority: int = DEFAULT_PRIORITY
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    first_seen: float = field(default=0.0, compare=False, hash=False)
    last_seen: float = field(default=0.0, compare=False, hash=False)


def _check_priority(priority: Any) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int from 1 to 16, not {type(priority).__name__}")
    if not 1 <= priority <= 16:
        raise ValueError(f"priority must be from 1 (preferred) to 16, got {priority}")
    return priority


def encode_answer(
    name: str, address: str, *, priority: int = DEFAULT_PRIORITY, metadata: Mapping[str, Any] | None = None
) -> bytes:
    """The answer an announcer sends: compact UTF-8 JSON (see ``docs/discovery.md``).

    Raises:
        TypeError, ValueError: a field is invalid, the metadata is not JSON-serialisable,
            or the answer would exceed 64 KiB.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("the service name must be a non-empty str")
    if not isinstance(address, str) or not address:
        raise ValueError("the service address must be a non-empty str (a URL clients can use)")
    obj: dict[str, Any] = {"v": FORMAT_VERSION, "name": name, "address": address,
                           "priority": _check_priority(priority)}
    if metadata:
        if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
            raise TypeError("metadata must be a mapping with str keys")
        obj["metadata"] = dict(metadata)
    try:
        data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metadata must be JSON-serialisable: {exc}") from None
    if len(data) > MAX_ANSWER_SIZE:
        raise ValueError(f"the answer is {len(data)} bytes; the limit is {MAX_ANSWER_SIZE}")
    return data


def decode_answer(data: bytes, now: float | None = None) -> Provider:
    """Parse an answer; unknown fields are ignored (forward compatible).

    Raises:
        ValueError: not a version-1 answer (bad JSON, wrong version, missing or
            ill-typed ``name``/``address``/``priority``/``metadata``).
    """
    if len(data) > MAX_ANSWER_SIZE:
        raise ValueError("answer too large")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not UTF-8 JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")  # noqa: TRY004 - a malformed answer, not a caller's bug
    version = obj.get("v")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise ValueError(f"unsupported format version {version!r}")
    name, address = obj.get("name"), obj.get("address")
    if not isinstance(name, str) or not name or not isinstance(address, str) or not address:
        raise ValueError("name and address must be non-empty strings")
    priority = obj.get("priority", DEFAULT_PRIORITY)
    try:
        priority = _check_priority(priority)
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc)) from None
    metadata = obj.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ValueError("metadata must be a JSON object")  # noqa: TRY004 - see above
    stamp = time.time() if now is None else now
    return Provider(name, address, priority, metadata, stamp, stamp)


# -- shared helpers ---------------------------------------------------------------------------


def _as_list(value: str | Iterable[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"{name} must be a number of seconds")
    if value <= 0 or math.isinf(value):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


@contextlib.contextmanager
def _closed_on_error(sock: Socket) -> Iterator[None]:
    """Close ``sock`` (at once) if setting it up fails."""
    try:
        yield
    except BaseException:
        sock.close(linger=0)
        raise


class _SocketThread:
    """A socket served by a daemon thread: the closing and context-manager logic
    :class:`Discovery` and :class:`Announcer` share."""

    _sock: Socket
    _thread: threading.Thread

    def _start_thread(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Close the socket and wait for the thread; idempotent."""
        self._sock.close(linger=0)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)

    async def aclose(self) -> None:
        """Async :meth:`close`."""
        await run_in_worker_thread(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# -- the discovery side -------------------------------------------------------------------------


class _BeaconSending:
    """A Discovery's beacons: the datagram built once from the bound URL, sent every round."""

    def __init__(self, bound_url: str, interval: float, group: str, port: int,
                 to: str | Iterable[str] | None) -> None:
        parts = urllib.parse.urlsplit(bound_url)
        if parts.port is None:
            raise ValueError(f"beacons carry a port: bind a tcp, ws, wss or tls+tcp address, not {bound_url!r}")
        if not isinstance(group, str):
            raise TypeError("group must be a str")
        ipv6 = ":" in (parts.hostname or "")
        if to is None and parts.hostname in ("127.0.0.1", "::1", "localhost"):
            log.warning("discovery bound to %s beacons on the LAN, where nobody can reach it: bind a wildcard "
                        "or LAN address, or keep beacons on loopback with beacon_to='127.255.255.255'", bound_url)
        self.beacon = Beacon(new_instance_id(), parts.port, interval, parts.scheme, group, parts.path)
        self.datagram = encode_beacon(self.beacon)  # raises ValueError for an unsuitable scheme or group
        self.sender = BeaconSender(_beacon_port(port), None if to is None else _as_list(to), ipv6=ipv6)

    def send(self) -> None:
        self.sender.send(self.datagram)

    def close(self) -> None:
        """Say goodbye (announcers forget this service at once), then close."""
        self.sender.send(encode_beacon(replace(self.beacon, bye=True)))
        self.sender.close()


def _beacon_port(port: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"beacon_port must be a UDP port number 1..65535, got {port!r}")
    return port



class _Entry:
    __slots__ = ("missed", "provider")

    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        self.missed = 0


class Discovery(_SocketThread):
    """A discovery service: surveys announcers and keeps the set of live providers.

    Args:
        url: where to bind the SURVEYOR (``"tcp://0.0.0.0:5600"``; port 0 picks one,
            see :attr:`url`). May be omitted with ``beacon=True``: it then binds a
            free TCP port on all IPv4 interfaces (``tcp://0.0.0.0:0``).
        interval: seconds between the starts of two surveys (and two beacons).
        deadline: seconds each survey collects answers (at most ``interval``);
            default: half the interval.
        misses: a provider missing from this many consecutive surveys is dropped.
        beacon: announce this discovery service by UDP every ``interval``, so that
            ``Announcer(..., beacon=True)`` finds it with no address configured:
            IPv4 broadcast on every up, non-loopback interface (and IPv6 all-nodes
            link-local multicast when bound to an IPv6 address such as ``tcp://[::]:0``).
        group: the beacon's group; announcers only follow beacons of their own group.
        beacon_port: UDP port the beacons go to (default :data:`DEFAULT_BEACON_PORT`, 5606).
        beacon_to: send beacons to these hosts instead of the interfaces' broadcast
            addresses (e.g. ``["127.255.255.255"]`` to stay on loopback, or unicast
            addresses across routers).
        **socket_options: extra :class:`nanopy.Socket` options for the SURVEYOR.

    Surveying starts at once, on a background thread. Change callbacks run on that
    thread and must not block for long.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        interval: float = 1.0,
        deadline: float | None = None,
        misses: int = 2,
        beacon: bool = False,
        group: str = "",
        beacon_port: int = DEFAULT_BEACON_PORT,
        beacon_to: str | Iterable[str] | None = None,
        **socket_options: Any,
    ) -> None:
        if url is None:
            if not beacon:
                raise TypeError("Discovery needs the address to bind (e.g. 'tcp://0.0.0.0:5600') or beacon=True")
            url = "tcp://0.0.0.0:0"
        self.interval = _seconds("interval", interval)
        self.deadline = self.interval / 2 if deadline is None else _seconds("deadline", deadline)
        if self.deadline > self.interval:
            raise ValueError(f"deadline ({deadline}) must not exceed interval ({interval})")
        if isinstance(misses, bool) or not isinstance(misses, int):
            raise TypeError("misses must be an int")
        if misses < 1:
            raise ValueError(f"misses must be at least 1, got {misses}")
        self.misses = misses
        self.rounds = 0  #: surveys completed
        self.rejected = 0  #: answers that were not valid version-1 answers
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._live: dict[tuple[str, str], _Entry] = {}
        self._callbacks: list[ChangeCallback] = []
        self._async_waiters: list[Any] = []
        self._wakeup = threading.Event()
        self._survey_requested = self._newcomers = False
        self._closing = False
        socket_options.setdefault("name", "discovery")
        self._beacon: _BeaconSending | None = None
        self._sock = Socket("surveyor", survey_deadline=self.deadline, **socket_options)
        with _closed_on_error(self._sock):
            self._endpoint = self._sock.bind(url)
            self._sock.on_pipe_added(self._newcomer)
            if beacon:
                self._beacon = _BeaconSending(self._endpoint.url, self.interval, group, beacon_port, beacon_to)
        self._start_thread(f"nanopy-discovery {url}")

    @property
    def url(self) -> str:
        """The bound address (with the real port when bound to port 0)."""
        return self._endpoint.url

    @property
    def socket(self) -> Socket:
        """The underlying SURVEYOR socket (for stats and pipe events)."""
        return self._sock

    @property
    def beacons_sent(self) -> int:
        """Beacon datagrams sent so far (0 without ``beacon=True``)."""
        return 0 if self._beacon is None else self._beacon.sender.sent

    def __repr__(self) -> str:
        return f"<nanopy.discovery.Discovery {self.url} {len(self._live)} providers>"

    # -- queries -------------------------------------------------------------------------------
    def services(self) -> dict[str, list[str]]:
        """Live providers: ``{name: [address, ...]}``, best priority first."""
        out: dict[str, list[str]] = {}
        for p in self.providers():
            out.setdefault(p.name, []).append(p.address)
        return out

    def providers(self, name: str | None = None) -> list[Provider]:
        """Live :class:`Provider` records (of one service, or all), sorted by name, priority, address."""
        with self._lock:
            found = [e.provider for e in self._live.values() if name is None or e.provider.name == name]
        return sorted(found, key=lambda p: (p.name, p.priority, p.address))

    def _pick(self, name: str) -> str | None:
        candidates = [e.provider for e in self._live.values() if e.provider.name == name]
        if not candidates:
            return None
        best = min(p.priority for p in candidates)
        return random.choice([p.address for p in candidates if p.priority == best])

    def _lookup_error(self, name: str) -> LookupError:
        known = sorted({k[0] for k in self._live})
        return LookupError(f"no live provider of {name!r}; live services: {', '.join(known) or 'none'}")

    def _resolve_step(self, name: str, end: float | None) -> tuple[str | None, float | None]:
        """One look (lock held): ``(address, None)``, or ``(None, seconds left to wait)``.

        Raises Closed or LookupError when waiting longer cannot help.
        """
        address = self._pick(name)
        if address is not None:
            return address, None
        if self._closing:
            raise Closed("discovery is closed")
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            raise self._lookup_error(name)
        return None, left

    def resolve(self, name: str, *, timeout: float = 0.0) -> str:
        """A random live provider's address among those with the best priority.

        Args:
            timeout: seconds to wait for a provider to appear (0: answer at once;
                ``None``: wait forever).

        Raises:
            LookupError: no live provider (within ``timeout``).
            Closed: the discovery was closed while waiting.
        """
        end = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                address, left = self._resolve_step(name, end)
                if address is not None:
                    return address
                self._changed.wait(left)

    async def aservices(self) -> dict[str, list[str]]:
        """Async :meth:`services` (never blocks; for symmetry in async code)."""
        return self.services()

    async def aresolve(self, name: str, *, timeout: float = 0.0) -> str:
        """Async :meth:`resolve` (trio or asyncio); waiting does not block the event loop."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                address, left = self._resolve_step(name, end)
                if address is not None:
                    return address
                waiter = async_waiter()
                self._async_waiters.append(waiter)
            try:
                await waiter.wait(left)
            finally:
                with self._lock:
                    if waiter in self._async_waiters:
                        self._async_waiters.remove(waiter)

    # -- change notification --------------------------------------------------------------------
    def on_change(self, callback: ChangeCallback) -> ChangeCallback:
        """Call ``callback(name, address, added)`` whenever a provider appears or is dropped.

        Runs on the discovery thread. Returns ``callback`` (usable as a decorator).
        """
        self._callbacks.append(callback)
        return callback

    def survey_now(self) -> None:
        """Start the next survey at once instead of waiting for the interval."""
        self._survey_requested = True
        self._wakeup.set()

    def _newcomer(self, pipe: Any) -> None:
        """A new announcer connected (engine thread): welcome it with a survey between rounds."""
        self._newcomers = True
        self._wakeup.set()

    # -- the survey loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._closing:
            start = time.monotonic()
            if self._beacon is not None:
                self._beacon.send()
            seen: set[tuple[str, str]] = set()
            if not self._survey(seen):
                break
            self._end_round(seen)
            self._pause_until(start + self.interval)
        with self._changed:
            self._wake_waiters()

    def _survey(self, seen: set[tuple[str, str]]) -> bool:
        """One survey, its answers recorded in ``seen``; False once the socket is closed."""
        try:
            for body in self._sock.survey(SURVEY):
                self._answer(body, seen)
        except Closed:
            return False
        except Exception:  # keep surveying whatever happened to this round
            log.exception("discovery survey failed")
        return True

    def _pause_until(self, end: float) -> None:
        """Wait for the next round. Announcers that connected meanwhile get a welcome survey,
        which may add providers but counts no misses. A welcome runs only when it (nearly)
        fits before the next round, so rounds keep their pace and the drop bound holds."""
        while not self._closing:
            left = end - time.monotonic()
            if left <= 0 or not self._wakeup.wait(left):
                return
            self._wakeup.clear()
            if self._survey_requested:
                self._survey_requested = False
                return
            if self._newcomers and end - time.monotonic() >= 0.9 * self.deadline:
                self._newcomers = False
                self._survey(set())

    def _answer(self, body: bytes, seen: set[tuple[str, str]]) -> None:
        try:
            provider = decode_answer(body)
        except ValueError as exc:
            self.rejected += 1
            log.debug("discovery: ignoring an answer: %s", exc)
            return
        key = (provider.name, provider.address)
        seen.add(key)
        with self._changed:
            entry = self._live.get(key)
            if entry is not None:
                old = entry.provider
                entry.provider = Provider(provider.name, provider.address, provider.priority,
                                          provider.metadata, old.first_seen, provider.last_seen)
                entry.missed = 0
                return
            self._live[key] = _Entry(provider)
            self._wake_waiters()
        self._notify(provider.name, provider.address, True)

    def _end_round(self, seen: set[tuple[str, str]]) -> None:
        gone: list[tuple[str, str]] = []
        with self._changed:
            self.rounds += 1
            for key, entry in list(self._live.items()):
                if key in seen:
                    continue
                entry.missed += 1
                if entry.missed >= self.misses:
                    del self._live[key]
                    gone.append(key)
            self._wake_waiters()
        for name, address in gone:
            self._notify(name, address, False)

    def _wake_waiters(self) -> None:
        """Wake every waiting resolve (lock held)."""
        self._changed.notify_all()
        for waiter in self._async_waiters:
            waiter.wake()
        self._async_waiters.clear()

    def _notify(self, name: str, address: str, added: bool) -> None:
        log.info("discovery: %s %s at %s", "found" if added else "lost", name, address)
        for callback in list(self._callbacks):
            try:
                callback(name, address, added)
            except Exception:
                log.exception("discovery: on_change callback %r failed", callback)

    # -- closing -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop surveying and unbind; idempotent. Waiting resolves raise :class:`nanopy.Closed`."""
        with self._changed:
            if self._closing:
                return
            self._closing = True
            self._wake_waiters()
        self._wakeup.set()
        super().close()
        if self._beacon is not None:
            self._beacon.close()


# -- the announcer side ---------------------------------------------------------------------------


class _Followed:
    """A discovery service an announcer dials because it heard its beacons."""

    __slots__ = ("endpoint", "last_heard", "silence", "url")

    def __init__(self, url: str, endpoint: Any, beacon: Beacon) -> None:
        self.url, self.endpoint = url, endpoint
        self.heard(beacon)

    def heard(self, beacon: Beacon) -> None:
        self.last_heard = time.monotonic()
        self.silence = min(BEACON_MISSES * beacon.interval, MAX_SILENCE)


class Announcer(_SocketThread):
    """Announce one service to one or more discovery services.

    Args:
        name: the service name clients resolve.
        address: the URL clients should use to reach the service. A wildcard host
            (``tcp://0.0.0.0:7000``, ``tcp://[::]:7000``) is replaced, in each answer,
            by this host's address on the route to the discovery service that asked.
        connect: the discovery address(es); each is dialled and re-dialled forever.
            May be omitted with ``beacon=True``.
        metadata: optional JSON-serialisable mapping sent with every answer.
        priority: 1 (most preferred) ... 16 (default 8).
        reconnect_interval_max: longest pause between reconnect attempts, so a
            restarted discovery sees the service again quickly.
        beacon: listen for discovery beacons and dial every discovery service of
            ``group`` that is heard, at the beacon's source address; one that stays
            silent for ``BEACON_MISSES`` (3) of its intervals is forgotten.
        group: only follow beacons of this group ("" by default).
        beacon_port: UDP port to listen on (default :data:`DEFAULT_BEACON_PORT`, 5606).
        beacon_bind: local address(es) to listen on: ``0.0.0.0`` and ``::`` by
            default; ``127.255.255.255`` hears only loopback beacons.
        **socket_options: extra :class:`nanopy.Socket` options for the RESPONDENT.

    Answers start at once, on a background thread, until :meth:`close`.
    """

    address: str
    priority: int
    metadata: dict[str, Any]

    def __init__(
        self,
        name: str,
        address: str,
        connect: str | Iterable[str] = (),
        *,
        metadata: Mapping[str, Any] | None = None,
        priority: int = DEFAULT_PRIORITY,
        reconnect_interval_max: float = 1.0,
        beacon: bool = False,
        group: str = "",
        beacon_port: int = DEFAULT_BEACON_PORT,
        beacon_bind: str | Iterable[str] = ("0.0.0.0", "::"),
        **socket_options: Any,
    ) -> None:
        connect = _as_list(connect)
        if not connect and not beacon:
            raise ValueError("Announcer needs a discovery address (connect=...) or beacon=True")
        if not isinstance(group, str):
            raise TypeError("group must be a str")
        self.name = name
        self.group = group
        self.address, self.priority, self.metadata = address, priority, dict(metadata or {})
        self.update()
        self.answered = 0  #: surveys answered
        self.beacons_heard = 0  #: valid beacons of this announcer's group
        self.beacons_refused = 0  #: beacons of new discovery services past MAX_DISCOVERIES
        self._other_group = 0
        self._local_hosts: dict[str, str] = {}  # discovery host -> our address towards it
        self._followed: dict[bytes, _Followed] = {}
        self._follow_lock = threading.Lock()
        self._listener: BeaconListener | None = None
        socket_options.setdefault("reconnect_interval", min(0.1, reconnect_interval_max))
        socket_options.setdefault("name", f"announce {name}")
        self._sock = Socket("respondent", reconnect_interval_max=reconnect_interval_max, **socket_options)
        with _closed_on_error(self._sock):
            for url in connect:
                self._sock.connect(url)
            if beacon:
                self._listener = BeaconListener(_as_list(beacon_bind), _beacon_port(beacon_port), self._heard,
                                                self._forget_silent, name=f"nanopy-beacons {name}")
        self._start_thread(f"nanopy-announce {name}")

    @property
    def socket(self) -> Socket:
        """The underlying RESPONDENT socket."""
        return self._sock

    @property
    def discoveries(self) -> list[str]:
        """URLs of the discovery services this announcer follows by beacon."""
        with self._follow_lock:
            return sorted(f.url for f in self._followed.values())

    @property
    def beacons_ignored(self) -> int:
        """Datagrams on the beacon port that were malformed, foreign or of another group."""
        return self._other_group + (0 if self._listener is None else self._listener.ignored)

    def __repr__(self) -> str:
        return f"<nanopy.discovery.Announcer {self.name!r} at {self.address!r}>"

    def connect(self, url: str) -> None:
        """Announce to one more discovery address."""
        self._sock.connect(url)

    def update(self, *, address: str | None = None, priority: int | None = None,
               metadata: Mapping[str, Any] | None = None) -> None:
        """Change what the next answers say."""
        address = self.address if address is None else address
        priority = self.priority if priority is None else priority
        metadata = self.metadata if metadata is None else dict(metadata)
        answer = encode_answer(self.name, address, priority=priority, metadata=metadata)
        self._answers: dict[str, bytes] = {"": answer}  # keyed by the host replacing a wildcard
        self._wildcard = _has_wildcard_host(address)
        self.address, self.priority, self.metadata = address, priority, metadata

    # -- answering -----------------------------------------------------------------------------
    def _answer_for(self, remote: str) -> bytes:
        """The answer for a survey from ``remote`` (``host:port``): a wildcard host made concrete."""
        if not self._wildcard:
            return self._answers[""]
        local = self._local_host(remote)
        answer = self._answers.get(local)
        if answer is None:
            if len(self._answers) > 64:  # bounded; a few discovery routes in practice
                self._answers = {"": self._answers[""]}
            address = _with_host(self.address, local)
            answer = self._answers[local] = encode_answer(self.name, address, priority=self.priority,
                                                          metadata=self.metadata)
        return answer

    def _local_host(self, remote: str) -> str:
        host = remote.rpartition(":")[0].strip("[]")
        local = self._local_hosts.get(host)
        if local is None:
            local = _route_source(host)
            if len(self._local_hosts) > 64:
                self._local_hosts.clear()
            self._local_hosts[host] = local
        return local

    def _run(self) -> None:
        sock = self._sock
        while True:
            try:
                msg = sock.recv_msg()
                msg.reply(self._answer_for(msg.pipe.remote_address if msg.pipe else ""))
            except Closed:
                return
            except NanopyError:
                log.exception("announcer %s: answering a survey failed", self.name)
                continue
            self.answered += 1

    # -- following beacons (on the listener thread) ------------------------------------------------
    def _heard(self, beacon: Beacon, source: str) -> None:
        if beacon.group != self.group:
            self._other_group += 1
            return
        self.beacons_heard += 1
        with self._follow_lock:
            followed = self._followed.get(beacon.instance)
            if beacon.bye:
                if followed is not None:
                    self._unfollow(beacon.instance, "said goodbye")
                return
            if followed is not None:
                followed.heard(beacon)  # first address heard wins (one connection per discovery)
                return
            if len(self._followed) >= MAX_DISCOVERIES:
                self.beacons_refused += 1
                return
            url = beacon.url(source)
            try:
                endpoint = self._sock.connect(url)
            except (NanopyError, ValueError) as exc:
                self._other_group += 1
                log.debug("announcer %s: cannot dial %s from a beacon: %s", self.name, url, exc)
                return
            self._followed[beacon.instance] = _Followed(url, endpoint, beacon)
        log.info("announcer %s: following discovery service %s", self.name, url)

    def _forget_silent(self, deaf: bool) -> None:
        now = time.monotonic()
        with self._follow_lock:
            for instance, followed in list(self._followed.items()):
                if deaf:  # a flood left beacons unread: silence proves nothing
                    followed.last_heard = now
                elif now - followed.last_heard > followed.silence:
                    self._unfollow(instance, "fell silent")

    def _unfollow(self, instance: bytes, why: str) -> None:
        followed = self._followed.pop(instance)
        log.info("announcer %s: forgetting discovery service %s (%s)", self.name, followed.url, why)
        with contextlib.suppress(NanopyError):
            followed.endpoint.close()

    def close(self) -> None:
        """Stop answering and disconnect; idempotent."""
        if self._listener is not None:
            self._listener.close()
        super().close()


def _has_wildcard_host(address: str) -> bool:
    """True for ``tcp://0.0.0.0:7000``, ``tcp://[::]:7000``, ``tcp://*:7000``, ``tcp://:7000``..."""
    parts = urllib.parse.urlsplit(address)
    try:
        has_port = parts.port is not None
    except ValueError:
        return False
    return has_port and (parts.hostname or "") in WILDCARD_HOSTS


def _with_host(address: str, host: str) -> str:
    parts = urllib.parse.urlsplit(address)
    return parts._replace(netloc=f"{_bracketed(host)}:{parts.port}").geturl()


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _route_source(host: str) -> str:
    """This host's source address on the route to ``host`` (a UDP connect sends nothing)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(ipv6_sockaddr(host, 9) if family == socket.AF_INET6 else (host, 9))
            return sockaddr_host(probe.getsockname())
    except (OSError, NanopyError):
        return "127.0.0.1" if family == socket.AF_INET else "::1"
