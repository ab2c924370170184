"""A bind's gate: who may become a pipe (``authorize=``, ``allow=``, ``deny=``).

ZeroMQ's ZAP (RFC 27) as a Python callable and address lists. The endpoint asks
the gate about every accepted connection once its handshake has established the
peer (a ZMTP connection asks before its READY, so a refusal is an ERROR command);
a refused connection is closed before the socket sees it, logged once per peer
host and interval, and counted in ``stats().auth_failures``.

``authorize`` runs in a worker thread (``trio.to_thread``), a few at a time per
bind, so a slow one holds up only the handshakes waiting for it, never the
socket's pipes; the handshake's ``handshake_timeout`` bounds it.

With ``zap_domain=`` the gate also asks the process's ZAP handler (RFC 27,
nanopy/socket/zap.py), in the same worker threads. The order: ``deny``/``allow``,
then ZAP, then ``authorize`` (which sees the handler's user id and metadata on
the peer); the first refusal ends it. A ZAP refusal tells a ZMTP peer only the
status code (what libzmq clients read); the log has the handler's text.

May call: nothing of the socket (the endpoint counts and closes).
"""

from __future__ import annotations

import ipaddress
import logging
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import trio

from ..core.errors import AddressError
from ..core.peer import Peer, address_host
from ..transports._base import Connection
from . import zap

log = logging.getLogger("nanopy")

#: schemes whose peers have an IP address (``allow=``/``deny=`` apply)
IP_SCHEMES = frozenset({"tcp", "tls+tcp", "ws", "wss", "zmtp+tcp"})
#: one WARNING per refused peer host per this many seconds (repeats at DEBUG)
LOG_INTERVAL = 10.0
#: hosts remembered for that; past it the expired ones are forgotten (memory stays flat)
LOG_MEMORY = 4096
#: ``authorize`` calls one bind runs at once (the others' handshakes wait)
THREADS = 4

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def make_peer(conn: Connection, scheme: str, gate: Gate | None = None) -> Peer:
    """The :class:`Peer` of a connection whose handshake is done (or under way);
    with the ZAP handler's user id and metadata if ``gate`` asked one."""
    address = conn.remote_address
    if scheme == "inproc" and address.startswith("inproc://"):
        address = address[len("inproc://"):]
    zapped = {} if gate is None else gate.zap_answer(conn)
    return Peer(address=address, transport=scheme, **conn.peer_details(), **zapped)


def _zap_domain(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"zap_domain= takes a str, not {type(value).__name__}")
    if not 0 < len(value) <= 255 or not value.isascii():
        raise ValueError("zap_domain= must be 1 to 255 ASCII characters (RFC 27)")
    return value


def _networks(value: Any, what: str) -> tuple[Network, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{what}= takes a list of addresses or CIDR blocks (e.g. ['10.0.0.0/8']), "
                        f"not {type(value).__name__}")
    nets = []
    for item in value:
        try:
            nets.append(ipaddress.ip_network(str(item), strict=False))
        except ValueError:
            raise AddressError(f"{what}=: {item!r} is not an IP address or CIDR block "
                               "(e.g. '192.168.1.7' or '10.0.0.0/8')") from None
    return tuple(nets)


