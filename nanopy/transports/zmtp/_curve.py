"""CURVE security for ZMTP (RFC 25 over the CurveZMQ handshake of RFC 26).

Needs PyNaCl (libsodium): ``pip install 'nanopy[curve]'``. Keys are 32 bytes,
given as Z85 text (``str`` or 40 ``bytes``, as libzmq and pyzmq print them) or
raw. The server side is whichever endpoint has ``curve_secret_key`` and no
``curve_server_key``; the client names the server's public key.

After the handshake every frame travels as a MESSAGE command whose box holds a
flags octet (MORE, COMMAND) and the frame's body: :class:`Cipher` seals and
opens them with short nonces that must strictly increase in each direction.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ...core.errors import AuthenticationFailed, RemoteProtocolError
from . import _codec as codec

if TYPE_CHECKING:
    from ._handshake import ZmtpHandshake
    from ._mechanisms import Metadata

EXTRA_HINT = "CURVE needs PyNaCl: pip install 'nanopy[curve]'"


def _nacl() -> Any:
    try:
        import nacl.bindings
    except ImportError:
        raise ImportError(EXTRA_HINT) from None
    return nacl.bindings


# -- Z85 (ZeroMQ RFC 32) ---------------------------------------------------------------
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85)}
_U32 = struct.Struct(">I")


def z85_encode(data: bytes) -> str:
    """Z85 text of ``data`` (its length a multiple of 4)."""
    if len(data) % 4:
        raise ValueError("Z85 encodes a multiple of 4 bytes")
    out = []
    for (value,) in _U32.iter_unpack(data):
        chars = []
        for _ in range(5):
            value, r = divmod(value, 85)
            chars.append(_Z85[r])
        out.append("".join(reversed(chars)))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    if len(text) % 5:
        raise ValueError("Z85 text has a multiple of 5 characters")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i : i + 5]:
            value = value * 85 + _Z85_INDEX[c]
        if value > 0xFFFFFFFF:
            raise ValueError("not Z85 text")
        out += _U32.pack(value)
    return bytes(out)


def as_key(value: Any, what: str) -> bytes:
    """A 32-byte key from Z85 text (str or 40 bytes) or 32 raw bytes."""
    if isinstance(value, str):
        value = value.encode("ascii", "replace")
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if len(raw) == 32:
            return raw
        if len(raw) == 40:
            try:
                return z85_decode(raw.decode("ascii"))
            except (ValueError, KeyError, UnicodeDecodeError):
                pass
    raise ValueError(f"{what} must be 32 raw bytes or 40 characters of Z85 text (as curve_keypair() gives)")


def curve_keypair() -> tuple[str, str]:
    """A new CURVE key pair as Z85 text: ``(public, secret)``.

    Raises:
        ImportError: PyNaCl is missing (``pip install 'nanopy[curve]'``).
    """
    public, secret = _nacl().crypto_box_keypair()
    return z85_encode(public), z85_encode(secret)


def public_key(secret: Any) -> str:
    """The Z85 public key that belongs to a secret key."""
    return z85_encode(_nacl().crypto_scalarmult_base(as_key(secret, "the secret key")))


# -- after the handshake ------------------------------------------------------------------
class Cipher:
    """Seals outgoing frames and opens incoming MESSAGE boxes of one connection."""

    def __init__(self, nacl: Any, shared: bytes, client: bool, sent: int, heard: int) -> None:
        self._after = nacl.crypto_box_afternm
        self._open = nacl.crypto_box_open_afternm
        self._error = ValueError
        self._shared = shared
        self._out_prefix = b"CurveZMQMESSAGEC" if client else b"CurveZMQMESSAGES"
        self._in_prefix = b"CurveZMQMESSAGES" if client else b"CurveZMQMESSAGEC"
        self._sent = sent  # our last short nonce
        self._heard = heard  # the peer's last short nonce
        self._lock = threading.Lock()  # frames are sealed by whoever holds the pipe's channel

    def seal_frames(self, frames: Iterable[tuple[int, bytes]]) -> bytes:
        """MESSAGE boxes for (flags, body) frames, in order (each in a data frame, as libzmq sends them)."""
        out = []
        with self._lock:
            nonce = self._sent
            for flags, body in frames:
                nonce += 1
                short = nonce.to_bytes(8, "big")
                payload = bytes((flags & codec.MORE | (0x02 if flags & codec.COMMAND else 0),)) + body
                box = self._after(payload, self._out_prefix + short, self._shared)
                out.append(codec.frame_header(len(box) + 16) + b"\x07MESSAGE" + short + box)
            self._sent = nonce
        return b"".join(out)

    def seal(self, plain: bytes) -> bytes:
        """Our own plaintext ZMTP frames, sealed (parsed again: they are well formed)."""
        return self.seal_frames(iter_frames(plain)) if plain else b""

    def open(self, data: bytes) -> tuple[int, bytes]:
        """A MESSAGE command's data -> (ZMTP flags, body)."""
        if len(data) < 8 + 17:
            raise RemoteProtocolError("CURVE MESSAGE command too short")
        nonce = int.from_bytes(data[:8], "big")
        if nonce <= self._heard:
            raise RemoteProtocolError("CURVE MESSAGE with a reused short nonce")
        try:
            payload = self._open(data[8:], self._in_prefix + data[:8], self._shared)
        except self._error:
            raise RemoteProtocolError("CURVE MESSAGE box does not open (tampered, or not from the peer)") from None
        self._heard = nonce
        flags = payload[0]
        return (codec.MORE if flags & 0x01 else 0) | (codec.COMMAND if flags & 0x02 else 0), payload[1:]


