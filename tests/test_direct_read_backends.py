"""The direct read (nanopy/driver/direct.py) on each platform backend.

A thread (or a trio/asyncio task) blocked in ``recv`` on a socket with one stream
pipe reads that pipe itself, waiting on the pipe's descriptor and the socket's
waker (nanopy.platform: eventfd + epoll on Linux, a socket pair + a selector with
the portable backend, which macOS and Windows run). On every backend, that wait
ends for bytes on the pipe, for the socket's close, and for a message handed to
the core by another thread (here: the engine thread, reading a second pipe).

Both backends run on Linux: each test runs the direct read on each of them in this
one process (the driver binds the backend's ``new_waker`` and ``ready_wait`` at
import; the fixture swaps them for the test's backend).
"""

from __future__ import annotations

import asyncio
import selectors
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio
from conftest import wait_until
from test_driver import _recv_in_thread, _role_taken, _single_pipe_pair

import nanopy
from nanopy import platform
from nanopy.driver import direct
from nanopy.testing import wait_pipes

Factory = Callable[..., nanopy.Socket]
BACKENDS = list(platform.BACKENDS) if sys.platform.startswith("linux") else ["portable"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The direct read of sockets made in this test uses this backend's waker and wait."""
    chosen = platform.load(request.param)
    monkeypatch.setattr(direct, "_new_waker", chosen.new_waker)
    monkeypatch.setattr(direct, "_ready_wait", chosen.ready_wait)
    yield chosen


def _wait_role(sock: nanopy.Socket) -> None:
    wait_until(lambda: _role_taken(sock), what="the receiver took the read role")


def _reader_wait(sock: nanopy.Socket) -> Any:
    wait_until(lambda: sock._driver.direct._wait_cache is not None, what="the receiver waits directly")
    cached = sock._driver.direct._wait_cache
    assert cached is not None
    return cached[1]


def test_a_blocked_thread_wakes_for_bytes_on_its_pipe(make_socket: Factory, backend: Any) -> None:
    push, pull = _single_pipe_pair(make_socket, "tcp")
    out: list[Any] = []
    thread = _recv_in_thread(pull, out, timeout=30)
    _wait_role(pull)
    wait = _reader_wait(pull)
    # What an event loop watches: one descriptor (epoll's; the portable backend's selector's
    # where it has one, as on Linux and macOS), both where the selector has none (Windows).
    one = backend.NAME == "linux" or hasattr(selectors.DefaultSelector, "fileno")
    assert len(wait.fds) == (1 if one else 2)
    push.send(b"direct")
    thread.join(10)
    assert out == [b"direct"]


def test_a_blocked_thread_wakes_for_close(make_socket: Factory, backend: Any) -> None:
    _, pull = _single_pipe_pair(make_socket, "tcp")
    out: list[Any] = []
    thread = _recv_in_thread(pull, out, timeout=30)
    _wait_role(pull)
    pull.close(linger=0)
    thread.join(10)
    assert not thread.is_alive() and len(out) == 1 and isinstance(out[0], nanopy.Closed), out
    # The last direct receiver of a closed socket closed the waker and the wait.
    assert pull._driver.direct._wait_cache is None and pull._driver.direct._waker_box == [None]


def test_a_blocked_thread_wakes_for_a_message_another_thread_hands_in(make_socket: Factory, backend: Any) -> None:
    """The reader waits on its pipe; a message arrives on a second pipe, read by the
    engine thread: the core's wake of the parked waiter reaches it through the waker."""
    _, pull = _single_pipe_pair(make_socket, "tcp")
    out: list[Any] = []
    thread = _recv_in_thread(pull, out, timeout=30)
    _wait_role(pull)
    other = make_socket("push", connect=pull.endpoints[0].url)
    wait_pipes(other)
    other.send(b"from the engine")
    thread.join(10)
    assert out == [b"from the engine"]


def test_many_round_trips_on_a_direct_read(make_socket: Factory, backend: Any) -> None:
    """A receiver that blocks for every message (the latency case) gets each, in order."""
    push, pull = _single_pipe_pair(make_socket, "ipc")
    got: list[bytes] = []
    ready = threading.Event()

    def receive() -> None:
        for _ in range(200):
            ready.set()
            got.append(pull.recv(timeout=10))

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    for i in range(200):
        ready.wait(10)
        ready.clear()
        push.send(b"%d" % i)
    thread.join(30)
    assert got == [b"%d" % i for i in range(200)]


@pytest.mark.parametrize("flavour", ["trio", "asyncio"])
def test_a_task_waiting_directly_wakes_for_bytes_and_for_close(
    make_socket: Factory, backend: Any, flavour: str
) -> None:
    """A task waits in its own loop on the wait's descriptors (one on Linux, both
    the pipe's and the waker's with the portable backend)."""
    push, pull = _single_pipe_pair(make_socket, "tcp")
    first = threading.Event()

    async def receive_two() -> list[Any]:
        got: list[Any] = [await pull.arecv(timeout=30)]
        first.set()  # (the first call gave the role back before it returned)
        try:
            got.append(await pull.arecv(timeout=30))
        except nanopy.Closed as exc:
            got.append(exc)
        return got

    def feed() -> None:
        _wait_role(pull)
        _reader_wait(pull)
        push.send(b"first")
        assert first.wait(10)
        _wait_role(pull)  # the second call waits directly
        pull.close(linger=0)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    got = trio.run(receive_two) if flavour == "trio" else asyncio.run(receive_two())
    feeder.join(10)
    assert got[0] == b"first" and isinstance(got[1], nanopy.Closed), got


class _LoopWithoutReaders(asyncio.SelectorEventLoop):
    """Like Windows' default (proactor) loop: no ``add_reader``."""

    add_reader = asyncio.BaseEventLoop.add_reader  # type: ignore[assignment]  # (raises NotImplementedError)


def test_an_asyncio_loop_that_cannot_watch_descriptors_waits_the_ordinary_way(make_socket: Factory) -> None:
    push, pull = _single_pipe_pair(make_socket, "tcp")
    waiting = threading.Event()

    async def receive() -> bytes:
        waiting.set()
        return await pull.arecv(timeout=30)

    def feed() -> None:
        assert waiting.wait(10)
        wait_until(lambda: len(pull._driver.recv_q.waiters) == 1, what="the task waits")
        assert not _role_taken(pull)  # (it never read the pipe itself)
        push.send(b"woken by the engine")

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    loop = _LoopWithoutReaders()
    try:
        got = loop.run_until_complete(receive())
    finally:
        loop.close()
    feeder.join(10)
    assert got == b"woken by the engine"


def _closed_fd() -> int:
    """A descriptor number that was a socket's and is closed now (made inside the
    running loop: a loop started after it would take its number for its own)."""
    a, b = socket.socketpair()
    fd = b.fileno()
    a.close()
    b.close()
    return fd


def test_a_descriptor_closed_under_a_wait_never_raises(backend: Any) -> None:
    """Another thread may close the pipe's connection while the reader waits: the
    wait goes on (or ends) quietly, and the waker still ends it."""
    waker = backend.new_waker()
    a, b = socket.socketpair()
    wait = backend.ready_wait(b.fileno(), waker)
    try:
        b.close()
        wait.wait(0)
        waker.wake()
        wait.wait(10)  # (returns at once: the wake)
    finally:
        wait.close()
        waker.close()
        a.close()


@pytest.mark.parametrize("flavour", ["trio", "asyncio"])
def test_a_task_waiting_on_a_closed_descriptor_looks_again_at_once(backend: Any, flavour: str) -> None:
    waker = backend.new_waker()
    try:
        if flavour == "trio":
            async def in_trio() -> None:
                with trio.fail_after(5):
                    await direct._trio_wait_readable((_closed_fd(), waker.fd), 30)

            trio.run(in_trio)
        else:
            async def in_asyncio() -> None:
                wait = direct._asyncio_wait_for_fds()
                assert wait is not None
                await asyncio.wait_for(wait((_closed_fd(), waker.fd), 30), 5)

            asyncio.run(in_asyncio())
    finally:
        waker.close()
