"""The :class:`Announcer` of service discovery (re-exported by nanopy.discovery).

Owns: a RESPONDENT that answers surveys with this process's services, the
discovery services it follows by beacon, and the address it announces for each
surveyor (a wildcard bind answered with the route's source address).

May call: the public Socket API, nanopy/discovery/beacon.py, nanopy/discovery/services.py.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.errors import Closed, NanopyError
from ..socket.socket import Socket
from ..transports.tcp import ipv6_sockaddr, sockaddr_host
from .beacon import DEFAULT_BEACON_PORT, Beacon, BeaconListener, new_instance_id
from .services import (
    BEACON_MISSES,
    DEFAULT_PRIORITY,
    MAX_DISCOVERIES,
    MAX_OPEN_DISCOVERIES,
    MAX_SILENCE,
    WILDCARD_HOSTS,
    _as_list,
    _beacon_port,
    _closed_on_error,
    _SocketThread,
    encode_answer,
)
from .signing import KIND_ANSWER, KIND_BEACON, KIND_SURVEY, Dropped, SecretSource, drop_counts, group_keys

log = logging.getLogger("nanopy.discovery")


class _Followed:
    """A discovery service an announcer dials because it heard its beacons."""

    __slots__ = ("endpoint", "host", "last_heard", "last_surveyed", "silence", "since", "url")

    def __init__(self, url: str, host: str, endpoint: Any, beacon: Beacon) -> None:
        self.url, self.host, self.endpoint = url, host, endpoint
        self.since = time.monotonic()
        self.last_surveyed = 0.0  # monotonic time of its latest verified survey (signed groups)
        self.heard(beacon)

    def unproven(self, now: float) -> bool:
        """Dialled for a while, and no verified survey came through that connection lately:
        it may have been a replay sent from an address the real service does not have."""
        window = 2 * min(self.silence, MAX_SILENCE) / BEACON_MISSES + 1.0
        return now - self.since > window and now - self.last_surveyed > window

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
        secret: the group secret (bytes, or the path of a key file; see
            ``docs/security.md``): only signed beacons are followed, only signed
            surveys are answered, and answers are signed; drops are counted by
            reason (:meth:`stats`). Without one the group is open (a WARNING is
            logged once per process).
        max_discoveries: follow at most this many discovery services by beacon
            (default :data:`MAX_DISCOVERIES`, 1024, with a secret; :data:`MAX_OPEN_DISCOVERIES`,
            256, without); beacons of new ones beyond it are counted in ``beacons_refused``.
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
        secret: SecretSource | None = None,
        max_discoveries: int | None = None,
        **socket_options: Any,
    ) -> None:
        self._signer, self._verifier = group_keys(secret, "Announcer", new_instance_id())
        if max_discoveries is None:
            max_discoveries = MAX_OPEN_DISCOVERIES if self._signer is None else MAX_DISCOVERIES
        if isinstance(max_discoveries, bool) or not isinstance(max_discoveries, int) or max_discoveries < 1:
            raise ValueError(f"max_discoveries must be an int >= 1, got {max_discoveries!r}")
        self.max_discoveries = max_discoveries
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
        self.beacons_refused = 0  #: beacons of new discovery services past max_discoveries
        self.redialled = 0  #: followed discovery services dialled again at a newer beacon's address
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
                self._listener = BeaconListener(
                    _as_list(beacon_bind),
                    _beacon_port(beacon_port),
                    self._heard,
                    self._forget_silent,
                    name=f"nanopy-beacons {name}",
                    verifier=self._verifier,
                )
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

    @property
    def signed(self) -> bool:
        """True when this announcer has a secret (its group is closed)."""
        return self._signer is not None

    def stats(self) -> dict[str, Any]:
        """Counters: ``answered``, ``beacons_heard``, ``beacons_ignored``,
        ``beacons_refused``, ``beacons_relayed`` (unicast beacons handed on to this
        host's other listeners), ``redialled``, ``discoveries`` (followed now), and, by
        reason (``unsigned``, ``bad_signature``, ``stale``, ``replayed``; all 0
        without a secret), ``beacons_dropped`` and ``surveys_dropped`` (surveys left
        unanswered)."""
        with self._follow_lock:
            followed = len(self._followed)
        return {"signed": self.signed, "answered": self.answered, "beacons_heard": self.beacons_heard,
                "beacons_ignored": self.beacons_ignored, "beacons_refused": self.beacons_refused,
                "redialled": self.redialled, "discoveries": followed,
                "beacons_relayed": 0 if self._listener is None else self._listener.relayed,
                "beacons_dropped": dict(drop_counts(self._verifier, KIND_BEACON)),
                "surveys_dropped": dict(drop_counts(self._verifier, KIND_SURVEY))}

    def __repr__(self) -> str:
        return f"<nanopy.discovery.Announcer {self.name!r} at {self.address!r}>"

    def connect(self, url: str) -> None:
        """Announce to one more discovery address."""
        self._sock.connect(url)

    def update(
        self, *, address: str | None = None, priority: int | None = None, metadata: Mapping[str, Any] | None = None
    ) -> None:
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
            answer = self._answers[local] = encode_answer(
                self.name, address, priority=self.priority, metadata=self.metadata
            )
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

    def _signed_reply(self, survey: bytes, remote: str) -> bytes | None:
        """The answer to ``survey``, signed and bound to it; None when the survey does not verify."""
        assert self._verifier is not None and self._signer is not None
        try:
            opened = self._verifier.open(KIND_SURVEY, survey)
        except Dropped as exc:  # (counted by the verifier)
            log.debug("announcer %s: not answering a survey from %s: %s", self.name, remote, exc)
            return None
        with self._follow_lock:
            followed = self._followed.get(opened.instance)
            if followed is not None and remote.rpartition(":")[0].strip("[]") == followed.host:
                followed.last_surveyed = time.monotonic()
        return self._signer.sign(KIND_ANSWER, self._answer_for(remote), opened.nonce)

    def _run(self) -> None:
        sock = self._sock
        while True:
            try:
                msg = sock.recv_msg()
                remote = msg.pipe.remote_address if msg.pipe else ""
                if self._signer is None:
                    msg.reply(self._answer_for(remote))
                else:
                    answer = self._signed_reply(msg.body, remote)
                    if answer is None:
                        continue
                    msg.reply(answer)
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
                followed.heard(beacon)  # first address heard wins (one connection per discovery)...
                if self._signer is None or source == followed.host or not followed.unproven(time.monotonic()):
                    return
                # ...unless, in a signed group, no verified survey came through it: the first
                # beacon may have been a replay from another address. Dial the newer one.
                self._unfollow(beacon.instance, f"no signed survey came from it; now heard from {source}")
                self.redialled += 1
            if len(self._followed) >= self.max_discoveries:
                self.beacons_refused += 1
                return
            url = beacon.url(source)
            try:
                endpoint = self._sock.connect(url)
            except (NanopyError, ValueError) as exc:
                self._other_group += 1
                log.debug("announcer %s: cannot dial %s from a beacon: %s", self.name, url, exc)
                return
            self._followed[beacon.instance] = _Followed(url, source, endpoint, beacon)
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
