"""Who is on the other end of a pipe: the :class:`Peer` value.

A transport's handshake learns the peer's address and credentials; the socket
freezes them into one ``Peer`` per pipe (``pipe.peer``), which a bind's gate
(``authorize=``) sees before the pipe joins the socket and which stays on the
pipe for a server to authorize each request by.

May call: nothing (a value type).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: the security mechanisms a peer can have come through
MECHANISMS = ("null", "plain", "curve", "tls")


@dataclass(frozen=True)
class Peer:
    """What the handshake established about the remote end of one pipe.

    Attributes:
        address: the remote ``"host:port"`` (tcp-based transports; IPv6 hosts in
            brackets), the socket path (ipc) or the name (inproc).
        transport: the URL scheme of the endpoint (``"tcp"``, ``"ipc"``,
            ``"inproc"``, ``"ws"``, ``"wss"``, ``"tls+tcp"``, ``"zmtp+tcp"``, ...).
        mechanism: ``"null"`` (no security), ``"plain"`` and ``"curve"`` (ZMTP
            mechanisms) or ``"tls"`` (tls+tcp, wss).
        user: the PLAIN user name the client gave (on the server side), else None.
        curve_key: the peer's CURVE long-term public key, Z85 text (on a server the
            client's key; on a client the server's), else None.
        certificate: the peer's certificate as :meth:`ssl.SSLSocket.getpeercert`
            returns it, when TLS verified one (a client certificate on a server that
            asks for them; the server's on a verifying client), else None.
        routing_id: the ZMTP Identity the peer announced (bytes), else None.
        zap_user: the user id a ZAP handler's 200 reply gave for the peer (a bind
            with ``zap_domain=``; ``""`` when it gave none), else None.
        zap_metadata: the metadata that reply carried, by property name as the
            handler wrote it (a read-only mapping of bytes), else None.
    """

    address: str
    transport: str
    mechanism: str = "null"
    user: str | None = None
    curve_key: str | None = None
    certificate: dict[str, Any] | None = None
    routing_id: bytes | None = None
    zap_user: str | None = None
    zap_metadata: Mapping[str, bytes] | None = None

    @property
    def host(self) -> str | None:
        """The IP address part of ``address`` (tcp-based transports), else None."""
        return address_host(self.address) if self.transport not in ("ipc", "inproc", "zmtp+ipc") else None


def address_host(address: str) -> str | None:
    """``"1.2.3.4"`` of ``"1.2.3.4:5"``, ``"::1"`` of ``"[::1]:5"`` (None if no port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or None
