"""Closing: order (listeners, dialers, pipes), linger, waiters, addresses freed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing
from trio.testing import MockClock

import nanopy
from engine.conftest import Connect, Wired
from nanopy.testing import FakeTransport

pytestmark = pytest.mark.trio


FLUSH_BOUND = 1e-3  # docs/testing.md
SLACK = 0.01


async def test_close_stops_listeners_then_dialers_then_pipes(fake: FakeTransport, autojump_clock: MockClock) -> None:
    for round_ in range(10):  # trio shuffles the order of tasks that run at the same time
        hub = nanopy.Socket("bus", bind=[f"fake://hub{round_}-a", f"fake://hub{round_}-b"])
        peers = [nanopy.Socket("bus", bind=f"fake://peer{round_}-{i}") for i in range(2)]
        clients = [nanopy.Socket("bus", connect=f"fake://hub{round_}-a") for _ in range(2)]
        for i in range(2):
            hub.connect(f"fake://peer{round_}-{i}")
        hub.connect(f"fake://absent{round_}")  # a dialer that keeps retrying
        await trio.sleep(1)
        assert len(hub.pipes) == 4
        mark = len(fake.events)
        await hub.aclose(linger=0)
        events = fake.events[mark:]
        kinds = [e.kind for e in events]
        closed_listeners = [i for i, e in enumerate(events) if e.kind == "listener-closed"]
        closed_pipes = [i for i, e in enumerate(events) if e.kind == "close"]
        assert len(closed_listeners) == 2 and len(closed_pipes) >= 4, kinds
        assert max(closed_listeners) < min(closed_pipes), kinds
        assert "dial" not in kinds
        for sock in [*peers, *clients]:
            await sock.aclose(linger=0)


async def test_close_frees_every_address_and_dials_no_more(fake: FakeTransport, autojump_clock: MockClock) -> None:
    sock = nanopy.Socket("pair", bind="fake://free", reconnect_interval=0.1)
    sock.connect("fake://nowhere")
    await trio.sleep(1)
    await sock.aclose()
    closed_at = trio.current_time()
    again = nanopy.Socket("pair", bind="fake://free")  # the address is free at once
    await trio.sleep(100)
    assert all(t <= closed_at for t in fake.times("dial", "fake://nowhere"))
    await again.aclose()


async def test_linger_flushes_queued_messages(fake: FakeTransport, wired: Wired, autojump_clock: MockClock) -> None:
    push, pull, wire = await wired("push", "pull", "fake://linger", hold=True)
    sent = [b"%d" % i for i in range(100)]
    for body in sent:
        await push.asend(body)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(push.aclose, 5.0)
        await trio.sleep(0.5)
        assert not wire.closed
        wire.release()
    assert trio.current_time() - start == pytest.approx(0.5, abs=FLUSH_BOUND)
    assert wire.payloads == sent
    assert fake.times("send", side="dialer")[-1] <= fake.times("close", side="dialer")[-1]
    assert await pull.arecv_batch(1000) == sent


async def test_linger_is_a_bound(wired: Wired, autojump_clock: MockClock) -> None:
    push, _, wire = await wired("push", "pull", "fake://linger-bound", hold=True)  # never reads
    for i in range(10):
        await push.asend(b"%d" % i)
    start = trio.current_time()
    await push.aclose(linger=2.0)
    assert trio.current_time() - start == pytest.approx(2.0, abs=SLACK)
    assert wire.payloads == [] and wire.closed


@pytest.mark.parametrize("linger", [0, 0.5])
async def test_close_without_queued_messages_does_not_wait(
    fake: FakeTransport, connected: Connect, autojump_clock: MockClock, linger: float
) -> None:
    push, pull = await connected("push", "pull", "fake://nowait")
    await push.asend(b"x")
    assert await pull.arecv() == b"x"
    start = trio.current_time()
    await push.aclose(linger=linger)
    await pull.aclose(linger=linger)
    assert trio.current_time() - start <= FLUSH_BOUND


async def test_close_wakes_every_blocked_call_with_closed(wired: Wired, autojump_clock: MockClock) -> None:
    push, pull, wire = await wired("push", "pull", "fake://wake", send_buffer=1, hold=True)
    await push.asend(b"takes the credit")
    outcomes: list[str] = []

    async def call(fn: Callable[[], Awaitable[object]]) -> None:
        try:
            await fn()
        except nanopy.Closed:
            outcomes.append("closed")
        else:
            outcomes.append("returned")

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(call, lambda: push.asend(b"blocked"))
            nursery.start_soon(call, pull.arecv)
        await trio.testing.wait_all_tasks_blocked()
        await push.aclose(linger=0)
        await pull.aclose(linger=0)
    assert outcomes == ["closed"] * 20


async def test_closing_one_endpoint_keeps_the_others(fake: FakeTransport, autojump_clock: MockClock) -> None:
    pulls = [nanopy.Socket("pull", bind=f"fake://ep{i}") for i in range(2)]
    push = nanopy.Socket("push")
    eps = [push.connect(f"fake://ep{i}") for i in range(2)]
    await trio.testing.wait_all_tasks_blocked()
    assert len(push.pipes) == 2
    eps[0].close()
    await trio.testing.wait_all_tasks_blocked()
    assert fake.ends("fake://ep0", "dialer")[0].closed
    assert not fake.ends("fake://ep1", "dialer")[0].closed
    for i in range(5):
        await push.asend(b"%d" % i)
    assert await pulls[1].arecv_batch(10) == [b"%d" % i for i in range(5)]
    assert not push.closed and len(push.pipes) == 1


async def test_while_lingering_nothing_new_is_accepted_or_dialed(
    fake: FakeTransport, autojump_clock: MockClock
) -> None:
    sock = nanopy.Socket("push", bind="fake://lingering", reconnect_interval=0.1, reconnect_interval_max=0.1)
    nanopy.Socket("pull", connect="fake://lingering")
    sock.connect("fake://absent-peer")
    await trio.sleep(1)
    (wire,) = fake.ends("fake://lingering", "listener")
    wire.hold()
    await sock.asend(b"queued")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sock.aclose, 5.0)
        await trio.sleep(0.5)  # virtual: lingering, the queued message still held
        closing_at = trio.current_time()
        late = nanopy.Socket("pull", connect="fake://lingering")
        await trio.sleep(0.5)
        assert not late.pipes  # the listener closed first
        assert all(t <= closing_at for t in fake.times("dial", "fake://absent-peer"))  # then the dialer
        wire.release()
    assert wire.payloads == [b"queued"]  # and the pipe was flushed last
