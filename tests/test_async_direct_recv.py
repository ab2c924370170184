"""A trio or asyncio task receiving on a socket with one stream pipe reads that pipe itself.

It takes the pipe's read role and waits in its own trio loop; these tests check
that it still follows trio's rules (a cancelled call takes nothing), that a close
or a peer leaving wakes it, and that it shares messages in order with a thread
receiving at the same time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
import trio
from conftest import wait_until
from test_driver import _role_taken, _single_pipe_pair

import nanopy
from nanopy.testing import wait_no_pipes, wait_pipes

Factory = Callable[..., nanopy.Socket]
TRANSPORTS = ["tcp", "ipc"]


async def _until_role_taken(sock: nanopy.Socket) -> None:
    # Polled from a worker thread: the loop stays free to run the receiving task.
    await trio.to_thread.run_sync(lambda: wait_until(lambda: _role_taken(sock), what="task took the read role"))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_waiting_task_takes_the_read_role_and_gets_everything_in_order(make_socket: Factory, transport: str) -> None:
    push, pull = _single_pipe_pair(make_socket, transport)

    async def main() -> list[bytes]:
        got: list[bytes] = []

        async def receive() -> None:
            got.append(await pull.arecv(timeout=5))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            await _until_role_taken(pull)
            push.send(b"direct")
        for i in range(2000):
            push.send(b"%d" % i)
        with trio.fail_after(10):
            for _ in range(2000):
                got.append(await pull.arecv(timeout=5))
        return got

    assert trio.run(main) == [b"direct"] + [b"%d" % i for i in range(2000)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cancelled_direct_wait_takes_nothing(make_socket: Factory, transport: str) -> None:
    push, pull = _single_pipe_pair(make_socket, transport)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def receive() -> None:
                with scope:
                    await pull.arecv(timeout=30)
                    raise AssertionError("the receive completed")

            nursery.start_soon(receive)
            await _until_role_taken(pull)
            scope.cancel()
        assert scope.cancelled_caught
        assert not _role_taken(pull)
        push.send(b"after")
        with trio.fail_after(5):
            assert await pull.arecv(timeout=5) == b"after"
        # An already-cancelled call raises Cancelled and leaves queued messages alone.
        push.send(b"kept")
        with trio.CancelScope() as cancelled:
            cancelled.cancel()
            await pull.arecv(timeout=5)
        assert cancelled.cancelled_caught
        with trio.fail_after(5):
            assert await pull.arecv(timeout=5) == b"kept"

    trio.run(main)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_direct_wait_times_out(make_socket: Factory, transport: str) -> None:
    push, pull = _single_pipe_pair(make_socket, transport)

    async def main() -> None:
        with trio.fail_after(5), pytest.raises(nanopy.Timeout):
            await pull.arecv(timeout=0.05)
        push.send(b"later")
        with trio.fail_after(5):
            assert await pull.arecv(timeout=5) == b"later"

    trio.run(main)


@pytest.mark.parametrize("from_thread", [False, True])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_close_wakes_a_task_waiting_directly(make_socket: Factory, transport: str, from_thread: bool) -> None:
    push, pull = _single_pipe_pair(make_socket, transport)

    async def main() -> None:
        outcome: list[BaseException] = []
        done = trio.Event()

        async def receive() -> None:
            try:
                await pull.arecv(timeout=30)
            except nanopy.Closed as exc:
                outcome.append(exc)
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            await _until_role_taken(pull)
            with trio.fail_after(1):  # the close reaches the waiting task within a second
                if from_thread:
                    await trio.to_thread.run_sync(lambda: pull.close(linger=0))
                else:
                    pull.close(linger=0)
                await done.wait()
        assert len(outcome) == 1
        # The last direct receiver of a closed socket closed its descriptors.
        assert pull._driver.direct._wait_cache is None and pull._driver.direct._waker_box == [None]

    trio.run(main)


def test_peer_leaving_during_a_direct_wait(make_socket: Factory) -> None:
    push, pull = _single_pipe_pair(make_socket, "tcp")

    async def main() -> bytes:
        got: list[bytes] = []
        done = trio.Event()

        async def receive() -> None:
            got.append(await pull.arecv(timeout=30))
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            await _until_role_taken(pull)
            push.close(linger=0)
            await trio.to_thread.run_sync(wait_no_pipes, pull)
            again = make_socket("push", connect=pull.endpoints[0].url)
            await trio.to_thread.run_sync(wait_pipes, again)
            again.send(b"after")
            with trio.fail_after(5):
                await done.wait()
        return got[0]

    assert trio.run(main) == b"after"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_task_and_thread_share_messages_in_order(make_socket: Factory, transport: str) -> None:
    push, pull = _single_pipe_pair(make_socket, transport)
    total = 5000
    lock = threading.Lock()
    counted = [0]
    by_thread: list[int] = []
    by_task: list[int] = []

    def take(body: bytes, into: list[int]) -> None:
        into.append(int(body))
        with lock:
            counted[0] += 1

    def thread_main() -> None:
        while counted[0] < total:
            try:
                take(pull.recv(timeout=0.2), by_thread)
            except nanopy.Timeout:
                pass

    def send_all() -> None:
        for i in range(total):
            push.send(b"%d" % i)

    async def main() -> None:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, send_all)
                while counted[0] < total:
                    try:
                        take(await pull.arecv(timeout=0.2), by_task)
                    except nanopy.Timeout:
                        pass

    thread = threading.Thread(target=thread_main, daemon=True)
    thread.start()
    trio.run(main)
    thread.join(5)
    assert not thread.is_alive()
    # Each receiver sees its share in sending order; together they got each message once.
    assert by_thread == sorted(by_thread) and by_task == sorted(by_task)
    assert sorted(by_thread + by_task) == list(range(total))


# -- asyncio: the same direct path, waiting with the loop's add_reader ---------------------


async def _asyncio_until_role_taken(sock: nanopy.Socket) -> None:
    await asyncio.to_thread(wait_until, lambda: _role_taken(sock), 5.0, "task took the read role")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_asyncio_task_reads_directly_in_order_and_cancel_takes_nothing(make_socket: Factory, transport: str) -> None:
    push, pull = _single_pipe_pair(make_socket, transport)

    async def main() -> list[bytes]:
        waiting = asyncio.ensure_future(pull.arecv(timeout=30))
        await _asyncio_until_role_taken(pull)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not _role_taken(pull)
        first = asyncio.ensure_future(pull.arecv(timeout=5))
        await _asyncio_until_role_taken(pull)
        push.send(b"direct")
        got = [await asyncio.wait_for(first, 5)]
        for i in range(2000):
            push.send(b"%d" % i)
        for _ in range(2000):
            got.append(await asyncio.wait_for(pull.arecv(timeout=5), 5))
        with pytest.raises(nanopy.Timeout):
            await asyncio.wait_for(pull.arecv(timeout=0.05), 5)
        return got

    assert asyncio.run(main()) == [b"direct"] + [b"%d" % i for i in range(2000)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_close_wakes_an_asyncio_task_waiting_directly(make_socket: Factory, transport: str) -> None:
    push, pull = _single_pipe_pair(make_socket, transport)

    async def main() -> None:
        waiting = asyncio.ensure_future(pull.arecv(timeout=30))
        await _asyncio_until_role_taken(pull)
        await asyncio.to_thread(pull.close, linger=0)
        with pytest.raises(nanopy.Closed):
            await asyncio.wait_for(waiting, 1)  # within a second

    asyncio.run(main())
