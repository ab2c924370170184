"""REQ/REP (request/reply v0): requests load-balanced to servers, replies routed back.

Theory of operation
-------------------
Wire (docs/wire.md section 7.1): every message starts with a backtrace stack of 32-bit
big-endian words. The bottom word is the request id, with the top bit set; each
raw REP a request passes (a device) pushes the id of the pipe it came in on, top
bit clear. A REP answers with the stack it received, so each device can pop its
word and send the reply back the way the request came.

REQ (cooked) keeps any number of requests in flight, each with its own id. The
classic ``send``/``recv`` pair uses one per caller -- thread, or trio/asyncio
task (:mod:`nanopy.core.callers`): a caller's new ``send`` abandons only that
caller's previous classic request, as nanomsg does for its one request, and its
``recv`` returns the reply to its own request; the core names a caller whose
reply arrived with ``(READY_CALLER, caller)`` so the socket wakes exactly it.
A caller with no classic request of its own takes (adopts) the socket's oldest
request that no caller's ``recv`` has asked for yet, so one thread may send and
another receive, as with nanomsg and NNG.
``Socket.request()`` uses one id per call. Many threads or tasks thus share one
socket without contexts. Ids start at
a random 31-bit value and count up; the id is the whole first word (top bit set).
Each request goes through ``REQUEST_TABLE`` (idle -> queued -> sent -> done, with
resends, lost pipes and cancellation; docs/protocols.md draws it from the table).
``take`` in queued or sent is not a transition: the caller waits.

A request with no REP connected stays queued until one connects (nanomsg and NNG
hold it too). Resends reuse the id. They are clocked by one "tick" timer running
at a quarter of ``resend_interval`` while anything is outstanding (not a timer per
request, so a busy socket does not pile up timers): a request is resent after
between 1 and 1.25 ``resend_interval``. Replies whose id matches nothing are
dropped (counted); a reply shorter than 4 bytes or whose first word lacks the top
bit closes the pipe (NNG behaviour).

REP (cooked) strips the stack, drops requests with more than ``max_ttl`` words
(loop protection, counted), and queues the rest fairly per pipe. ``recv`` makes
the request the *pending* one for the classic ``send``; every received message
also carries its route, so ``msg.reply()`` can answer it from any thread in any
order. See :mod:`nanopy.protocols._common` for the shared replier cores.

Raw mode (``raw=True``, devices): constructing ``Req0``/``Rep0`` with ``raw=True``
gives the raw variants :class:`XReq0`/:class:`XRep0` (separate classes, as NNG's
``xreq.c``/``xrep.c``). They expose the stack in ``Message.header`` and keep no
request state, timers or resends.
"""

from __future__ import annotations

import enum
import random
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from ..core.base import (
    ARM_TIMER,
    CANCEL_TIMER,
    READY,
    READY_CALLER,
    TRANSMIT,
    Action,
    Core,
    LoadBalancer,
    LoadBalancing,
    PipeInfo,
)
from ..core.callers import PerCaller, current_caller
from ..core.drops import CANCELLED, PROTOCOL_ERROR
from ..core.errors import WouldBlock
from ..core.message import Message
from ._common import END_BIT, ID_MASK, BacktraceQueuing, RawReplier, RawVariant, Replier, StateTable, table_rows


class RequestState(enum.StrEnum):
    """States of one request."""

    IDLE = "idle"
    QUEUED = "queued"
    SENT = "sent"
    DONE = "done"


class RequestEvent(enum.StrEnum):
    """Events of one request."""

    SEND = "send"
    TRANSMIT = "transmit"
    REPLY = "reply"
    CANCEL = "cancel"
    PIPE_LOST = "pipe_lost"
    RESEND = "resend"
    TAKE = "take"


_REQUEST_ROWS = """
    idle    send       queued  new id; waits for a pipe with send credit
    queued  transmit   sent    written to one pipe (priority, then round robin)
    queued  reply      done    a reply to an earlier transmission is accepted
    queued  cancel     idle    abandoned (timeout, cancellation, a newer classic send)
    sent    reply      done    matching id: kept for its caller
    sent    pipe_lost  queued  the pipe died: resent at once on another pipe
    sent    resend     queued  no reply after `resend_interval`: sent again, on another pipe when one can take it
    sent    cancel     idle    abandoned; a late reply is dropped
    done    take       idle    the caller takes the reply
    done    cancel     idle    the reply is dropped (counted)
"""
REQUEST_TABLE = StateTable(
    "req", RequestState.IDLE, table_rows(RequestState, RequestEvent, _REQUEST_ROWS),
    {(RequestState.IDLE, RequestEvent.TAKE): "recv() without a request: send() a request first (this thread or "
     "task has none, and no other classic request is left unclaimed)"},
)

