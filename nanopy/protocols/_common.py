"""Pieces shared by several protocol cores (and their raw forms).

* :class:`StateTable`: an explicit ``(state, event) -> state`` table; any pair not
  in it is an illegal transition and raises :class:`ProtocolError`.
* :func:`split_backtrace`: pops the backtrace stack (docs/wire.md section 7.1) off a
  payload -- 32-bit big-endian words, pipe ids with the top bit clear, ending with
  the request/survey id that has the top bit set.
* :class:`RawVariant`: ``Req0(options, raw=True)`` and friends build the separate
  raw core instead.
* :class:`SinglePeer`: PAIR v0/v1's one-peer pipe handling.
* :class:`BacktraceQueuing`: the receive path of REP, RESPONDENT and all four
  raw backtrace cores (split, hop limit, route or header, fair queue).
* :class:`Replier` / :class:`RawReplier`: the REP and RESPONDENT cores, which
  differ only in their protocol identity; :class:`ReplyRoutes` is the part of a
  cooked one that keeps the routes of requests not answered yet.

The generic building blocks (LoadBalancing, Distributing, FairQueuing,
BodyQueuing) live in :mod:`nanopy.core.base`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from ..core.base import CLOSE_PIPE, Core, FairQueue, FairQueuing, LoadBalancing, PipeInfo
from ..core.callers import PerCaller, current_caller
from ..core.drops import PROTOCOL_ERROR, TTL_EXCEEDED
from ..core.errors import ProtocolError
from ..core.message import Message

END_BIT = 0x80000000  # set on the last word of a backtrace (the request id)
ID_MASK = 0x7FFFFFFF

MALFORMED = "malformed"  # split_backtrace outcomes that are not (header, body)
TOO_MANY_HOPS = "too-many-hops"


S = TypeVar("S", bound=str)
E = TypeVar("E", bound=str)


class StateTable(Generic[S, E]):
    """An explicit state machine: only the listed transitions are legal.

    States and events are string enums (a plain string of the same value looks
    up the same entry); every state change of a core goes through ``step``.
    Each row is ``(state, event, next state, what happens)``: the last part is
    prose for the reader (the cores write their rows as text: :func:`table_rows`).
    docs/protocols.md draws its diagrams and tables from these rows
    (``python -m nanopy.protocols._diagram --write docs/protocols.md``).
    """

    __slots__ = ("initial", "messages", "name", "notes", "transitions")

    def __init__(
        self,
        name: str,
        initial: S,
        rows: Iterable[tuple[S, E, S, str]],
        messages: Mapping[tuple[S, E], str] | None = None,
    ) -> None:
        self.name = name
        self.initial = initial  # the state a new core (or request) starts in
        self.transitions: dict[tuple[S, E], S] = {}
        self.notes: dict[tuple[S, E], str] = {}
        for state, event, new, note in rows:
            if (state, event) in self.transitions:
                raise ValueError(f"{name}: ({state!r}, {event!r}) is listed twice")
            self.transitions[(state, event)] = new
            self.notes[(state, event)] = note
        self.messages = dict(messages or {})  # friendly errors for user-visible misuse
        if not self.messages.keys().isdisjoint(self.transitions):
            raise ValueError(f"{name}: an error message is given for a legal transition")

    def step(self, state: S, event: E) -> S:
        """The state after ``event`` in ``state``; ProtocolError if illegal."""
        try:
            return self.transitions[(state, event)]
        except KeyError:
            msg = self.messages.get((state, event))
            raise ProtocolError(msg or f"{self.name}: '{event}' is illegal in state '{state}'") from None

    def states(self) -> set[S]:
        return {s for s, _ in self.transitions} | set(self.transitions.values())

    def events(self) -> set[E]:
        return {e for _, e in self.transitions}

    def illegal(self) -> Iterable[tuple[S, E]]:
        """Every (state, event) pair that is not a legal transition."""
        for state in sorted(self.states()):
            for event in sorted(self.events()):
                if (state, event) not in self.transitions:
                    yield state, event


def table_rows(states: type[S], events: type[E], text: str) -> list[tuple[S, E, S, str]]:
    """The rows of a :class:`StateTable`, written as a text table: one transition a
    line, ``state event next-state what happens`` (the first three are values of
    ``states`` and ``events``: a misspelt one fails at import)."""
    found: list[tuple[S, E, S, str]] = []
    for line in text.strip().splitlines():
        state, event, new, note = line.split(None, 3)
        found.append((states(state), events(event), states(new), note))
    return found


def split_backtrace(payload: bytes, max_ttl: int) -> tuple[bytes, bytes] | str:
    """Split ``payload`` into (backtrace header, body).

    Returns MALFORMED when the stack runs off the end without an end word (the
    peer is broken: close its pipe, as NNG does) and TOO_MANY_HOPS when the stack
    holds more than ``max_ttl`` words (drop the message, keep the pipe).
    """
    if payload.__class__ is not bytes and not hasattr(payload, "parts"):  # (a Multipart stays one)
        payload = bytes(payload)  # the header is kept and joined to replies: never a view
    # Fast path: a direct peer sends exactly one word.
    if len(payload) >= 4 and payload[0] & 0x80:
        return payload[:4], payload[4:]
    end = len(payload)
    pos = 0
    words = 0
    while pos + 4 <= end:
        words += 1
        last = payload[pos] & 0x80
        pos += 4
        if words > max_ttl:
            # Too long to be legal whether or not an end word follows: drop it
            # without walking a hostile stack to its end.
            return TOO_MANY_HOPS
        if last:
            return payload[:pos], payload[pos:]
    return MALFORMED


class RawVariant:
    """``Cls(options, raw=True)`` builds ``Cls.raw_class`` instead.

    The raw forms of REQ, REP, SURVEYOR and RESPONDENT are separate cores (as in
    NNG's ``xreq.c`` and friends). Only the class that sets ``raw_class`` switches;
    its subclasses are built as asked. A cooked class takes its identity
    (``protocol_id``, ``peer_id``, ``name``, ``peer_name``) from its raw form.
    """

    raw_class: ClassVar[type[Core]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        raw = cls.__dict__.get("raw_class")
        if raw is not None:
            for attr in ("protocol_id", "peer_id", "name", "peer_name"):
                if attr not in cls.__dict__:
                    setattr(cls, attr, getattr(raw, attr))

    def __new__(cls, options: Any = None, raw: bool = False) -> Any:
        variant = cls.__dict__.get("raw_class")
        if raw and variant is not None:
            return variant(options)
        return super().__new__(cls)


# -- PAIR v0 / v1 -----------------------------------------------------------------
class SinglePeer(Core):
    """Monogamous pipe handling: the first pipe is the peer; later ones are closed
    while it lives, and every other pipe event is ignored. List it first among
    the bases so it sees add_pipe/remove_pipe before the other building blocks.
    """

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, raw)
        self.peer: int | None = None

    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        if self.peer is not None:
            self.actions.append((CLOSE_PIPE, pipe.id, f"{self.name.upper()} already has a peer"))
            return
        self.peer = pipe.id
        super().add_pipe(pipe, credit)

    def remove_pipe(self, pid: int) -> None:
        if pid == self.peer:
            self.peer = None
            super().remove_pipe(pid)


# -- REQ/REP and SURVEYOR/RESPONDENT receive side -----------------------------------
class BacktraceQueuing(FairQueuing):
    """Receive side of the backtrace protocols: REQ/REP and SURVEYOR/RESPONDENT.

    Each payload's stack is split off (:func:`split_backtrace`): a stack over the
    hop limit drops the message (counted), a malformed one closes the pipe. A
    cooked core keeps the stack as the message's reply route ``(pid, stack)``
    for ``msg.reply()`` (which finds the socket through the message's pipe); a raw one exposes it in ``Message.header``,
    after the incoming pipe's id when ``push_hop`` is set (raw REP/RESPONDENT).
    """

    hop_limit: ClassVar[int | None] = None  # None: options.max_ttl
    push_hop: ClassVar[bool] = False
    malformed: ClassVar[str] = "{name}: malformed backtrace from peer"

    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        pipe = self.pipes.get(pid)
        if pipe is None:
            return False
        token = pipe.token
        ttl = self.hop_limit or self.options.max_ttl
        raw = self.raw
        hop = pid.to_bytes(4, "big") if self.push_hop else b""
        msgs: list[Message] = []
        ok = True
        for i, payload in enumerate(payloads):
            split = split_backtrace(payload, ttl)
            if isinstance(split, str):
                if split is TOO_MANY_HOPS:
                    self.count_drop(TTL_EXCEEDED, 1, pid)
                    continue
                self.protocol_violation(pid, self.malformed.format(name=self.name))
                self.count_drop(PROTOCOL_ERROR, len(payloads) - i, pid)  # (it and the rest of the read)
                ok = False
                break
            header, body = split
            if raw:
                msgs.append(Message(body, token, hop + header))
            else:
                msg = Message(body, token)
                msg._reply_to = (pid, header)
                msgs.append(msg)
        if msgs:
            ok = self._fq.push(pid, msgs) and ok
        return ok


# -- REP / RESPONDENT -------------------------------------------------------------
# Classic replier state, kept per caller (thread, or trio/asyncio task; see
# nanopy.core.callers): a cooked REP (or RESPONDENT) remembers the route of the last
# request each caller received with recv(); that caller's send() answers it. A
# caller holding none answers the oldest request still unanswered (socket-wide,
# as nanomsg: one thread may receive and another reply).
# Replies made through Message.reply() carry their own route; one that answers the
# caller's pending request is that caller's "answered" event.
class ReplierState(enum.StrEnum):
    """States of one caller's classic send/recv pair on a cooked REP/RESPONDENT."""

    IDLE = "idle"
    PENDING = "pending"


class ReplierEvent(enum.StrEnum):
    RECV = "recv"
    SEND = "send"
    ANSWERED = "answered"  # the pending request was answered through msg.reply()


_REPLIER_ROWS = """
    idle     recv      pending  the request's route is remembered
    pending  recv      pending  the older request is abandoned (nanomsg)
    pending  send      idle     the reply goes back along the route
    pending  answered  idle     answered through `msg.reply()` instead
"""
REPLIER_TABLE = StateTable(
    "replier", ReplierState.IDLE, table_rows(ReplierState, ReplierEvent, _REPLIER_ROWS),
    {(ReplierState.IDLE, ReplierEvent.SEND): "send() without a pending request: call recv() first "
     "(or reply via msg.reply())"},
)


def _replier_state(route: tuple[int, bytes] | None) -> ReplierState:
    return ReplierState.IDLE if route is None else ReplierState.PENDING


class ReplyRoutes:
    """The classic replies of a cooked REP/RESPONDENT: the routes ``(pid,
    backtrace)`` of requests received and not answered yet, and the answers.

    A part of :class:`Replier` that owns this bookkeeping; it takes requests from
    the core's fair queue and answers through the core's ``send_to`` (both handed
    over at construction). Each caller's pending route lives in a
    :class:`PerCaller` map, so threads and tasks sharing one socket through classic
    recv()/send() answer their own requests; every pending route is also kept
    socket-wide, oldest recv() first, keyed by identity (two copies of a resent
    request are two routes), so a caller with none of its own answers the oldest
    (one thread receives, another sends, as in nanomsg).
    """

    __slots__ = ("_fq", "_pending", "_send_to", "_unanswered")

    def __init__(self, fq: FairQueue, send_to: Callable[[int, bytes], None]) -> None:
        self._fq = fq
        self._send_to = send_to
        self._pending: PerCaller[tuple[int, bytes]] = PerCaller()
        self._unanswered: dict[int, tuple[int, bytes]] = {}

    def __bool__(self) -> bool:
        return bool(self._unanswered)

    def state(self) -> ReplierState:
        """The calling thread's (task's) classic state."""
        return _replier_state(self._pending.get())

    def recv(self) -> Message:
        """The next request; its route becomes the caller's pending one."""
        msg: Message = self._fq.pop()
        caller = current_caller()
        pending = self._pending
        unanswered = self._unanswered
        old = pending.get(caller)
        REPLIER_TABLE.step(_replier_state(old), ReplierEvent.RECV)
        if old is not None:
            unanswered.pop(id(old), None)  # abandoned, as nanomsg's second recv
        elif len(unanswered) > len(pending):
            self._forget_ended_callers()
        route: tuple[int, bytes] = msg._reply_to  # type: ignore[assignment]
        pending.set(route, caller)
        unanswered[id(route)] = route
        return msg

    def _forget_ended_callers(self) -> None:
        """Drop the routes of callers that ended holding one (nothing leaks)."""
        live = {id(route) for _, route in self._pending.items()}
        for key in [key for key in self._unanswered if key not in live]:
            del self._unanswered[key]

    def send(self, body: bytes, header: bytes = b"") -> None:
        """Answer the caller's pending request, else the oldest unanswered one;
        ProtocolError (friendly) when there is none."""
        route = self._pending.pop()
        if route is None and self._unanswered:
            route = next(iter(self._unanswered.values()))  # the oldest, whoever received it
            self._pending.discard_value(route)
        REPLIER_TABLE.step(_replier_state(route), ReplierEvent.SEND)  # idle: the friendly ProtocolError
        assert route is not None
        del self._unanswered[id(route)]
        pid, stack = route
        self._send_to(pid, stack + body)

    def reply(self, route: tuple[int, bytes], body: bytes) -> None:
        """Answer the request that came with ``route`` (pipe id, backtrace)."""
        if self._unanswered.pop(id(route), None) is not None:
            # Answered through the message: a classic send has nothing left to do.
            pending = self._pending
            if pending.get() is route:
                REPLIER_TABLE.step(ReplierState.PENDING, ReplierEvent.ANSWERED)
                pending.pop()
            else:
                pending.discard_value(route)
        pid, header = route
        self._send_to(pid, header + body)


class Replier(LoadBalancing, BacktraceQueuing):
    """Cooked REP/RESPONDENT: strips and stores backtraces, answers along them.

    Its classic replies are a :class:`ReplyRoutes` part. Replies never block: a
    reply for a pipe that is gone or whose send queue is full is dropped and
    counted (the requester resends), as in nanomsg.
    """

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, raw)
        routes = self._routes = ReplyRoutes(self._fq, self.send_to)
        # The hot calls are the part's own methods, bound here unless a subclass
        # has its own: no hop through the core per message (as BodyQueuing binds
        # recv_body). Nothing else replaces them: a replier never holds requeued
        # payloads (``requeues`` is False), the one case LoadBalancing swaps send.
        cls = type(self)
        for name in ("recv", "send", "reply"):
            if getattr(cls, name) is getattr(Replier, name) and not self.requeues:
                setattr(self, name, getattr(routes, name))

    @property
    def state(self) -> ReplierState:
        """The calling thread's (task's) classic state: "idle" or "pending"."""
        return self._routes.state()

    def recv(self) -> Message:
        return self._routes.recv()

    def send(self, body: bytes, header: bytes = b"") -> None:
        self._routes.send(body, header)

    def can_send(self) -> bool:
        # Per caller (the Poller asks from the polling thread), with the socket-wide
        # fallback. send() never waits -- it raises or sends (or drops) -- so no
        # waiter depends on this.
        return bool(self._routes)

    def reply(self, route: tuple[int, bytes], body: bytes) -> None:
        """Answer the request that came with ``route`` (pipe id, backtrace)."""
        self._routes.reply(route, body)


class RawReplier(LoadBalancing, BacktraceQueuing):
    """Raw REP/RESPONDENT (device side): the header is pipe id + backtrace.

    Receiving pushes the id of the incoming pipe (top bit clear) onto the stack;
    sending pops the first word to choose the pipe. Unknown or full pipes: dropped.
    """

    push_hop = True

    def __init__(self, options: Any, raw: bool = True) -> None:
        super().__init__(options, True)

    def send(self, body: bytes, header: bytes = b"") -> None:
        if len(header) < 4 or len(header) % 4:
            raise ProtocolError(
                f"raw {self.name}: the header must be a pipe id word followed by the "
                f"backtrace (as received); got {len(header)} bytes"
            )
        self.send_to(int.from_bytes(header[:4], "big"), header[4:] + body)

    def can_send(self) -> bool:
        return True
