"""The protocol operations beyond send and receive, as typed seams.

A core offers ``request()`` (REQ), replies (REP, RESPONDENT), ``survey()``
(SURVEYOR) or ``subscribe()`` (SUB) by having the methods of one of these
protocols. :class:`Operations` looks once, when the socket is built, which of
them its core has; the socket's conveniences (nanopy/socket/requests.py,
nanopy/socket/messaging.py) then call a typed object, or refuse with a ProtocolError
that names the socket's protocol -- no ``Any`` core, no lookup by name per call.

May call: nothing (declarations, and one isinstance check per protocol per socket).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from .errors import ProtocolError
from .message import Message


@runtime_checkable
class RequestOps(Protocol):
    """REQ: requests with ids, each answered by one reply."""

    def start_request(self, body: bytes) -> int: ...

    def reply_ready(self, rid: int) -> bool: ...

    def take_reply(self, rid: int) -> Message | None: ...

    def cancel_request(self, rid: int) -> None: ...


@runtime_checkable
class ReplyOps(Protocol):
    """REP, RESPONDENT: answer the message that arrived with ``route``."""

    def reply(self, route: Any, body: bytes) -> None: ...


@runtime_checkable
class SurveyOps(Protocol):
    """SURVEYOR: surveys with ids, each answered by any number of respondents."""

    def start_survey(self, body: bytes) -> int: ...

    def answer_ready(self, sid: int) -> bool: ...

    def take_answer(self, sid: int) -> Message | None: ...


@runtime_checkable
class SubscribeOps(Protocol):
    """SUB: topics."""

    def subscribe(self, topic: bytes) -> None: ...

    def unsubscribe(self, topic: bytes) -> None: ...

    @property
    def topics(self) -> Iterable[bytes]: ...


class Operations:
    """Which operations a socket's core offers (found once, when the socket is built)."""

    __slots__ = ("_name", "_protocol", "_raw", "reply", "request", "subscribe", "survey")

    def __init__(self, core: object, raw: bool, protocol: str, name: Any) -> None:
        self.request = core if isinstance(core, RequestOps) else None
        self.reply = core if isinstance(core, ReplyOps) else None
        self.survey = core if isinstance(core, SurveyOps) else None
        self.subscribe = core if isinstance(core, SubscribeOps) else None
        self._raw = raw
        self._protocol = protocol
        self._name = name  # the socket's name (an option: read when an error is raised)

    def refuse(self, what: str, cooked: bool = False) -> ProtocolError:
        """The error of ``what`` on a socket whose core lacks it (or is raw, for ``cooked`` calls)."""
        if cooked and self._raw:
            return ProtocolError(f"{self._name()}: {what} is not available on raw sockets")
        return ProtocolError(f"{self._name()}: {what} is not available on {self._protocol} sockets")

    def requests(self) -> RequestOps:
        if self.request is None or self._raw:
            raise self.refuse("request()", cooked=True)
        return self.request

    def surveys(self) -> SurveyOps:
        if self.survey is None or self._raw:
            raise self.refuse("survey()", cooked=True)
        return self.survey

    def replies(self) -> ReplyOps:
        if self.reply is None:
            raise self.refuse("reply()")
        return self.reply

    def topics(self, what: str) -> SubscribeOps:
        if self.subscribe is None:
            raise self.refuse(what)
        return self.subscribe
