"""REQ/REP and SURVEYOR/RESPONDENT conveniences of :class:`nanopy.Socket`.

``request()`` and ``survey()`` may run from many threads and tasks at once on one
socket: each request (survey) has its own id, its own :class:`WaitQueue`, and the
:class:`_IdRouter` wakes exactly the caller whose reply (answer) arrived.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from ._core import Core
from ._errors import ProtocolError
from ._message import Message
from ._util import ASYNC_YIELD_EVERY, DEFAULT, as_bytes, yield_to_loop
from ._waiters import WaitQueue

if TYPE_CHECKING:
    from ._socket import Socket

class _IdRouter:
    """Wakes the waiter of each request/survey id whose state changed (lock held).

    Sits in ``Socket._wait_queues`` like a WaitQueue: the core lists ids in
    ``core.replied``; ``wake_one`` routes each to that id's own WaitQueue, so a
    reply wakes exactly its caller however many requests are in flight.
    """

    __slots__ = ("_core", "queues")

    def __init__(self, core: Core) -> None:
        self._core = core
        core.replied = []  # type: ignore[attr-defined]  # the core starts listing ids
        self.queues: dict[int, WaitQueue] = {}

    @property
    def waiters(self) -> list[int]:
        return self._core.replied  # type: ignore[attr-defined]

    def wake_one(self) -> None:
        replied = self._core.replied  # type: ignore[attr-defined]
        queues = self.queues
        for key in replied:
            queue = queues.get(key)
            if queue is not None and queue.waiters:
                queue.wake_one()
        replied.clear()

    def wake_all(self) -> None:
        for queue in list(self.queues.values()):
            queue.wake_all()


class RequestMethods:
    """Mixed into :class:`nanopy.Socket`; uses its lock, core and blocking machinery."""

    _router: _IdRouter | None = None  # created on first request()/survey()

    def _id_router(self: Socket) -> _IdRouter:
        """The per-id waiter router (lock held); registered as a wait queue once."""
        router = self._router
        if router is None:
            router = self._router = _IdRouter(self._core)
            self._wait_queues.append(router)  # type: ignore[arg-type]
        return router

    def _cooked_method(self, name: str, what: str) -> Callable[..., Any]:
        if self.raw:
            raise ProtocolError(f"{self.name}: {what} is not available on raw sockets")
        return self._core_method(name, what)

    def _start_request(self, data: bytes) -> tuple[int, WaitQueue]:
        core = self._core
        with self._lock:
            self._check_open()
            rid = self._cooked_method("start_request", "request()")(data)
            self._sent += 1
            self._bytes_sent += len(data)
            queue = WaitQueue(lambda: core.reply_ready(rid))  # type: ignore[attr-defined]
            self._id_router().queues[rid] = queue
            actions = self._take_actions()
            self._wake()
        if actions:
            self._execute(actions)
        return rid, queue

    def _take_reply_attempt(self, rid: int) -> Callable[[], Message]:
        core = self._core

        def attempt() -> Message:
            msg = core.take_reply(rid)  # type: ignore[attr-defined]
            self._received += 1
            self._bytes_received += len(msg.body)
            self._router.queues.pop(rid, None)  # type: ignore[union-attr]
            return msg

        return attempt

    def _forget_request(self, rid: int) -> None:
        with self._lock:
            if self._router is not None:
                self._router.queues.pop(rid, None)
            self._core.cancel_request(rid)  # type: ignore[attr-defined]
            actions = self._take_actions()
        if actions:
            self._execute(actions)

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
        if data.__class__ is not bytes:
            data = as_bytes(data)
        timeout = self._timeout(timeout, self._options.recv_timeout)
        rid, queue = self._start_request(data)
        try:
            return self._call(self._take_reply_attempt(rid), queue, timeout, "request").body
        except BaseException:
            self._forget_request(rid)
            raise

    async def arequest(self, data: Any, *, timeout: float | None = DEFAULT) -> bytes:
        """Async :meth:`request` (trio or asyncio); cancelling it abandons the request.

        Args:
            data: the request body (bytes-like).
            timeout: seconds for the whole round trip; defaults to ``recv_timeout``.

        Returns:
            The reply body.

        Raises:
            Timeout: no reply in time.
            Closed: the socket closed.
            ProtocolError: not a cooked REQ.
        """
        data = as_bytes(data)
        timeout = self._timeout(timeout, self._options.recv_timeout)
        rid, queue = self._start_request(data)
        try:
            return (await self._acall(self._take_reply_attempt(rid), queue, timeout, "request")).body
        except BaseException:
            self._forget_request(rid)
            raise

    def _reply(self, route: Any, data: Any, timeout: float | None = None) -> None:
        """REP/RESPONDENT: answer the request that arrived with ``route``.

        Never blocks: a reply for a pipe that is gone or full is dropped (counted)
        and the requester's resend recovers, as in nanomsg.
        """
        if data.__class__ is not bytes:
            data = as_bytes(data)
        with self._lock:
            self._check_open()
            self._core.reply(route, data)  # type: ignore[attr-defined]
            self._sent += 1
            self._bytes_sent += len(data)
            actions = self._take_actions()
            self._wake()
        if actions:
            self._execute(actions)

    async def _areply(self, route: Any, data: Any) -> None:
        self._reply(route, data)
        self._async_calls += 1
        if self._async_calls % ASYNC_YIELD_EVERY == 0:
            await yield_to_loop()

    def _start_survey(self, data: Any) -> tuple[int, WaitQueue]:
        data = as_bytes(data)
        core = self._core
        with self._lock:
            self._check_open()
            sid = self._cooked_method("start_survey", "survey()")(data)
            self._sent += 1
            self._bytes_sent += len(data)
            queue = WaitQueue(lambda: core.answer_ready(sid))  # type: ignore[attr-defined]
            self._id_router().queues[sid] = queue
            actions = self._take_actions()
            self._wake()
        if actions:
            self._execute(actions)
        return sid, queue

    def _take_answer_attempt(self, sid: int) -> Callable[[], Message | None]:
        core = self._core

        def attempt() -> Message | None:
            msg = core.take_answer(sid)  # type: ignore[attr-defined]
            if msg is None:
                self._router.queues.pop(sid, None)  # type: ignore[union-attr]
            else:
                self._received += 1
                self._bytes_received += len(msg.body)
            return msg

        return attempt

    def _end_survey(self, sid: int) -> None:
        # No lock: this may run from a generator finalizer (GC) on a thread that
        # already holds it; a single dict.pop is atomic anyway.
        if self._router is not None:
            self._router.queues.pop(sid, None)

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
        sid, queue = self._start_survey(data)
        return self._answers(sid, queue)

    def _answers(self, sid: int, queue: WaitQueue) -> Iterator[bytes]:
        attempt = self._take_answer_attempt(sid)
        try:
            while True:
                msg = self._call(attempt, queue, None, "survey")
                if msg is None:
                    return
                yield msg.body
        finally:
            self._end_survey(sid)

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
        sid, queue = self._start_survey(data)
        return self._aanswers(sid, queue)

    async def _aanswers(self, sid: int, queue: WaitQueue) -> AsyncIterator[bytes]:
        attempt = self._take_answer_attempt(sid)
        try:
            while True:
                msg = await self._acall(attempt, queue, None, "survey")
                if msg is None:
                    return
                yield msg.body
        finally:
            self._end_survey(sid)
