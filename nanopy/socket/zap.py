"""ZAP (ZeroMQ RFC 27), the server side: a bind with ``zap_domain=`` asks a ZAP
handler about each connection, over ``inproc://zeromq.zap.01``.

The gate (nanopy/socket/gate.py) builds a :class:`ZapRequest` from the finished
handshake and hands it to the process's :class:`ZapClient`, which sends it as one
multipart message (:class:`~nanopy.zmtp.Multipart`, the RFC's frames without the
delimiter a REQ socket adds itself) on a nanopy REQ socket and waits for the
handler's :class:`ZapReply`. Any nanopy REP (or raw REP) bound at the address is a
handler: :class:`nanopy.auth.ZapAuthenticator` is one; a hand-written one calls
``recv_multipart()`` and ``send_multipart()``. nanopy's inproc is nanopy's own, so
a handler must be a nanopy socket (pyzmq's authenticators answer libzmq sockets).

The REQ socket is one per process, made at the first request; its ``request()``
is thread-safe, and each request runs in a worker thread of its gate, so a slow
handler holds up only the handshakes that wait for it.

May call: the Socket API (a REQ socket), the inproc table (is a handler bound?).
"""

from __future__ import annotations

import itertools
import struct
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .. import _fork
from ..core.errors import Closed, RemoteProtocolError, Timeout
from ..core.message import Multipart
from ..transports import inproc

if TYPE_CHECKING:
    from .socket import Socket

#: where a ZAP handler binds (RFC 27)
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
#: the status codes of RFC 27: success, temporary error, refusal, internal error
STATUS_CODES = ("200", "300", "400", "500")
_U32 = struct.Struct(">I")


@runtime_checkable
class ZapCredentials(Protocol):
    """A connection whose handshake had a mechanism with credentials (ZMTP)."""

    def zap_credentials(self) -> tuple[str, tuple[bytes, ...]]:
        """The ZAP mechanism name and credential frames of the peer."""
        ...


def _text(frame: bytes, what: str) -> str:
    try:
        return frame.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"the {what} frame is not ASCII text") from None


def encode_metadata(metadata: Mapping[str, bytes]) -> bytes:
    """ZMTP metadata (name length, name, 4-byte value length, value) of a mapping."""
    out = []
    for name, value in metadata.items():
        key = name.encode("ascii")
        if not 0 < len(key) < 256:
            raise ValueError(f"metadata name {name!r} must be 1 to 255 ASCII characters")
        out.append(bytes((len(key),)) + key + _U32.pack(len(value)) + bytes(value))
    return b"".join(out)


def parse_metadata(data: bytes) -> dict[str, bytes]:
    """The properties of ZMTP metadata, names as written (ValueError if malformed)."""
    from ..transports.zmtp._codec import iter_metadata

    try:
        return {_text(name, "metadata name"): value for name, value in iter_metadata(data)}
    except RemoteProtocolError as exc:
        raise ValueError(str(exc)) from None


@dataclass(frozen=True)
class ZapRequest:
    """One ZAP request (RFC 27), as a handler receives it.

    Attributes:
        domain: the bind's ``zap_domain``.
        address: the client's IP address (tcp-based transports), else its socket
            path (ipc) or inproc name.
        identity: the ZMTP Identity the client announced (``b""`` if none).
        mechanism: ``"NULL"``, ``"PLAIN"`` or ``"CURVE"`` (SP transports: ``"NULL"``).
        credentials: PLAIN: ``(user, password)``; CURVE: ``(32-byte public key,)``;
            NULL: ``()``.
        request_id: the id the reply must echo.
        version: ``"1.0"``.
    """

    domain: str
    address: str
    identity: bytes = b""
    mechanism: str = "NULL"
    credentials: tuple[bytes, ...] = ()
    request_id: bytes = b""
    version: str = "1.0"

    @property
    def user(self) -> str | None:
        """The PLAIN user name (None for other mechanisms)."""
        ok = self.mechanism == "PLAIN" and len(self.credentials) > 0
        return self.credentials[0].decode("utf-8", "replace") if ok else None

    @property
    def password(self) -> str | None:
        """The PLAIN password (None for other mechanisms)."""
        ok = self.mechanism == "PLAIN" and len(self.credentials) > 1
        return self.credentials[1].decode("utf-8", "replace") if ok else None

    @property
    def curve_key(self) -> str | None:
        """The CURVE client's public key as Z85 text (None for other mechanisms)."""
        if self.mechanism != "CURVE" or not self.credentials or len(self.credentials[0]) != 32:
            return None
        from ..transports.zmtp._curve import z85_encode

        return z85_encode(self.credentials[0])

    def frames(self) -> list[bytes]:
        """The message frames (without the REQ socket's delimiter)."""
        return [self.version.encode(), self.request_id, self.domain.encode(), self.address.encode(),
                self.identity, self.mechanism.encode(), *self.credentials]

    @classmethod
    def from_frames(cls, frames: Iterable[bytes]) -> ZapRequest:
        """Parse a request's frames (a REP handler's ``recv_multipart()``).

        Raises:
            ValueError: too few frames, a version other than 1.0, or text that is
                not ASCII.
        """
        f = [bytes(x) for x in frames]
        if len(f) < 6:
            raise ValueError(f"a ZAP request has at least 6 frames, not {len(f)}")
        version = _text(f[0], "version")
        if version != "1.0":
            raise ValueError(f"ZAP version {version!r} (want '1.0')")
        return cls(domain=_text(f[2], "domain"), address=f[3].decode("utf-8", "replace"), identity=f[4],
                   mechanism=_text(f[5], "mechanism"), credentials=tuple(f[6:]), request_id=f[1],
                   version=version)


