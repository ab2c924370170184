"""The socket's message calls: send and receive, sync and async, batches, SUB topics.

Owns: the user-facing fast paths into the driver (``try_send``,
``try_recv_body``) and the fallback to waiting (``call``/``acall``) when they
would block; timeout arguments.

May call: the socket's driver only (nanopy/driver/socket_driver.py and its parts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trio.lowlevel import cancel_shielded_checkpoint

from ..core.message import Message
from ..driver.socket_driver import _Blocked, cancellation_point, in_trio
from ..transports._base import SubscriptionForwarding
from .util import DEFAULT as _DEFAULT
from .util import as_bytes, async_twin_of, check_timeout

if TYPE_CHECKING:
    from ..core.operations import Operations
    from ..driver.socket_driver import SocketDriver


class Messaging:
    """Sending and receiving, mixed into :class:`nanopy.Socket`."""

    _driver: SocketDriver
    _ops: Operations
    _options: Any
    raw: bool
    name: Any

    if TYPE_CHECKING:

        def _outgoing(self, data: Any) -> bytes: ...

        def _refuse_multipart(self, body: bytes) -> bytes: ...

    _timeout = staticmethod(check_timeout)  # (tests and the other parts use it as sock._timeout)

    # -- sending and receiving -------------------------------------------------------
    def send(self, data: Any, *, timeout: float | None = _DEFAULT) -> None:
        """Send a message; returns once it is queued on a pipe.

        Args:
            data: bytes-like (``bytes``, ``bytearray``, ``memoryview``); ``str`` is refused.
            timeout: seconds to wait for room; ``None`` waits forever; ``0`` never
                waits. Defaults to the ``send_timeout`` option.

        On REP/RESPONDENT it answers the request the calling thread (or task)
        last received; on REQ each calling thread (or task) has its own request.

        Raises:
            Timeout: no room in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot send (SUB, PULL) or not now.
            TypeError: ``data`` is not bytes-like.
        """
        if data.__class__ is not bytes:
            data = self._outgoing(data)
        if timeout is _DEFAULT:
            driver = self._driver
            lane = driver.lane
            if lane is not None:
                # try_send's lane step (nanopy/driver/lanes.py) written out, a deliberate
                # exception (docs/architecture.md): a call here costs ~11% of a send.
                # (A closed socket has no lane: close_core revokes it under the lock.)
                done = lane.transmit(data, None, None, True)
                if not done:  # (queued, or written with the credit kept on the lane)
                    return
                if done > 0:
                    driver.credit(lane.pid, done)
                    return
            if not driver.try_send(data, b""):  # the fast path: one round, no waiting
                self._wait_to_send(data, b"", timeout)
            return
        self._send(data, b"", timeout)

    def _send(self, body: bytes, header: bytes, timeout: Any) -> None:
        if timeout is not _DEFAULT:
            self._timeout(timeout, None)  # refuse a bad timeout whichever path runs
        if not self._driver.try_send(body, header):
            self._wait_to_send(body, header, timeout)

    def _wait_to_send(self, body: bytes, header: bytes, timeout: Any) -> None:
        """A send the fast path could not take now: wait for room."""
        driver = self._driver
        timeout = self._timeout(timeout, self._options.send_timeout)
        driver.call(driver.send_attempt(body, header), driver.send_q, timeout, "send")

    def recv(self, *, timeout: float | None = _DEFAULT) -> bytes:
        """Receive the next message body.

        On REQ it returns the reply to the calling thread's (or task's) own request.

        Args:
            timeout: seconds to wait; ``None`` waits forever, ``0`` never waits.
                Defaults to the socket's ``recv_timeout`` option.

        Returns:
            The message body.

        Raises:
            Timeout: nothing arrived in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot receive (PUB, PUSH) or not now; or
                the next message has several frames (ZeroMQ multipart, ``zmtp+``
                pipes), which stays first in line for :meth:`recv_multipart`,
                :meth:`recv_msg` or :meth:`recv_batch`.
        """
        driver = self._driver
        if timeout is _DEFAULT and not driver.closed:
            run = driver.run
            if run:
                try:
                    # try_recv_body's first step written out (docs/architecture.md); a run
                    # holds only bytes, never a multipart message (nanopy/driver/runs.py)
                    return run.popleft()
                except IndexError:
                    pass
            if not run and driver.nothing_queued():
                # try_recv_body's idle look made here (nothing queued, seen without the
                # lock): straight to the wait, whose first try, under the lock, finds a
                # body queued meanwhile (docs/architecture.md, "Deliberate exceptions").
                body = driver.call(driver.recv_body_attempt, driver.recv_q, self._options.recv_timeout, "recv")
                return body if body.__class__ is bytes else self._refuse_multipart(body)
        return _next_plain_body(self, timeout)  # (it checks a timeout given)

    def recv_msg(self, *, timeout: float | None = _DEFAULT) -> Message:
        """Receive the next message with its pipe (and header, on raw sockets).

        Args:
            timeout: seconds to wait; ``None`` waits forever, ``0`` never waits.
                Defaults to the socket's ``recv_timeout`` option.

        Returns:
            A :class:`Message`: ``body``, ``pipe``, ``header``; REP and RESPONDENT
            messages can be answered with ``msg.reply()``.

        Raises:
            Timeout: nothing arrived in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot receive.
        """
        return _next_message(self, timeout)

    def recv_batch(self, max_messages: int, *, timeout: float | None = _DEFAULT) -> list[bytes]:
        """Receive up to ``max_messages`` message bodies in one call.

        Waits (as :meth:`recv`) for the first message, then takes whatever else is
        already queued, up to ``max_messages`` in all, under one lock round and
        without waiting again. Use it to drain a busy socket cheaply.

        A ZeroMQ multipart message (``zmtp+`` pipes) comes back as a
        :class:`~nanopy.zmtp.Multipart`, first in the batch or not: its frames are
        in ``.parts``, never joined away and never refused (unlike :meth:`recv`).

        Args:
            max_messages: the most bodies to return (at least 1).
            timeout: seconds to wait for the first message; ``None`` waits forever,
                ``0`` never waits. Defaults to the socket's ``recv_timeout`` option.

        Returns:
            One to ``max_messages`` message bodies, in arrival order: ``bytes``, or a
            ``Multipart`` (a ``bytes`` subclass) for a message of several frames.

        Raises:
            ValueError: ``max_messages`` < 1.
            Timeout: nothing arrived in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot receive.
        """
        return _batch(self, max_messages, timeout)

    @async_twin_of(recv_batch)
    async def arecv_batch(self, max_messages: int, *, timeout: float | None = _DEFAULT) -> list[bytes]:
        """Receive up to ``max_messages`` bodies in one call, from trio or asyncio.

        The async form of :meth:`recv_batch`; it is a checkpoint. A multipart
        message comes back as a ``Multipart``, as there.
        """
        return await _abatch(self, max_messages, timeout)

    @async_twin_of(send)
    async def asend(self, data: Any, *, timeout: float | None = _DEFAULT) -> None:
        """Async :meth:`send` (trio or asyncio); a checkpoint: if cancelled, it sends nothing."""
        if data.__class__ is not bytes:
            data = self._outgoing(data)
        await _asend(self, data, b"", timeout)

    @async_twin_of(recv)
    async def arecv(self, *, timeout: float | None = _DEFAULT) -> bytes:
        """Async :meth:`recv` (trio or asyncio); a checkpoint: if cancelled, it takes nothing."""
        body = await _anext_body(self, timeout)
        return body if body.__class__ is bytes else self._refuse_multipart(body)

    @async_twin_of(recv_msg)
    async def arecv_msg(self, *, timeout: float | None = _DEFAULT) -> Message:
        """Async :meth:`recv_msg` (trio or asyncio); a checkpoint: if cancelled, it takes nothing."""
        timeout = self._timeout(timeout, self._options.recv_timeout)
        driver = self._driver
        return await driver.acall(driver.recv_attempt, driver.recv_q, timeout, "recv")

    # -- protocol conveniences ----------------------------------------------------------
    # Each delegates to an optional core method; a protocol without it raises
    # ProtocolError. REQ/REP and SURVEYOR methods live below (issue: protocols).
    def subscribe(self, topic: bytes | str) -> None:
        """SUB: receive messages that start with ``topic``.

        Args:
            topic: a prefix; ``b""`` matches everything. A ``str`` is UTF-8 encoded.
                Subscribing twice needs two unsubscribes.

        Raises:
            ProtocolError: not a cooked SUB socket.
            Closed: the socket is closed.
        """
        topic = topic.encode() if isinstance(topic, str) else as_bytes(topic)
        self._driver.feed(self._ops.topics("subscribe()").subscribe, topic)
        self._subscriptions_changed()

    def unsubscribe(self, topic: bytes | str) -> None:
        """SUB: drop one subscription to ``topic``.

        Args:
            topic: a prefix given to :meth:`subscribe` before.

        Raises:
            ValueError: not subscribed to ``topic``.
            ProtocolError: not a cooked SUB socket.
            Closed: the socket is closed.
        """
        topic = topic.encode() if isinstance(topic, str) else as_bytes(topic)
        self._driver.feed(self._ops.topics("unsubscribe()").unsubscribe, topic)
        self._subscriptions_changed()

    def _subscriptions_changed(self) -> None:
        """Pipes that forward subscriptions to the peer (ZMTP) hear of the change."""
        conns: list[SubscriptionForwarding] = []
        for driver in self._driver.pipe_drivers():
            conn = driver.conn
            if isinstance(conn, SubscriptionForwarding):
                conns.append(conn)
        if conns:
            self._tell_subscriptions(conns)

    def _tell_subscriptions(self, conns: list[SubscriptionForwarding]) -> None:
        """Push the subscriptions to ``conns`` (SubscriptionForwarding, nanopy/transports/_base.py)
        in one round: a peer hears successive changes in the order they were made."""
        ops, raw = self._ops.subscribe, self.raw
        self._driver.feed(lambda: _push_subscriptions(conns, frozenset((b"",)) if raw or ops is None
                                                      else frozenset(ops.topics)), check_open=False)

    def send_msg(self, msg: Message, *, timeout: float | None = _DEFAULT) -> None:
        """Send a :class:`Message`, header included: how devices forward on raw sockets.

        Args:
            msg: the message; on a cooked socket its header is ignored (the
                protocol makes its own).
            timeout: seconds to wait; ``None`` waits forever, ``0`` never waits.
                Defaults to the socket's ``send_timeout`` option.

        Raises:
            Timeout: no room in time.
            Closed: the socket is closed.
            ProtocolError: the protocol cannot send.
        """
        body = msg.body if msg.body.__class__ is bytes else self._outgoing(msg.body)
        self._send(body, msg.header if self.raw else b"", timeout)

    @async_twin_of(send_msg)
    async def asend_msg(self, msg: Message, *, timeout: float | None = _DEFAULT) -> None:
        """Async :meth:`send_msg` (trio or asyncio)."""
        body = msg.body if msg.body.__class__ is bytes else self._outgoing(msg.body)
        await _asend(self, body, msg.header if self.raw else b"", timeout)


# The slow paths of the calls above. (Functions, not methods: the Socket's
# methods only delegate, tests/test_structure.py.)
async def _asend(sock: Messaging, body: bytes, header: bytes, timeout: Any) -> None:
    """Async send of one body (asend, asend_msg): the cancellation point, one round,
    the schedule point; a wait for room only when there is none."""
    if timeout is not _DEFAULT:
        check_timeout(timeout, None)  # refuse a bad timeout whichever path runs
    driver = sock._driver
    # Fast path: the cancellation point, one round, the schedule point.
    trio_task = in_trio()
    await cancellation_point(trio_task)
    if driver.try_send(body, header):
        if trio_task:
            await cancel_shielded_checkpoint()
        return
    timeout = check_timeout(timeout, sock._options.send_timeout)
    await driver.acall(driver.send_attempt(body, header), driver.send_q, timeout, "send")


def _batch(sock: Messaging, max_messages: int, timeout: Any) -> list[bytes]:
    """recv_batch()'s work: what is queued comes in one round (up to ``max_messages``);
    only an empty socket waits, with an attempt that takes the batch in the round
    that finds a first message. (Not recv(): it refuses a multipart message, and a
    batch takes it as it is.)"""
    if max_messages < 1 or timeout is not _DEFAULT:
        _check_batch(max_messages, timeout, "recv_batch")  # (before anything is taken)
    driver = sock._driver
    out = driver.recv_bodies(max_messages)
    if out:
        return out
    timeout = sock._timeout(timeout, sock._options.recv_timeout)
    return driver.call(driver.bodies_attempt(max_messages), driver.recv_q, timeout, "recv")


async def _abatch(sock: Messaging, max_messages: int, timeout: Any) -> list[bytes]:
    """arecv_batch()'s work: :func:`_batch` between a cancellation point and a
    schedule point (a checkpoint; cancelled while it waits, it takes nothing)."""
    if max_messages < 1 or timeout is not _DEFAULT:
        _check_batch(max_messages, timeout, "arecv_batch")  # (before anything is taken)
    driver = sock._driver
    trio_task = in_trio()
    await cancellation_point(trio_task)
    out = driver.recv_bodies(max_messages)
    if out:
        if trio_task:
            await cancel_shielded_checkpoint()
        return out
    timeout = sock._timeout(timeout, sock._options.recv_timeout)
    return await driver.acall(driver.bodies_attempt(max_messages), driver.recv_q, timeout, "recv")


def _check_batch(max_messages: int, timeout: Any, what: str) -> None:
    """A batch receive's arguments, checked before it takes anything."""
    if max_messages < 1:
        raise ValueError(f"{what}: max_messages must be >= 1, got {max_messages}")
    check_timeout(timeout, None)


