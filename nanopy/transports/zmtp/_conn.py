"""ZMTP connections: the stream connection of tcp/ipc with ZeroMQ's greeting,
handshake and framing in place of SP's.

Everything after the handshake goes through the same stream code as SP pipes
(direct writes from the sending thread, the read role, batching): only the
codec differs -- ``frame`` builds ZMTP frames (through the socket type's role)
and the decoder parses them. Commands the peer sends (PING, SUBSCRIBE, ...) are
handled by the reader; what we owe in return (PONG, our SUBSCRIBEs: the socket
pushes its subscriptions, SubscriptionForwarding) goes out through the pipe's
control frame, ahead of queued messages.
"""

from __future__ import annotations

import logging
import math
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ... import platform
from ...core.errors import RemoteProtocolError
from .._base import PipeContext
from .._keepalive import PeerWatch, PongDebt
from .._stream import StreamConnection
from . import _codec as codec
from ._curve import Cipher
from ._handshake import ZmtpHandshake
from ._roles import make_role

log = logging.getLogger("nanopy")
_monotonic = time.monotonic

#: Our PINGs ask the peer to give up on us after ``TTL_FACTOR * dead_peer_timeout``
#: seconds without a word from us (their TTL, RFC 37). We write something (a PING
#: if nothing else) at least every half timeout, so a stall of our own process
#: (GC, SIGSTOP, a C call holding the GIL) shorter than the TTL less that interval
#: -- 1.5 x dead_peer_timeout -- never makes the peer drop us (docs/partitions.md).
TTL_FACTOR = 2.0
#: the largest TTL a PING carries (16 bits of deciseconds)
MAX_TTL = 0xFFFF / 10
#: A peer that closes the pipe at most this long after we went silent for longer
#: than the TTL we announced is taken to have closed it for that silence.
SILENCE_BLAME_WINDOW = 2.0


def announced_ttl(timeout: float) -> float:
    """The TTL (seconds) our PINGs carry for ``dead_peer_timeout`` = ``timeout``."""
    return min(TTL_FACTOR * timeout, MAX_TTL)


