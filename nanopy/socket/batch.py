"""Batch send: many messages in one call (``send_batch``, ``asend_batch``).

Owns: turning the caller's iterable into (body, header) pairs with the checks
``send``/``send_msg`` make, refusing the protocols where a run of sends has no
meaning, and the loop of batch rounds (``SendLanes.send_batch``: one lock round
and one framed write per pipe) with waits for room between them.

May call: the socket's driver only (nanopy/driver/lanes.py and waiting.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from trio.lowlevel import cancel_shielded_checkpoint

from ..core.errors import ProtocolError, Timeout
from ..core.message import Message
from ..driver.socket_driver import cancellation_point, in_trio
from .util import DEFAULT as _DEFAULT
from .util import async_twin_of, check_timeout

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ..driver.socket_driver import SocketDriver

# Cooked sockets whose every send belongs to one exchange (a request, its reply, a
# survey, a response): a batch of them would be one exchange overwritten many times.
_REFUSED = {
    "req": "a REQ socket has one request in flight per caller, and each send() replaces the last",
    "rep": "a REP socket sends one reply to the request the caller last received",
    "surveyor": "a SURVEYOR socket has one survey in flight, and each send() starts a new one",
    "respondent": "a RESPONDENT socket sends one response to the survey the caller last received",
}


class BatchSending:
    """``send_batch``/``asend_batch``, mixed into :class:`nanopy.Socket`: each hands
    the call to the socket's :class:`Batches` part."""

    _batches: Batches

    def send_batch(self, messages: Iterable[Any], *, timeout: float | None = _DEFAULT) -> int:
        """Send many messages in one call, in order; returns how many were sent.

        The same as calling :meth:`send` for each message in turn -- the same
        back-pressure, drops (a PUB with no subscriber) and counters -- but each
        round takes the socket lock once for as many messages as there is room for,
        and each pipe gets what it took as one framed write.

        ``messages`` is read to the end and checked before anything is sent, so a
        bad item sends nothing.

        Args:
            messages: an iterable of messages, each what :meth:`send` takes
                (bytes-like; a ``Multipart`` on ``zmtp+`` pipes) or a :class:`Message`
                (as :meth:`send_msg`: its header is used on raw sockets only).
            timeout: seconds for the whole batch to find room; ``None`` waits
                forever, ``0`` sends what fits now. Defaults to the ``send_timeout`` option.

        Returns:
            The number of messages sent: all of them (an empty batch returns 0 at once).

        Raises:
            Timeout: not all of them found room in time; its ``sent`` attribute says
                how many went (the first ``sent`` messages, none twice), the rest did not.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot send (SUB, PULL), or sends are one
                exchange each (cooked REQ, REP, SURVEYOR, RESPONDENT: call :meth:`send`
                in a loop); a ``Multipart`` where :meth:`send` refuses it.
            TypeError: ``messages`` is not an iterable of messages (a lone ``bytes``
                or ``str`` included), or an item is not bytes-like.
        """
        return self._batches.send(messages, timeout)

    @async_twin_of(send_batch)
    async def asend_batch(self, messages: Iterable[Any], *, timeout: float | None = _DEFAULT) -> int:
        """Send many messages in one call, from trio or asyncio; returns how many were sent.

        The async form of :meth:`send_batch`; it is a checkpoint. Cancelled while
        it waits for room, it raises Cancelled (CancelledError): the messages before
        the wait stay sent, the rest are not sent.
        """
        return await self._batches.asend(messages, timeout)


class Batches:
    """The batch part of a socket: checks a batch, then sends it in rounds with waits
    for room between them (``send_batch`` and ``asend_batch`` delegate here)."""

    def __init__(self, driver: SocketDriver, options: Any, raw: bool, outgoing: Callable[[Any], bytes]) -> None:
        self._driver = driver
        self._options = options  # (read per call: send_timeout may change)
        self._raw = raw
        self._outgoing = outgoing

    def send(self, messages: Iterable[Any], timeout: Any) -> int:
        """:meth:`nanopy.Socket.send_batch`'s work."""
        limit = check_timeout(timeout, self._options.send_timeout)
        bodies, headers = self._items(messages, "send_batch")
        driver = self._driver
        deadline = None if limit is None else time.monotonic() + limit
        done, end = 0, len(bodies)
        driver.check_open()
        while done < end:
            went = driver.send_batch(bodies, headers, done)
            if went == done:  # no room: wait for some
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    driver.call(driver.room_attempt, driver.send_q, left, "send_batch")
                except Timeout as exc:
                    raise _timed_out(exc, done, end) from None
            done = went
        return end

    async def asend(self, messages: Iterable[Any], timeout: Any) -> int:
        """:meth:`nanopy.Socket.asend_batch`'s work."""
        limit = check_timeout(timeout, self._options.send_timeout)
        bodies, headers = self._items(messages, "asend_batch")
        driver = self._driver
        trio_task = in_trio()
        await cancellation_point(trio_task)
        deadline = None if limit is None else time.monotonic() + limit
        done, end = 0, len(bodies)
        driver.check_open()
        waited = False
        while done < end:
            went = driver.send_batch(bodies, headers, done)
            if went == done:  # no room: wait for some
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                waited = True
                try:
                    await driver.acall(driver.room_attempt, driver.send_q, left, "asend_batch")
                except Timeout as exc:
                    raise _timed_out(exc, done, end) from None
            done = went
        if trio_task and not waited:
            await cancel_shielded_checkpoint()
        return end

    def _items(self, messages: Any, what: str) -> tuple[list[bytes], list[bytes] | None]:
        """The bodies of ``messages`` and their headers (None: all empty), checked
        as send() and send_msg() check."""
        protocol = self._driver.core.name
        if not self._raw:
            why = _REFUSED.get(protocol)
            if why is not None:
                raise ProtocolError(
                    f"{what} is not available on {protocol.upper()} sockets: {why}; call send() in a loop"
                )
        if isinstance(messages, (bytes, bytearray, memoryview, str)):
            raise TypeError(f"{what} takes an iterable of messages, e.g. [b'one', b'two']; use send() for one message")
        try:
            iterator = iter(messages)
        except TypeError:
            raise TypeError(
                f"{what} takes an iterable of messages, e.g. [b'one', b'two'], not {type(messages).__name__}"
            ) from None
        items = list(iterator)
        if set(map(type, items)) <= _PLAIN:  # (the usual batch: bytes alone, no header)
            return items, None
        raw = self._raw
        bodies, headers = [], []
        for data in items:
            if data.__class__ is bytes:
                bodies.append(data)
                headers.append(b"")
            elif isinstance(data, Message):
                bodies.append(data.body if data.body.__class__ is bytes else self._outgoing(data.body))
                headers.append(data.header if raw else b"")
            else:
                bodies.append(self._outgoing(data))
                headers.append(b"")
        return bodies, headers if any(headers) else None


_PLAIN = {bytes}


def _timed_out(exc: Timeout, sent: int, total: int) -> Timeout:
    """The Timeout of a batch: ``exc``'s words, how many went, and ``sent`` set."""
    err = Timeout(f"{exc} after sending {sent} of {total} messages (Timeout.sent = {sent})")
    err.sent = sent
    return err
