"""A ZMTP connection's handshake: greeting, security mechanism, metadata, ZAP credentials.

Owns: what the handshake learns and needs, made by ``ZmtpHandshake.__init__``:
the mechanism, the peer's version, Socket-Type, Identity and credentials (PLAIN
user, CURVE key; a PLAIN password only until the gate admitted the peer) and the
cipher CURVE agreed on. The connection (nanopy/transports/zmtp/_conn.py) keeps
the framed I/O: it runs :meth:`ZmtpHandshake.run` once and takes the version and
the cipher from it.

May call: the connection's byte stream (``recv_some``/``send_all``, given to
``__init__``) and its ``gate`` (nanopy/transports/_base.py, ``Connection.gate``),
with the connection itself as the gate's argument.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ...core.errors import Refused, RemoteProtocolError
from ...core.wire import other_wire
from . import _codec as codec
from ._curve import Cipher, z85_decode
from ._mechanisms import Mechanism, make_mechanism
from ._roles import Role, describe_peers

if TYPE_CHECKING:
    from .._base import Connection, Gate, PipeContext


class ZmtpHandshake:
    """One connection's handshake and what it learned of the peer.

    Attributes:
        mechanism: the security mechanism (NULL, PLAIN or CURVE).
        minor: the peer's ZMTP minor version (0 for a 3.0 peer, 1 for 3.1).
        peer_type: the peer's Socket-Type (``b"PULL"``, ...) once done.
        peer_identity: the Identity the peer announced (``b""`` if none).
        peer_user: the PLAIN user name a client gave us, or None.
        peer_curve_key: the peer's CURVE public key (Z85), or None.
        plain_credentials: a PLAIN client's (user, password), kept for the gate's
            ZAP request until admitted.
        cipher: CURVE's sealer and opener (None: frames go in the clear).
    """

    def __init__(
        self,
        owner: Connection,
        ctx: PipeContext,
        role: Role,
        recv_some: Callable[[int], Awaitable[bytes]],
        send_all: Callable[[bytes], Awaitable[Any]],
        is_ipc: Callable[[], bool],
    ) -> None:
        self._owner = owner  # (its ``gate``, and the argument the gate gets)
        self._options = ctx.options
        self._role = role
        self._recv_some = recv_some
        self._send_all = send_all
        self._is_ipc = is_ipc
        self.remote_address = owner.remote_address
        self.mechanism: Mechanism = make_mechanism(ctx.options)
        self.minor = 1
        self.peer_type = b""
        self.peer_identity = b""
        self.peer_user: str | None = None
        self.peer_curve_key: str | None = None
        self.plain_credentials: tuple[bytes, bytes] | None = None
        self.cipher: Cipher | None = None
        self._greeted = False  # the peer sent its first bytes

    @property
    def gate(self) -> Gate | None:
        """The listener's gate (set on the connection by its endpoint), or None."""
        return self._owner.gate

    async def run(self) -> None:
        """Greetings, the mechanism's commands, metadata; raises if the peer is refused."""
        mech = self.mechanism
        await self._send_all(codec.encode_greeting(mech.name, mech.as_server))
        signature = await self.read_exact(codec.SIGNATURE_SIZE, "greeting")
        codec.check_signature(signature, self._is_ipc())
        self.minor = self._role.minor = codec.parse_version(await self.read_exact(2, "greeting"))
        codec.parse_mechanism(await self.read_exact(codec.GREETING_SIZE - 12, "greeting"), mech.name)
        props = await mech.handshake(self, self._metadata())
        try:
            self._check_peer(props)
        except RemoteProtocolError as exc:
            # Tell the peer why before closing (RFC 37's ERROR); it may not listen.
            frame = _error_command(str(exc))
            try:
                await self._send_all(frame if self.cipher is None else self.cipher.seal(frame))
            except OSError:
                pass
            raise

    async def read_exact(self, n: int, what: str) -> bytes:
        data = b""
        first = not self._greeted  # (``data`` is what the peer sent first)
        while len(data) < n:
            try:
                chunk = await self._recv_some(n - len(data))
            except ConnectionResetError as exc:
                # An SP peer sends its header, reads our greeting and resets: name it.
                raise self._sp_peer(data, first) or RemoteProtocolError(
                    f"connection reset during the ZMTP {what}: {exc}") from None
            if not chunk:
                if not data and what == "greeting" and not self._greeted:
                    raise EOFError("peer closed before the ZMTP greeting")
                raise self._sp_peer(data, first) or RemoteProtocolError(f"peer closed during the ZMTP {what}")
            data += chunk
            self._greeted = True
        return data

    def _sp_peer(self, data: bytes, first: bool) -> RemoteProtocolError | None:
        """The error naming an SP peer when the peer's first bytes are an SP header."""
        return other_wire(data, "ZMTP", self._is_ipc()) if first else None

    async def read_command(self) -> tuple[bytes, bytes]:
        """One command frame of the handshake (an ERROR command raises its reason)."""
        head = await self.read_exact(2, "handshake")
        flags = head[0]
        if not flags & codec.COMMAND or flags & codec.MORE or flags & 0xF8:
            raise RemoteProtocolError(f"expected a ZMTP command during the handshake, got flags 0x{flags:02x}")
        if flags & codec.LONG:
            size = int.from_bytes(head[1:] + await self.read_exact(7, "handshake"), "big")
        else:
            size = head[1]
        if size > 1 << 16:
            raise RemoteProtocolError(f"a {size}-byte command during the ZMTP handshake")
        name, data = codec.split_command(await self.read_exact(size, "handshake"))
        if name == b"ERROR":
            reason = data[1 : 1 + data[0]].decode("utf-8", "replace") if data else ""
            raise RemoteProtocolError(f"the ZMTP peer refused the handshake: {reason or 'no reason given'}")
        return name, data

    async def write(self, data: bytes) -> None:
        await self._send_all(data)

    async def admit(self, props: dict[str, bytes]) -> None:
        """Server side, before our READY: ask the listener's gate (if any) about the
        peer, whose credentials and metadata (``props``) are known now. A refusal
        goes to the peer as an ERROR command (RFC 37) and raises."""
        self.peer_identity = props.get("identity", b"")
        gate = self.gate
        if gate is None:
            return
        try:
            reason = await gate(self._owner)
        finally:
            self.plain_credentials = None  # (no password outlives the handshake)
        if reason is not None:
            await self.refuse(reason)

    async def refuse(self, reason: str) -> None:
        """Send ERROR with ``reason`` (as much as its 255 bytes hold), then raise."""
        try:
            await self._send_all(_error_command(reason))
        except OSError:
            pass  # (it may not listen)
        raise Refused(reason)

    def zap_credentials(self) -> tuple[str, tuple[bytes, ...]]:
        """The mechanism's name and credentials as a ZAP request carries them (RFC 27)."""
        name = self.mechanism.name.decode()
        if name == "PLAIN" and self.plain_credentials is not None:
            return name, self.plain_credentials
        if name == "CURVE" and self.peer_curve_key is not None:
            return name, (z85_decode(self.peer_curve_key),)
        return name, ()

    def peer_details(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism.name.decode().lower(), "user": self.peer_user,
                "curve_key": self.peer_curve_key, "routing_id": self.peer_identity or None}

    def _metadata(self) -> list[tuple[bytes, bytes]]:
        props = [(b"Socket-Type", self._role.zmq_type)]
        identity = self._options.get("identity")
        if identity:
            props.append((b"Identity", identity.encode() if isinstance(identity, str) else bytes(identity)))
        return props

    def _check_peer(self, props: dict[str, bytes]) -> None:
        peer = props.get("socket-type", b"")
        role = self._role
        if peer not in role.peers:
            shown = peer.decode("ascii", "replace") or "(none)"
            raise RemoteProtocolError(
                f"a ZeroMQ {shown} socket is not a valid peer of a nanopy {role.zmq_type.decode().lower()} "
                f"socket (it talks to {describe_peers(role)})"
            )
        self.peer_type = peer
        self.peer_identity = props.get("identity", b"")


def _error_command(reason: str) -> bytes:
    """An ERROR command with ``reason`` (as much as its 255 bytes hold)."""
    data = reason.encode("utf-8", "replace")[:255]
    return codec.encode_command(b"ERROR", bytes((len(data),)) + data)
