"""Fixtures of the engine tier: nanopy's engine in the test's trio run, under a
MockClock that jumps whenever every task waits, with an in-memory transport."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from nanopy.testing import FakeTransport, engine_in_this_loop, fake_transport


@pytest.fixture
async def fake() -> AsyncIterator[FakeTransport]:
    """The ``fake://`` transport, with the engine running in this test's trio run.

    Tests also take pytest-trio's ``autojump_clock`` (pytest-trio hands a clock to
    ``trio.run`` only when the test itself asks for it).
    """
    with fake_transport() as transport:
        async with engine_in_this_loop():
            yield transport
