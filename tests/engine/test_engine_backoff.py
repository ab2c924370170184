"""Reconnect back-off in virtual time (docs/api.md, "Connections")."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from trio.testing import MockClock

import nanopy
from nanopy.testing import FakeTransport

pytestmark = pytest.mark.trio

EPS = 1e-9


def _gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in zip(times, times[1:])]


def _check_backoff(gaps: list[float], first: float, largest: float) -> None:
    """Each gap is jittered in [current/2, current]; current doubles from ``first`` up to ``largest``."""
    current = first
    for i, gap in enumerate(gaps):
        assert current / 2 - EPS <= gap <= current + EPS, (i, gap, current, gaps)
        current = min(current * 2, largest)


@pytest.mark.parametrize(("first", "largest"), [(0.1, 1.0), (0.1, 5.0), (0.25, 0.25), (1.0, 0.5)])
async def test_dial_retries_double_up_to_the_maximum(
    fake: FakeTransport, autojump_clock: MockClock, first: float, largest: float
) -> None:
    url = "fake://absent"
    push = nanopy.Socket("push", reconnect_interval=first, reconnect_interval_max=largest)
    push.connect(url)
    await trio.sleep(60)
    dials = fake.times("dial", url)
    assert dials[0] == 0.0  # the first dial is at once
    # A maximum below the first interval: the first interval is used throughout.
    _check_backoff(_gaps(dials), first, max(largest, first))
    assert len(dials) >= 60 / max(largest, first)
    assert push.stats().reconnect_attempts == len(fake.times("refused", url))


async def test_retry_delays_are_jittered(fake: FakeTransport, autojump_clock: MockClock) -> None:
    push = nanopy.Socket("push", reconnect_interval=1.0, reconnect_interval_max=1.0)
    push.connect("fake://jitter")
    await trio.sleep(100)
    gaps = _gaps(fake.times("dial", "fake://jitter"))
    assert all(0.5 - EPS <= gap <= 1.0 + EPS for gap in gaps)
    assert len({round(gap, 6) for gap in gaps}) > len(gaps) // 2  # spread, not one fixed delay


async def test_a_refused_peer_is_reached_once_it_accepts(fake: FakeTransport, autojump_clock: MockClock) -> None:
    url = "fake://refusing"
    pull = nanopy.Socket("pull", bind=url)
    fake.refuse(url)
    push = nanopy.Socket("push", connect=url, reconnect_interval=0.1, reconnect_interval_max=2.0)
    await trio.sleep(10)
    assert not push.pipes
    accepted_at = trio.current_time()
    fake.accept_dials(url)
    await push.asend(b"through")  # waits for the pipe
    assert await pull.arecv() == b"through"
    connected_at = fake.times("handshake", url, "dialer")[-1]
    assert connected_at - accepted_at <= 2.0 + EPS  # within one (largest) retry delay


async def test_a_pipe_that_dies_at_once_keeps_the_back_off(fake: FakeTransport, autojump_clock: MockClock) -> None:
    url = "fake://flaky"
    nanopy.Socket("pull", bind=url)
    fake.refuse(url)
    push = nanopy.Socket("push", connect=url, reconnect_interval=0.1, reconnect_interval_max=4.0)
    up = trio.Event()
    push.on_pipe_added(lambda pipe: up.set())
    await trio.sleep(30)  # the retry delay has grown to the maximum
    fake.accept_dials(url)
    await up.wait()  # cut the pipe as soon as it is up: it lives no time at all
    (end,) = fake.ends(url, "dialer")
    cut_at = trio.current_time()
    end.cut()
    await trio.sleep(10)
    redial = [t for t in fake.times("dial", url) if t > cut_at][0]
    assert 2.0 - EPS <= redial - cut_at <= 4.0 + EPS


async def test_a_pipe_that_lived_resets_the_back_off(fake: FakeTransport, autojump_clock: MockClock) -> None:
    url = "fake://healthy"
    nanopy.Socket("pull", bind=url)
    fake.refuse(url)
    nanopy.Socket("push", connect=url, reconnect_interval=0.1, reconnect_interval_max=4.0)
    await trio.sleep(30)
    fake.accept_dials(url)
    await trio.sleep(5)  # the pipe lives longer than a second
    (end,) = fake.ends(url, "dialer")
    cut_at = trio.current_time()
    end.cut()
    await trio.sleep(10)
    redial = [t for t in fake.times("dial", url) if t > cut_at][0]
    assert redial - cut_at <= 0.1 + EPS


async def test_a_closed_endpoint_stops_dialing(fake: FakeTransport, autojump_clock: MockClock) -> None:
    push = nanopy.Socket("push", reconnect_interval=0.1, reconnect_interval_max=0.5)
    ep = push.connect("fake://gone")
    await trio.sleep(5)
    ep.close()
    closed_at = trio.current_time()
    await trio.sleep(100)
    assert all(t <= closed_at for t in fake.times("dial", "fake://gone"))
    assert not push.closed


async def test_a_cut_pipe_is_redialed_and_delivery_goes_on(fake: FakeTransport, autojump_clock: MockClock) -> None:
    url = "fake://cut"
    pull = nanopy.Socket("pull", bind=url)
    push = nanopy.Socket("push", connect=url, reconnect_interval=0.1, reconnect_interval_max=1.0)
    for round_ in range(5):
        await push.asend(b"before-cut-%d" % round_)
        assert await pull.arecv() == b"before-cut-%d" % round_
        fake.ends(url, "dialer")[-1].cut()
        await trio.testing.wait_all_tasks_blocked()
        assert not push.pipes
    assert push.stats().connects == 5 and push.stats().disconnects == 5
    await push.asend(b"after")
    assert await pull.arecv() == b"after"