def iter_frames(data: bytes) -> Iterable[tuple[int, bytes]]:
    pos, end = 0, len(data)
    while pos < end:
        flags = data[pos]
        if flags & codec.LONG:
            size = int.from_bytes(data[pos + 1 : pos + 9], "big")
            pos += 9
        else:
            size = data[pos + 1]
            pos += 2
        yield flags, data[pos : pos + size]
        pos += size


# -- the handshake ----------------------------------------------------------------------
def _open(nacl: Any, box: bytes, nonce: bytes, pk: bytes, sk: bytes, what: str) -> bytes:
    try:
        return bytes(nacl.crypto_box_open(box, nonce, pk, sk))
    except ValueError:
        raise AuthenticationFailed(f"CURVE: the {what} box does not open (wrong key?)") from None


class CurveClient:
    name = b"CURVE"
    as_server = False

    def __init__(self, server_key: bytes, secret: bytes | None, public: bytes | None) -> None:
        self.nacl = _nacl()
        self.server_key = server_key
        if secret is None:
            public, secret = self.nacl.crypto_box_keypair()  # an ephemeral permanent key
        elif public is None:
            public = self.nacl.crypto_scalarmult_base(secret)
        self.secret = secret
        self.public = public

    async def handshake(self, conn: ZmtpHandshake, metadata: Metadata) -> dict[str, bytes]:
        from ._mechanisms import expect

        nacl = self.nacl
        tpub, tsec = nacl.crypto_box_keypair()  # our transient pair
        short = (1).to_bytes(8, "big")
        signature = nacl.crypto_box(bytes(64), b"CurveZMQHELLO---" + short, self.server_key, tsec)
        await conn.write(codec.encode_command(b"HELLO", b"\x01\x00" + bytes(72) + tpub + short + signature))
        welcome = await expect(conn, b"WELCOME")
        if len(welcome) != 160:
            raise RemoteProtocolError("malformed CURVE WELCOME")
        opened = _open(nacl, welcome[16:], b"WELCOME-" + welcome[:16], self.server_key, tsec, "WELCOME")
        server_tpub, cookie = opened[:32], opened[32:]
        vouch_nonce = os.urandom(16)
        vouch = vouch_nonce + nacl.crypto_box(
            tpub + self.server_key, b"VOUCH---" + vouch_nonce, server_tpub, self.secret
        )
        short = (2).to_bytes(8, "big")
        box = nacl.crypto_box(
            self.public + vouch + codec.encode_metadata(metadata), b"CurveZMQINITIATE" + short, server_tpub, tsec
        )
        await conn.write(codec.encode_command(b"INITIATE", cookie + short + box))
        ready = await expect(conn, b"READY")
        if len(ready) < 8 + 16:
            raise RemoteProtocolError("malformed CURVE READY")
        props = _open(nacl, ready[8:], b"CurveZMQREADY---" + ready[:8], server_tpub, tsec, "READY")
        shared = nacl.crypto_box_beforenm(server_tpub, tsec)
        conn.cipher = Cipher(nacl, shared, True, 2, int.from_bytes(ready[:8], "big"))
        conn.peer_curve_key = z85_encode(self.server_key)
        return codec.parse_metadata(props)


