"""Fixtures of the engine tier: nanopy's engine in the test's trio run, under a
MockClock that jumps whenever every task waits, with an in-memory transport."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trio.testing

import nanopy
from nanopy.testing import FakeConnection, FakeTransport, engine_in_this_loop, fake_transport

Connect = Callable[..., Awaitable[tuple[nanopy.Socket, nanopy.Socket]]]
Wired = Callable[..., Awaitable[tuple[nanopy.Socket, nanopy.Socket, FakeConnection]]]


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


@pytest.fixture
def wired(fake: FakeTransport, connected: Connect) -> Wired:
    """``await wired(client, server, url, hold=False, **client_options)``: as
    ``connected``, plus the client's end of the fake wire -- held from the start
    with ``hold=True`` (a peer that reads nothing)."""

    async def connect(
        client: str, server: str, url: str, hold: bool = False, **options: object
    ) -> tuple[nanopy.Socket, nanopy.Socket, FakeConnection]:
        dialer, bound = await connected(client, server, url, **options)
        (wire,) = fake.ends(side="dialer")
        if hold:
            wire.hold()
        return dialer, bound, wire

    return connect
