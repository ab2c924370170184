"""SURVEYOR/RESPONDENT sockets: survey() iterators, deadlines, classic recv, raw mode."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Callable

import pytest
import trio
from conftest import bind_url, wait_until

import nanopy
from nanopy.testing import wait_pipes

MakeSocket = Callable[..., nanopy.Socket]


def answer_all(resp: nanopy.Socket, answer: bytes) -> threading.Thread:
    """Answer every survey through msg.reply() until the socket closes."""

    def loop() -> None:
        while True:
            try:
                msg = resp.recv_msg()
            except nanopy.Closed:
                return
            msg.reply(answer + b":" + msg.body)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def surveyor_with(make_socket: MakeSocket, n: int, transport: str = "tcp", **opts) -> nanopy.Socket:
    sv = make_socket("surveyor", **opts)
    ep = sv.bind(bind_url(transport))
    for i in range(n):
        resp = make_socket("respondent", connect=ep.url)
        answer_all(resp, b"r%d" % i)
    wait_pipes(sv, n)
    return sv


@pytest.mark.parametrize("transport", ["tcp", "ipc", "inproc"])
def test_survey_collects_every_answer_and_ends_at_deadline(make_socket: MakeSocket, transport: str) -> None:
    sv = surveyor_with(make_socket, 3, transport, survey_deadline=0.5)
    t0 = time.monotonic()
    answers = sorted(sv.survey(b"who"))
    elapsed = time.monotonic() - t0
    assert answers == [b"r0:who", b"r1:who", b"r2:who"]
    assert 0.49 < elapsed < 1.0


def test_classic_send_then_recv_until_timeout(make_socket: MakeSocket) -> None:
    sv = surveyor_with(make_socket, 2, survey_deadline=0.5)
    with pytest.raises(nanopy.ProtocolError):
        sv.recv(timeout=0)  # no survey yet
    sv.send(b"q")
    got = []
    t0 = time.monotonic()
    with pytest.raises(nanopy.Timeout):
        while True:
            got.append(sv.recv())
    assert sorted(got) == [b"r0:q", b"r1:q"]
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(nanopy.ProtocolError):
        sv.recv(timeout=0)  # the timeout is reported once, then "no survey"


def test_new_survey_cancels_previous_and_late_answers_are_dropped(make_socket: MakeSocket) -> None:
    sv = make_socket("surveyor", survey_deadline=0.5)
    resp = make_socket("respondent", recv_timeout=5)
    ep = sv.bind(bind_url("tcp"))
    resp.connect(ep.url)
    wait_pipes(sv)
    first = sv.survey(b"one")
    m1 = resp.recv_msg()
    second = sv.survey(b"two")
    assert list(first) == []  # abandoned by the newer survey
    m2 = resp.recv_msg()
    m1.reply(b"late for one")
    m2.reply(b"for two")
    assert list(second) == [b"for two"]
    # After the deadline an answer is late.
    sv.send(b"three")
    m3 = resp.recv_msg()
    with pytest.raises(nanopy.Timeout):
        sv.recv()
    dropped = sv.stats().messages_dropped
    m3.reply(b"too late")
    wait_until(lambda: sv.stats().messages_dropped == dropped + 1, what="late answer dropped")


def test_respondent_classic_and_errors(make_socket: MakeSocket) -> None:
    resp = make_socket("respondent", recv_timeout=5)
    with pytest.raises(nanopy.ProtocolError):
        resp.send(b"no survey")
    sv = make_socket("surveyor", survey_deadline=1.0)
    ep = sv.bind(bind_url("inproc"))
    resp.connect(ep.url)
    wait_pipes(sv)
    answers = sv.survey(b"ping")
    assert resp.recv() == b"ping"
    resp.send(b"pong")
    with pytest.raises(nanopy.ProtocolError):
        resp.send(b"twice")
    assert next(answers) == b"pong"


def test_asurvey_trio_and_asyncio(make_socket: MakeSocket) -> None:
    sv = surveyor_with(make_socket, 2, "inproc", survey_deadline=0.4)

    async def collect() -> list[bytes]:
        return sorted([a async for a in sv.asurvey(b"x")])

    assert trio.run(collect) == [b"r0:x", b"r1:x"]
    assert asyncio.run(collect()) == [b"r0:x", b"r1:x"]


def test_raw_surveyor_and_respondent(make_socket: MakeSocket) -> None:
    sv = make_socket("surveyor", raw=True, recv_timeout=5)
    resp = make_socket("respondent", raw=True, recv_timeout=5)
    ep = sv.bind(bind_url("tcp"))
    resp.connect(ep.url)
    wait_pipes(sv)
    wait_pipes(resp)
    header = struct.pack(">I", 0x80000042)
    sv.send_msg(nanopy.Message(b"raw q", header=header))
    msg = resp.recv_msg()
    assert msg.header == struct.pack(">I", resp.pipes[0].id) + header
    resp.send_msg(nanopy.Message(b"raw a", header=msg.header))
    back = sv.recv_msg()
    assert (back.header, back.body) == (header, b"raw a")
    with pytest.raises(nanopy.ProtocolError):
        list(sv.survey(b"raw sockets have no survey()"))


def test_survey_iterator_ends_when_socket_closes(make_socket: MakeSocket) -> None:
    sv = make_socket("surveyor", survey_deadline=30)
    it = sv.survey(b"q")
    threading.Timer(0.1, sv.close).start()
    with pytest.raises(nanopy.Closed):
        next(it)


def test_malformed_answer_closes_only_that_pipe(make_socket: MakeSocket) -> None:
    sv = make_socket("surveyor", survey_deadline=2.0)
    ep = sv.bind(bind_url("tcp"))
    bad = make_socket("respondent", raw=True, recv_timeout=5, connect=ep.url)
    good = make_socket("respondent", connect=ep.url)
    answer_all(good, b"good")
    wait_pipes(sv, 2)
    wait_pipes(bad)
    answers = sv.survey(b"q")
    msg = bad.recv_msg()
    pipe_word = msg.header[:4]
    bad.send_msg(nanopy.Message(b"garbage", header=pipe_word + struct.pack(">I", 5)))  # no top bit
    wait_until(lambda: sv.stats().protocol_errors == 1, what="protocol error counted")
    wait_until(lambda: sv.stats().disconnects >= 1, what="bad pipe closed")
    assert next(answers) == b"good:q"  # the other respondent is not disturbed
