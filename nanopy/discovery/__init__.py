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
``group`` that it hears, at the beacon's source address (see ``nanopy.discovery.beacon``)::

    disco = Discovery(beacon=True)                                   # on any host
    Announcer("echo", "tcp://0.0.0.0:7000", beacon=True)             # on each service host

The answer format is JSON (UTF-8), versioned and language-neutral, so any SP
library can announce a service (see ``docs/discovery.md``)::

    {"v": 1, "name": "echo", "address": "tcp://10.0.0.2:7000", "priority": 8,
     "metadata": {"zone": "ny"}}
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from ..core.errors import Closed
from ..socket.socket import Socket
from .announcer import Announcer
from .beacon import DEFAULT_BEACON_PORT, new_instance_id
from .live import LiveProviders
from .services import BEACON_MISSES as BEACON_MISSES  # (the module's constants stay importable here)
from .services import DEFAULT_PRIORITY as DEFAULT_PRIORITY
from .services import (
    FORMAT_VERSION,
    SURVEY,
    ChangeCallback,
    Provider,
    _BeaconSending,
    _closed_on_error,
    _seconds,
    _SocketThread,
    decode_answer,
    encode_answer,
)
from .services import MAX_ANSWER_SIZE as MAX_ANSWER_SIZE
from .services import MAX_DISCOVERIES as MAX_DISCOVERIES
from .services import MAX_OPEN_DISCOVERIES as MAX_OPEN_DISCOVERIES
from .services import MAX_SILENCE as MAX_SILENCE
from .services import WILDCARD_HOSTS as WILDCARD_HOSTS
from .signing import KIND_ANSWER, KIND_SURVEY, Dropped, SecretSource, drop_counts, group_keys, split_signed
from .signing import MAX_SKEW as MAX_SKEW

__all__ = [
    "DEFAULT_BEACON_PORT",
    "FORMAT_VERSION",
    "SURVEY",
    "Announcer",
    "Discovery",
    "Provider",
    "decode_answer",
    "encode_answer",
]

