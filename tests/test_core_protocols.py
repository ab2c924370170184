"""Drive the REQ/REP, SURVEYOR/RESPONDENT, BUS and PAIR1 cores without any I/O."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from nanopy import ProtocolError, Timeout
from nanopy.core.base import ARM_TIMER, CANCEL_TIMER, CLOSE_PIPE, READY, TRANSMIT, PipeInfo
from nanopy.core.errors import WouldBlock
from nanopy.core.options import new_options
from nanopy.protocols._common import (
    MALFORMED,
    REPLIER_TABLE,
    TOO_MANY_HOPS,
    ReplierEvent,
    ReplierState,
    StateTable,
    split_backtrace,
    table_rows,
)
from nanopy.protocols.bus import Bus0
from nanopy.protocols.pair1 import Pair1
from nanopy.protocols.reqrep import REQUEST_TABLE, RESEND_TICKS, Rep0, Req0, XRep0, XReq0
from nanopy.protocols.survey import SURVEY_TABLE, Respondent0, Surveyor0, XRespondent0, XSurveyor0


def w(*words: int) -> bytes:
    return b"".join(struct.pack(">I", x) for x in words)


def make(cls, raw=False, **opts):
    options = new_options(cls.name)
    for k, v in opts.items():
        setattr(options, k, v)
    return cls(options, raw=raw)


def add(core, pid, credit=16):
    core.add_pipe(PipeInfo(pid, f"pipe{pid}", 8, 8), credit)


def take(core):
    out = list(core.actions)
    core.actions.clear()
    return out


def transmits(actions):
    return [(a[1], a[2]) for a in actions if a[0] == TRANSMIT]


# -- state tables ---------------------------------------------------------------------


@pytest.mark.parametrize("table", [REQUEST_TABLE, SURVEY_TABLE, REPLIER_TABLE], ids=lambda t: t.name)
def test_every_illegal_transition_raises(table: StateTable) -> None:
    illegal = list(table.illegal())
    assert illegal, "a table with no illegal pair tests nothing"
    for state, event in illegal:
        with pytest.raises(ProtocolError):
            table.step(state, event)
    for (state, event), new in table.transitions.items():
        assert table.step(state, event) == new


def test_state_table_rejects_a_pair_listed_twice_or_an_error_for_a_legal_pair() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        StateTable("t", "a", [("a", "go", "b", ""), ("a", "go", "a", "")])
    with pytest.raises(ValueError, match="legal transition"):
        StateTable("t", "a", [("a", "go", "b", "")], {("a", "go"): "no"})
    table = StateTable("t", "a", [("a", "go", "b", "off it goes")], {("b", "go"): "b cannot go"})
    assert table.initial == "a" and table.notes[("a", "go")] == "off it goes"
    with pytest.raises(ProtocolError, match="^b cannot go$"):
        table.step("b", "go")


def test_table_rows_read_a_text_table_of_enum_values() -> None:
    rows = table_rows(ReplierState, ReplierEvent, """
        idle     recv  pending  a note: with  its own   spacing
        pending  send  idle     back
    """)
    assert rows == [
        (ReplierState.IDLE, ReplierEvent.RECV, ReplierState.PENDING, "a note: with  its own   spacing"),
        (ReplierState.PENDING, ReplierEvent.SEND, ReplierState.IDLE, "back"),
    ]
    assert type(rows[0][0]) is ReplierState and type(rows[0][1]) is ReplierEvent
    with pytest.raises(ValueError, match="'pendng' is not a valid ReplierState"):
        table_rows(ReplierState, ReplierEvent, "idle recv pendng typo")


def test_request_table_is_the_documented_one() -> None:
    t = REQUEST_TABLE.transitions
    assert t[("idle", "send")] == "queued"
    assert t[("sent", "pipe_lost")] == "queued"
    assert t[("sent", "resend")] == "queued"
    assert ("idle", "take") not in t and ("done", "reply") not in t
    with pytest.raises(ProtocolError, match="without a request"):
        REQUEST_TABLE.step("idle", "take")


# -- backtraces -------------------------------------------------------------------------


def test_split_backtrace() -> None:
    assert split_backtrace(w(0x80000005) + b"body", 8) == (w(0x80000005), b"body")
    assert split_backtrace(w(7, 9, 0x80000001) + b"x", 8) == (w(7, 9, 0x80000001), b"x")
    assert split_backtrace(w(*range(1, 8), 0x80000001), 8) == (w(*range(1, 8), 0x80000001), b"")
    assert split_backtrace(w(*range(1, 9), 0x80000001), 8) is TOO_MANY_HOPS  # 9 words
    assert split_backtrace(w(1, 2), 8) is MALFORMED  # no end word
    assert split_backtrace(b"\x80\x00", 8) is MALFORMED  # short
    assert split_backtrace(b"", 8) is MALFORMED
    assert split_backtrace(w(1, 2, 3) + b"\x00", 2) is TOO_MANY_HOPS


# -- REQ ---------------------------------------------------------------------------------


def test_req_ids_have_the_high_bit_and_count_up() -> None:
    req = make(Req0)
    add(req, 1)
    ids = [req.start_request(b"q") for _ in range(3)]
    assert all(i & 0x80000000 for i in ids)
    assert [(i - ids[0]) & 0x7FFFFFFF for i in ids] == [0, 1, 2]
    sent = transmits(take(req))
    assert [p for _, p in sent] == [w(i) + b"q" for i in ids]


def test_req_random_start() -> None:
    starts = {make(Req0).start_request(b"") for _ in range(8)}
    assert len(starts) > 1


def test_req_holds_request_until_a_rep_connects() -> None:
    req = make(Req0, resend_interval=None)
    rid = req.start_request(b"hello")
    assert req.request_state(rid) == "queued"
    assert transmits(take(req)) == []
    add(req, 7)
    assert transmits(take(req)) == [(7, w(rid) + b"hello")]
    assert req.request_state(rid) == "sent"


def test_req_reply_matching_and_drops() -> None:
    req = make(Req0)
    add(req, 1)
    a = req.start_request(b"a")
    b = req.start_request(b"b")
    take(req)
    assert req.messages_received(1, [w(b) + b"B", w(0x80000000 | 12345) + b"?"])
    assert req.dropped == 1  # unknown id
    assert take(req) == [(READY, b)]  # readiness is an action: the caller of b is woken
    assert not req.reply_ready(a) and req.reply_ready(b)
    with pytest.raises(WouldBlock):
        req.take_reply(a)
    msg = req.take_reply(b)
    assert msg.body == b"B" and msg.pipe == "pipe1"
    # A duplicate reply to an answered request is dropped.
    req.messages_received(1, [w(b) + b"B"])
    assert req.dropped == 2
    assert req.request_state(b) == "idle"


@pytest.mark.parametrize("bad", [b"", b"\x80\x00", w(5) + b"no high bit"])
def test_req_malformed_reply_closes_pipe(bad: bytes) -> None:
    req = make(Req0)
    add(req, 1)
    req.start_request(b"a")
    take(req)
    assert req.messages_received(1, [bad]) is False
    actions = take(req)
    assert [a[:2] for a in actions if a[0] == CLOSE_PIPE] == [(CLOSE_PIPE, 1)]
    assert req.protocol_errors == 1


def test_req_resends_at_once_when_its_pipe_dies() -> None:
    req = make(Req0)
    add(req, 1)
    add(req, 2)
    rid = req.start_request(b"x")
    (first_pid, payload), = transmits(take(req))
    req.remove_pipe(first_pid)
    other = 2 if first_pid == 1 else 1
    assert transmits(take(req)) == [(other, payload)]  # same id, other pipe
    req.remove_pipe(other)
    assert req.request_state(rid) == "queued"
    add(req, 3)
    assert transmits(take(req)) == [(3, payload)]


def test_req_resend_timer_ticks() -> None:
    req = make(Req0, resend_interval=2.0)
    add(req, 1)
    rid = req.start_request(b"x")
    actions = take(req)
    assert (ARM_TIMER, "resend-tick", 2.0 / RESEND_TICKS) in actions
    for _ in range(RESEND_TICKS):
        req.timer_fired("resend-tick")
        assert transmits(take(req)) == []  # not yet a whole interval
    req.timer_fired("resend-tick")
    actions = take(req)
    assert transmits(actions) == [(1, w(rid) + b"x")]
    assert any(a[0] == ARM_TIMER for a in actions)  # still outstanding: keeps ticking
    req.messages_received(1, [w(rid) + b"ok"])
    req.timer_fired("resend-tick")
    assert not [a for a in take(req) if a[0] in (ARM_TIMER, TRANSMIT)]  # idle: ticking stops


def test_req_resend_disabled() -> None:
    req = make(Req0, resend_interval=None)
    add(req, 1)
    req.start_request(b"x")
    assert not [a for a in take(req) if a[0] == ARM_TIMER]


def test_req_classic_send_recv_and_cancel() -> None:
    req = make(Req0)
    with pytest.raises(ProtocolError, match="without a request"):
        req.recv()
    add(req, 1)
    req.send(b"one")
    (_, p1), = transmits(take(req))
    req.send(b"two")  # abandons "one"
    (_, p2), = transmits(take(req))
    assert p1[:4] != p2[:4]
    assert not req.can_recv()
    with pytest.raises(WouldBlock):
        req.recv()
    req.messages_received(1, [p1[:4] + b"late"])
    assert req.dropped == 1 and not req.can_recv()
    req.messages_received(1, [p2[:4] + b"ans"])
    assert req.can_recv()
    assert req.recv().body == b"ans"
    with pytest.raises(ProtocolError):
        req.recv()  # the reply was taken: no request any more


def test_req_reply_while_queued_is_accepted() -> None:
    req = make(Req0)
    add(req, 1, credit=1)
    rid = req.start_request(b"x")
    (_, payload), = transmits(take(req))
    req.remove_pipe(1)  # back to queued, no pipe to resend on
    assert req.request_state(rid) == "queued"
    add(req, 2, credit=0)
    req.messages_received(2, [payload[:4] + b"r"])
    assert req.take_reply(rid).body == b"r"
    req.pipe_credit(2, 1)
    assert transmits(take(req)) == []  # nothing left to send


def test_req_cancel_and_close() -> None:
    req = make(Req0)
    add(req, 1, credit=0)
    rid = req.start_request(b"x")
    req.cancel_request(rid)
    req.pipe_credit(1, 5)
    assert transmits(take(req)) == []
    req.cancel_request(rid)  # idempotent
    req.start_request(b"y")
    take(req)
    req.close()
    assert (CANCEL_TIMER, "resend-tick") in take(req)


def test_xreq_raw() -> None:
    req = make(Req0, raw=True)
    assert isinstance(req, XReq0) and req.raw
    with pytest.raises(WouldBlock):
        req.send(b"body", w(3, 0x80000009))
    add(req, 1)
    req.send(b"body", w(3, 0x80000009))
    assert transmits(take(req)) == [(1, w(3, 0x80000009) + b"body")]
    assert req.messages_received(1, [w(3, 0x80000009) + b"rep"])
    msg = req.recv()
    assert (msg.header, msg.body) == (w(3, 0x80000009), b"rep")
    assert req.messages_received(1, [w(1, 2)]) is False
    assert req.protocol_errors == 1


# -- REP / RESPONDENT ---------------------------------------------------------------------


@pytest.mark.parametrize("cls", [Rep0, Respondent0])
def test_replier_classic(cls) -> None:
    rep = make(cls)
    with pytest.raises(ProtocolError, match="pending request"):
        rep.send(b"no")
    add(rep, 4)
    rep.messages_received(4, [w(9, 0x80000001) + b"q1", w(0x80000002) + b"q2"])
    m1 = rep.recv()
    assert (m1.body, m1.header) == (b"q1", b"")
    m2 = rep.recv()  # abandons q1 for the classic send
    rep.send(b"a2")
    assert transmits(take(rep)) == [(4, w(0x80000002) + b"a2")]
    with pytest.raises(ProtocolError):
        rep.send(b"again")
    # q1 can still be answered through its own route.
    rep.reply(m1._reply_to, b"a1")
    assert transmits(take(rep)) == [(4, w(9, 0x80000001) + b"a1")]
    assert m2._reply_to == (4, w(0x80000002))  # the route only: the core knows no socket


@pytest.mark.parametrize("cls", [Rep0, Respondent0])
def test_replier_reply_via_route_clears_pending(cls) -> None:
    rep = make(cls)
    add(rep, 1)
    rep.messages_received(1, [w(0x80000001) + b"q"])
    msg = rep.recv()
    rep.reply(msg._reply_to, b"a")
    with pytest.raises(ProtocolError):
        rep.send(b"twice")


@pytest.mark.parametrize("cls", [Rep0, Respondent0])
def test_replier_ttl_and_malformed(cls) -> None:
    rep = make(cls, max_ttl=3)
    add(rep, 1)
    assert rep.messages_received(1, [w(1, 2, 0x80000001) + b"ok", w(1, 2, 3, 0x80000001) + b"far"])
    assert rep.dropped == 1
    assert rep.recv().body == b"ok"
    assert rep.messages_received(1, [w(1, 2)]) is False
    assert (CLOSE_PIPE, 1) in [a[:2] for a in take(rep)]
    assert rep.protocol_errors == 1
    assert rep.messages_received(1, [b"\x80"]) is False
    assert rep.protocol_errors == 2


@pytest.mark.parametrize("cls", [Rep0, Respondent0])
def test_replier_drops_replies_it_cannot_send(cls) -> None:
    rep = make(cls)
    add(rep, 1, credit=1)
    rep.messages_received(1, [w(0x80000001) + b"a", w(0x80000002) + b"b"])
    m1, m2 = rep.recv(), rep.recv()
    rep.reply(m1._reply_to, b"1")
    rep.reply(m2._reply_to, b"2")  # no credit left: dropped
    assert len(transmits(take(rep))) == 1 and rep.dropped == 1
    rep.remove_pipe(1)
    rep.pipe_credit(1, 5)
    rep.reply(m2._reply_to, b"2")  # pipe gone: dropped
    assert rep.dropped == 2 and transmits(take(rep)) == []


@pytest.mark.parametrize("cls,xcls", [(Rep0, XRep0), (Respondent0, XRespondent0)])
def test_raw_replier(cls, xcls) -> None:
    rep = make(cls, raw=True, max_ttl=3)
    assert isinstance(rep, xcls)
    add(rep, 0x1234)
    rep.messages_received(0x1234, [w(5, 0x80000001) + b"req", w(1, 2, 3, 0x80000001)])
    assert rep.dropped == 1
    msg = rep.recv()
    assert msg.header == w(0x1234, 5, 0x80000001) and msg.body == b"req"
    rep.send(b"rep", msg.header)
    assert transmits(take(rep)) == [(0x1234, w(5, 0x80000001) + b"rep")]
    rep.send(b"x", w(999, 0x80000001))  # unknown pipe: dropped
    assert rep.dropped == 2
    with pytest.raises(ProtocolError):
        rep.send(b"x", b"\x00\x01")
    assert rep.messages_received(0x1234, [w(1)]) is False
    assert rep.protocol_errors == 1


# -- SURVEYOR --------------------------------------------------------------------------------


def test_surveyor_broadcast_and_deadline() -> None:
    sv = make(Surveyor0, survey_deadline=0.5)
    with pytest.raises(ProtocolError, match="no survey"):
        sv.recv()
    add(sv, 1)
    add(sv, 2)
    add(sv, 3, credit=0)  # busy: misses the survey
    sid = sv.start_survey(b"who")
    assert sid & 0x80000000
    actions = take(sv)
    assert sorted(transmits(actions)) == [(1, w(sid) + b"who"), (2, w(sid) + b"who")]
    assert (ARM_TIMER, sid, 0.5) in actions
    assert sv.drops["queue_full"] == 1  # the busy respondent's miss
    with pytest.raises(WouldBlock):
        sv.recv()
    sv.messages_received(1, [w(sid) + b"me", w(sid ^ 1) + b"other"])
    assert sv.drops["cancelled"] == 1 and take(sv) == [(READY, sid)]
    sv.timer_fired(sid)
    assert take(sv) == [(READY, sid)]  # the deadline ends the survey's iterators
    sv.messages_received(2, [w(sid) + b"late"])
    assert sv.drops["cancelled"] == 2 and sv.dropped == 3
    assert sv.can_recv()
    assert sv.recv().body == b"me"  # in time: still readable
    with pytest.raises(Timeout):
        sv.recv()
    with pytest.raises(ProtocolError):
        sv.recv()


def test_surveyor_new_survey_cancels_old() -> None:
    sv = make(Surveyor0)
    add(sv, 1)
    old = sv.start_survey(b"1")
    sv.messages_received(1, [w(old) + b"a"])
    take(sv)
    new = sv.start_survey(b"2")
    assert new != old
    actions = take(sv)
    assert (CANCEL_TIMER, old) in actions
    assert (READY, old) in actions  # the old iterator is told to finish
    assert sv.take_answer(old) is None
    assert sv.answer_ready(old)
    assert sv.dropped == 1  # the unread answer to the old survey
    sv.timer_fired(old)  # stale deadline: ignored
    assert sv.state == "active"
    sv.messages_received(1, [w(old) + b"late", w(new) + b"b"])
    assert sv.take_answer(new).body == b"b"
    with pytest.raises(WouldBlock):
        sv.take_answer(new)
    sv.timer_fired(new)
    assert sv.take_answer(new) is None
    assert sv.state == "idle"


@pytest.mark.parametrize("bad", [b"\x80\x00\x00", w(3) + b"x"])
def test_surveyor_malformed_answer_closes_pipe(bad: bytes) -> None:
    sv = make(Surveyor0)
    add(sv, 1)
    sv.start_survey(b"q")
    take(sv)
    assert sv.messages_received(1, [bad]) is False
    assert (CLOSE_PIPE, 1) in [a[:2] for a in take(sv)]
    assert sv.protocol_errors == 1


def test_xsurveyor_raw() -> None:
    sv = make(Surveyor0, raw=True)
    assert isinstance(sv, XSurveyor0)
    add(sv, 1)
    add(sv, 2)
    sv.send(b"q", w(0x80000077))
    assert sorted(transmits(take(sv))) == [(1, w(0x80000077) + b"q"), (2, w(0x80000077) + b"q")]
    sv.messages_received(2, [w(0x80000077) + b"a"])
    msg = sv.recv()
    assert (msg.header, msg.body) == (w(0x80000077), b"a")
    assert sv.messages_received(1, [b"\x00"]) is False


# -- BUS ---------------------------------------------------------------------------------------


def test_bus_cooked_and_raw() -> None:
    bus = make(Bus0)
    bus.send(b"nobody")  # no peers: nothing happens, nothing blocks
    add(bus, 1)
    add(bus, 2)
    add(bus, 3, credit=0)
    bus.send(b"hi")
    assert sorted(transmits(take(bus))) == [(1, b"hi"), (2, b"hi")]
    assert bus.drops["no_peer"] == 1 and bus.drops["queue_full"] == 1 and bus.dropped == 2
    bus.messages_received(2, [b"m"])
    msg = bus.recv()
    assert (msg.body, msg.header) == (b"m", b"")

    raw = make(Bus0, raw=True)
    add(raw, 1)
    add(raw, 2)
    add(raw, 3)
    raw.messages_received(2, [b"m"])
    msg = raw.recv()
    assert msg.header == w(2)
    raw.send(msg.body, msg.header)  # forwarded to everyone but the origin
    assert sorted(transmits(take(raw))) == [(1, b"m"), (3, b"m")]


# -- PAIR1 --------------------------------------------------------------------------------------


def test_pair1_cooked() -> None:
    p = make(Pair1, max_ttl=4)
    with pytest.raises(WouldBlock):
        p.send(b"x")
    add(p, 1)
    add(p, 2)  # monogamous: refused
    assert (CLOSE_PIPE, 2) in [a[:2] for a in take(p)]
    p.send(b"x")
    assert transmits(take(p)) == [(1, w(1) + b"x")]
    assert p.messages_received(1, [w(0) + b"mangos", w(4) + b"far", w(5) + b"too far"])
    assert p.dropped == 1
    assert p.recv().body == b"mangos"
    assert p.recv().body == b"far"
    assert p.messages_received(1, [w(0x100) + b"bad"]) is False
    assert p.protocol_errors == 1
    assert p.messages_received(1, [b"\x00\x00"]) is False


def test_pair1_raw_counts_hops() -> None:
    p = make(Pair1, raw=True)
    add(p, 1)
    p.messages_received(1, [w(3) + b"m"])
    msg = p.recv()
    assert msg.header == w(3)
    p.send(msg.body, msg.header)
    p.send(b"fresh")  # no header: counts as 0 hops
    assert transmits(take(p)) == [(1, w(4) + b"m"), (1, w(1) + b"fresh")]
    for bad in (w(0xFF), w(0x100), b"\x00"):
        with pytest.raises(ProtocolError):
            p.send(b"x", bad)


# -- REQ under random pipe churn, timers and replies (property test) ----------------------------


class ReqChurn(RuleBasedStateMachine):
    """Pipes come and go, credits trickle in, ticks fire, replies (some stale) arrive."""

    def __init__(self) -> None:
        super().__init__()
        self.req = make(Req0, resend_interval=1.0)
        self.credit: dict[int, int] = {}
        self.next_pid = 1
        self.on_wire: dict[int, list[bytes]] = {}  # pid -> payloads the peer has not answered
        self.live: set[int] = set()

    def _drain(self) -> None:
        for a in take(self.req):
            if a[0] == TRANSMIT:
                pid = a[1]
                assert pid in self.credit, "transmit on a pipe that is gone"
                self.credit[pid] -= 1
                assert self.credit[pid] >= 0, "more transmits than credit"
                self.on_wire[pid].append(a[2])

    @rule(credit=st.integers(0, 3))
    def add_pipe(self, credit: int) -> None:
        pid = self.next_pid
        self.next_pid += 1
        self.credit[pid] = credit
        self.on_wire[pid] = []
        add(self.req, pid, credit)
        self._drain()

    @rule(data=st.data())
    def remove_pipe(self, data) -> None:
        if self.credit:
            pid = data.draw(st.sampled_from(sorted(self.credit)))
            del self.credit[pid]
            del self.on_wire[pid]
            self.req.remove_pipe(pid)
            self._drain()

    @rule(data=st.data(), n=st.integers(1, 2))
    def give_credit(self, data, n: int) -> None:
        if self.credit:
            pid = data.draw(st.sampled_from(sorted(self.credit)))
            self.credit[pid] += n
            self.req.pipe_credit(pid, n)
            self._drain()

    @rule(body=st.binary(max_size=4))
    def new_request(self, body: bytes) -> None:
        self.live.add(self.req.start_request(body))
        self._drain()

    @rule(data=st.data())
    def cancel(self, data) -> None:
        if self.live:
            rid = data.draw(st.sampled_from(sorted(self.live)))
            self.live.discard(rid)
            self.req.cancel_request(rid)
            self._drain()

    @rule()
    def tick(self) -> None:
        self.req.timer_fired("resend-tick")
        self._drain()

    @rule(data=st.data())
    def answer(self, data) -> None:
        busy = sorted(pid for pid, q in self.on_wire.items() if q)
        if busy:
            pid = data.draw(st.sampled_from(busy))
            payload = self.on_wire[pid].pop(0)
            rid = int.from_bytes(payload[:4], "big")
            assert self.req.messages_received(pid, [payload[:4] + b"re:" + payload[4:]])
            if rid in self.live and self.req.reply_ready(rid):
                msg = self.req.take_reply(rid)
                assert msg.body == b"re:" + payload[4:]
                self.live.discard(rid)
            self._drain()

    @invariant()
    def work_conserving(self) -> None:
        # A request is only left queued when no pipe has credit for it.
        queued = [r for r in self.live if self.req.request_state(r) == "queued"]
        if queued:
            assert all(c == 0 for c in self.credit.values())

    @invariant()
    def states_are_known(self) -> None:
        for rid in self.live:
            assert self.req.request_state(rid) in ("queued", "sent", "done")
        assert self.req.outstanding == len(self.live)


TestReqChurn = ReqChurn.TestCase
TestReqChurn.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_a_subclass_keeps_its_own_hot_methods() -> None:
    # The cores bind their parts' hot methods onto the instance; a subclass's own wins.
    class MyRep(Rep0):
        def recv(self) -> Any:
            return "mine"

    class MyReq(Req0):
        def start_request(self, body: bytes) -> int:
            return 7

    assert make(MyRep).recv() == "mine"
    assert make(MyReq).start_request(b"x") == 7
    plain = make(Req0)
    plain.add_pipe(PipeInfo(1, None, 8, 8), 1)
    rid = plain.start_request(b"x")
    assert plain.request_state(rid) == "sent" and not plain.reply_ready(rid)
