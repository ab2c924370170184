"""nanopy.Poller / nanopy.poll: readiness across sockets and transports, sync and async."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
import trio
import trio.testing
from conftest import bind_url, wait_until

import nanopy
from nanopy import POLLIN, POLLOUT
from nanopy.testing import connect_pair, wait_pipes

MakeSocket = Callable[..., nanopy.Socket]


def pull_push(make_socket: MakeSocket, transport: str) -> tuple[nanopy.Socket, nanopy.Socket]:
    pull = make_socket("pull")
    push = make_socket("push")
    connect_pair(pull, push, bind_url(transport, "poll"))
    return pull, push


def test_several_sockets_of_different_transports(make_socket: MakeSocket) -> None:
    pairs = {t: pull_push(make_socket, t) for t in ("tcp", "ipc", "inproc")}
    poller = nanopy.Poller()
    for pull, _ in pairs.values():
        poller.register(pull, POLLIN)
    assert poller.poll(timeout=0) == []
    for transport in ("ipc", "tcp", "inproc"):
        pull, push = pairs[transport]
        push.send(transport.encode())
        assert poller.poll(timeout=5) == [(pull, POLLIN)]
        assert pull.recv(timeout=0) == transport.encode()
    # Two ready at once come back in registration order.
    pairs["inproc"][1].send(b"a")
    pairs["tcp"][1].send(b"b")
    wait_until(lambda: len(poller.poll(0)) == 2, what="both sockets readable")
    assert [s for s, _ in poller.poll(1)] == [pairs["tcp"][0], pairs["inproc"][0]]


def test_a_blocked_poll_wakes_on_a_message_from_another_thread(make_socket: MakeSocket) -> None:
    pull, push = pull_push(make_socket, "tcp")
    sub = make_socket("sub", bind=bind_url("ipc", "poll-sub"))
    sub.subscribe(b"")
    poller = nanopy.Poller()
    poller.register(pull, POLLIN)
    poller.register(sub, POLLIN)
    started = threading.Event()

    def later() -> None:
        started.wait(5)
        push.send(b"wake")

    t = threading.Thread(target=later, daemon=True)
    t.start()
    started.set()
    assert poller.poll(timeout=10) == [(pull, POLLIN)]
    t.join(5)


def test_timeout_returns_empty_after_about_that_long(make_socket: MakeSocket) -> None:
    pull, _ = pull_push(make_socket, "inproc")
    start = time.monotonic()
    assert nanopy.poll([(pull, POLLIN)], timeout=0.2) == []
    took = time.monotonic() - start
    assert 0.19 <= took < 2.0


def test_pollout_without_a_peer_and_with_one(make_socket: MakeSocket) -> None:
    push = make_socket("push")
    req = make_socket("req")
    sub = make_socket("sub")
    # PUSH has nowhere to send; REQ queues requests until a peer comes; SUB never sends.
    assert nanopy.poll([(push, POLLOUT), (req, POLLOUT), (sub, POLLOUT)], timeout=0.05) == [(req, POLLOUT)]
    pull = make_socket("pull")
    connect_pair(pull, push, bind_url("inproc"))
    assert nanopy.poll([(push, POLLIN | POLLOUT)], timeout=5) == [(push, POLLOUT)]


def test_pollout_turns_false_when_the_queue_fills(make_socket: MakeSocket) -> None:
    pull = make_socket("pull", recv_buffer=2)
    push = make_socket("push", send_buffer=2)
    connect_pair(pull, push, bind_url("inproc"))
    sent = 0
    while nanopy.poll([(push, POLLOUT)], timeout=0.2):
        push.send(b"x", timeout=0)
        sent += 1
        assert sent < 100
    with pytest.raises(nanopy.Timeout):
        push.send(b"x", timeout=0)
    # The reader drains the queue (PULL resumes reading at half its recv_buffer):
    # a poll blocked meanwhile wakes when the credit comes back.
    drain = threading.Thread(target=lambda: [pull.recv(timeout=5) for _ in range(sent)], daemon=True)
    drain.start()
    assert nanopy.poll([(push, POLLOUT)], timeout=5) == [(push, POLLOUT)]
    drain.join(5)


def test_rep_and_req_readiness_is_per_caller(make_socket: MakeSocket) -> None:
    rep = make_socket("rep")
    req = make_socket("req")
    connect_pair(rep, req, bind_url("inproc"))
    assert nanopy.poll([(rep, POLLIN | POLLOUT)], timeout=0) == []
    req.send(b"q")
    assert nanopy.poll([(rep, POLLIN | POLLOUT)], timeout=5) == [(rep, POLLIN)]
    rep.recv(timeout=0)
    assert nanopy.poll([(rep, POLLOUT)], timeout=0) == [(rep, POLLOUT)]  # this thread may reply
    other = []
    t = threading.Thread(target=lambda: other.append(nanopy.poll([(rep, POLLOUT)], timeout=0)))
    t.start()
    t.join(5)
    # Another thread holds no request, but may answer the oldest unanswered one
    # (the socket-wide fallback, docs/api.md).
    assert other == [[(rep, POLLOUT)]]
    rep.send(b"a")
    assert nanopy.poll([(rep, POLLOUT)], timeout=0) == []  # nothing left to answer
    assert nanopy.poll([(req, POLLIN)], timeout=5) == [(req, POLLIN)]
    assert req.recv(timeout=0) == b"a"


def test_register_modify_unregister(make_socket: MakeSocket) -> None:
    pull, push = pull_push(make_socket, "inproc")
    poller = nanopy.Poller()
    poller.register(pull)  # POLLIN | POLLOUT
    assert poller.sockets == [(pull, POLLIN | POLLOUT)]
    poller.register(push, POLLOUT)
    assert poller.poll(timeout=0) == [(push, POLLOUT)]
    poller.unregister(push)
    push.send(b"m")
    assert poller.poll(timeout=5) == [(pull, POLLIN)]
    poller.register(pull, 0)  # pyzmq: flags 0 unregisters
    assert poller.sockets == []
    with pytest.raises(KeyError):
        poller.unregister(pull)
    with pytest.raises(ValueError, match="wait forever"):
        poller.poll()
    assert poller.poll(timeout=0.01) == []


def test_bad_arguments(make_socket: MakeSocket) -> None:
    poller = nanopy.Poller()
    pull = make_socket("pull")
    with pytest.raises(TypeError):
        poller.register(object(), POLLIN)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        poller.register(pull, 8)
    with pytest.raises(TypeError):
        poller.register(pull, "in")  # type: ignore[arg-type]
    poller.register(pull, POLLIN)
    with pytest.raises(ValueError):
        poller.poll(timeout=-1)
    with pytest.raises(TypeError):
        poller.poll(timeout="1")  # type: ignore[arg-type]


def test_closing_a_registered_socket_wakes_a_blocked_poll(make_socket: MakeSocket) -> None:
    pull, _ = pull_push(make_socket, "tcp")
    outcome: list[BaseException] = []

    def blocked() -> None:
        try:
            nanopy.poll([(pull, POLLIN)], timeout=30)
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=blocked, daemon=True)
    t.start()
    wait_until(lambda: bool(pull._driver.watchers), what="the poll to block")
    pull.close(linger=0)
    t.join(5)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], nanopy.Closed)
    with pytest.raises(nanopy.Closed):
        nanopy.poll([(pull, POLLIN)], timeout=0)


def test_apoll_with_trio(make_socket: MakeSocket) -> None:
    pull, push = pull_push(make_socket, "ipc")

    async def main() -> None:
        poller = nanopy.Poller()
        poller.register(pull, POLLIN)
        assert await poller.apoll(timeout=0.05) == []

        async def send_later() -> None:
            await trio.testing.wait_all_tasks_blocked()  # apoll is parked
            await push.asend(b"hello")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_later)
            with trio.fail_after(10):
                assert await poller.apoll() == [(pull, POLLIN)]
        assert await pull.arecv() == b"hello"
        # Cancelling a blocked apoll leaves nothing behind.
        with trio.move_on_after(0.05):
            await poller.apoll()
        assert pull._driver.watchers == []

    trio.run(main)


def test_apoll_with_asyncio_and_close(make_socket: MakeSocket) -> None:
    pull, push = pull_push(make_socket, "tcp")

    async def main() -> None:
        poller = nanopy.Poller()
        poller.register(pull, POLLIN)
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, push.send, b"x")
        assert await asyncio.wait_for(poller.apoll(timeout=10), 10) == [(pull, POLLIN)]
        assert pull.recv(timeout=0) == b"x"
        loop.call_later(0.01, pull.close, 0)
        with pytest.raises(nanopy.Closed):
            await asyncio.wait_for(poller.apoll(), 10)

    asyncio.run(main())


def test_idle_poll_sleeps(make_socket: MakeSocket) -> None:
    pairs = [pull_push(make_socket, t) for t in ("tcp", "ipc", "inproc")]
    sub = make_socket("sub", connect="tcp://127.0.0.1:9")  # a dialer retrying in the background
    sub.subscribe(b"")
    wait_pipes(pairs[0][0])
    poller = nanopy.Poller()
    for pull, _ in pairs:
        poller.register(pull, POLLIN)
    poller.register(sub, POLLIN)
    cpu = time.process_time()
    wall = time.monotonic()
    assert poller.poll(timeout=1.0) == []
    assert time.monotonic() - wall >= 0.99
    used = time.process_time() - cpu  # every thread of this process, the engine's too
    assert used < 0.1, f"an idle 1 s poll used {used:.3f} s of CPU"


def test_threads_sharing_a_req_each_poll_for_their_own_reply(make_socket: MakeSocket) -> None:
    rep = make_socket("rep")
    req = make_socket("req")
    connect_pair(rep, req, bind_url("inproc"))
    asked = threading.Barrier(3)
    results: dict[int, object] = {}

    def caller(i: int) -> None:
        req.send(b"q%d" % i)
        asked.wait(5)
        results[i] = nanopy.poll([(req, POLLIN)], timeout=10) and req.recv(timeout=0)

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    asked.wait(5)
    requests = {}
    for _ in range(2):
        msg = rep.recv_msg(timeout=5)
        requests[msg.body] = msg
    # Answer the second caller first: only its poll may return.
    requests[b"q1"].reply(b"a1")
    threads[1].join(5)
    assert results == {1: b"a1"}
    assert nanopy.poll([(req, POLLIN)], timeout=0) == []  # this thread has no request
    requests[b"q0"].reply(b"a0")
    threads[0].join(5)
    assert results == {0: b"a0", 1: b"a1"}
