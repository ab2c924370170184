"""Multipart messages (ZeroMQ's frames) on the socket API.

A multipart message travels through the protocol cores as a :class:`Multipart`:
``bytes`` holding the frames joined, with the frames kept in ``parts``. ZMTP
pipes write it as frames, and inproc pipes between REQ and REP sockets hand the
object over as it is (a ZAP handler's requests are multipart); other pipes carry
one frame per message, so a socket with such endpoints refuses to send one rather
than join it silently. A
plain ``recv()`` that meets one raises and leaves it first in line for
``recv_multipart()``, ``recv_msg()`` or ``recv_batch()``; every other receive
(``recv_msg``, ``recv_multipart``, ``recv_batch``, their async forms, ``request``)
returns it with its frames.

Only a pipe whose transport carries multipart messages
(``Transport.carries_multipart``: ``zmtp+tcp``, ``zmtp+ipc``, or a plug-in that
says so) can deliver one, and the socket learns it per pipe when the pipe joins
(``SocketDriver.add_pipe``). Such a pipe's runs end before a multipart message
(``FairQueue.stops``), so the lock-free pop of a run, ``recv()``'s fast path,
never meets one and looks at nothing; ``recv()`` tests a body's class only on
its locked path. The socket's class never changes. Inproc pipes carry them too
between REQ and REP sockets (:data:`INPROC_MULTIPART`: what a ZAP handler needs),
as inproc hands the message object over as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..core.errors import ProtocolError
from ..core.message import Multipart
from .util import DEFAULT, as_bytes

if TYPE_CHECKING:
    from ..core.message import Message
    from ..driver.socket_driver import SocketDriver
    from .endpoint import Endpoint
    from .pipes import PipeHost

#: the socket types whose messages may have several frames on ZMTP pipes
MULTIPART_PROTOCOLS = frozenset({"pair", "push", "pull", "pub", "sub", "req", "rep"})
#: ... and on inproc pipes: request/reply, what a ZAP handler needs. Other types keep
#: one frame per message there, so their inproc receive path pays no check.
INPROC_MULTIPART = frozenset({"req", "rep"})


def endpoint_carries_multipart(ep: Endpoint, protocol: str) -> bool:
    """Whether ``ep``'s pipes carry multipart messages for a ``protocol`` socket: its
    transport says so (``Transport.carries_multipart``), or it is inproc between
    request/reply sockets."""
    return ep.transport.carries_multipart or (protocol in INPROC_MULTIPART and "inproc" in ep.transport.schemes)


def as_multipart(parts: Any) -> Multipart:
    """The frames of ``parts`` (bytes-like items; text refused) as one message."""
    if isinstance(parts, (bytes, bytearray, memoryview, str)):
        raise TypeError("send_multipart takes a list of frames, e.g. [b'topic', b'body']; use send() for one")
    frames = [as_bytes(p) for p in parts]
    if not frames:
        raise ValueError("a multipart message needs at least one frame")
    return Multipart(frames)


class MultipartMixin:
    """``send_multipart``/``recv_multipart`` and their async forms, for :class:`Socket`."""

    _driver: SocketDriver
    _host: PipeHost

    if TYPE_CHECKING:  # what the mixin uses of Socket (declared for mypy only)
        @property
        def protocol(self) -> str:
            raise NotImplementedError

        def send(self, data: Any, *, timeout: float | None = DEFAULT) -> None:
            raise NotImplementedError

        async def asend(self, data: Any, *, timeout: float | None = DEFAULT) -> None:
            raise NotImplementedError

        def recv_msg(self, *, timeout: float | None = DEFAULT) -> Message:
            raise NotImplementedError

        async def arecv_msg(self, *, timeout: float | None = DEFAULT) -> Message:
            raise NotImplementedError

    def send_multipart(self, parts: Iterable[Any], *, timeout: float | None = DEFAULT) -> None:
        """Send one message of several frames (ZeroMQ multipart) over ``zmtp+`` pipes.

        Args:
            parts: the frames, bytes-like.
            timeout: as for :meth:`send`.

        Raises:
            ProtocolError: the socket has SP endpoints (``tcp://``, ``ipc://``, ...),
                which carry one frame per message, or its type has no ZeroMQ
                counterpart (SURVEYOR, BUS, ...).
            TypeError: ``parts`` is not a list of bytes-like frames.
        """
        self.send(as_multipart(parts), timeout=timeout)

    async def asend_multipart(self, parts: Iterable[Any], *, timeout: float | None = DEFAULT) -> None:
        """Async :meth:`send_multipart` (trio or asyncio).

        Args:
            parts: the frames, bytes-like.
            timeout: as for :meth:`asend`.

        Raises:
            ProtocolError: as for :meth:`send_multipart`.
            TypeError: ``parts`` is not a list of bytes-like frames.
        """
        await self.asend(as_multipart(parts), timeout=timeout)

    def recv_multipart(self, *, timeout: float | None = DEFAULT) -> list[bytes]:
        """Receive the next message as its list of frames (one frame for a plain message).

        Args:
            timeout: as for :meth:`recv`.

        Returns:
            The frames, in order (a one-item list for a single-frame message).
        """
        return self.recv_msg(timeout=timeout).parts

    async def arecv_multipart(self, *, timeout: float | None = DEFAULT) -> list[bytes]:
        """Async :meth:`recv_multipart` (trio or asyncio).

        Args:
            timeout: as for :meth:`arecv`.

        Returns:
            The frames, in order (a one-item list for a single-frame message).
        """
        return (await self.arecv_msg(timeout=timeout)).parts

    # -- the checks the plain calls make (only for data that is not exactly bytes) --
    def _outgoing(self, data: Any) -> bytes:
        """``data`` as the bytes to send: a :class:`Multipart` only where it stays one."""
        if isinstance(data, Multipart):
            self._check_multipart()
            return data
        return as_bytes(data)

    def _check_multipart(self) -> None:
        if self.protocol not in MULTIPART_PROTOCOLS:
            raise ProtocolError(
                f"{self.protocol} sockets send one frame per message; multipart messages work on "
                f"{', '.join(sorted(MULTIPART_PROTOCOLS))} sockets over zmtp+ URLs"
            )
        sp = [ep.url for ep in self._host.endpoints if not endpoint_carries_multipart(ep, self.protocol)]
        if sp:
            raise ProtocolError(
                f"a multipart message cannot go to {sp[0]}: SP pipes carry one frame per message, "
                "and nanopy never joins frames silently; send it on a socket whose endpoints are "
                "all zmtp+tcp:// or zmtp+ipc:// (req and rep: or inproc://), or join the frames "
                "yourself and send() them"
            )

    def _refuse_multipart(self, body: bytes) -> bytes:
        """A plain receive met a multipart message: put it back first in line and say so."""
        if not isinstance(body, Multipart):
            return body
        raise _held_back(self._driver, body)


def _held_back(driver: SocketDriver, body: Multipart) -> ProtocolError:
    """``body`` put back first in line, and the error that tells a plain receive so."""
    # Into ``held``, not the run: recv()'s fast path takes a run unseen. (Without
    # check_open: the ProtocolError says more than Closed would.)
    driver.feed(driver.held.appendleft, body, check_open=False)
    return ProtocolError(
        f"the next message has {len(body.parts)} frames (ZeroMQ multipart); it is still "
        "queued: receive it with recv_multipart(), recv_msg() (Message.parts) or recv_batch()"
    )
