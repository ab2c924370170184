"""Messages and the user-visible view of a pipe."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from .errors import ProtocolError
from .peer import Peer
from .stats import PipeStats


class Replier(Protocol):
    """What a message needs of its socket to be answered (a cooked REP or RESPONDENT)."""

    def _reply(self, token: tuple[int, bytes], data: Any, timeout: float | None) -> None: ...

    async def _areply(self, token: tuple[int, bytes], data: Any) -> None: ...


class Pipe:
    """One connection between this socket and a peer.

    Attributes:
        id: a 31-bit number unique within the process (as NNG pipe ids).
        remote_address: the peer's address as text (``"127.0.0.1:5555"``, a path, ...).
        endpoint: the :class:`Endpoint` that created the pipe.
        connected_at: when the pipe came up (seconds since the epoch).
        peer: who is on the other end (a :class:`nanopy.Peer`: address, transport,
            mechanism and credentials), or None for a pipe made outside a socket.
    """

    __slots__ = ("id", "remote_address", "endpoint", "connected_at", "peer", "_driver", "__weakref__")

    #: how a snapshot of a pipe driver is taken: set by the socket layer
    #: (nanopy/socket/observe.py) when it loads, so this value type needs nothing above it
    _snapshot: ClassVar[Callable[[Any], PipeStats]]

    def __init__(self, pid: int, remote_address: str, endpoint: Any, peer: Peer | None = None) -> None:
        self.id = pid
        self.remote_address = remote_address
        self.endpoint = endpoint
        self.peer = peer
        self.connected_at = time.time()
        self._driver: Any = None

    def stats(self) -> PipeStats:
        """A snapshot of this pipe's counters and queues (see ``Socket.pipes()``).

        Returns:
            A frozen :class:`PipeStats`; a pipe that is gone keeps its last counts.
        """
        return Pipe._snapshot(self._driver)

    def close(self) -> None:
        """Close this pipe only; a dialer will reconnect."""
        if self._driver is not None:
            self._driver.close_soon()

    def __repr__(self) -> str:
        return f"<nanopy.Pipe id={self.id} remote={self.remote_address!r}>"


class Multipart(bytes):
    """A message of several frames (ZeroMQ multipart, over ``zmtp+`` pipes).

    It is ``bytes`` (the frames joined, so code that only wants the data still
    works with it) and keeps the frames in :attr:`parts`. SP pipes carry one
    frame per message: a socket refuses to send a ``Multipart`` there rather
    than join it silently.

    Inside nanopy a protocol core may put a header in front of a body (a REQ's
    request id, a REP's backtrace) as ``header + body`` and take it off again as
    ``payload[len(header):]``; both keep the frames (``header`` holds it meanwhile),
    so REQ and REP carry multipart bodies without knowing it.
    """

    parts: tuple[bytes, ...]
    header: bytes

    def __new__(cls, parts: Any, header: bytes = b"") -> Multipart:
        frames = tuple(bytes(p) if p.__class__ is not bytes else p for p in parts)
        obj = super().__new__(cls, header + b"".join(frames))
        obj.parts = frames
        obj.header = header
        return obj

    def __radd__(self, other: Any) -> Multipart:
        # ``bytes + Multipart`` lands here (a bytes subclass's reflected add comes first).
        if isinstance(other, (bytes, bytearray)):
            return Multipart(self.parts, bytes(other) + self.header)
        return NotImplemented

    def __getitem__(self, key: Any) -> Any:
        header = self.header
        if (
            header and key.__class__ is slice and key.start == len(header)
            and key.stop is None and key.step is None
        ):
            return Multipart(self.parts)  # the header taken off again
        return bytes.__getitem__(self, key)

    def __repr__(self) -> str:
        return f"Multipart({list(self.parts)!r})"

    def __reduce__(self) -> Any:
        return (Multipart, (self.parts, self.header))


class Message:
    """A received message.

    Attributes:
        body: the payload, protocol header removed.
        header: the protocol header (raw sockets; ``b""`` otherwise).
        pipe: the :class:`Pipe` it came from (``None`` for locally made messages).
    """

    __slots__ = ("body", "header", "pipe", "_reply_to")

    def __init__(self, body: bytes, pipe: Pipe | None = None, header: bytes = b"") -> None:
        self.body = body
        self.header = header
        self.pipe = pipe
        # the reply route (pipe id, backtrace) for protocols that can answer a message
        self._reply_to: tuple[int, bytes] | None = None

    @property
    def parts(self) -> list[bytes]:
        """The body's frames: several for a ZeroMQ multipart message, else the body alone."""
        body = self.body
        return list(body.parts) if isinstance(body, Multipart) else [body]

    def __bytes__(self) -> bytes:
        return self.body

    def __len__(self) -> int:
        return len(self.body)

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 32 else self.body[:32] + b"..."
        return f"<nanopy.Message {body!r} header={self.header!r} pipe={self.pipe!r}>"

    def reply(self, data: Any, *, timeout: float | None = None) -> None:
        """Answer this message (REP/RESPONDENT): routed back to the requester.

        Never blocks: a reply whose pipe is gone or full is dropped (counted), and
        the requester's resend recovers, as in nanomsg.

        Args:
            data: the reply body (bytes-like).
            timeout: accepted for symmetry with ``send``; a reply never waits.

        Raises:
            ProtocolError: the message did not come from a cooked REP or RESPONDENT.
            Closed: the socket is closed.
        """
        sock, token = self._replier()
        sock._reply(token, data, timeout)

    async def areply(self, data: Any) -> None:
        """Async form of :meth:`reply`.

        Args:
            data: the reply body (bytes-like).

        Raises:
            ProtocolError: the message did not come from a cooked REP or RESPONDENT.
            Closed: the socket is closed.
        """
        sock, token = self._replier()
        await sock._areply(token, data)

    def _replier(self) -> tuple[Replier, tuple[int, bytes]]:
        route = self._reply_to
        sock = getattr(getattr(self.pipe, "endpoint", None), "socket", None)
        if route is None or sock is None:
            raise ProtocolError(
                "this message cannot be replied to: only messages received on a "
                "cooked REP or RESPONDENT socket carry a return route"
            )
        return sock, route
