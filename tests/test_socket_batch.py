"""Socket.recv_batch / arecv_batch: wait for one message, then take what is queued."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import trio
from conftest import bind_url
from test_socket import push_pull

import nanopy
from nanopy.testing import connect_pair

Factory = Callable[..., nanopy.Socket]


def test_batch_takes_what_is_queued_up_to_the_limit(make_socket: Factory, transport: str) -> None:
    push, pull = push_pull(make_socket, transport)
    for i in range(50):
        push.send(b"%d" % i)
    got: list[bytes] = []
    first = pull.recv_batch(20, timeout=5)
    assert 1 <= len(first) <= 20
    got += first
    while len(got) < 50:
        got += pull.recv_batch(1000, timeout=5)
    assert got == [b"%d" % i for i in range(50)]  # order kept, nothing lost or repeated
    stats = pull.stats()
    assert stats.messages_received == 50
    assert stats.bytes_received == sum(map(len, got))


def test_batch_of_one_and_bad_limits(make_socket: Factory) -> None:
    push, pull = push_pull(make_socket, "inproc")
    push.send(b"a")
    push.send(b"b")
    assert pull.recv_batch(1, timeout=5) == [b"a"]
    assert pull.recv_batch(1, timeout=5) == [b"b"]
    for bad in (0, -3):
        with pytest.raises(ValueError, match="max_messages"):
            pull.recv_batch(bad)


def test_batch_times_out_when_empty(make_socket: Factory) -> None:
    _, pull = push_pull(make_socket, "inproc")
    with pytest.raises(nanopy.Timeout):
        pull.recv_batch(10, timeout=0.05)
    with pytest.raises(nanopy.Timeout):
        pull.recv_batch(10, timeout=0)


def test_batch_waits_for_a_late_first_message(make_socket: Factory, transport: str) -> None:
    import threading

    push, pull = push_pull(make_socket, transport)
    threading.Timer(0.05, push.send, args=(b"late",)).start()
    assert pull.recv_batch(10, timeout=5) == [b"late"]


def test_batch_on_closed_socket_and_wrong_protocol(make_socket: Factory) -> None:
    push, pull = push_pull(make_socket, "inproc")
    with pytest.raises(nanopy.ProtocolError):
        push.recv_batch(5, timeout=0)
    pull.close()
    with pytest.raises(nanopy.Closed):
        pull.recv_batch(5, timeout=1)


def test_batch_drains_past_back_pressure(make_socket: Factory, transport: str) -> None:
    """A full receive queue pauses the pipe; draining in batches resumes it."""
    push, pull = push_pull(make_socket, transport, recv_buffer=8)
    n = 2000
    sender_done = []

    import threading

    def send_all() -> None:
        for i in range(n):
            push.send(b"x%d" % i, timeout=10)
        sender_done.append(True)

    t = threading.Thread(target=send_all)
    t.start()
    got: list[bytes] = []
    while len(got) < n:
        got += pull.recv_batch(64, timeout=10)
    t.join(10)
    assert sender_done
    assert got == [b"x%d" % i for i in range(n)]


def test_batch_on_sub_keeps_filtering(make_socket: Factory) -> None:
    pub = make_socket("pub")
    sub = make_socket("sub")
    sub.subscribe(b"a")
    connect_pair(sub, pub, bind_url("inproc"))
    for body in (b"a1", b"b1", b"a2", b"b2", b"a3"):
        pub.send(body)
    got: list[bytes] = []
    while len(got) < 3:
        got += sub.recv_batch(10, timeout=5)
    assert got == [b"a1", b"a2", b"a3"]


def test_arecv_batch_trio(transport: str) -> None:
    async def main() -> list[bytes]:
        async with nanopy.Socket("pull", bind=bind_url(transport)) as pull, \
                nanopy.Socket("push", connect=pull.endpoints[0].url) as push:
            for i in range(30):
                await push.asend(b"%d" % i, timeout=5)
            got: list[bytes] = []
            while len(got) < 30:
                got += await pull.arecv_batch(16, timeout=5)
            with pytest.raises(nanopy.Timeout):
                await pull.arecv_batch(16, timeout=0.05)
            with pytest.raises(ValueError):
                await pull.arecv_batch(0)
            return got

    assert trio.run(main) == [b"%d" % i for i in range(30)]


def test_arecv_batch_asyncio() -> None:
    async def main() -> list[bytes]:
        async with nanopy.Socket("pull", bind=bind_url("tcp")) as pull, \
                nanopy.Socket("push", connect=pull.endpoints[0].url) as push:
            waiting = asyncio.create_task(pull.arecv_batch(100, timeout=5))
            await asyncio.sleep(0)  # let the receiver park before anything is sent
            for i in range(10):
                await push.asend(b"%d" % i, timeout=5)
            got = await asyncio.wait_for(waiting, 10)
            while len(got) < 10:
                got += await pull.arecv_batch(100, timeout=5)
            return got

    assert asyncio.run(main()) == [b"%d" % i for i in range(10)]
