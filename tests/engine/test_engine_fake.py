"""The tier's own tools: engine_in_this_loop and the fake:// transport."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from trio.testing import MockClock

import nanopy
from nanopy import transports
from nanopy.testing import FakeTransport, engine_in_this_loop, fake_transport
from nanopy.transports import PipeContext

pytestmark = pytest.mark.trio


async def test_binding_a_taken_address_raises(fake: FakeTransport, autojump_clock: MockClock) -> None:
    nanopy.Socket("pull", bind="fake://taken")
    other = nanopy.Socket("pull")
    with pytest.raises(nanopy.AddressInUse):
        other.bind("fake://taken")
    with pytest.raises(nanopy.AddressError):
        other.bind("fake://")


async def test_a_blocking_call_that_must_wait_raises_in_the_loop(autojump_clock: MockClock) -> None:
    class SlowToBind(FakeTransport):
        async def listen(self, url: str, ctx: PipeContext) -> transports.Listener:
            await trio.sleep(1)
            return await super().listen(url, ctx)

    transports.register("slowfake", SlowToBind("slowfake"), override=True)
    try:
        async with engine_in_this_loop():
            sock = nanopy.Socket("pull")
            with pytest.raises(RuntimeError, match="async form"):
                sock.bind("slowfake://x")
            await trio.sleep(5)  # the abandoned bind left nothing behind to wake
            assert sock.endpoints == []
            # From a worker thread the engine is waited for as usual.
            ep = await trio.to_thread.run_sync(sock.bind, "slowfake://y")
            assert ep.url == "slowfake://y"
    finally:
        transports.unregister("slowfake")


async def test_sockets_left_open_are_closed_on_exit(autojump_clock: MockClock) -> None:
    with fake_transport():
        async with engine_in_this_loop():
            pull = nanopy.Socket("pull", bind="fake://left")
            push = nanopy.Socket("push", connect="fake://left")
            await push.asend(b"x")
            with pytest.raises(RuntimeError, match="already active"):
                async with engine_in_this_loop():
                    pass
    assert pull.closed and push.closed


async def test_a_peer_of_the_wrong_protocol_is_refused(fake: FakeTransport, autojump_clock: MockClock) -> None:
    nanopy.Socket("pull", bind="fake://proto")
    pub = nanopy.Socket("pub", connect="fake://proto", reconnect_interval=1.0, reconnect_interval_max=1.0)
    await trio.sleep(10)
    assert not pub.pipes
    assert pub.stats().protocol_errors >= 1
    assert len(fake.times("dial", "fake://proto")) >= 10  # it keeps retrying, with back-off


async def test_injected_wire_messages_reach_the_core(fake: FakeTransport, autojump_clock: MockClock) -> None:
    req = nanopy.Socket("req", bind="fake://inject")
    nanopy.Socket("rep", connect="fake://inject")
    await trio.testing.wait_all_tasks_blocked()
    (wire,) = fake.ends(side="listener")
    wire.inject(b"\x80\x00\x00\x01not a reply to anything")  # an unknown request id: dropped
    wire.inject(b"\x00\x00\x00\x01")  # no end-of-stack bit: a broken peer, its pipe is closed
    await trio.testing.wait_all_tasks_blocked()
    assert req.stats().protocol_errors == 1
    assert wire.closed
