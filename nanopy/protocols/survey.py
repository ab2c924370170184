"""SURVEYOR/RESPONDENT (survey v0): ask everyone, collect answers until a deadline.

Theory of operation
-------------------
Wire (docs/wire.md section 7.2): the same backtrace stack as REQ/REP; the bottom word
is the survey id (top bit set), devices push pipe ids (top bit clear).

SURVEYOR (cooked) sends each survey to every connected respondent whose pipe has
send credit; a pipe that cannot take it misses it (best effort, like nanomsg's
``dist`` and NNG). Survey ids start at a random 31-bit value and count up. One
survey is open at a time; ``SURVEY_TABLE`` gives its states (idle, active,
expired; docs/protocols.md draws it from the table). ``recv`` with no survey
open, and an answer or a deadline with none active, are illegal there.

The deadline is ``survey_deadline`` seconds (an ARM_TIMER keyed by the survey
id). Answers with another id, or arriving after the deadline, are dropped and
counted. A message shorter than 4 bytes or without the top bit on its first word
closes the pipe (NNG). ``start_survey``/``take_answer``/``answer_ready`` serve the
``Socket.survey()`` iterators: each follows its own survey id and ends when that
survey expires or a newer one starts.

Deviation from nanomsg: there, answers still unread at the deadline are lost;
here answers that arrived before the deadline stay readable, and the Timeout
comes after them.

RESPONDENT is REP's twin (see :mod:`nanopy.protocols._common`): it strips and
keeps the backtrace (dropping stacks over ``max_ttl`` words), and answers along
it through classic ``send`` or ``msg.reply()``.

Raw mode: ``raw=True`` gives :class:`XSurveyor0` (broadcasts header + body,
exposes each answer's stack) or :class:`XRespondent0` (pipe id + backtrace in
``Message.header``), with no ids, timers or state.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from typing import Any

from ..core.base import ARM_TIMER, CANCEL_TIMER, READY, Distributing
from ..core.drops import CANCELLED, PROTOCOL_ERROR, QUEUE_FULL
from ..core.errors import Timeout, WouldBlock
from ..core.message import Message
from ._common import END_BIT, ID_MASK, BacktraceQueuing, RawReplier, RawVariant, Replier, StateTable, table_rows


class Survey(enum.StrEnum):
    """States of a cooked SURVEYOR."""

    IDLE = "idle"
    ACTIVE = "active"
    EXPIRED = "expired"


class SurveyEvent(enum.StrEnum):
    SEND = "send"
    ANSWER = "answer"
    RECV = "recv"
    DEADLINE = "deadline"


_SURVEY_ROWS = """
    idle     send      active   new id, broadcast, deadline timer armed
    active   send      active   the previous survey is abandoned, its answers dropped
    expired  send      active   a new survey; the expired one's answers are dropped
    active   answer    active   matching id: queued for `recv()` or the iterator
    active   recv      active   an answer, or wait
    active   deadline  expired  later answers are dropped
    expired  recv      idle     answers that came in time first, then `Timeout` once
