"""Multipart messages (ZeroMQ's frames) on the socket API.

A multipart message travels through the protocol cores as a :class:`Multipart`:
``bytes`` holding the frames joined, with the frames kept in ``parts``. Only
ZMTP pipes write it as frames; an SP pipe carries one frame per message, so a
socket with SP endpoints refuses to send one rather than join it silently. A
plain ``recv()`` that meets one raises and leaves it first in line for
``recv_multipart()``, ``recv_msg()`` or ``recv_batch()``; every other receive
(``recv_msg``, ``recv_multipart``, ``recv_batch``, their async forms, ``request``)
returns it with its frames.

Only a socket with a ZMTP endpoint can receive one, so only such a socket pays
for the check: its first ``zmtp+`` bind or connect moves it to a subclass whose
``recv``/``arecv`` look at the body's class (:func:`receive_multipart`); an SP
socket's receive path is untouched.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .. import _fork
from ..core.errors import ProtocolError
from ..core.message import Multipart
from .util import DEFAULT, as_bytes

if TYPE_CHECKING:
    from ..core.message import Message
    from ..driver.socket_driver import SocketDriver
    from .endpoint import Endpoint

#: the socket types whose messages may have several frames on ZMTP pipes
MULTIPART_PROTOCOLS = frozenset({"pair", "push", "pull", "pub", "sub", "req", "rep"})


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
    _endpoints: list[Endpoint]

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
        sp = [ep.url for ep in self._endpoints if not ep.transport.carries_multipart]
        if sp:
            raise ProtocolError(
                f"a multipart message cannot go to {sp[0]}: SP pipes carry one frame per message, "
                "and nanopy never joins frames silently; send it on a socket whose endpoints are "
                "all zmtp+tcp:// or zmtp+ipc://, or join the frames yourself and send() them"
            )

    def _refuse_multipart(self, body: bytes) -> bytes:
        """A plain receive met a multipart message: put it back first in line and say so."""
        if not isinstance(body, Multipart):
            return body
        driver = self._driver
        if not driver.run:
            driver.run_token = None  # (its pipe is not known here)
        driver.run.appendleft(body)
        raise ProtocolError(
            f"the next message has {len(body.parts)} frames (ZeroMQ multipart); it is still "
            "queued: receive it with recv_multipart(), recv_msg() (Message.parts) or recv_batch()"
        )


_checking: dict[type, type] = {}
_checking_lock = _fork.process_lock()


def receive_multipart(sock: Any) -> None:
    """Make ``sock``'s plain receives refuse multipart messages (see the module docstring)."""
    base = type(sock)
    if getattr(base, "_checks_multipart", False):
        return
    with _checking_lock:
        cls = _checking.get(base)
        if cls is None:
            cls = _checking[base] = _checking_class(base)
    sock.__class__ = cls


def _checking_class(base: type) -> type:
    plain_recv: Any = getattr(base, "recv")  # noqa: B009 - (a Socket class, typed loosely here)
    plain_arecv: Any = getattr(base, "arecv")  # noqa: B009

    def recv(self: Any, *, timeout: float | None = DEFAULT) -> bytes:
        if timeout is DEFAULT:
            # The rest of a run, as the plain recv serves it (a call level less).
            driver = self._driver
            run = driver.run
            if run and not driver.closed:
                try:
                    head = run.popleft()
                except IndexError:
                    pass
                else:
                    return head if head.__class__ is bytes else self._refuse_multipart(head)
        body: bytes = plain_recv(self, timeout=timeout)
        return body if body.__class__ is bytes else self._refuse_multipart(body)

    async def arecv(self: Any, *, timeout: float | None = DEFAULT) -> bytes:
        body: bytes = await plain_arecv(self, timeout=timeout)
        return body if body.__class__ is bytes else self._refuse_multipart(body)

    recv.__doc__ = plain_recv.__doc__
    arecv.__doc__ = plain_arecv.__doc__
    return type(base.__name__, (base,), {
        "recv": recv, "arecv": arecv, "_checks_multipart": True,
        "__module__": base.__module__, "__qualname__": base.__qualname__, "__doc__": base.__doc__,
    })