RESEND_TICKS = 4  # tick timer period = resend_interval / RESEND_TICKS
_TICK = "resend-tick"


class _Request:
    __slots__ = ("id", "payload", "pid", "reply", "stamp", "state")

    def __init__(self, rid: int, payload: bytes) -> None:
        self.id = rid
        self.payload = payload
        self.state = REQUEST_TABLE.initial
        self.pid: int | None = None  # the pipe of the latest transmission
        self.stamp = 0  # resend tick count at the latest transmission
        self.reply: Message | None = None


class XReq0(LoadBalancing, BacktraceQueuing):
    """Raw REQ: sends header + body load-balanced; received replies keep their stack.

    No ids, no resends, no matching: a device forwards whatever comes.
    """

    protocol_id = 0x30
    peer_id = 0x31
    name = "req"
    peer_name = "rep"
    hop_limit = 255  # replies shrink on the way back: no hop limit to enforce here
    malformed = "raw req: reply without a request id word"
    requeues = True  # a dead pipe's unwritten requests go to the other REPs

    def __init__(self, options: Any, raw: bool = True) -> None:
        super().__init__(options, True)

    def send(self, body: bytes, header: bytes = b"") -> None:
        pid = self._lb.take()
        if pid is None:
            raise WouldBlock
        self.actions.append((TRANSMIT, pid, header + body))


