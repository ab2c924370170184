"""Waiters: many blocked asend/arecv calls, woken in order; cancellation loses nothing."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing
from trio.testing import MockClock

import nanopy
from engine.conftest import Connect, Wired
from nanopy.testing import FakeTransport

pytestmark = pytest.mark.trio



async def _park_receivers(
    nursery: trio.Nursery, sock: nanopy.Socket, count: int, got: list[tuple[int, bytes]]
) -> list[trio.CancelScope]:
    """Start ``count`` receivers one after the other, each parked before the next starts."""
    scopes = []
    for i in range(count):
        scope = trio.CancelScope()

        async def receive(i: int = i, scope: trio.CancelScope = scope) -> None:
            with scope:
                got.append((i, await sock.arecv()))

        nursery.start_soon(receive)
        await trio.testing.wait_all_tasks_blocked()
        scopes.append(scope)
    return scopes


async def test_blocked_receivers_are_served_in_arrival_order(
    fake: FakeTransport, connected: Connect, autojump_clock: MockClock
) -> None:
    push, pull = await connected("push", "pull", "fake://fifo-recv")
    got: list[tuple[int, bytes]] = []
    async with trio.open_nursery() as nursery:
        await _park_receivers(nursery, pull, 20, got)
        for i in range(20):
            await push.asend(b"%d" % i)
            await trio.sleep(0.01)  # virtual: delivered, and its receiver has run
            assert got[-1] == (i, b"%d" % i)


async def test_a_batch_reaches_every_blocked_receiver_once(
    fake: FakeTransport, connected: Connect, autojump_clock: MockClock
) -> None:
    push, pull = await connected("push", "pull", "fake://batch-recv")
    got: list[tuple[int, bytes]] = []
    async with trio.open_nursery() as nursery:
        await _park_receivers(nursery, pull, 50, got)
        for i in range(50):
            await push.asend(b"%d" % i)  # one burst: one delivery wakes them all, one by one
    assert sorted(i for i, _ in got) == list(range(50))
    assert sorted(int(body) for _, body in got) == list(range(50))


async def test_blocked_senders_are_served_in_arrival_order(wired: Wired, autojump_clock: MockClock) -> None:
    push, pull, wire = await wired("push", "pull", "fake://fifo-send", send_buffer=1, hold=True)
    await push.asend(b"first")  # takes the pipe's only credit
    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(push.asend, b"%d" % i)
            await trio.testing.wait_all_tasks_blocked()  # parked before the next one starts
        wire.release()
    bodies = [await pull.arecv() for _ in range(21)]
    assert bodies == [b"first"] + [b"%d" % i for i in range(20)]


async def test_cancelled_senders_send_nothing(wired: Wired, autojump_clock: MockClock) -> None:
    push, pull, wire = await wired("push", "pull", "fake://cancel-send", send_buffer=1, hold=True)
    await push.asend(b"first")
    scopes = []
    async with trio.open_nursery() as nursery:
        for i in range(10):
            scope = trio.CancelScope()
            scopes.append(scope)

            async def send(i: int = i, scope: trio.CancelScope = scope) -> None:
                with scope:
                    await push.asend(b"%d" % i)

            nursery.start_soon(send)
            await trio.testing.wait_all_tasks_blocked()
        for i in range(0, 10, 3):
            scopes[i].cancel()
        await trio.testing.wait_all_tasks_blocked()
        wire.release()
    await push.asend(b"sentinel")
    kept = [b"%d" % i for i in range(10) if i % 3]
    assert [await pull.arecv() for _ in range(len(kept) + 2)] == [b"first", *kept, b"sentinel"]
    assert push.stats().messages_sent == len(kept) + 2


async def test_cancelled_receivers_lose_no_message(
    fake: FakeTransport, connected: Connect, autojump_clock: MockClock
) -> None:
    push, pull = await connected("push", "pull", "fake://cancel-recv")
    got: list[tuple[int, bytes]] = []
    async with trio.open_nursery() as nursery:
        scopes = await _park_receivers(nursery, pull, 10, got)
        for i in range(0, 10, 2):
            scopes[i].cancel()
        await trio.testing.wait_all_tasks_blocked()
        for i in range(10):
            await push.asend(b"%d" % i)
    # The five receivers left took the first five, in order; the rest wait in the queue.
    assert got == [(i, b"%d" % n) for n, i in enumerate(range(1, 10, 2))]
    assert await pull.arecv_batch(100) == [b"%d" % i for i in range(5, 10)]


@pytest.mark.parametrize("seed", range(8))
async def test_cancelling_woken_receivers_loses_nothing(
    fake: FakeTransport, connected: Connect, autojump_clock: MockClock, seed: int
) -> None:
    """Cancel receivers at the worst moment -- woken by a delivery, not yet run --
    and at random others: every message is taken exactly once or stays queued."""
    rng = random.Random(seed)
    push, pull = await connected("push", "pull", "fake://cancel-woken")
    (wire,) = fake.ends(side="listener")
    got: list[tuple[int, bytes]] = []
    sent = [b"%d" % i for i in range(40)]
    async with trio.open_nursery() as nursery:
        scopes = await _park_receivers(nursery, pull, 30, got)
        for start in range(0, len(sent), 8):
            victims = rng.sample(scopes, 3)
            wire.call_when_drained(lambda victims=victims: [s.cancel() for s in victims])
            for body in sent[start:start + 8]:
                await push.asend(body)
            await trio.sleep(rng.choice([0, 1e-4, 1e-3, 1]))
        for scope in scopes:
            scope.cancel()
    await trio.sleep(1)  # virtual: whatever is still on its way arrives
    assert pull.stats().messages_received == len(got)
    left = []
    while True:
        try:
            left.append(await pull.arecv(timeout=0))
        except nanopy.Timeout:
            break
    taken = [body for _, body in got]
    assert sorted(taken + left, key=int) == sent
    assert left == sorted(left, key=int)  # what nobody took stays in order
