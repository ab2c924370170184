"""``Socket.flush``/``aflush`` and ``Socket.wait_for_pipes`` (docs/api.md, "Flushing").

flush waits until what is queued on the socket's pipes is written to the
connections, on every transport; it times out (``nanopy.Timeout``) behind a
reader that stalls, loses nothing doing so, and returns once the reader drains.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import trio
from peers import free_tcp_port
from test_close import ALL_TRANSPORTS, Place, closing, place, stalled_pair

import nanopy

pytestmark = pytest.mark.usefixtures("no_nanopy_errors")


@pytest.fixture(params=[*ALL_TRANSPORTS, "zmtp+tcp", "zmtp+ipc"])
def where(request: pytest.FixtureRequest) -> Place:
    if request.param == "zmtp+tcp":
        return Place("zmtp+tcp", f"zmtp+tcp://127.0.0.1:{free_tcp_port()}")
    if request.param == "zmtp+ipc":
        return Place("zmtp+ipc", "zmtp+" + place("ipc", "flush").url)
    return place(request.param, "flush")


def _drain_until_end(pull: nanopy.Socket) -> Iterator[bytes]:
    while (body := pull.recv(timeout=10)) != b"end":
        yield body


def test_flush_waits_for_a_stalled_reader_and_returns_once_it_drains(where: Place) -> None:
    push, pull, _ = stalled_pair(where)
    with closing(pull, push):
        queued = push.stats().queued_out
        assert queued > 0, "the pair is stalled: messages wait on the pipe"
        with pytest.raises(nanopy.Timeout, match="still queued"):
            push.flush(timeout=0)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):  # (nanopy.Timeout is a TimeoutError)
            push.flush(timeout=0.2)
        assert time.monotonic() - t0 < 2, "the timeout bounds the wait"
        assert push.stats().queued_out >= queued - 1, "a timed-out flush drops nothing"

        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.extend(_drain_until_end(pull)))
        reader.start()
        push.flush(timeout=10)
        assert push.stats().queued_out == 0
        push.send(b"end")
        push.flush(timeout=10)
        reader.join(10)
        assert not reader.is_alive()
        assert len(got) >= queued, "every message queued before the flush arrived"


def test_a_pipe_that_closes_during_flush_counts_as_flushed() -> None:
    push, pull, _ = stalled_pair(place("tcp", "flush-gone"))
    with closing(pull, push):
        flushed: list[BaseException | None] = []

        def flush() -> None:
            try:
                push.flush(timeout=30)
                flushed.append(None)
            except BaseException as exc:  # noqa: BLE001 - checked below
                flushed.append(exc)

        flusher = threading.Thread(target=flush)
        flusher.start()
        pull.close(linger=0)  # the reader goes: its pipe ends with messages unwritten
        flusher.join(10)
        assert not flusher.is_alive(), "flush returns when the pipe ends, not at its timeout"
        assert flushed == [None]


def test_flush_and_wait_for_pipes_on_the_engine_thread_are_refused() -> None:
    pull = nanopy.Socket("pull")
    push = nanopy.Socket("push")
    with closing(pull, push):
        seen: list[BaseException] = []
        done = threading.Event()

        def in_callback(_pipe: nanopy.Pipe) -> None:
            for call in (lambda: push.flush(timeout=1), lambda: push.wait_for_pipes(1, timeout=1)):
                try:
                    call()
                except RuntimeError as exc:
                    seen.append(exc)
            done.set()

        push.on_pipe_added(in_callback)
        push.connect(pull.bind(place("tcp", "flush-cb").url).url)
        assert done.wait(10)
        assert len(seen) == 2 and all("engine thread" in str(exc) for exc in seen), seen


def test_flush_with_nothing_queued_returns_at_once(where: Place) -> None:
    pull = nanopy.Socket("pull", recv_timeout=5)
    push = nanopy.Socket("push")
    with closing(pull, push):
        push.flush(timeout=0)  # no pipe: nothing to write
        bound = pull.bind(where.url, **where.bind_opts).url
        push.connect(where.dial_url(bound), **where.dial_opts)
        push.wait_for_pipes(1, timeout=10)
        push.send(b"one")
        push.flush(timeout=10)
        push.flush(timeout=0)
        assert pull.recv() == b"one"


def test_flush_refuses_a_closed_socket_and_a_bad_timeout() -> None:
    sock = nanopy.Socket("push")
    with pytest.raises(ValueError, match="timeout"):
        sock.flush(timeout=-1)
    with pytest.raises(TypeError, match="timeout"):
        sock.flush(timeout="1")  # type: ignore[arg-type]
    sock.close()
    with pytest.raises(nanopy.Closed):
        sock.flush()


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_aflush_in_trio_and_asyncio(library: str) -> None:
    push, pull, _ = stalled_pair(place("tcp", "aflush"))
    with closing(pull, push):

        async def flushes() -> None:
            with pytest.raises(nanopy.Timeout):
                await push.aflush(timeout=0.2)
            reader = threading.Thread(target=lambda: list(_drain_until_end(pull)))
            reader.start()
            await push.aflush(timeout=10)
            push.send(b"end")
            reader.join(10)
            assert not reader.is_alive()

        if library == "trio":
            trio.run(flushes)
        else:
            asyncio.run(flushes())
        assert push.stats().queued_out == 0


# -- wait_for_pipes -----------------------------------------------------------------------------------


def test_wait_for_pipes_returns_once_connected_and_names_the_address_on_timeout() -> None:
    pull = nanopy.Socket("pull")
    push = nanopy.Socket("push", reconnect_interval=0.05)
    with closing(pull, push):
        push.wait_for_pipes(0)
        url = f"tcp://127.0.0.1:{free_tcp_port()}"
        push.connect(url)
        with pytest.raises(nanopy.Timeout, match=url.replace(".", r"\.")):
            push.wait_for_pipes(1, timeout=0.1)
        pull.bind(url)
        push.wait_for_pipes(1, timeout=10)
        pull.wait_for_pipes(1, timeout=10)
        assert len(push.pipes) == 1


def test_wait_for_pipes_raises_closed_when_the_socket_closes_meanwhile() -> None:
    sock = nanopy.Socket("push")
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            sock.wait_for_pipes(1)
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    sock.close()
    waiter.join(5)
    assert not waiter.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], nanopy.Closed)
    with pytest.raises(nanopy.Closed):
        sock.wait_for_pipes(0)


@pytest.mark.parametrize("count", [-1, 1.5, True])
def test_wait_for_pipes_refuses_a_bad_count(count: object) -> None:
    sock = nanopy.Socket("push")
    with closing(sock), pytest.raises(ValueError, match="count"):
        sock.wait_for_pipes(count)  # type: ignore[arg-type]


def test_wait_for_pipes_refuses_a_bad_timeout() -> None:
    sock = nanopy.Socket("push")
    with closing(sock):
        with pytest.raises(ValueError, match="timeout"):
            sock.wait_for_pipes(1, timeout=-1)
        with pytest.raises(TypeError, match="timeout"):
            sock.wait_for_pipes(1, timeout="1")  # type: ignore[arg-type]
