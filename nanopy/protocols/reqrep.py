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
from typing import Any

from ..core.base import ARM_TIMER, CANCEL_TIMER, READY, READY_CALLER, TRANSMIT, LoadBalancing, PipeInfo
from ..core.callers import PerCaller, current_caller
from ..core.drops import CANCELLED, PROTOCOL_ERROR
from ..core.errors import WouldBlock
from ..core.message import Message
from ._common import END_BIT, ID_MASK, BacktraceQueuing, RawReplier, RawVariant, Replier, StateTable


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


REQUEST_TABLE = StateTable(
    "req",
    RequestState.IDLE,
    [
        (RequestState.IDLE, RequestEvent.SEND, RequestState.QUEUED, "new id; waits for a pipe with send credit"),
        (RequestState.QUEUED, RequestEvent.TRANSMIT, RequestState.SENT,
         "written to one pipe (priority, then round robin)"),
        (RequestState.QUEUED, RequestEvent.REPLY, RequestState.DONE,
         "a reply to an earlier transmission is accepted"),
        (RequestState.QUEUED, RequestEvent.CANCEL, RequestState.IDLE,
         "abandoned (timeout, cancellation, a newer classic send)"),
        (RequestState.SENT, RequestEvent.REPLY, RequestState.DONE, "matching id: kept for its caller"),
        (RequestState.SENT, RequestEvent.PIPE_LOST, RequestState.QUEUED,
         "the pipe died: resent at once on another pipe"),
        (RequestState.SENT, RequestEvent.RESEND, RequestState.QUEUED,
         "no reply after `resend_interval`: sent again, on another pipe when one can take it"),
        (RequestState.SENT, RequestEvent.CANCEL, RequestState.IDLE, "abandoned; a late reply is dropped"),
        (RequestState.DONE, RequestEvent.TAKE, RequestState.IDLE, "the caller takes the reply"),
        (RequestState.DONE, RequestEvent.CANCEL, RequestState.IDLE, "the reply is dropped (counted)"),
    ],
    {
        (RequestState.IDLE, RequestEvent.TAKE): (
            "recv() without a request: send() a request first (this thread or task has none, "
            "and no other classic request is left unclaimed)"
        )
    },
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


class Req0(RawVariant, LoadBalancing):
    """Cooked REQ (see the module docstring). ``Req0(options, raw=True)`` is an XReq0."""

    raw_class = XReq0
    per_caller_recv = True

    def requeue(self, payloads: list[bytes], pid: int | None = None) -> int:
        return 0  # withdraw_pipe (or remove_pipe) resends every request the pipe carried: none is lost

    def __init__(self, options: Any, raw: bool = False) -> None:
        super().__init__(options, False)
        self._requests: dict[int, _Request] = {}
        self._queue: deque[int] = deque()  # request ids waiting for send credit
        self._inflight: dict[int, set[int]] = {}  # pid -> ids last sent on it
        self._sent: dict[int, None] = {}  # ids in "sent", oldest transmission first
        self._next = random.getrandbits(31)
        # Classic send/recv state per caller: caller -> its request id, and back
        # (weakly: a caller that ends without recv() has its request cancelled).
        self._classic: PerCaller[int] = PerCaller()
        self._classic_owner: dict[int, weakref.ref[Any]] = {}  # oldest send first
        self._claimed: set[int] = set()  # classic ids some caller's recv() asked for
        self._tick = 0
        self._ticking = False

    # -- pipes ---------------------------------------------------------------------
    def add_pipe(self, pipe: PipeInfo, credit: int) -> None:
        super().add_pipe(pipe, credit)
        self._inflight[pipe.id] = set()
        if self._queue:
            self._flush()

    def withdraw_pipe(self, pid: int, pending: bool = False) -> None:
        super().withdraw_pipe(pid, pending)
        self._resend_lost(pid)  # found dead: its requests go to another pipe now

    def remove_pipe(self, pid: int) -> None:
        super().remove_pipe(pid)
        self._resend_lost(pid)

    def _resend_lost(self, pid: int) -> None:
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
            self._flush()

    def pipe_credit(self, pid: int, n: int) -> None:
        self._lb.give(pid, n)
        if self._queue:
            self._flush()

    # -- requests --------------------------------------------------------------------
    def start_request(self, body: bytes) -> int:
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

    def reply_ready(self, rid: int) -> bool:
        req = self._requests.get(rid)
        return req is None or req.state is RequestState.DONE

    def take_reply(self, rid: int) -> Message:
        """The reply to request ``rid``; WouldBlock while it is outstanding."""
        req = self._requests.get(rid)
        if req is None:
            REQUEST_TABLE.step(RequestState.IDLE, RequestEvent.TAKE)  # raises ProtocolError
            raise AssertionError("unreachable")
        if req.state is not RequestState.DONE:
            raise WouldBlock
        req.state = REQUEST_TABLE.step(req.state, RequestEvent.TAKE)
        del self._requests[rid]
        self._classic_owner.pop(rid, None)
        self._claimed.discard(rid)
        return req.reply  # type: ignore[return-value]

    def cancel_request(self, rid: int) -> None:
        """Abandon request ``rid`` (no-op if it is already finished)."""
        req = self._requests.pop(rid, None)
        if req is None:
            return
        self._classic_owner.pop(rid, None)
        self._claimed.discard(rid)
        if req.state is RequestState.DONE:
            self.count_drop(CANCELLED)  # its reply came, and nobody takes it now
        req.state = REQUEST_TABLE.step(req.state, RequestEvent.CANCEL)
        self._sent.pop(rid, None)
        if req.pid is not None:
            inflight = self._inflight.get(req.pid)
            if inflight is not None:
                inflight.discard(rid)
        # A queued id is skipped lazily by _flush.

    def _transmit(self, req: _Request, pid: int) -> None:
        req.state = REQUEST_TABLE.step(req.state, RequestEvent.TRANSMIT)
        req.pid = pid
        req.stamp = self._tick
        self._inflight[pid].add(req.id)
        self._sent[req.id] = None
        self.actions.append((TRANSMIT, pid, req.payload))
        if not self._ticking:
            interval = self.options.resend_interval
            if interval is not None:
                self._ticking = True
                self.actions.append((ARM_TIMER, _TICK, interval / RESEND_TICKS))

    def _flush(self) -> None:
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

    def timer_fired(self, key: Any) -> None:
        if key != _TICK:
            return
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
            self._flush()
        interval = self.options.resend_interval
        if self._sent and interval is not None:
            self.actions.append((ARM_TIMER, _TICK, interval / RESEND_TICKS))
        else:
            self._ticking = False
            if not self._sent:
                self._tick = 0  # idle: restart the count (stamps are all gone)

    # -- replies ---------------------------------------------------------------------
    def messages_received(self, pid: int, payloads: list[bytes]) -> bool:
        requests = self._requests
        for i, payload in enumerate(payloads):
            if len(payload) < 4 or not payload[0] & 0x80:
                self.protocol_violation(pid, "req: reply without a request id word")
                self.count_drop(PROTOCOL_ERROR, len(payloads) - i, pid)
                return False
            rid = int.from_bytes(payload[:4], "big")
            req = requests.get(rid)
            if req is None or req.state is not RequestState.SENT and req.state is not RequestState.QUEUED:
                self.count_drop(CANCELLED, 1, pid)  # stale, duplicate or unknown
                continue
            req.state = REQUEST_TABLE.step(req.state, RequestEvent.REPLY)
            req.reply = Message(payload[4:], self.pipes[pid].token)
            req.payload = b""
            self._sent.pop(rid, None)
            if req.pid is not None:
                inflight = self._inflight.get(req.pid)
                if inflight is not None:
                    inflight.discard(rid)
            self.actions.append((READY, rid))  # wakes request()'s caller of this id
            owner = self._classic_owner.get(rid)
            if owner is not None:
                caller = owner()
                if caller is not None:
                    self.actions.append((READY_CALLER, caller))  # wakes that caller's classic recv()
        return True

    # -- classic send/recv (per caller) --------------------------------------------------
    def send(self, body: bytes, header: bytes = b"") -> None:
        caller = current_caller()
        old = self._classic.pop(caller)
        if old is not None:
            self.cancel_request(old)  # only this caller's earlier request
        self._cancel_orphans()
        rid = self.start_request(body)
        self._classic.set(rid, caller)
        self._classic_owner[rid] = weakref.ref(caller)

    def _cancel_orphans(self) -> None:
        """Cancel classic requests whose caller (thread/task) ended without recv()."""
        owners = self._classic_owner
        if owners:
            for rid in [rid for rid, ref in owners.items() if ref() is None]:
                self.cancel_request(rid)

    def can_send(self) -> bool:
        return True  # a request waits inside the core for a pipe, never in send()

    def recv(self) -> Message:
        caller = current_caller()
        rid = self._classic.get(caller)
        if rid is None:
            rid = self._oldest_unclaimed()
            if rid is None:
                REQUEST_TABLE.step(RequestState.IDLE, RequestEvent.TAKE)  # raises the friendly ProtocolError
            self._adopt(rid, caller)  # type: ignore[arg-type]
        self._claimed.add(rid)  # type: ignore[arg-type]
        msg = self.take_reply(rid)  # type: ignore[arg-type]
        self._classic.pop(caller)
        return msg

    def _oldest_unclaimed(self) -> int | None:
        """The oldest classic request no caller's recv() has asked for (socket-wide
        fallback: one thread or task sends, another receives, as in nanomsg)."""
        claimed = self._claimed
        for rid in self._classic_owner:  # insertion order: oldest send first
            if rid not in claimed:
                return rid
        return None

    def _adopt(self, rid: int, caller: Any) -> None:
        """Make ``caller`` the owner of classic request ``rid`` (its sender lets go of it)."""
        sender = self._classic_owner[rid]()
        if sender is not None and self._classic.get(sender) == rid:
            self._classic.pop(sender)
        self._classic.set(rid, caller)
        self._classic_owner[rid] = weakref.ref(caller)  # keeps its place in the order

    def can_recv(self) -> bool:
        """Whether the *calling* thread's (task's) classic reply is here, or, for a
        caller with no request of its own, the oldest unclaimed one's."""
        rid = self._classic.get()
        if rid is None:
            rid = self._oldest_unclaimed()
            if rid is None:
                return False
        req = self._requests.get(rid)
        return req is not None and req.state is RequestState.DONE

    def close(self) -> None:
        super().close()
        self._queue.clear()
        self._sent.clear()
        if self._ticking:
            self._ticking = False
            self.actions.append((CANCEL_TIMER, _TICK))

    # -- introspection (tests, stats) ---------------------------------------------------
    def request_state(self, rid: int) -> str:
        req = self._requests.get(rid)
        return RequestState.IDLE if req is None else req.state

    @property
    def outstanding(self) -> int:
        return len(self._requests)


class XRep0(RawReplier):
    """Raw REP: the header is the incoming pipe id followed by the backtrace."""

    protocol_id = 0x31
    peer_id = 0x30
    name = "rep"
    peer_name = "req"


class Rep0(RawVariant, Replier):
    """Cooked REP. ``Rep0(options, raw=True)`` is an XRep0."""

    raw_class = XRep0
