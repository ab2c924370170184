"""Batching and flush: how the engine hands queued messages to a transport."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from trio.testing import MockClock

import nanopy
from engine.conftest import Connect, Wired
from nanopy.testing import FakeTransport

pytestmark = pytest.mark.trio


# docs/testing.md: a queued message waits at most this long for the pipe's writer.
FLUSH_BOUND = 1e-3


async def test_a_burst_is_written_in_batches(
    fake: FakeTransport, connected: Connect, autojump_clock: MockClock
) -> None:
    push, pull = await connected("push", "pull", "fake://batch")
    sent = [b"m%d" % i for i in range(1000)]
    for body in sent:
        await push.asend(body)
    got = [await pull.arecv() for _ in sent]
    assert got == sent
    (wire,) = fake.ends(side="dialer")
    assert len(wire.payloads) == len(sent)
    # A burst is written as a few large batches, never message by message.
    assert len(wire.batches) <= len(sent) // 32, [len(b) for _, b in wire.batches]


async def test_a_burst_under_back_pressure_keeps_order_and_batches(wired: Wired, autojump_clock: MockClock) -> None:
    # a slow peer: credit runs out and the sender parks
    push, pull, wire = await wired("push", "pull", "fake://batch", send_buffer=50, hold=True)
    sent = [b"%d" % i for i in range(500)]

    got: list[bytes] = []

    async def receiver() -> None:
        got.extend([await pull.arecv() for _ in sent])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        async with trio.open_nursery() as senders:
            senders.start_soon(lambda: _send_all(push, sent))
            await trio.sleep(1)  # virtual: the sender has filled the pipe and waits
            assert push.stats().messages_sent < len(sent)
            wire.release()
    assert got == sent
    assert len(wire.batches) <= len(sent) // 10, [len(b) for _, b in wire.batches]


async def _send_all(sock: nanopy.Socket, bodies: list[bytes]) -> None:
    for body in bodies:
        await sock.asend(body)


async def test_a_lone_message_is_flushed_within_the_bound(wired: Wired, autojump_clock: MockClock) -> None:
    push, pull, wire = await wired("push", "pull", "fake://batch")
    for i in range(5):
        await trio.sleep(1)  # idle in between: each message is alone
        sent_at = trio.current_time()
        await push.asend(b"lone%d" % i)
        assert await pull.arecv() == b"lone%d" % i
        written_at, batch = wire.batches[-1]
        assert batch == [b"lone%d" % i]
        assert written_at - sent_at <= FLUSH_BOUND


async def test_a_trickle_is_never_held_longer_than_the_bound(wired: Wired, autojump_clock: MockClock) -> None:
    push, pull, wire = await wired("push", "pull", "fake://batch")
    sent_at: dict[bytes, float] = {}
    for i in range(200):
        body = b"t%d" % i
        sent_at[body] = trio.current_time()
        await push.asend(body)
        await trio.sleep(50e-6)  # a steady stream, a message every 50 virtual microseconds
    for _ in sent_at:
        await pull.arecv()
    late = [
        (body, written - sent_at[body])
        for written, batch in wire.batches
        for body in batch
        if written - sent_at[body] > FLUSH_BOUND + 1e-9
    ]
    assert not late, late[:5]


async def test_a_held_write_is_flushed_when_the_peer_drains(wired: Wired, autojump_clock: MockClock) -> None:
    push, pull, wire = await wired("push", "pull", "fake://batch", hold=True)
    for i in range(10):
        await push.asend(b"%d" % i)
    await trio.sleep(5)  # virtual: nothing can be written
    assert wire.payloads == []
    wire.release()
    got = [await pull.arecv() for _ in range(10)]
    assert got == [b"%d" % i for i in range(10)]
    assert len(wire.batches) <= 2