class CurveServer:
    name = b"CURVE"
    as_server = True

    def __init__(self, secret: bytes, clients: frozenset[bytes] | None) -> None:
        self.nacl = _nacl()
        self.secret = secret
        self.public = self.nacl.crypto_scalarmult_base(secret)
        self.clients = clients

    async def handshake(self, conn: ZmtpHandshake, metadata: Metadata) -> dict[str, bytes]:
        from ._mechanisms import expect

        nacl = self.nacl
        hello = await expect(conn, b"HELLO")
        if len(hello) != 194 or hello[:2] != b"\x01\x00":
            raise RemoteProtocolError("malformed CURVE HELLO (or not version 1.0)")
        client_tpub, short = hello[74:106], hello[106:114]
        if _open(nacl, hello[114:], b"CurveZMQHELLO---" + short, client_tpub, self.secret, "HELLO") != bytes(64):
            raise RemoteProtocolError("CURVE HELLO signature box is not 64 zero bytes")
        tpub, tsec = nacl.crypto_box_keypair()
        cookie_key = os.urandom(32)
        cookie_nonce = os.urandom(16)
        cookie = cookie_nonce + nacl.crypto_secretbox(client_tpub + tsec, b"COOKIE--" + cookie_nonce, cookie_key)
        long_nonce = os.urandom(16)
        box = nacl.crypto_box(tpub + cookie, b"WELCOME-" + long_nonce, client_tpub, self.secret)
        await conn.write(codec.encode_command(b"WELCOME", long_nonce + box))
        initiate = await expect(conn, b"INITIATE")
        if len(initiate) < 96 + 8 + 16 + 128 or initiate[:96] != cookie:
            raise RemoteProtocolError("malformed CURVE INITIATE (or not our cookie)")
        short = initiate[96:104]
        if int.from_bytes(short, "big") <= int.from_bytes(hello[106:114], "big"):
            raise RemoteProtocolError("CURVE INITIATE reuses a short nonce")
        opened = _open(nacl, initiate[104:], b"CurveZMQINITIATE" + short, client_tpub, tsec, "INITIATE")
        client_key, vouch, props = opened[:32], opened[32:128], opened[128:]
        vouched = _open(nacl, vouch[16:], b"VOUCH---" + vouch[:16], client_key, tsec, "vouch")
        if vouched != client_tpub + self.public:
            raise AuthenticationFailed("CURVE vouch does not match the connection")
        if self.clients is not None and client_key not in self.clients:
            raise AuthenticationFailed(f"CURVE client key {z85_encode(client_key)} is not in curve_clients")
        conn.peer_curve_key = z85_encode(client_key)
        metadata_in = codec.parse_metadata(props)
        await conn.admit(metadata_in)
        short = (1).to_bytes(8, "big")
        box = nacl.crypto_box(codec.encode_metadata(metadata), b"CurveZMQREADY---" + short, client_tpub, tsec)
        await conn.write(codec.encode_command(b"READY", short + box))
        shared = nacl.crypto_box_beforenm(client_tpub, tsec)
        conn.cipher = Cipher(nacl, shared, False, 1, int.from_bytes(initiate[96:104], "big"))
        return metadata_in


def make_curve(options: Any) -> CurveClient | CurveServer | None:
    """The CURVE side the endpoint options ask for (None: no CURVE)."""
    server_key = options.get("curve_server_key")
    secret = options.get("curve_secret_key")
    if server_key is not None:
        public = options.get("curve_public_key")
        return CurveClient(
            as_key(server_key, "curve_server_key"),
            None if secret is None else as_key(secret, "curve_secret_key"),
            None if public is None else as_key(public, "curve_public_key"),
        )
    if secret is not None:
        clients = options.get("curve_clients")
        allowed = None if clients is None else frozenset(as_key(k, "a curve_clients key") for k in clients)
        return CurveServer(as_key(secret, "curve_secret_key"), allowed)
    return None
