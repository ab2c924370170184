"""Service discovery's shared parts: the answer format, constants, and the socket thread.

Owns: the survey/answer wire format (:class:`Provider`, :func:`encode_answer`,
:func:`decode_answer`), the limits and defaults, the background-thread base of
:class:`~nanopy.discovery.Discovery` and :class:`~nanopy.discovery.Announcer`, and
the beacon sending of a Discovery. Public names are re-exported by nanopy.discovery.

May call: the public Socket API, nanopy/discovery/beacon.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .. import _fork
from ..socket.socket import Socket
from ..socket.util import ClosingContext, run_in_worker_thread
from .beacon import Beacon, BeaconSender, encode_beacon
from .signing import Signer

log = logging.getLogger("nanopy.discovery")

FORMAT_VERSION = 1
"""Version of the survey/answer format (the ``"v"`` field)."""

SURVEY = b'{"v":1,"survey":"services"}'
"""The survey body a :class:`Discovery` sends (announcers of an open group answer any survey
body); with a secret it is followed by the signed trailer (``docs/discovery.md``)."""

MAX_ANSWER_SIZE = 65536
DEFAULT_PRIORITY = 8
BEACON_MISSES = 3
"""An announcer forgets a discovery service after this many beacon intervals of silence."""
MAX_SILENCE = 180.0  # ...but after at most this many seconds, whatever interval a beacon claims
MAX_DISCOVERIES = 1024
"""Discovery services one announcer of a signed group follows by beacon, by default (each
costs about 7 KiB, and a dialer while it cannot connect); ``max_discoveries=`` changes it."""
MAX_OPEN_DISCOVERIES = 256
"""The same for an open group, where anyone can make an announcer dial (a flood of made-up
beacons costs at most this many dialers until they fall silent)."""
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
    obj: dict[str, Any] = {"v": FORMAT_VERSION, "name": name, "address": address, "priority": _check_priority(priority)}
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


class _SocketThread(ClosingContext):
    """A socket served by a daemon thread: the closing and context-manager logic
    :class:`Discovery` and :class:`Announcer` share."""

    _sock: Socket
    _thread: threading.Thread

    def _start_thread(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _fork.track(self)

    def _after_fork_in_child(self) -> None:
        """In a forked child (nanopy/_fork.py) the thread is the parent's and gone, the
        socket fork-closed: locks new, nothing of the parent's woken; ``close()`` returns
        at once."""
        _fork.renew_locks(self)

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


# -- the discovery side -------------------------------------------------------------------------


class _BeaconSending:
    """A Discovery's beacons: the datagram built once from the bound URL, sent every round."""

    def __init__(self, bound_url: str, interval: float, group: str, port: int, to: str | Iterable[str] | None,
                 instance: bytes, signer: Signer | None) -> None:
        parts = urllib.parse.urlsplit(bound_url)
        if parts.port is None:
            raise ValueError(f"beacons carry a port: bind a tcp, ws, wss or tls+tcp address, not {bound_url!r}")
        if not isinstance(group, str):
            raise TypeError("group must be a str")
        ipv6 = ":" in (parts.hostname or "")
        if to is None and parts.hostname in ("127.0.0.1", "::1", "localhost"):
            log.warning(
                "discovery bound to %s beacons on the LAN, where nobody can reach it: bind a wildcard "
                "or LAN address, or keep beacons on loopback with beacon_to='127.255.255.255'",
                bound_url,
            )
        self.beacon = Beacon(instance, parts.port, interval, parts.scheme, group, parts.path)
        self._signer = signer
        self.datagram = encode_beacon(self.beacon)  # raises ValueError for an unsuitable scheme or group
        self.sender = BeaconSender(_beacon_port(port), None if to is None else _as_list(to), ipv6=ipv6)

    def send(self) -> None:
        self.sender.send(self.datagram if self._signer is None else self._signed(self.beacon))

    def _signed(self, beacon: Beacon) -> Callable[[], bytes]:
        """Each copy signed afresh (a new stamp and counter), so no copy replays another."""
        return lambda: encode_beacon(beacon, self._signer)

    def close(self) -> None:
        """Say goodbye (announcers forget this service at once), then close."""
        bye = replace(self.beacon, bye=True)
        self.sender.send(encode_beacon(bye) if self._signer is None else self._signed(bye))
        self.sender.close()


def _beacon_port(port: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"beacon_port must be a UDP port number 1..65535, got {port!r}")
    return port
