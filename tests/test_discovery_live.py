"""nanopy/discovery/live.py: a Discovery's live-provider table on its own, without sockets.

What Discovery's own tests check through surveys (misses, priorities, waiting resolves,
closing, a forked child), checked here on the part that owns it, round by round.
"""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from nanopy import Closed
from nanopy.discovery import Provider
from nanopy.discovery.live import LiveProviders


def provider(name: str, address: str, priority: int = 8, seen: float = 1.0) -> Provider:
    return Provider(name, address, priority, {}, seen, seen)


def test_an_answer_adds_a_provider_once_and_refreshes_it_after() -> None:
    table = LiveProviders(misses=2)
    assert table.record(provider("echo", "tcp://a:1", seen=1.0)) is True
    assert table.record(provider("echo", "tcp://a:1", priority=3, seen=5.0)) is False
    [p] = table.providers()
    assert (p.priority, p.first_seen, p.last_seen) == (3, 1.0, 5.0)  # the first sighting kept
    assert len(table) == 1


def test_a_provider_is_dropped_after_misses_rounds_in_a_row() -> None:
    table = LiveProviders(misses=2)
    table.record(provider("echo", "tcp://a:1"))
    table.record(provider("echo", "tcp://b:1"))
    assert table.end_round({("echo", "tcp://a:1")}) == []  # b missed one
    table.record(provider("echo", "tcp://b:1"))  # ...and answered again: its misses start over
    assert table.end_round({("echo", "tcp://a:1")}) == []
    assert table.end_round({("echo", "tcp://a:1")}) == [("echo", "tcp://b:1")]
    assert [p.address for p in table.providers("echo")] == ["tcp://a:1"]


def test_resolve_picks_the_best_priority_and_names_the_live_services() -> None:
    table = LiveProviders(misses=1)
    table.record(provider("db", "tcp://slow:1", priority=9))
    table.record(provider("db", "tcp://fast:1", priority=2))
    table.record(provider("web", "tcp://w:1"))
    assert {table.resolve("db", 0.0) for _ in range(20)} == {"tcp://fast:1"}
    with pytest.raises(LookupError, match="no live provider of 'cache'; live services: db, web"):
        table.resolve("cache", 0.0)
    assert [p.name for p in table.providers()] == ["db", "db", "web"]


def test_a_waiting_resolve_gets_the_provider_that_appears() -> None:
    table = LiveProviders(misses=1)
    found: list[str] = []
    waiter = threading.Thread(target=lambda: found.append(table.resolve("echo", None)))
    waiter.start()
    table.record(provider("echo", "tcp://a:1"))  # (before or after it waits: either way it returns it)
    waiter.join(10.0)
    assert found == ["tcp://a:1"]


def test_close_wakes_waiting_resolves_with_closed_and_happens_once() -> None:
    table = LiveProviders(misses=1)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            table.resolve("echo", None)
        except Closed as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert table.close() is True
    assert table.close() is False
    waiter.join(10.0)
    assert len(errors) == 1 and table.closed


def test_an_async_resolve_is_woken_by_an_answer_and_by_close() -> None:
    table = LiveProviders(misses=1)

    async def main() -> None:
        results: list[object] = []

        async def resolve(name: str) -> None:
            try:
                results.append(await table.aresolve(name, None))
            except Closed as exc:
                results.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(resolve, "echo")
            await trio.testing.wait_all_tasks_blocked()
            table.record(provider("echo", "tcp://a:1"))
        assert results == ["tcp://a:1"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(resolve, "other")
            await trio.testing.wait_all_tasks_blocked()
            table.close()
        assert isinstance(results[-1], Closed)

    trio.run(main)


def test_a_forked_child_knows_no_provider_and_is_closed() -> None:
    table = LiveProviders(misses=1)
    table.record(provider("echo", "tcp://a:1"))
    table.after_fork_in_child()  # (what the at-fork hook calls in the child; here in-process)
    assert table.closed and table.providers() == []
    with pytest.raises(Closed):
        table.resolve("echo", 0.0)