def _next_plain_body(sock: Messaging, timeout: Any) -> bytes:
    """recv() past its lock-free step: the next body, waiting as ``timeout`` says; a
    multipart message is refused (and stays first in line)."""
    if timeout is not _DEFAULT:
        check_timeout(timeout, None)  # refuse a bad timeout whichever path runs
    driver = sock._driver
    body = driver.try_recv_body()
    if body is None:
        # (the option was checked when set; a timeout given was checked above)
        timeout = sock._options.recv_timeout if timeout is _DEFAULT else check_timeout(timeout, None)
        body = driver.call(driver.recv_body_attempt, driver.recv_q, timeout, "recv")
    # (a multipart message comes this way only, alone: the one class test of recv)
    return body if body.__class__ is bytes else sock._refuse_multipart(body)


def _next_message(sock: Messaging, timeout: Any) -> Message:
    """recv_msg()'s work: the next message with its pipe, waiting as ``timeout`` says."""
    if timeout is not _DEFAULT:
        check_timeout(timeout, None)  # refuse a bad timeout whichever path runs
    driver = sock._driver
    msg = driver.try_once(driver.recv_attempt)
    if not isinstance(msg, _Blocked):
        return msg
    timeout = check_timeout(timeout, sock._options.recv_timeout)
    return driver.call(driver.recv_attempt, driver.recv_q, timeout, "recv")


# The receives that take a multipart message as it is (recv_batch).
async def _anext_body(sock: Messaging, timeout: Any) -> bytes:
    """The next body, multipart or not, waiting for it as ``timeout`` says: a
    checkpoint; if cancelled, it takes nothing."""
    if timeout is not _DEFAULT:
        sock._timeout(timeout, None)  # refuse a bad timeout whichever path runs
    driver = sock._driver
    # Fast path: the cancellation point, one round, the schedule point.
    trio_task = in_trio()
    await cancellation_point(trio_task)
    body = driver.try_recv_body()
    if body is not None:
        if trio_task:
            await cancel_shielded_checkpoint()
        return body
    timeout = sock._timeout(timeout, sock._options.recv_timeout)
    return await driver.acall(driver.recv_body_attempt, driver.recv_q, timeout, "recv")


def _push_subscriptions(conns: list[SubscriptionForwarding], topics: frozenset[bytes]) -> None:
    """In a round of the socket: tell each connection the topics subscribed now."""
    for conn in conns:
        conn.subscriptions(topics)
