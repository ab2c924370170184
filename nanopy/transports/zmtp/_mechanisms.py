"""ZMTP security mechanisms: NULL (RFC 37) and PLAIN (RFC 24).

A mechanism runs after the greetings and returns the peer's metadata. The
server side of PLAIN is whichever endpoint was given ``plain_auth`` or
``plain_server=True`` (a bind whose ZAP handler checks the password); the client
side is the endpoint given ``plain=(user, password)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ...core.errors import AuthenticationFailed, RemoteProtocolError
from . import _codec as codec

if TYPE_CHECKING:
    from ._handshake import ZmtpHandshake

log = logging.getLogger("nanopy")

Metadata = list[tuple[bytes, bytes]]


class Mechanism(Protocol):
    name: bytes
    as_server: bool

    async def handshake(self, conn: ZmtpHandshake, metadata: Metadata) -> dict[str, bytes]:
        """Run the mechanism's commands; return the peer's metadata."""
        ...


def _error(reason: str) -> bytes:
    data = reason.encode()[:255]
    return codec.encode_command(b"ERROR", bytes((len(data),)) + data)


async def expect(conn: ZmtpHandshake, wanted: bytes) -> bytes:
    name, data = await conn.read_command()
    if name != wanted:
        raise RemoteProtocolError(
            f"ZMTP handshake: expected {wanted.decode()}, got {name.decode('ascii', 'replace')!r}"
        )
    return data


class Null:
    """No security: both sides send READY with their metadata."""

    name = b"NULL"
    as_server = False

    async def handshake(self, conn: ZmtpHandshake, metadata: Metadata) -> dict[str, bytes]:
        if conn.gate is not None:  # a gated listener hears the peer out before admitting it
            props = codec.parse_metadata(await expect(conn, b"READY"))
            await conn.admit(props)
            await conn.write(codec.encode_command(b"READY", codec.encode_metadata(metadata)))
            return props
        await conn.write(codec.encode_command(b"READY", codec.encode_metadata(metadata)))
        return codec.parse_metadata(await expect(conn, b"READY"))


class PlainClient:
    """PLAIN, client side: HELLO with the credentials, WELCOME, INITIATE, READY."""

    name = b"PLAIN"
    as_server = False

    def __init__(self, user: bytes, password: bytes) -> None:
        self.user = user
        self.password = password

    async def handshake(self, conn: ZmtpHandshake, metadata: Metadata) -> dict[str, bytes]:
        hello = bytes((len(self.user),)) + self.user + bytes((len(self.password),)) + self.password
        await conn.write(codec.encode_command(b"HELLO", hello))
        await expect(conn, b"WELCOME")
        await conn.write(codec.encode_command(b"INITIATE", codec.encode_metadata(metadata)))
        return codec.parse_metadata(await expect(conn, b"READY"))


class PlainServer:
    """PLAIN, server side: the credentials go to ``auth(user, password) -> bool``
    and, with no ``auth`` or besides it, to the listener's gate (its ZAP handler)."""

    name = b"PLAIN"
    as_server = True

    def __init__(self, auth: Callable[[str, str], bool] | None) -> None:
        self.auth = auth

    async def handshake(self, conn: ZmtpHandshake, metadata: Metadata) -> dict[str, bytes]:
        hello = await expect(conn, b"HELLO")
        try:
            n = hello[0]
            user = hello[1 : 1 + n]
            m = hello[1 + n]
            password = hello[2 + n : 2 + n + m]
            if len(password) != m or len(hello) != 2 + n + m:
                raise IndexError
        except IndexError:
            raise RemoteProtocolError("malformed PLAIN HELLO command") from None
        if self.auth is None:
            ok = conn.gate is not None  # (the gate's ZAP handler checks the password: never none at all)
        else:
            try:
                ok = bool(self.auth(user.decode("utf-8", "replace"), password.decode("utf-8", "replace")))
            except Exception:
                log.exception("zmtp: the plain_auth callable failed; refusing %s", conn.remote_address)
                ok = False
        if not ok:
            await conn.write(_error("Invalid username or password"))
            raise AuthenticationFailed(f"PLAIN: credentials of user {user.decode('utf-8', 'replace')!r} refused")
        conn.peer_user = user.decode("utf-8", "replace")
        if conn.gate is not None:
            conn.plain_credentials = (user, password)  # (for a ZAP request; dropped once admitted)
        await conn.write(codec.encode_command(b"WELCOME"))
        props = codec.parse_metadata(await expect(conn, b"INITIATE"))
        await conn.admit(props)  # (after INITIATE: the gate sees the Identity too)
        await conn.write(codec.encode_command(b"READY", codec.encode_metadata(metadata)))
        return props


def _text(value: Any, what: str) -> bytes:
    data = value.encode() if isinstance(value, str) else bytes(value)
    if len(data) > 255:
        raise ValueError(f"{what} is longer than 255 bytes (PLAIN's limit)")
    return data


def check_options(options: Mapping[str, Any]) -> None:
    """Refuse bad endpoint options (identity, security) at bind/connect."""
    identity = options.get("identity")
    if identity is not None:
        if not isinstance(identity, (str, bytes, bytearray, memoryview)):
            raise TypeError("identity= takes bytes or str")
        data = identity.encode() if isinstance(identity, str) else bytes(identity)
        if not 0 < len(data) <= 255 or data[0] == 0:
            raise ValueError("identity= must be 1 to 255 bytes, not starting with a zero byte (RFC 37)")
    plain = options.get("plain")
    if plain is not None:
        if not (isinstance(plain, tuple) and len(plain) == 2):
            raise TypeError("plain= takes a (user, password) tuple")
        _text(plain[0], "the PLAIN user name")
        _text(plain[1], "the PLAIN password")
    auth = options.get("plain_auth")
    if auth is not None and not callable(auth):
        raise TypeError("plain_auth= takes a callable(user, password) -> bool")
    server = options.get("plain_server")
    if server is not None and not isinstance(server, bool):
        raise TypeError("plain_server= takes True or False")
    if plain is not None and (auth is not None or server):
        raise TypeError("an endpoint is either a PLAIN client (plain=) or a PLAIN server (plain_auth=, "
                        "plain_server=True), not both")
    curve = [key for key in options if key.startswith("curve_") and options[key] is not None]
    if curve:
        if plain is not None or auth is not None or server:
            raise TypeError("an endpoint uses one security mechanism: PLAIN or CURVE, not both")
        from ._curve import make_curve

        if options.get("curve_server_key") is None and options.get("curve_secret_key") is None:
            raise TypeError(
                "CURVE needs curve_server_key= (a client) or curve_secret_key= without it (a server)"
            )
        make_curve(options)  # the keys are checked now (and PyNaCl is there)


def make_mechanism(options: Mapping[str, Any]) -> Mechanism:
    if any(key.startswith("curve_") for key in options):
        from ._curve import make_curve

        curve = make_curve(options)
        if curve is not None:
            return curve
    plain = options.get("plain")
    if plain is not None:
        return PlainClient(_text(plain[0], "user"), _text(plain[1], "password"))
    auth = options.get("plain_auth")
    if auth is not None or options.get("plain_server"):
        return PlainServer(auth)
    return Null()
