"""A ZAP handler (ZeroMQ RFC 27) in the shape of pyzmq's ``zmq.auth``.

:class:`ZapAuthenticator` answers the ZAP requests of every nanopy bind made with
``zap_domain=`` in this process, on ``inproc://zeromq.zap.01``: address lists,
PLAIN passwords and CURVE keys per domain, and a method to override for any other
decision. See docs/api.md ("ZAP") and docs/security.md ("Notes for zmq.auth users").
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from .core.errors import Closed
from .core.message import Multipart
from .socket.socket import Socket
from .socket.zap import ZAP_ENDPOINT, ZapReply, ZapRequest
from .transports.zmtp._curve import as_key

__all__ = ["CURVE_ALLOW_ANY", "ZAP_ENDPOINT", "ZapAuthenticator", "ZapReply", "ZapRequest"]

ZapReply.__module__ = ZapRequest.__module__ = __name__  # (shown as nanopy.auth.X)

log = logging.getLogger("nanopy")

#: ``configure_curve(location=CURVE_ALLOW_ANY)``: any client that knows the server key
CURVE_ALLOW_ANY = "*"


def _address_matcher(item: str) -> Any:
    """An IP network for an address or CIDR block; the text itself for anything else
    (an ipc path or inproc name, compared as it is)."""
    try:
        return ipaddress.ip_network(item, strict=False)
    except ValueError:
        return item


def _matches(address: str, entries: Iterable[Any]) -> bool:
    try:
        ip: Any = ipaddress.ip_address(address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    except ValueError:
        ip = None
    for entry in entries:
        if isinstance(entry, str):
            if entry == address:
                return True
        elif ip is not None and ip.version == entry.version and ip in entry:
            return True
    return False


def load_public_keys(directory: str | Path) -> frozenset[bytes]:
    """The public keys of the ``*.key`` certificate files in ``directory`` (the
    files pyzmq's ``zmq.auth.create_certificates`` writes)."""
    if not Path(directory).is_dir():
        raise ValueError(f"{str(directory)!r} is no directory of certificate files (for one key, pass {{key}})")
    keys = set()
    for path in sorted(Path(directory).glob("*.key")):
        for line in path.read_text().splitlines():
            name, sep, value = line.strip().partition("=")
            if sep and name.strip() == "public-key":
                keys.add(as_key(value.strip().strip('"'), f"the public key in {path}"))
    return frozenset(keys)


class ZapAuthenticator:
    """A ZAP handler on ``inproc://zeromq.zap.01``, run in a thread of its own.

    The shape of pyzmq's ``zmq.auth.thread.ThreadAuthenticator``: :meth:`start`,
    :meth:`stop` (or ``with``), :meth:`allow`, :meth:`deny`, :meth:`configure_plain`,
    :meth:`configure_curve`. It answers the binds of this process made with
    ``zap_domain=``. Decisions, in order (:meth:`authenticate`):

    1. the address: a denied one is refused; with any ``allow`` entries, only those
       are admitted (unlike zmq.auth, both lists may be set; deny wins);
    2. the mechanism: NULL is admitted; PLAIN needs the user's password in the
       domain's table (or the ``"*"`` table); CURVE needs the client's key in the
       domain's set (or ``"*"``'s), or :data:`CURVE_ALLOW_ANY`.

    The user id of a PLAIN client is its user name, of a CURVE client its key (Z85).
    Override :meth:`authenticate` for other decisions (call ``super()`` for these).
    Configuration may change while it runs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._allow: tuple[Any, ...] = ()
        self._deny: tuple[Any, ...] = ()
        self._passwords: dict[str, dict[str, str]] = {}
        self._curve: dict[str, frozenset[bytes] | str] = {}
        self._sock: Socket | None = None
        self._thread: threading.Thread | None = None

    # -- configuration -------------------------------------------------------------
    def allow(self, *addresses: str) -> None:
        """Admit only these client addresses; adds to earlier calls.

        Args:
            *addresses: IP addresses, CIDR blocks, ipc paths or inproc names.
        """
        with self._lock:
            self._allow += tuple(_address_matcher(a) for a in addresses)

    def deny(self, *addresses: str) -> None:
        """Refuse these client addresses; adds to earlier calls (deny wins over allow).

        Args:
            *addresses: as for :meth:`allow`.
        """
        with self._lock:
            self._deny += tuple(_address_matcher(a) for a in addresses)

    def configure_plain(self, domain: str = "*", passwords: Mapping[str, str] | None = None) -> None:
        """PLAIN clients of ``domain`` must give one of these user names with its password.

        Args:
            domain: the bind's ``zap_domain`` (``"*"``: any domain without its own table).
            passwords: password by user name (None: nobody).
        """
        with self._lock:
            self._passwords[domain] = dict(passwords or {})

    def configure_curve(self, domain: str = "*", location: str | Path | Iterable[Any] = CURVE_ALLOW_ANY) -> None:
        """CURVE clients of ``domain`` must have one of these public keys.

        Args:
            domain: the bind's ``zap_domain`` (``"*"``: any domain without its own set).
            location: :data:`CURVE_ALLOW_ANY`; a directory of ``*.key`` certificate
                files (pyzmq's); or public keys (Z85 text, or 32 raw bytes).
        """
        keys: frozenset[bytes] | str
        if isinstance(location, str) and location == CURVE_ALLOW_ANY:
            keys = CURVE_ALLOW_ANY
        elif isinstance(location, (str, Path)):
            keys = load_public_keys(location)
        else:
            keys = frozenset(as_key(k, "a CURVE public key") for k in location)
        with self._lock:
            self._curve[domain] = keys

    # -- the decision ----------------------------------------------------------------
    def authenticate(self, request: ZapRequest) -> ZapReply:
        """The reply to one request (runs in the handler's thread; override to decide
        otherwise). An exception is answered with status 500.

        Args:
            request: the parsed ZAP request.

        Returns:
            The reply (:meth:`ZapReply.to` echoes the request id).
        """
        with self._lock:
            allow, deny = self._allow, self._deny
            passwords = self._passwords.get(request.domain, self._passwords.get("*"))
            curve = self._curve.get(request.domain, self._curve.get("*"))
        if deny and _matches(request.address, deny):
            return ZapReply.to(request, "400", f"address {request.address} is denied")
        if allow and not _matches(request.address, allow):
            return ZapReply.to(request, "400", f"address {request.address} is not allowed")
        if request.mechanism == "NULL":
            return ZapReply.to(request, "200", "OK")
        if request.mechanism == "PLAIN":
            if passwords is None:
                return ZapReply.to(request, "400", f"no passwords for domain {request.domain!r}")
            user, password = request.user, request.password
            if user is None or user not in passwords or passwords[user] != password:
                return ZapReply.to(request, "400", "invalid user name or password")
            return ZapReply.to(request, "200", "OK", user)
        if request.mechanism == "CURVE":
            key = request.curve_key
            if curve is None or key is None:
                return ZapReply.to(request, "400", f"no CURVE keys for domain {request.domain!r}")
            if curve != CURVE_ALLOW_ANY and request.credentials[0] not in curve:
                return ZapReply.to(request, "400", f"unknown CURVE key {key}")
            return ZapReply.to(request, "200", "OK", key)
        return ZapReply.to(request, "400", f"mechanism {request.mechanism!r} is not supported")

    def _reply(self, frames: list[bytes]) -> ZapReply:
        try:
            request = ZapRequest.from_frames(frames)
        except ValueError as exc:
            log.warning("ZapAuthenticator: a malformed request: %s", exc)
            return ZapReply("500", f"malformed request: {exc}", request_id=frames[1] if len(frames) > 1 else b"")
        try:
            reply = self.authenticate(request)
        except Exception as exc:  # noqa: BLE001 - a failing decision refuses, and says why
            log.exception("ZapAuthenticator: authenticate() failed for %s", request.address)
            return ZapReply.to(request, "500", f"internal error: {exc!r}")
        log.debug("ZapAuthenticator: %s %s %s: %s %s", request.domain, request.mechanism, request.address,
                  reply.status_code, reply.status_text)
        return reply

    # -- the thread --------------------------------------------------------------------
    def start(self) -> None:
        """Bind ``inproc://zeromq.zap.01`` and answer requests in a daemon thread.

        Raises:
            AddressInUse: another handler is bound in this process.
            RuntimeError: already started.
        """
        if self._thread is not None:
            raise RuntimeError("ZapAuthenticator already started")
        sock = Socket("rep", name="zap-handler", bind=ZAP_ENDPOINT)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, args=(sock,), name="nanopy-zap", daemon=True)
        self._thread.start()

    def _serve(self, sock: Socket) -> None:
        while True:
            try:
                frames = sock.recv_multipart(timeout=None)
                sock.send(Multipart(self._reply(frames).frames()))
            except Closed:
                return

    def stop(self) -> None:
        """Unbind and end the thread (idempotent)."""
        sock, thread = self._sock, self._thread
        self._sock = self._thread = None
        if sock is not None:
            sock.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(10)

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._thread is not None

    def __enter__(self) -> ZapAuthenticator:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