class RequestTracker:
    """The requests of a cooked REQ: ids, states, the queue waiting for send credit,
    which pipe carries which, and the resend schedule.

    A part of :class:`Req0` that owns these fields. It spends the credit of the
    core's :class:`LoadBalancer` and emits its TRANSMIT, ARM_TIMER and READY actions
    into the core's action list (both handed over at construction).
    """

    __slots__ = ("_actions", "_inflight", "_lb", "_next", "_options", "_queue", "_requests", "_sent", "_tick",
                 "_ticking")

    def __init__(self, actions: list[Action], lb: LoadBalancer, options: Any) -> None:
        self._actions = actions
        self._lb = lb
        self._options = options
        self._requests: dict[int, _Request] = {}
        self._queue: deque[int] = deque()  # request ids waiting for send credit
        self._inflight: dict[int, set[int]] = {}  # pid -> ids last sent on it
        self._sent: dict[int, None] = {}  # ids in "sent", oldest transmission first
        self._next = random.getrandbits(31)
        self._tick = 0
        self._ticking = False

    def __len__(self) -> int:
        return len(self._requests)

    def state(self, rid: int) -> RequestState:
        req = self._requests.get(rid)
        return RequestState.IDLE if req is None else req.state

    def ready(self, rid: int) -> bool:
        """Whether request ``rid`` has its reply (or is gone): its caller may go on."""
        req = self._requests.get(rid)
        return req is None or req.state is RequestState.DONE

    # -- pipes ---------------------------------------------------------------------
    def credit(self, pid: int, n: int) -> None:
        """``n`` more requests may go to pipe ``pid``: queued ones go now."""
        self._lb.give(pid, n)
        if self._queue:
            self.flush()

    def pipe_added(self, pid: int) -> None:
        self._inflight[pid] = set()
        if self._queue:
            self.flush()

    def pipe_lost(self, pid: int) -> None:
        """Send again, on the best other pipe, each request whose latest attempt
        went to pipe ``pid`` (once: the pipe is forgotten)."""
        lost = self._inflight.pop(pid, ())
        requests = self._requests
        for rid in sorted(lost):
            req = requests.get(rid)
            if req is not None and req.state is RequestState.SENT:
                req.state = REQUEST_TABLE.step(RequestState.SENT, RequestEvent.PIPE_LOST)
                self._sent.pop(rid, None)
                self._queue.append(rid)
        if self._queue:
            self.flush()

    # -- requests --------------------------------------------------------------------
    def start(self, body: bytes) -> int:
        """Queue a new request and send it if a pipe can take it; returns its id."""
        nxt = self._next
        requests = self._requests
        while True:
            nxt = (nxt + 1) & ID_MASK
            rid = nxt | END_BIT
            if rid not in requests:
                break
        self._next = nxt
        req = _Request(rid, rid.to_bytes(4, "big") + body)
        req.state = REQUEST_TABLE.step(RequestState.IDLE, RequestEvent.SEND)
        requests[rid] = req
        pid = self._lb.take() if not self._queue else None
        if pid is None:
            self._queue.append(rid)
        else:
            self._transmit(req, pid)
        return rid

    def take(self, rid: int) -> Message:
        """The reply to request ``rid``, which is then forgotten; WouldBlock while
        it is outstanding, ProtocolError for an unknown id."""
        req = self._requests.get(rid)
        if req is None:
            REQUEST_TABLE.step(RequestState.IDLE, RequestEvent.TAKE)  # raises ProtocolError
            raise AssertionError("unreachable")
        if req.state is not RequestState.DONE:
            raise WouldBlock
        req.state = REQUEST_TABLE.step(req.state, RequestEvent.TAKE)
        del self._requests[rid]
        return req.reply  # type: ignore[return-value]

    def cancel(self, rid: int) -> RequestState | None:
        """Abandon request ``rid``; its state before, None if it was already finished."""
        req = self._requests.pop(rid, None)
        if req is None:
            return None
        old = req.state
        req.state = REQUEST_TABLE.step(old, RequestEvent.CANCEL)
        self._sent.pop(rid, None)
        if req.pid is not None:
            inflight = self._inflight.get(req.pid)
            if inflight is not None:
                inflight.discard(rid)
        # A queued id is skipped lazily by flush.
        return old

    def replied(self, rid: int, payload: bytes, token: Any) -> bool:
        """Keep ``payload`` (id word first) as the reply of request ``rid`` and wake
        its ``request()`` caller; False if no request waits for it."""
        req = self._requests.get(rid)
        if req is None or req.state is not RequestState.SENT and req.state is not RequestState.QUEUED:
            return False  # stale, duplicate or unknown
        req.state = REQUEST_TABLE.step(req.state, RequestEvent.REPLY)
        req.reply = Message(payload[4:], token)
        req.payload = b""
        self._sent.pop(rid, None)
        if req.pid is not None:
            inflight = self._inflight.get(req.pid)
            if inflight is not None:
                inflight.discard(rid)
        self._actions.append((READY, rid))  # wakes request()'s caller of this id
        return True

    def _transmit(self, req: _Request, pid: int) -> None:
        req.state = REQUEST_TABLE.step(req.state, RequestEvent.TRANSMIT)
        req.pid = pid
        req.stamp = self._tick
        self._inflight[pid].add(req.id)
        self._sent[req.id] = None
        self._actions.append((TRANSMIT, pid, req.payload))
        if not self._ticking:
            interval = self._options.resend_interval
            if interval is not None:
                self._ticking = True
                self._actions.append((ARM_TIMER, _TICK, interval / RESEND_TICKS))

    def flush(self) -> None:
        """Send queued requests while some pipe has credit."""
        queue = self._queue
        requests = self._requests
        lb = self._lb
        while queue and lb:
            rid = queue.popleft()
            req = requests.get(rid)
            if req is None or req.state is not RequestState.QUEUED:
                continue  # cancelled or answered meanwhile
            # A resend goes elsewhere when it can (req.pid: the last attempt's pipe).
            pid = lb.take() if req.pid is None else lb.take_other(req.pid)
            self._transmit(req, pid)  # type: ignore[arg-type]

    def tick(self) -> None:
        """The resend timer fired: queue again what waited long enough for a reply."""
        self._tick += 1
        tick = self._tick
        requests = self._requests
        due = []
        for rid in self._sent:
            if tick - requests[rid].stamp < RESEND_TICKS + 1:
                break  # later ones were sent later still
            due.append(rid)
        for rid in due:
            req = requests[rid]
            req.state = REQUEST_TABLE.step(req.state, RequestEvent.RESEND)
            del self._sent[rid]
            inflight = self._inflight.get(req.pid)  # type: ignore[arg-type]
            if inflight is not None:
                inflight.discard(rid)
            self._queue.append(rid)
        if self._queue:
            self.flush()
        interval = self._options.resend_interval
        if self._sent and interval is not None:
            self._actions.append((ARM_TIMER, _TICK, interval / RESEND_TICKS))
        else:
            self._ticking = False
            if not self._sent:
                self._tick = 0  # idle: restart the count (stamps are all gone)

    def close(self) -> None:
        self._queue.clear()
        self._sent.clear()
        if self._ticking:
            self._ticking = False
            self._actions.append((CANCEL_TIMER, _TICK))