@dataclass(frozen=True)
class ZapReply:
    """One ZAP reply (RFC 27), as a handler sends it.

    Attributes:
        status_code: ``"200"`` admits; ``"300"`` (temporary error), ``"400"``
            (refused) and ``"500"`` (internal error) refuse.
        status_text: why, for the server's log.
        user_id: who the client is, for the application (``peer.zap_user``).
        metadata: properties for the application (``peer.zap_metadata``).
        request_id: the request's id, echoed.
        version: ``"1.0"``.
    """

    status_code: str
    status_text: str = ""
    user_id: str = ""
    metadata: Mapping[str, bytes] = field(default_factory=dict)
    request_id: bytes = b""
    version: str = "1.0"

    @classmethod
    def to(cls, request: ZapRequest, status_code: str, status_text: str = "", user_id: str = "",
           metadata: Mapping[str, bytes] | None = None) -> ZapReply:
        """The reply to ``request`` (its id echoed)."""
        return cls(status_code, status_text, user_id, dict(metadata or {}), request.request_id)

    @property
    def ok(self) -> bool:
        """True for status 200 (the client is admitted)."""
        return self.status_code == "200"

    def frames(self) -> list[bytes]:
        """The message frames (without the REP socket's delimiter)."""
        return [self.version.encode(), self.request_id, self.status_code.encode(),
                self.status_text.encode("utf-8"), self.user_id.encode("utf-8"), encode_metadata(self.metadata)]

    @classmethod
    def from_frames(cls, frames: Iterable[bytes]) -> ZapReply:
        """Parse a reply's frames.

        Raises:
            ValueError: not 6 frames, a version other than 1.0, an unknown status
                code, or malformed metadata.
        """
        f = [bytes(x) for x in frames]
        if len(f) != 6:
            raise ValueError(f"a ZAP reply has 6 frames, not {len(f)}")
        version, code = _text(f[0], "version"), _text(f[2], "status code")
        if version != "1.0":
            raise ValueError(f"ZAP version {version!r} (want '1.0')")
        if code not in STATUS_CODES:
            raise ValueError(f"status code {code!r} (want one of {', '.join(STATUS_CODES)})")
        return cls(code, f[3].decode("utf-8", "replace"), f[4].decode("utf-8", "replace"),
                   MappingProxyType(parse_metadata(f[5])), f[1], version)


def handler_bound() -> bool:
    """True if a socket of this process binds ``inproc://zeromq.zap.01`` now."""
    return inproc.listening(ZAP_ENDPOINT[len("inproc://"):])


class ZapClient:
    """The process's ZAP requester: one REQ socket, made at the first request."""

    def __init__(self) -> None:
        self._reset()
        _fork.reset_in_child(self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._sock: Socket | None = None
        self._ids = itertools.count(1)

    def _socket(self) -> Socket:
        with self._lock:
            sock = self._sock
            if sock is None or sock.closed:
                from .socket import Socket  # (a function-level import: socket.py imports the gate)

                # A handler that restarts is found again within half a second.
                sock = self._sock = Socket("req", name="zap-client", reconnect_interval=0.05,
                                           reconnect_interval_max=0.5, connect=ZAP_ENDPOINT)
            return sock

    def next_id(self) -> bytes:
        """A fresh request id."""
        with self._lock:
            return str(next(self._ids)).encode()

    def ask(self, request: ZapRequest, timeout: float) -> ZapReply | str:
        """The handler's reply, or why there is none (blocks: a worker thread calls it)."""
        if not handler_bound():
            return f"no ZAP handler is bound at {ZAP_ENDPOINT} (start a nanopy.auth.ZapAuthenticator)"
        try:
            body: Any = self._socket().request(Multipart(request.frames()), timeout=timeout)
        except Timeout:
            return f"the ZAP handler did not answer within {timeout:.3g} s"
        except Closed:
            return "the ZAP client socket closed"
        try:
            reply = ZapReply.from_frames(body.parts if isinstance(body, Multipart) else [body])
        except ValueError as exc:
            return f"malformed ZAP reply: {exc}"
        if reply.request_id != request.request_id:
            return "the ZAP reply echoes another request id"
        return reply


#: the process's client
client = ZapClient()
