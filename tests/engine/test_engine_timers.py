"""Timers in virtual time: REQ resend, survey deadline, send/recv timeouts."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from trio.testing import MockClock

import nanopy
from engine.conftest import Connect, Wired
from nanopy.testing import FakeTransport

pytestmark = pytest.mark.trio


# The clock of a caller's own deadline is read with time.monotonic() next to the
# virtual clock, so a timeout may end a few real microseconds early.
SLACK = 0.01
FLUSH_BOUND = 1e-3  # docs/testing.md


@pytest.mark.parametrize("interval", [0.5, 2.0, 60.0])
async def test_req_resends_every_resend_interval(wired: Wired, autojump_clock: MockClock, interval: float) -> None:
    req, rep, wire = await wired("req", "rep", "fake://resend", resend_interval=interval)
    replies: list[bytes] = []

    async def ask() -> None:
        replies.append(await req.arequest(b"question"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        for _ in range(3):  # the request and two resends, the same each time
            assert await rep.arecv() == b"question"
        await rep.asend(b"answer")
    assert replies == [b"answer"]
    times = [t for t, batch in wire.batches for _ in batch]
    assert len(times) == 3 and len(set(wire.payloads)) == 1
    for earlier, later in zip(times, times[1:]):
        # docs/protocols.md: a resend comes between 1 and 1.25 x resend_interval.
        assert interval - SLACK <= later - earlier <= 1.25 * interval + FLUSH_BOUND
    await trio.sleep(10 * interval)  # virtual: answered, so never sent again
    assert len(wire.payloads) == 3


async def test_req_without_resend_interval_never_resends(wired: Wired, autojump_clock: MockClock) -> None:
    req, rep, wire = await wired("req", "rep", "fake://noresend", resend_interval=None)
    with pytest.raises(nanopy.Timeout):
        await req.arequest(b"q", timeout=10_000)
    assert len(wire.payloads) == 1
    assert await rep.arecv(timeout=0) == b"q"


async def test_survey_collects_until_its_deadline(fake: FakeTransport, autojump_clock: MockClock) -> None:
    surveyor = nanopy.Socket("surveyor", bind="fake://survey", survey_deadline=1.0)
    respondents = [nanopy.Socket("respondent", connect="fake://survey") for _ in range(3)]
    await trio.testing.wait_all_tasks_blocked()
    assert len(surveyor.pipes) == 3

    async def answer(sock: nanopy.Socket, delay: float, body: bytes) -> None:
        assert await sock.arecv() == b"who?"
        await trio.sleep(delay)
        await sock.asend(body)

    answers: list[tuple[bytes, float]] = []
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for sock, delay, body in zip(respondents, [0.25, 0.75, 1.5], [b"early", b"mid", b"late"]):
            nursery.start_soon(answer, sock, delay, body)
        async for body in surveyor.asurvey(b"who?"):
            answers.append((body, trio.current_time() - start))
        ended = trio.current_time() - start
    assert [body for body, _ in answers] == [b"early", b"mid"]
    assert answers[0][1] == pytest.approx(0.25, abs=2 * FLUSH_BOUND)
    assert answers[1][1] == pytest.approx(0.75, abs=2 * FLUSH_BOUND)
    assert 1.0 - SLACK <= ended <= 1.0 + 2 * FLUSH_BOUND
    await trio.sleep(1)  # virtual: the late answer arrives, after the deadline
    assert surveyor.stats().messages_received == 2
    assert surveyor.stats().messages_dropped == 1


@pytest.mark.parametrize("timeout", [0.001, 0.5, 7.0, 3600.0])
async def test_arecv_times_out_in_virtual_time(
    fake: FakeTransport, autojump_clock: MockClock, timeout: float
) -> None:
    pull = nanopy.Socket("pull", bind="fake://rt")
    start = trio.current_time()
    with pytest.raises(nanopy.Timeout):
        await pull.arecv(timeout=timeout)
    assert timeout - SLACK <= trio.current_time() - start <= timeout


async def test_recv_timeout_option_applies_to_arecv(fake: FakeTransport, autojump_clock: MockClock) -> None:
    pull = nanopy.Socket("pull", bind="fake://rto", recv_timeout=0.75)
    start = trio.current_time()
    with pytest.raises(nanopy.Timeout):
        await pull.arecv()
    assert trio.current_time() - start == pytest.approx(0.75, abs=SLACK)


async def test_a_message_before_the_deadline_ends_the_wait_at_once(
    fake: FakeTransport, connected: Connect, autojump_clock: MockClock
) -> None:
    push, pull = await connected("push", "pull", "fake://early")

    async def later() -> None:
        await trio.sleep(3)
        await push.asend(b"hello")

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        assert await pull.arecv(timeout=10) == b"hello"
    assert trio.current_time() - start == pytest.approx(3, abs=FLUSH_BOUND)


async def test_asend_without_a_peer_times_out(fake: FakeTransport, autojump_clock: MockClock) -> None:
    push = nanopy.Socket("push", connect="fake://nobody", send_timeout=1.5)
    start = trio.current_time()
    with pytest.raises(nanopy.Timeout):
        await push.asend(b"x")
    assert trio.current_time() - start == pytest.approx(1.5, abs=SLACK)
    assert push.stats().messages_sent == 0


async def test_a_timed_out_asend_sends_nothing(wired: Wired, autojump_clock: MockClock) -> None:
    push, pull, wire = await wired("push", "pull", "fake://full", send_buffer=2, hold=True)
    await push.asend(b"1")
    await push.asend(b"2")
    with pytest.raises(nanopy.Timeout):
        await push.asend(b"lost", timeout=2.0)
    wire.release()
    await push.asend(b"sentinel")
    assert [await pull.arecv() for _ in range(3)] == [b"1", b"2", b"sentinel"]


async def test_a_stalled_handshake_times_out_and_is_retried(fake: FakeTransport, autojump_clock: MockClock) -> None:
    url = "fake://stalled"
    nanopy.Socket("pull", bind=url)
    fake.stall_handshakes(url)
    push = nanopy.Socket(
        "push", connect=url, handshake_timeout=2.0, reconnect_interval=0.5, reconnect_interval_max=0.5
    )
    await trio.sleep(10)
    assert not push.pipes
    dials = fake.times("dial", url)
    closes = fake.times("close", url, "dialer")
    assert closes[0] == pytest.approx(dials[0] + 2.0)  # exactly handshake_timeout
    for earlier, later in zip(dials, dials[1:]):
        assert 2.25 - 1e-9 <= later - earlier <= 2.5 + 1e-9  # the timeout, then the back-off
    assert push.stats().protocol_errors == len(closes)
    fake.stall_handshakes(url, stall=False)
    await push.asend(b"through")  # the next dial gets through
    assert push.stats().messages_sent == 1