class ClassicCallers:
    """The classic send()/recv() of a cooked REQ: which caller (thread or task)
    owns which request.

    A part of :class:`Req0`: each caller's request id (a :class:`PerCaller` map),
    the owner of each classic request (weakly: a caller that ends without recv()
    has its request cancelled; oldest send first; read by the core through
    :attr:`owners`) and the requests some caller's recv() asked for. A caller with
    none of its own adopts the oldest unclaimed one. Requests are started, taken
    and cancelled through the three functions handed over at construction.
    """

    __slots__ = ("_by_caller", "_cancel", "_claimed", "_owners", "_start", "_take")

    def __init__(
        self,
        start: Callable[[bytes], int],
        take: Callable[[int], Message],
        cancel: Callable[[int], None],
    ) -> None:
        self._start = start
        self._take = take
        self._cancel = cancel
        self._by_caller: PerCaller[int] = PerCaller()
        self._owners: dict[int, weakref.ref[Any]] = {}  # oldest send first
        self._claimed: set[int] = set()  # classic ids some caller's recv() asked for

    @property
    def owners(self) -> Mapping[int, weakref.ref[Any]]:
        """Classic request id -> a weak reference to its caller (read only)."""
        return self._owners

    def send(self, body: bytes, header: bytes = b"") -> None:
        """Start the caller's request; its previous one, and those of callers that
        ended without recv(), are cancelled."""
        caller = current_caller()
        old = self._by_caller.pop(caller)
        if old is not None:
            self._cancel(old)  # only this caller's earlier request
        owners = self._owners
        if owners:
            for rid in [rid for rid, ref in owners.items() if ref() is None]:
                self._cancel(rid)
        rid = self._start(body)
        self._by_caller.set(rid, caller)
        owners[rid] = weakref.ref(caller)

    def forget(self, rid: int) -> None:
        """Request ``rid`` is finished (taken or cancelled)."""
        self._owners.pop(rid, None)
        self._claimed.discard(rid)

    def recv(self) -> Message:
        """The reply to the caller's own request, else to the oldest unclaimed one,
        which it adopts. ProtocolError (friendly) if there is neither; WouldBlock
        while the reply is outstanding."""
        caller = current_caller()
        by_caller = self._by_caller
        rid = by_caller.get(caller)
        if rid is None:
            rid = self._oldest_unclaimed()
            if rid is None:
                REQUEST_TABLE.step(RequestState.IDLE, RequestEvent.TAKE)  # raises the friendly ProtocolError
                raise AssertionError("unreachable")
            sender = self._owners[rid]()  # it lets go of it
            if sender is not None and by_caller.get(sender) == rid:
                by_caller.pop(sender)
            by_caller.set(rid, caller)
            self._owners[rid] = weakref.ref(caller)  # keeps its place in the order
        self._claimed.add(rid)
        msg = self._take(rid)
        by_caller.pop(caller)
        self._owners.pop(rid, None)
        self._claimed.discard(rid)
        return msg

    def peek(self) -> int | None:
        """The request the calling thread's (task's) recv() would wait for."""
        rid = self._by_caller.get()
        return self._oldest_unclaimed() if rid is None else rid

    def _oldest_unclaimed(self) -> int | None:
        """The oldest classic request no caller's recv() has asked for (socket-wide
        fallback: one thread or task sends, another receives, as in nanomsg)."""
        claimed = self._claimed
        for rid in self._owners:  # insertion order: oldest send first
            if rid not in claimed:
                return rid
        return None


