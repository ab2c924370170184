"""Fixtures of the engine tier: nanopy's engine in the test's trio run, under a
MockClock that jumps whenever every task waits, with an in-memory transport."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trio.testing

import nanopy
from nanopy.testing import FakeTransport, engine_in_this_loop, fake_transport

Connect = Callable[..., Awaitable[tuple[nanopy.Socket, nanopy.Socket]]]


@pytest.fixture
async def fake() -> AsyncIterator[FakeTransport]:
    """The ``fake://`` transport, with the engine running in this test's trio run.

    Tests also take pytest-trio's ``autojump_clock`` (pytest-trio hands a clock to
    ``trio.run`` only when the test itself asks for it).
    """
    with fake_transport() as transport:
        async with engine_in_this_loop():
            yield transport


@pytest.fixture
def connected(fake: FakeTransport) -> Connect:
    """``await connected(client, server, url, **client_options)``: a ``server`` socket
    bound on ``url`` and a ``client`` connected to it, both with their pipe up."""

    async def connect(client: str, server: str, url: str, **options: object) -> tuple[nanopy.Socket, nanopy.Socket]:
        bound = nanopy.Socket(server, bind=url)
        dialer = nanopy.Socket(client, connect=url, **options)
        await trio.testing.wait_all_tasks_blocked()
        assert dialer.pipes and bound.pipes
        return dialer, bound

    return connect