"""
SURVEY_TABLE = StateTable(
    "surveyor", Survey.IDLE, table_rows(Survey, SurveyEvent, _SURVEY_ROWS),
    {(Survey.IDLE, SurveyEvent.RECV): "recv() with no survey open: send() a survey first"},
)


class XSurveyor0(Distributing, BacktraceQueuing):
    """Raw SURVEYOR: broadcasts header + body; answers keep their stack as header."""

    protocol_id = 0x62
    peer_id = 0x63
    name = "surveyor"
    peer_name = "respondent"
    hop_limit = 255  # answers shrink on the way back: no hop limit to enforce here
    malformed = "raw surveyor: answer without a survey id word"

    def __init__(self, options: Any, raw: bool = True) -> None:
        super().__init__(options, True)

    def send(self, body: bytes, header: bytes = b"") -> None:
        self.distribute(header + body)


class Surveyor0(RawVariant, Distributing):
    """Cooked SURVEYOR (see the module docstring). ``raw=True`` gives an XSurveyor0."""

    raw_class = XSurveyor0

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, False)
        self.state = SURVEY_TABLE.initial
        self.survey_id: int | None = None
        self._answers: deque[Message] = deque()
        self._next = random.getrandbits(31)

    # -- surveys ---------------------------------------------------------------------
    def start_survey(self, body: bytes) -> int:
        """Open a new survey (abandoning any open one) and broadcast it."""
        self.state = SURVEY_TABLE.step(self.state, SurveyEvent.SEND)
        old = self.survey_id
        if old is not None:
            self.actions.append((CANCEL_TIMER, old))
            self.actions.append((READY, old))  # its iterator ends
            if self._answers:
                self.count_drop(CANCELLED, len(self._answers))
            self._answers.clear()
        self._next = (self._next + 1) & ID_MASK
        sid = self.survey_id = self._next | END_BIT
        self.distribute(sid.to_bytes(4, "big") + body)  # (misses count as queue_full drops)
        self.actions.append((ARM_TIMER, sid, self.options.survey_deadline))
        return sid

    def answer_ready(self, sid: int) -> bool:
        return sid != self.survey_id or self.state is not Survey.ACTIVE or bool(self._answers)

    def take_answer(self, sid: int) -> Message | None:
        """The next answer to survey ``sid``; None once it is over; WouldBlock meanwhile."""
        if sid != self.survey_id:
            return None
        if self._answers:
            return self._answers.popleft()
        if self.state is Survey.EXPIRED:
            self.state = SURVEY_TABLE.step(self.state, SurveyEvent.RECV)
            self.survey_id = None
            return None
        raise WouldBlock

    def timer_fired(self, key: Any) -> None:
        if key != self.survey_id or self.state is not Survey.ACTIVE:
            return  # a stale deadline of an abandoned survey
        self.state = SURVEY_TABLE.step(self.state, SurveyEvent.DEADLINE)
        self.actions.append((READY, key))

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        sid = self.survey_id
        answered = False
        for i, payload in enumerate(payloads):
            if len(payload) < 4 or not payload[0] & 0x80:
                self.protocol_violation(pid, "surveyor: answer without a survey id word")
                self.count_drop(PROTOCOL_ERROR, len(payloads) - i, pid)
                return False
            if self.state is not Survey.ACTIVE or int.from_bytes(payload[:4], "big") != sid:
                self.count_drop(CANCELLED, 1, pid)  # late, or for an abandoned survey
                continue
            if len(self._answers) >= self.options.recv_buffer:
                self.count_drop(QUEUE_FULL, 1, pid)
                continue
            self.state = SURVEY_TABLE.step(self.state, SurveyEvent.ANSWER)
            self._answers.append(Message(payload[4:], self.pipes[pid].token))
            answered = True
        if answered:
            self.actions.append((READY, sid))
        return True

    # -- classic send/recv -------------------------------------------------------------
    def send(self, body: bytes, header: bytes = b"") -> None:
        self.start_survey(body)

    def recv(self) -> Message:
        if self._answers:
            return self._answers.popleft()
        state = self.state
        if state is Survey.ACTIVE:
            SURVEY_TABLE.step(state, SurveyEvent.RECV)
            raise WouldBlock
        self.state = SURVEY_TABLE.step(state, SurveyEvent.RECV)  # idle: ProtocolError
        self.survey_id = None
        raise Timeout("surveyor: the survey deadline passed")

    def can_recv(self) -> bool:
        return bool(self._answers) or self.state is Survey.EXPIRED

    def queued(self, pid: int | None = None) -> int:
        if pid is None:
            return len(self._answers)
        return sum(1 for msg in self._answers if msg.pipe is not None and msg.pipe.id == pid)

    def close(self) -> None:
        super().close()
        if self.survey_id is not None:
            self.actions.append((CANCEL_TIMER, self.survey_id))


class XRespondent0(RawReplier):
    """Raw RESPONDENT: the header is the incoming pipe id followed by the backtrace."""

    protocol_id = 0x63
    peer_id = 0x62
    name = "respondent"
    peer_name = "surveyor"


class Respondent0(RawVariant, Replier):
    """Cooked RESPONDENT. ``Respondent0(options, raw=True)`` is an XRespondent0."""

    raw_class = XRespondent0