class ZmtpConnection(StreamConnection):
    """A ZMTP 3.1 pipe (accepting 3.0 peers) over a connected stream socket.

    The handshake is a part of its own (``shake``, a :class:`ZmtpHandshake`: the
    mechanism, the peer's Socket-Type, Identity and credentials); the connection
    keeps the framed I/O.

    Attributes:
        minor: the peer's ZMTP minor version (0 for a 3.0 peer, 1 for 3.1).
        last_heard: when the peer last sent anything (``time.monotonic()``), the
            sign of life the dead-peer check looks at (see :meth:`send_ping`).
        last_sent: when we last wrote to the peer (``time.monotonic()``): the
            peer's view of our liveness.
        ttl: the TTL our PINGs carry (seconds; :func:`announced_ttl`), or None.
        keepalive: the pipe's dead-peer task (a :class:`PeerWatch` that PINGs a
            silent 3.1 peer), or None when ``dead_peer_timeout`` is None or the
            peer speaks 3.0.
    """

    def __init__(self, sock: socket.socket, ctx: PipeContext, remote_address: str) -> None:
        super().__init__(sock, ctx, False, remote_address)
        self.framing = None  # a role may filter or rewrite per pipe: no shared chunks
        self.frame_overhead = None  # flags and a 1- or 8-byte size; a role may add frames
        self.role = make_role(ctx.protocol_name)
        # The role's write window (WriteWindow: one request per REQ pipe), as the connection's.
        self.window = self.role.window
        self.watch_window = self.role.watch_window
        #: the handshake and what it learns of the peer (nanopy/transports/zmtp/_handshake.py)
        self.shake = ZmtpHandshake(self, ctx, self.role, self._recv_some, self._send_all,
                                   lambda: platform.is_unix_socket(self._sock))
        self._decoder = self._zmtp_decoder = codec.ZmtpDecoder(
            ctx.recv_max_size, self.role.multi, self._command, self.role.single
        )
        self._send_control: Callable[..., bool] | None = None
        self._pong_debt = PongDebt()
        self.gates_itself = True  # a refusal is an ERROR command in the handshake
        self.refuses_early = False  # (even a denied address hears its ERROR)
        self.minor = 1
        self.last_heard = self.last_sent = time.monotonic()
        # Our longest silence toward the peer past ``ttl``, and when it ended (see silence_blamed).
        self._overdue = (0.0, 0.0)
        #: CURVE's sealer and opener, from its handshake (None: frames go in the clear)
        self.cipher: Cipher | None = None
        # Dead-peer detection (docs/zmtp.md): PINGs to a silent 3.1 peer, driven by
        # dead_peer_timeout; ``keepalive`` is the pipe's extra task, or None.
        timeout = ctx.options.get("dead_peer_timeout")
        self._watch: PeerWatch | None = None
        self.keepalive: Callable[[Callable[[], bool]], Awaitable[None]] | None = None
        self.ttl: float | None = None
        if timeout is not None:
            self.ttl = self._ttl_or_never = announced_ttl(timeout)
            self._watch = PeerWatch(timeout, lambda: self.last_heard, self._heartbeat, "ZMTP traffic",
                                    remote_address, sent=lambda: self.last_sent,
                                    unread=lambda: platform.unread_bytes(self._sock) > 0)
            self.keepalive = self._watch.run
        self._ping_unwritten = False  # our last PING waits in the pipe's control slot
        self._pings_sent = 0

    # -- handshake (engine thread, under the socket's handshake_timeout) ---------
    async def handshake(self) -> None:
        shake = self.shake
        await shake.run()
        self.minor = shake.minor
        self.cipher = cipher = shake.cipher
        if cipher is not None:
            self._zmtp_decoder.unbox = cipher.open
        if self.minor < 1:
            # ZMTP 3.0 has no PING: TCP keepalive (zmtp+tcp) is all that watches it.
            self.keepalive = None

    def zap_credentials(self) -> tuple[str, tuple[bytes, ...]]:
        """The mechanism's name and credentials as a ZAP request carries them (RFC 27)."""
        return self.shake.zap_credentials()

    def peer_details(self) -> dict[str, Any]:
        return self.shake.peer_details()

    _ttl_or_never = math.inf  # (``ttl`` where the write path reads it)

    # -- after the handshake -------------------------------------------------------
    def read_nowait(self) -> list[bytes] | None:
        got = super().read_nowait()
        if got is not None:
            self.last_heard = time.monotonic()  # any traffic is a sign of life (RFC 37)
        return got

    async def receive(self) -> list[bytes]:
        got = await super().receive()
        self.last_heard = time.monotonic()
        return got

    def frame(self, payloads: list[bytes]) -> bytes:
        cipher = self.cipher
        if cipher is None:
            return self.role.frame(payloads)
        return cipher.seal(self.role.frame(payloads))

    def control_chunk(self, frame: bytes) -> bytes:
        self._ping_unwritten = False  # the writer takes the control slot, our PING with it
        # Sealed when written, not when queued: CURVE nonces must grow in wire order.
        return frame if self.cipher is None else self.cipher.seal(frame)

    def write_nowait(self, chunk: bytes | memoryview) -> int:
        if not chunk:
            return 0  # (a publisher's batch that matched nothing)
        n = super().write_nowait(chunk)
        if n:  # (what _note_sent does, inline: this is the sending thread's path)
            now = _monotonic()
            if now - self.last_sent >= self._ttl_or_never:
                self._overdue = (now - self.last_sent, now)
            self.last_sent = now
        return n

    async def write_all(self, chunk: bytes | memoryview) -> None:
        if chunk:
            await self._send_all(chunk)
            self._note_sent()

    def _note_sent(self) -> None:
        """We wrote to the peer (any thread): note when, and a silence past our TTL."""
        now = _monotonic()
        if now - self.last_sent >= self._ttl_or_never:
            self._overdue = (now - self.last_sent, now)
        self.last_sent = now

    def silence_blamed(self) -> str | None:
        """Why the peer ended the pipe (its EOF or reset) when that was for our own
        silence: we announced a TTL and wrote nothing for longer than it (our
        process stood still, or our writes could not go out), just before. None
        when nothing says so: then it is an ordinary disconnect."""
        ttl, watch = self.ttl, self._watch
        if ttl is None or watch is None or not self._pings_sent:
            return None  # no TTL announced: the peer has none of ours to apply
        now = time.monotonic()
        silent = now - self.last_sent
        gap, ended = self._overdue
        if silent < ttl and now - ended <= SILENCE_BLAME_WINDOW:
            silent = gap
        if silent < ttl:
            return None
        why = f"it heard nothing from us for {silent:.1f} s, longer than the {ttl:g} s TTL our PINGs announce"
        stalled = watch.stalled_for()
        if stalled:
            why += f"; our own process stood still for {stalled:.1f} s or more"
        return why

    def count_drops_with(self, count: Callable[[str, int], Any]) -> None:
        """Where the role counts the messages it discards (the socket's drops)."""
        self.role.count_drop = count

    def attach_control(self, send_control: Callable[..., bool]) -> None:
        self._send_control = send_control
        self.role.send_control = self._queue_control

    def _queue_control(self, frame: bytes) -> bool:
        """Queue a command after any not yet written; True if one was still there."""
        return self._send_control is not None and self._send_control(frame, append=True)

    def _answer_ping(self, context: bytes) -> None:
        """A PONG for a PING. While our earlier commands wait unwritten, past
        MAX_UNANSWERED_PINGS no more PONGs are queued (what waits answers for them:
        memory stays bounded); a peer that goes on PINGing for PONG_PATIENCE while
        they wait -- it reads nothing and the kernel's buffers are full -- is
        closed as a flood."""
        debt = self._pong_debt
        flood = debt.owe(self._queue_control(b""))  # (b"": asks whether our last commands still wait)
        if not debt.saturated():
            self._queue_control(codec.encode_command(b"PONG", context))
        if flood:
            raise RemoteProtocolError(
                f"the ZMTP peer {self.remote_address} sent {debt.unanswered} PINGs in "
                f"{time.monotonic() - debt.since:.1f} s while leaving our frames unread"
            )

    def _command(self, name: bytes, data: bytes) -> None:
        """A command after the handshake (reader side)."""
        self.last_heard = time.monotonic()
        if name == b"PING":
            # Answered always; the context (at most 16 octets) comes back as it was.
            self._answer_ping(data[2:18])
            if self._watch is not None and len(data) >= 2:
                # The TTL (deciseconds, 0: none): the peer asks to be given up on
                # after that long without a word from it (RFC 37).
                ttl = int.from_bytes(data[:2], "big")
                self._watch.peer_limit(ttl / 10 if ttl else None)
        elif name == b"PONG":
            pass  # last_heard is the sign of life
        elif name == b"ERROR":
            reason = data[1 : 1 + data[0]].decode("utf-8", "replace") if data else ""
            raise RemoteProtocolError(f"the ZMTP peer sent ERROR: {reason or 'no reason given'}")
        elif self.role.command(name, data):
            pass
        elif name in (b"READY", b"HELLO", b"WELCOME", b"INITIATE"):
            raise RemoteProtocolError(f"ZMTP {name.decode()} command after the handshake")
        else:
            log.debug("zmtp pipe %s: ignoring unknown command %r", self.remote_address, name)

    def send_ping(self, ttl: float = 0.0) -> None:
        """Queue a PING (the hook a dead-peer check drives; any thread).

        ``ttl`` (seconds, 0 = none) asks the peer to drop the connection if it
        hears nothing from us for that long (RFC 37). The PONG, or any traffic,
        moves :attr:`last_heard`.
        """
        deciseconds = min(int(ttl * 10), 0xFFFF)
        self._queue_control(codec.encode_command(b"PING", deciseconds.to_bytes(2, "big")))

    def _heartbeat(self) -> None:
        """The watch's PING (engine thread): one at a time, with :attr:`ttl` as its
        TTL, so the peer may give up on us too; none while the last is unwritten
        (the writer waits on a full send buffer)."""
        if self._ping_unwritten or self.ttl is None:
            return
        self._ping_unwritten = True
        self._pings_sent += 1
        self.send_ping(self.ttl)

    def subscriptions(self, topics: frozenset[bytes]) -> None:
        """The socket's subscriptions now (SubscriptionForwarding): a SUB tells its
        peer what changed since the last call."""
        self.role.subscriptions(topics)