class Req0(RawVariant, Core):
    """Cooked REQ (see the module docstring). ``Req0(options, raw=True)`` is an XReq0.

    Made of parts that own their state: a :class:`LoadBalancer` (send credit), a
    :class:`RequestTracker` (requests and resends) and :class:`ClassicCallers`
    (who owns which classic request).
    """

    raw_class = XReq0
    per_caller_recv = True

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, False)
        self._lb = LoadBalancer()
        tracker = self._tracker = RequestTracker(self.actions, self._lb, options)
        classic = self._classic = ClassicCallers(tracker.start, tracker.take, self.cancel_request)
        self._owners = classic.owners  # (read on every reply)
        # Classic send/recv, Socket.request()'s calls and returned credit go straight
        # to the parts (no hop per message), unless a subclass has its own.
        cls = type(self)
        if cls.send is Req0.send:
            self.send = classic.send  # type: ignore[method-assign]
        if cls.recv is Req0.recv:
            self.recv = classic.recv  # type: ignore[method-assign]
        if cls.start_request is Req0.start_request:
            self.start_request = tracker.start  # type: ignore[method-assign]
        if cls.reply_ready is Req0.reply_ready:
            self.reply_ready = tracker.ready  # type: ignore[method-assign]
        if cls.pipe_credit is Req0.pipe_credit:
            self.pipe_credit = tracker.credit  # type: ignore[method-assign]

    # -- pipes ---------------------------------------------------------------------
    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        super().add_pipe(pipe, credit)
        self._lb.add(pipe.id, pipe.send_priority, credit)
        self._tracker.pipe_added(pipe.id)

    def withdraw_pipe(self, pid: int, pending: bool = False) -> None:
        super().withdraw_pipe(pid, pending)
        self._lb.remove(pid)
        self._tracker.pipe_lost(pid)  # found dead: its requests go to another pipe now

    def remove_pipe(self, pid: int) -> None:
        super().remove_pipe(pid)
        self._lb.remove(pid)
        self._tracker.pipe_lost(pid)

    def requeue(self, payloads: list[bytes], pid: int | None = None) -> int:
        return 0  # withdraw_pipe (or remove_pipe) resends every request the pipe carried: none is lost

    def pipe_credit(self, pid: int, n: int) -> None:
        self._tracker.credit(pid, n)

    def timer_fired(self, key: Any) -> None:
        if key == _TICK:
            self._tracker.tick()

    # -- requests (Socket.request) -------------------------------------------------------
    def start_request(self, body: bytes) -> int:
        """Queue a new request and send it if a pipe can take it; returns its id."""
        return self._tracker.start(body)

    def reply_ready(self, rid: int) -> bool:
        return self._tracker.ready(rid)

    def take_reply(self, rid: int) -> Message:
        """The reply to request ``rid``; WouldBlock while it is outstanding."""
        msg = self._tracker.take(rid)
        if rid in self._owners:
            self._classic.forget(rid)
        return msg

    def cancel_request(self, rid: int) -> None:
        """Abandon request ``rid`` (no-op if it is already finished)."""
        old = self._tracker.cancel(rid)
        if old is None:
            return
        self._classic.forget(rid)
        if old is RequestState.DONE:
            self.count_drop(CANCELLED)  # its reply came, and nobody takes it now

    # -- replies ---------------------------------------------------------------------
    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        replied = self._tracker.replied
        owners = self._owners
        actions = self.actions
        info = self.pipes.get(pid)
        token = None if info is None else info.token
        for i, payload in enumerate(payloads):
            if len(payload) < 4 or not payload[0] & 0x80:
                self.protocol_violation(pid, "req: reply without a request id word")
                self.count_drop(PROTOCOL_ERROR, len(payloads) - i, pid)
                return False
            rid = int.from_bytes(payload[:4], "big")
            if not replied(rid, payload, token):
                self.count_drop(CANCELLED, 1, pid)  # stale, duplicate or unknown
                continue
            owner = owners.get(rid)
            if owner is not None:
                caller = owner()
                if caller is not None:
                    actions.append((READY_CALLER, caller))  # wakes that caller's classic recv()
        return True

    # -- classic send/recv (per caller) --------------------------------------------------
    def send(self, body: bytes, header: bytes = b"") -> None:
        self._classic.send(body, header)

    def can_send(self) -> bool:
        return True  # a request waits inside the core for a pipe, never in send()

    def recv(self) -> Message:
        return self._classic.recv()

    def can_recv(self) -> bool:
        """Whether the *calling* thread's (task's) classic reply is here, or, for a
        caller with no request of its own, the oldest unclaimed one's."""
        rid = self._classic.peek()
        return rid is not None and self._tracker.state(rid) is RequestState.DONE

    def close(self) -> None:
        super().close()
        self._tracker.close()

    # -- introspection (tests, stats) ---------------------------------------------------
    def request_state(self, rid: int) -> str:
        return self._tracker.state(rid)

    @property
    def outstanding(self) -> int:
        return len(self._tracker)


class XRep0(RawReplier):
    """Raw REP: the header is the incoming pipe id followed by the backtrace."""

    protocol_id = 0x31
    peer_id = 0x30
    name = "rep"
    peer_name = "req"


class Rep0(RawVariant, Replier):
    """Cooked REP. ``Rep0(options, raw=True)`` is an XRep0."""

    raw_class = XRep0
