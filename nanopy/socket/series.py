"""The metric series of sockets: which series each socket counts in, and what the
sockets that left a series counted there (nanopy.metrics exports them;
docs/metrics.md, "Series").

A series is a label set: the socket's ``name`` when one was set (else
:data:`UNNAMED`, so sockets without a name share one series per protocol) and
its protocol. Prometheus counters only go up for the life of the process, so a
socket's counts stay in its series when it leaves: when its close has finished,
when it is renamed (it counts in the new series from zero), or, never closed,
when it is garbage-collected (with what the last collection read of it). A
series' counter is what its leavers left plus what its live members count now;
its gauges are the sum over its live members.

The documented internal API: :func:`live_sockets` (every socket not yet closed
for good, in creation order) and :func:`collect`. Sockets call :func:`join`,
:func:`renamed` and :func:`leave`.

Locks: the registry's lock is taken before any socket's (``stats()``), never
after one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _fork
from ..core.stats import GAUGE_FIELDS, SocketStats

if TYPE_CHECKING:
    from .socket import Socket

log = logging.getLogger("nanopy")

#: the ``socket`` label of the sockets that have no ``name``: one series per protocol
UNNAMED = "(unnamed)"

#: a series: (socket label, protocol)
SeriesKey = tuple[str, str]
#: counters by (SocketStats field, reason); the reason is "" for a plain number
Counts = dict[tuple[str, str], int]

# per snapshot class (a test may subclass it): its counter fields, each with whether
# it counts by reason (a Mapping), found once from a blank snapshot
_counter_fields: dict[type, tuple[tuple[str, bool], ...]] = {}


def _fields_of(cls: type[SocketStats]) -> tuple[tuple[str, bool], ...]:
    blank = cls()
    found = tuple(
        (f.name, isinstance(getattr(blank, f.name), Mapping))
        for f in dataclasses.fields(cls)
        if f.name not in GAUGE_FIELDS and isinstance(getattr(blank, f.name), (int, Mapping))
        and not isinstance(getattr(blank, f.name), bool)
    )
    _counter_fields[cls] = found
    return found


def counts_of(stats: SocketStats) -> Counts:
    """Every counter of a snapshot: each number, and each Mapping by reason."""
    out: Counts = {}
    fields = _counter_fields.get(stats.__class__) or _fields_of(stats.__class__)
    for name, by_reason in fields:
        value = getattr(stats, name)
        if by_reason:
            for reason, n in value.items():
                out[(name, reason)] = n
        else:
            out[(name, "")] = value
    return out


def series_key(sock: Socket) -> SeriesKey:
    """The series ``sock`` counts in now."""
    return (str(sock.name) if sock._named else UNNAMED), sock.protocol


@dataclass
class Series:
    """One series as a collection found it.

    Attributes:
        key: its labels, ``(socket, protocol)``.
        counters: by (SocketStats field, reason): what every socket that was ever in
            it counted there.
        gauges: by SocketStats field (:data:`~nanopy.core.stats.GAUGE_FIELDS`): the sum
            over its live sockets.
    """

    key: SeriesKey
    counters: Counts
    gauges: dict[str, int]


class _Member:
    """A socket in its series: ``base`` is what it had counted when it joined this
    series (after a rename), ``seen`` what the last look at it read."""

    __slots__ = ("ref", "key", "base", "seen")

    def __init__(self, ref: weakref.ref[Any], key: SeriesKey) -> None:
        self.ref = ref
        self.key = key
        self.base: Counts = {}
        self.seen: Counts = {}

    def add_counted(self, into: Counts, counts: Counts) -> None:
        """Add what this member counts in its series (``counts`` less ``base``) to ``into``."""
        base = self.base
        for key, n in counts.items():
            if n:  # (most counters of most sockets are 0: nothing to add)
                into[key] = into.get(key, 0) + n - base.get(key, 0)


class SeriesRegistry:
    """Every socket's series, and what left each series (one per process)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._members: dict[int, _Member] = {}  # by socket serial: creation order
        self._left: dict[SeriesKey, Counts] = {}  # every series ever, in the order it appeared
        self._gone: list[int] = []  # serials of sockets collected unclosed (weakref callbacks)

    def _here(self) -> threading.Lock:
        """The lock, after making sure the registry is this process's (a forked child
        may call in before its at-fork handler has run: the parent's lock may be held)."""
        if self._pid != os.getpid():
            self.forked()
        return self._lock

    def join(self, sock: Socket) -> None:
        serial = sock._serial
        gone = self._gone
        ref = weakref.ref(sock, lambda _: gone.append(serial))  # (list.append: safe in any thread, any lock)
        key = series_key(sock)
        with self._here():
            self._members[serial] = _Member(ref, key)
            self._left.setdefault(key, {})

    def renamed(self, sock: Socket) -> None:
        with self._here():
            member = self._members.get(sock._serial)
            if member is None:
                return  # (named in its constructor: it joins under that name)
            key = series_key(sock)
            if key == member.key:
                return
            counts = counts_of(sock.stats())
            member.add_counted(self._left[member.key], counts)
            member.base = member.seen = counts
            member.key = key
            self._left.setdefault(key, {})

    def leave(self, sock: Socket) -> None:
        if sock._driver.fork_closed:
            return  # inherited across a fork: the child's registry starts afresh
        with self._here():
            member = self._members.pop(sock._serial, None)
            if member is not None:
                member.add_counted(self._left[member.key], counts_of(sock.stats()))

    def _sweep(self) -> None:
        """Sockets collected without a close leave with what was last read of them (lock held)."""
        gone = self._gone
        while gone:
            member = self._members.pop(gone.pop(), None)
            if member is not None:
                member.add_counted(self._left[member.key], member.seen)

    def live_sockets(self) -> list[Socket]:
        with self._lock:
            self._sweep()
            return [sock for member in self._members.values() if (sock := member.ref()) is not None]

    def collect(self) -> list[Series]:
        with self._lock:
            self._sweep()
            found = {key: Series(key, dict(left), dict.fromkeys(GAUGE_FIELDS, 0)) for key, left in self._left.items()}
            for member in self._members.values():
                series = found[member.key]
                sock = member.ref()
                if sock is not None:
                    try:
                        stats = sock.stats()
                    except Exception:  # a socket in a state no scrape must break on: its last counts stand
                        log.debug("metrics: cannot read %r", sock, exc_info=True)
                    else:
                        member.seen = counts_of(stats)
                        for name in GAUGE_FIELDS:
                            series.gauges[name] += getattr(stats, name)
                # (collected meanwhile: what it counted stays, until the sweep moves it to _left)
                member.add_counted(series.counters, member.seen)
            return list(found.values())

    def forked(self) -> None:
        """In a child process: a new process, with series of its own."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._members.clear()
        self._left.clear()
        self._gone.clear()


_registry = SeriesRegistry()
join = _registry.join
renamed = _registry.renamed
leave = _registry.leave
collect = _registry.collect
#: every socket of this process not yet closed for good (its close has not finished),
#: in creation order
live_sockets = _registry.live_sockets

_fork.reset_in_child(_registry.forked)
