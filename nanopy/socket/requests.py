"""REQ/REP and SURVEYOR/RESPONDENT conveniences of :class:`nanopy.Socket`.

``request()`` and ``survey()`` may run from many threads and tasks at once on one
socket: each request (survey) has its own id and its own wait queue in the
socket driver, and the core's ``(READY, id)`` action wakes exactly the caller
whose reply (answer) arrived.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..core.message import Message
from ..driver.socket_driver import checkpoint_after, checkpoint_before
from .util import DEFAULT, as_bytes, async_twin_of, check_timeout

if TYPE_CHECKING:
    from ..core.operations import Operations
    from ..driver.socket_driver import SocketDriver
    from ..driver.waiters import WaitQueue


class RequestMethods:
    """REQ/REP and SURVEYOR/RESPONDENT calls, mixed into :class:`nanopy.Socket`: each
    hands the call to the socket's :class:`Requests` part."""

    _requests: Requests

    def request(self, data: Any, *, timeout: float | None = DEFAULT) -> bytes:
        """REQ: send ``data`` as a new request and return the reply to it.

        Thread-safe: any number of threads may call it at once on one socket; each
        request has its own id and gets its own reply. Independent of the classic
        ``send``/``recv`` pair (neither cancels the other). The request is resent
        every ``resend_interval`` and at once when its pipe dies, until answered.

        Args:
            data: the request body (bytes-like).
            timeout: seconds for the whole round trip; defaults to ``recv_timeout``.

        Returns:
            The reply body.

        Raises:
            Timeout: no reply in time (the request is abandoned; a late reply is
                dropped).
            Closed: the socket closed.
            ProtocolError: not a cooked REQ.
        """
        return self._requests.request(data, timeout)

    @async_twin_of(request)
    async def arequest(self, data: Any, *, timeout: float | None = DEFAULT) -> bytes:
        """Async :meth:`request` (trio or asyncio); cancelling it abandons the request."""
        return await self._requests.arequest(data, timeout)

    def _reply(self, route: Any, data: Any, timeout: float | None = None) -> None:
        """REP/RESPONDENT: answer the request that arrived with ``route``.

        Never blocks: a reply for a pipe that is gone or full is dropped (counted)
        and the requester's resend recovers, as in nanomsg.
        """
        self._requests.reply(route, data)

    async def _areply(self, route: Any, data: Any) -> None:
        await self._requests.areply(route, data)

    def survey(self, data: Any) -> Iterator[bytes]:
        """SURVEYOR: send a survey now; iterate over the answers until its deadline.

        The iterator ends ``survey_deadline`` seconds after the call, or as soon
        as a newer survey starts on this socket. Late answers are dropped.

        Args:
            data: the survey body (bytes-like).

        Returns:
            An iterator over the answer bodies.

        Raises:
            ProtocolError: not a cooked SURVEYOR.
            Closed: the socket is closed.
        """
        return self._requests.survey(data)

    def asurvey(self, data: Any) -> AsyncIterator[bytes]:
        """Async :meth:`survey`: ``async for answer in sock.asurvey(b"?")``.

        The survey is sent when ``asurvey`` is called.

        Args:
            data: the survey body (bytes-like).

        Returns:
            An async iterator over the answer bodies.

        Raises:
            ProtocolError: not a cooked SURVEYOR.
            Closed: the socket is closed.
        """
        return self._requests.asurvey(data)


class Requests:
    """The request part of a socket: request and survey ids, their waits, replies.

    Each request (survey) id gets its own wait queue in the driver; the core's
    ``(READY, id)`` action wakes exactly that id's caller.
    """

    def __init__(self, driver: SocketDriver, ops: Operations, options: Any, outgoing: Callable[[Any], bytes]) -> None:
        self._driver = driver
        self._ops = ops
        self._options = options  # (read per call: recv_timeout may change)
        self._outgoing = outgoing

    def _start_request(self, data: bytes) -> tuple[int, WaitQueue]:
        core = self._ops.requests()
        return self._driver.start_id(lambda: core.start_request(data), core.reply_ready, len(data))

    def _take_reply_attempt(self, rid: int) -> Callable[[], Message | None]:
        return self._driver.take_attempt(rid, self._ops.requests().take_reply, one_shot=True)

    def _forget_request(self, rid: int) -> None:
        self._driver.forget_id(rid, self._ops.requests().cancel_request)

    def request(self, data: Any, timeout: Any) -> bytes:
        """:meth:`nanopy.Socket.request`'s work."""
        if data.__class__ is not bytes:
            data = self._outgoing(data)
        timeout = check_timeout(timeout, self._options.recv_timeout)
        rid, queue = self._start_request(data)
        try:
            msg = self._driver.call(self._take_reply_attempt(rid), queue, timeout, "request")
            assert msg is not None
            return msg.body
        except BaseException:
            self._forget_request(rid)
            raise

    async def arequest(self, data: Any, timeout: Any) -> bytes:
        """:meth:`nanopy.Socket.arequest`'s work."""
        data = self._outgoing(data)
        timeout = check_timeout(timeout, self._options.recv_timeout)
        await checkpoint_before()  # cancelled: nothing is sent
        rid, queue = self._start_request(data)
        try:
            msg = await self._driver.acall(self._take_reply_attempt(rid), queue, timeout, "request")
            assert msg is not None
            return msg.body
        except BaseException:
            self._forget_request(rid)
            raise

    def reply(self, route: Any, data: Any) -> None:
        """Answer the request that arrived with ``route``; never blocks (see ``Socket._reply``)."""
        if data.__class__ is not bytes:
            data = self._outgoing(data)
        driver = self._driver
        core = self._ops.replies()

        def reply() -> None:
            core.reply(route, data)
            driver.sent += 1
            driver.bytes_sent += len(data)

        driver.feed(reply)

    async def areply(self, route: Any, data: Any) -> None:
        """Async :meth:`reply`: a checkpoint before and after."""
        trio_task = await checkpoint_before()
        self.reply(route, data)
        await checkpoint_after(trio_task)

    def _start_survey(self, data: Any) -> tuple[int, WaitQueue]:
        data = as_bytes(data)
        core = self._ops.surveys()
        return self._driver.start_id(lambda: core.start_survey(data), core.answer_ready, len(data))

    def _take_answer_attempt(self, sid: int) -> Callable[[], Message | None]:
        return self._driver.take_attempt(sid, self._ops.surveys().take_answer, one_shot=False)

    def _end_survey(self, sid: int) -> None:
        self._driver.forget_id(sid)

    def survey(self, data: Any) -> Iterator[bytes]:
        """Start a survey; the iterator over its answers."""
        sid, queue = self._start_survey(data)
        return self._answers(sid, queue)

    def _answers(self, sid: int, queue: WaitQueue) -> Iterator[bytes]:
        attempt = self._take_answer_attempt(sid)
        try:
            while True:
                msg = self._driver.call(attempt, queue, None, "survey")
                if msg is None:
                    return
                yield msg.body
        finally:
            self._end_survey(sid)

    def asurvey(self, data: Any) -> AsyncIterator[bytes]:
        """Start a survey; the async iterator over its answers."""
        sid, queue = self._start_survey(data)
        return self._aanswers(sid, queue)

    async def _aanswers(self, sid: int, queue: WaitQueue) -> AsyncIterator[bytes]:
        attempt = self._take_answer_attempt(sid)
        try:
            while True:
                msg = await self._driver.acall(attempt, queue, None, "survey")
                if msg is None:
                    return
                yield msg.body
        finally:
            self._end_survey(sid)