class Gate:
    """The admission check of one bound endpoint (see the module docstring)."""

    def __init__(self, name: str, url: str, authorize: Any = None, allow: Any = None, deny: Any = None,
                 zap_domain: Any = None, timeout: float = 10.0) -> None:
        scheme = url.partition("://")[0]
        if authorize is not None and not callable(authorize):
            raise TypeError("authorize= takes a callable(peer) -> bool | str")
        if (allow is not None or deny is not None) and scheme not in IP_SCHEMES:
            raise AddressError(f"allow=/deny= need a transport whose peers have an IP address "
                               f"({', '.join(sorted(IP_SCHEMES))}); {scheme}:// has none: "
                               "use authorize= to check its peers")
        self.name = name
        self.scheme = scheme
        self.authorize: Callable[[Peer], Any] | None = authorize
        self.allow = None if allow is None else _networks(allow, "allow")
        self.deny = () if deny is None else _networks(deny, "deny")
        #: the ZAP domain (None: no ZAP) and the request timeout's upper bound
        self.zap_domain = None if zap_domain is None else _zap_domain(zap_domain)
        self.timeout = timeout
        # what the handler's 200 said per connection, until its Peer is made
        self._zapped: weakref.WeakKeyDictionary[Connection, dict[str, Any]] = weakref.WeakKeyDictionary()
        self._limiter = trio.CapacityLimiter(THREADS)
        self._next_log: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def address_refusal(self, address: str) -> str | None:
        """Why ``allow``/``deny`` refuse the peer at ``address`` (None: they admit it)."""
        if self.allow is None and not self.deny:
            return None
        host = address_host(address)
        try:
            ip = ipaddress.ip_address(host or "")
        except ValueError:
            return f"address {address!r} cannot be checked against allow=/deny="
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in self.deny):
            return f"address {ip} is denied"
        if self.allow is not None and not any(ip in net for net in self.allow):
            return f"address {ip} is not allowed"
        return None

    def refuse_early(self, conn: Connection) -> str | None:
        """Before the handshake: the address lists' refusal, logged (None: go on)."""
        reason = self.address_refusal(conn.remote_address)
        if reason is not None:
            self._log(conn.remote_address, reason)
        return reason

    async def __call__(self, conn: Connection) -> str | None:
        """After the handshake (ZMTP: before its READY): the reason to refuse, or None."""
        peer = make_peer(conn, self.scheme)
        reason = told = self.address_refusal(peer.address)
        failure = None
        if reason is None and self.zap_domain is not None:
            reason, told = await self._ask_zap(conn, peer)
            if reason is None:
                peer = make_peer(conn, self.scheme, self)  # (authorize sees the ZAP answer)
        if reason is None and self.authorize is not None:
            reason, failure = await self._ask(peer)
            told = reason
        if reason is not None:
            self._log(peer.address, reason, failure)
        return told

    def zap_answer(self, conn: Connection) -> dict[str, Any]:
        """``zap_user``/``zap_metadata`` of an admitted connection (``{}``: no ZAP)."""
        return self._zapped.get(conn, {})

    async def _ask_zap(self, conn: Connection, peer: Peer) -> tuple[str | None, str | None]:
        """(reason to log, what the peer is told), or (None, None) for a 200."""
        assert self.zap_domain is not None
        mechanism: str = "NULL"
        credentials: tuple[bytes, ...] = ()
        if isinstance(conn, zap.ZapCredentials):
            mechanism, credentials = conn.zap_credentials()
        request = zap.ZapRequest(self.zap_domain, peer.host or peer.address, peer.routing_id or b"", mechanism,
                                 credentials, zap.client.next_id())
        # The handshake's deadline bounds the wait; the request gives up a little
        # earlier, so that the refusal is ours (and reaches the peer), not a timeout.
        left = min(trio.current_effective_deadline() - trio.current_time(), self.timeout)
        wait = max(left - min(0.5, left / 10), 0.0)
        answer = await trio.to_thread.run_sync(zap.client.ask, request, wait, limiter=self._limiter,
                                               abandon_on_cancel=True)
        if isinstance(answer, str):
            return f"ZAP: {answer}", "500"
        if not answer.ok:
            return f"ZAP handler said {answer.status_code} {answer.status_text}".rstrip(), answer.status_code
        try:
            self._zapped[conn] = {"zap_user": answer.user_id, "zap_metadata": answer.metadata}
        except TypeError:
            pass  # (a plug-in connection without weak references: its peer lacks the ZAP answer)
        return None, None

    async def _ask(self, peer: Peer) -> tuple[str | None, Exception | None]:
        """``authorize``'s verdict as (refusal reason or None, what it raised)."""
        fn = self.authorize
        assert fn is not None
        try:
            answer = await trio.to_thread.run_sync(fn, peer, limiter=self._limiter, abandon_on_cancel=True)
        except Exception as exc:  # noqa: BLE001 - a failing gate refuses (and says why)
            return f"authorize raised {exc!r}", exc
        if answer is True:
            return None, None
        if isinstance(answer, str):
            return answer or "refused by authorize", None
        if answer is False:
            return "refused by authorize", None
        return f"authorize returned {answer!r} (want True, False or a reason)", None

    def _log(self, address: str, reason: str, exc: BaseException | None = None) -> None:
        """One WARNING per peer host per LOG_INTERVAL; the repeats go to DEBUG."""
        key = address_host(address) or address
        now = time.monotonic()
        if now < self._next_log.get(key, 0.0):
            self._quiet[key] = self._quiet.get(key, 0) + 1
            log.debug("%s: refused %s on %s://: %s", self.name, address, self.scheme, reason)
            return
        if len(self._next_log) >= LOG_MEMORY:
            for old in [k for k, t in self._next_log.items() if t <= now]:
                del self._next_log[old]
                self._quiet.pop(old, None)
            if len(self._next_log) >= LOG_MEMORY:
                self._next_log.clear()
                self._quiet.clear()
        self._next_log[key] = now + LOG_INTERVAL
        quiet = self._quiet.pop(key, 0)
        more = f" (and {quiet} more refusals of {key} since, logged at DEBUG)" if quiet else ""
        log.warning("%s: refused %s on %s://: %s%s", self.name, address, self.scheme, reason, more,
                    exc_info=exc)
