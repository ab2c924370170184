"""Messages and the user-visible view of a pipe."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._socket import Socket
    from ._stats import PipeStats


class Pipe:
    """One connection between this socket and a peer.

    Attributes:
        id: a 31-bit number unique within the process (as NNG pipe ids).
        remote_address: the peer's address as text (``"127.0.0.1:5555"``, a path, ...).
        endpoint: the :class:`Endpoint` that created the pipe.
        connected_at: when the pipe came up (seconds since the epoch).
    """

    __slots__ = ("id", "remote_address", "endpoint", "connected_at", "_driver", "__weakref__")

    def __init__(self, pid: int, remote_address: str, endpoint: Any) -> None:
        self.id = pid
        self.remote_address = remote_address
        self.endpoint = endpoint
        self.connected_at = time.time()
        self._driver: Any = None

    def stats(self) -> PipeStats:
        """A snapshot of this pipe's counters and queues (see ``Socket.pipes()``).

        Returns:
            A frozen :class:`PipeStats`; a pipe that is gone keeps its last counts.
        """
        from ._observe import pipe_stats

        return pipe_stats(self._driver)

    def close(self) -> None:
        """Close this pipe only; a dialer will reconnect."""
        if self._driver is not None:
            self._driver.close_soon()

    def __repr__(self) -> str:
        return f"<nanopy.Pipe id={self.id} remote={self.remote_address!r}>"


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

    def _replier(self) -> tuple[Socket, tuple[int, bytes]]:
        from ._errors import ProtocolError

        route = self._reply_to
        sock = getattr(getattr(self.pipe, "endpoint", None), "socket", None)
        if route is None or sock is None:
            raise ProtocolError(
                "this message cannot be replied to: only messages received on a "
                "cooked REP or RESPONDENT socket carry a return route"
            )
        return sock, route