log = logging.getLogger("nanopy.discovery")


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
        secret: the group secret (bytes, or the path of a key file; see
            ``docs/security.md``): beacons, surveys and answers are signed, and answers
            that do not verify are dropped and counted (:meth:`stats`). Without one
            the group is open (a WARNING is logged once per process).
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
        secret: SecretSource | None = None,
        **socket_options: Any,
    ) -> None:
        self._instance = new_instance_id()
        self._signer, self._verifier = group_keys(secret, "Discovery", self._instance)
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
        self.answers = 0  #: answers taken (valid, and verified when there is a secret)
        self._live = LiveProviders(misses)  # the providers, the waiting resolves, the closed flag
        self._callbacks: list[ChangeCallback] = []
        self._wakeup = threading.Event()
        self._survey_requested = self._newcomers = False
        socket_options.setdefault("name", "discovery")
        self._beacon: _BeaconSending | None = None
        self._sock = Socket("surveyor", survey_deadline=self.deadline, **socket_options)
        with _closed_on_error(self._sock):
            self._endpoint = self._sock.bind(url)
            self._sock.on_pipe_added(self._newcomer)
            if beacon:
                self._beacon = _BeaconSending(self._endpoint.url, self.interval, group, beacon_port, beacon_to,
                                              self._instance, self._signer)
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

    @property
    def signed(self) -> bool:
        """True when this discovery service has a secret (its group is closed)."""
        return self._signer is not None

    def stats(self) -> dict[str, Any]:
        """Counters: ``rounds``, ``beacons_sent``, ``answers`` (taken), ``rejected``
        (malformed answers), ``providers`` (live now) and ``dropped``: answers that
        failed verification, by reason (``unsigned``, ``bad_signature``, ``stale``,
        ``replayed``, ``wrong_survey``; all 0 without a secret)."""
        return {"signed": self.signed, "rounds": self.rounds, "beacons_sent": self.beacons_sent,
                "answers": self.answers, "rejected": self.rejected, "providers": len(self._live),
                "dropped": dict(drop_counts(self._verifier, KIND_ANSWER))}

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
        return self._live.providers(name)

    def resolve(self, name: str, *, timeout: float = 0.0) -> str:
        """A random live provider's address among those with the best priority.

        Args:
            timeout: seconds to wait for a provider to appear (0: answer at once;
                ``None``: wait forever).

        Raises:
            LookupError: no live provider (within ``timeout``).
            Closed: the discovery was closed while waiting.
        """
        return self._live.resolve(name, timeout)

    async def aservices(self) -> dict[str, list[str]]:
        """Async :meth:`services` (never blocks; for symmetry in async code)."""
        return self.services()

    async def aresolve(self, name: str, *, timeout: float = 0.0) -> str:
        """Async :meth:`resolve` (trio or asyncio); waiting does not block the event loop."""
        return await self._live.aresolve(name, timeout)

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
        while not self._live.closed:
            start = time.monotonic()
            if self._beacon is not None:
                self._beacon.send()
            seen: set[tuple[str, str]] = set()
            if not self._survey(seen):
                break
            self._end_round(seen)
            self._pause_until(start + self.interval)
        self._live.wake_all()

    def _survey(self, seen: set[tuple[str, str]]) -> bool:
        """One survey, its answers recorded in ``seen``; False once the socket is closed."""
        nonce = b""
        survey = SURVEY
        if self._signer is not None:  # each survey its own nonce: its answers cannot be replayed into another
            nonce = os.urandom(16)
            survey = self._signer.sign(KIND_SURVEY, SURVEY, nonce)
        try:
            for body in self._sock.survey(survey):
                self._answer(body, seen, nonce)
        except Closed:
            return False
        except Exception:  # keep surveying whatever happened to this round
            log.exception("discovery survey failed")
        return True

    def _pause_until(self, end: float) -> None:
        """Wait for the next round. Announcers that connected meanwhile get a welcome survey,
        which may add providers but counts no misses. A welcome runs only when it (nearly)
        fits before the next round, so rounds keep their pace and the drop bound holds."""
        while not self._live.closed:
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

    def _answer(self, body: bytes, seen: set[tuple[str, str]], nonce: bytes) -> None:
        try:
            if self._verifier is not None:
                payload = self._verifier.open(KIND_ANSWER, body, nonce).payload
            else:
                payload = split_signed(body).payload
        except Dropped as exc:  # (counted by the verifier)
            log.debug("discovery: dropping an answer: %s", exc)
            return
        try:
            provider = decode_answer(payload)
        except ValueError as exc:
            self.rejected += 1
            log.debug("discovery: ignoring an answer: %s", exc)
            return
        self.answers += 1
        seen.add((provider.name, provider.address))
        if self._live.record(provider):
            self._notify(provider.name, provider.address, True)

    def _end_round(self, seen: set[tuple[str, str]]) -> None:
        self.rounds += 1  # (counted before the drops: whoever sees one sees its round counted)
        for name, address in self._live.end_round(seen):
            self._notify(name, address, False)

    def _notify(self, name: str, address: str, added: bool) -> None:
        log.info("discovery: %s %s at %s", "found" if added else "lost", name, address)
        for callback in list(self._callbacks):
            try:
                callback(name, address, added)
            except Exception:
                log.exception("discovery: on_change callback %r failed", callback)

    # -- closing -----------------------------------------------------------------------------------
    def _after_fork_in_child(self) -> None:
        """Inherited by a forked child: closed there, and it knows no provider (what it
        knew was the parent's, never refreshed here): lookups raise Closed."""
        super()._after_fork_in_child()
        self._live.after_fork_in_child()

    def close(self) -> None:
        """Stop surveying and unbind; idempotent. Waiting resolves raise :class:`nanopy.Closed`."""
        if not self._live.close():
            return
        self._wakeup.set()
        super().close()
        if self._beacon is not None:
            self._beacon.close()


# -- the announcer side ---------------------------------------------------------------------------


# The public names keep their public home (reprs, pickles, docs).
for _public in (Announcer, Provider, decode_answer, encode_answer):
    _public.__module__ = __name__
del _public
