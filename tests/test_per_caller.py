"""Classic REQ/REP/RESPONDENT calls keep their state per caller (thread or task).

Many threads (or trio/asyncio tasks) share one socket through plain
``send``/``recv`` and each gets its own request and reply -- against nanopy
peers and against NNG (pynng).
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import trio
import trio.lowlevel
from conftest import bind_url, wait_until
from peers import pynng_socket

import nanopy
from nanopy.testing import connect_pair, wait_pipes

MakeSocket = Callable[..., nanopy.Socket]
CALLERS = 8
ROUNDS = 10


def run_threads(target: Callable[[int], Any], count: int = CALLERS) -> dict[int, Any]:
    """Run ``target(i)`` in ``count`` threads; return results, re-raise the first error."""
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a caller thread hung"
    if errors:
        raise errors[0]
    return results


def shared_rep_workers(rep: nanopy.Socket, stop: threading.Event, count: int = CALLERS) -> list[threading.Thread]:
    """``count`` threads answering on one REP through classic recv()/send()."""

    def work(i: int) -> None:
        while not stop.is_set():
            try:
                request = rep.recv(timeout=0.05)
            except nanopy.Timeout:
                continue
            except nanopy.Closed:
                return
            rep.send(b"re:" + request + b" by %d" % i)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    return threads


def check_client(send: Callable[[bytes], None], recv: Callable[[], bytes], name: bytes) -> int:
    for n in range(ROUNDS):
        request = b"%s #%d" % (name, n)
        send(request)
        reply = recv()
        assert reply.startswith(b"re:" + request + b" by "), (request, reply)
    return ROUNDS


@pytest.mark.parametrize("transport", ["tcp", "ipc", "inproc"])
def test_threads_share_one_rep(make_socket: MakeSocket, transport: str) -> None:
    rep = make_socket("rep", bind=bind_url(transport))
    url = rep.endpoints[0].url
    clients = [make_socket("req", connect=url, recv_timeout=10) for _ in range(CALLERS)]
    wait_pipes(rep, CALLERS)
    stop = threading.Event()
    workers = shared_rep_workers(rep, stop)
    try:
        done = run_threads(lambda i: check_client(clients[i].send, clients[i].recv, b"client %d" % i))
    finally:
        stop.set()
        for t in workers:
            t.join(5)
    assert sum(done.values()) == CALLERS * ROUNDS
    assert rep.stats().messages_dropped == 0


@pytest.mark.parametrize("transport", ["tcp", "inproc"])
def test_threads_share_one_req(make_socket: MakeSocket, transport: str) -> None:
    rep = make_socket("rep")
    req = make_socket("req", recv_timeout=10)
    connect_pair(rep, req, bind_url(transport))
    stop = threading.Event()
    workers = shared_rep_workers(rep, stop, count=3)
    try:
        done = run_threads(lambda i: check_client(req.send, req.recv, b"thread %d" % i))
    finally:
        stop.set()
        for t in workers:
            t.join(5)
    assert sum(done.values()) == CALLERS * ROUNDS
    assert req._core.outstanding == 0


def test_trio_tasks_share_rep_and_req(make_socket: MakeSocket) -> None:
    rep = make_socket("rep")
    req = make_socket("req", recv_timeout=10)
    connect_pair(rep, req, bind_url("tcp"))
    replies: list[bytes] = []

    async def server(i: int) -> None:
        while True:
            request = await rep.arecv()
            await trio.lowlevel.checkpoint()  # let the other servers interleave
            await rep.asend(b"re:" + request + b" by %d" % i)

    async def client(i: int) -> None:
        for n in range(ROUNDS):
            request = b"task %d #%d" % (i, n)
            await req.asend(request)
            reply = await req.arecv()
            assert reply.startswith(b"re:" + request + b" by "), (request, reply)
            replies.append(reply)

    async def main() -> None:
        with trio.fail_after(30):
            async with trio.open_nursery() as servers:
                for i in range(CALLERS):
                    servers.start_soon(server, i)
                async with trio.open_nursery() as clients:
                    for i in range(CALLERS):
                        clients.start_soon(client, i)
                servers.cancel_scope.cancel()

    trio.run(main)
    assert len(replies) == CALLERS * ROUNDS


def test_asyncio_tasks_share_rep_and_req(make_socket: MakeSocket) -> None:
    rep = make_socket("rep")
    req = make_socket("req", recv_timeout=10)
    connect_pair(rep, req, bind_url("inproc"))

    async def server(i: int) -> None:
        while True:
            request = await rep.arecv()
            await asyncio.sleep(0)
            await rep.asend(b"re:" + request + b" by %d" % i)

    async def client(i: int) -> int:
        for n in range(ROUNDS):
            request = b"aio %d #%d" % (i, n)
            await req.asend(request)
            reply = await req.arecv()
            assert reply.startswith(b"re:" + request + b" by "), (request, reply)
        return ROUNDS

    async def main() -> int:
        servers = [asyncio.ensure_future(server(i)) for i in range(CALLERS)]
        try:
            done = await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(CALLERS))), 30)
        finally:
            for s in servers:
                s.cancel()
            await asyncio.gather(*servers, return_exceptions=True)
        return sum(done)

    assert asyncio.run(main()) == CALLERS * ROUNDS


@pytest.mark.parametrize("protocol", ["rep", "respondent"])
def test_send_without_own_request_answers_the_oldest(make_socket: MakeSocket, protocol: str) -> None:
    peer_protocol = "req" if protocol == "rep" else "surveyor"
    server = make_socket(protocol, recv_timeout=5)
    peer = make_socket(peer_protocol, survey_deadline=5.0)
    connect_pair(server, peer, bind_url("inproc"))
    peer.send(b"question")
    assert server.recv() == b"question"  # this thread now holds the request
    # Another thread, with no request of its own, answers the oldest unanswered one.
    assert run_threads(lambda i: _send_error(server), count=1)[0] is None
    assert peer.recv(timeout=5) == b"not mine"
    with pytest.raises(nanopy.ProtocolError, match="call recv\\(\\) first"):
        server.send(b"answer")  # answered already: nothing pending anywhere


def _send_error(sock: nanopy.Socket) -> BaseException | None:
    try:
        sock.send(b"not mine")
    except nanopy.ProtocolError as exc:
        return exc
    return None


def test_second_send_cancels_only_that_callers_request(make_socket: MakeSocket) -> None:
    rep = make_socket("rep", recv_timeout=5)
    req = make_socket("req", recv_timeout=5)
    connect_pair(rep, req, bind_url("inproc"))
    b_sent = threading.Event()
    b_may_recv = threading.Event()

    def caller_b() -> bytes:
        req.send(b"b1")
        b_sent.set()
        assert b_may_recv.wait(5)
        return req.recv()

    result: dict[int, Any] = {}
    tb = threading.Thread(target=lambda: result.__setitem__(0, caller_b()), daemon=True)
    req.send(b"a1")
    tb.start()
    assert b_sent.wait(5)
    req.send(b"a2")  # abandons a1, not b1
    requests = [rep.recv_msg() for _ in range(3)]
    assert sorted(m.body for m in requests) == [b"a1", b"a2", b"b1"]
    for m in requests:
        m.reply(b"re:" + m.body)
    assert req.recv() == b"re:a2"
    b_may_recv.set()
    tb.join(5)
    assert result[0] == b"re:b1"
    assert req.stats().messages_dropped == 1  # the reply to a1
    with pytest.raises(nanopy.ProtocolError, match="send\\(\\) a request first"):
        req.recv(timeout=0)


def test_classic_recv_timeout_keeps_the_request(make_socket: MakeSocket) -> None:
    rep = make_socket("rep", recv_timeout=5)
    req = make_socket("req")
    connect_pair(rep, req, bind_url("inproc"))
    req.send(b"slow")
    with pytest.raises(nanopy.Timeout):
        req.recv(timeout=0.05)
    assert rep.recv() == b"slow"
    rep.send(b"late but kept")
    assert req.recv(timeout=5) == b"late but kept"


def test_request_of_a_finished_thread_is_cancelled(make_socket: MakeSocket) -> None:
    req = make_socket("req")  # no peer: requests stay queued
    run_threads(lambda i: req.send(b"forgotten %d" % i), count=3)
    gc.collect()
    req.send(b"mine")  # sweeps requests whose callers are gone
    assert req._core.outstanding == 1


def test_close_wakes_classic_req_waiters(make_socket: MakeSocket) -> None:
    req = make_socket("req")

    def wait_reply(i: int) -> type:
        req.send(b"q")
        try:
            req.recv(timeout=10)
        except nanopy.Closed as exc:
            return type(exc)
        return type(None)

    out: dict[int, Any] = {}
    t = threading.Thread(target=lambda: out.update(run_threads(wait_reply, count=4)), daemon=True)
    t.start()
    # Every caller parks (no peer); close must wake all of them.
    wait_until(lambda: len(req._driver.recv_q._parked) == 4, what="4 parked callers")
    req.close(linger=0)
    t.join(10)
    assert out == {i: nanopy.Closed for i in range(4)}


# -- against NNG --------------------------------------------------------------------------


@pytest.fixture
def nng_clients(make_socket: MakeSocket) -> Iterator[tuple[nanopy.Socket, Callable[[], dict[int, Any]]]]:
    """A nanopy REP dialled by CALLERS pynng REQ sockets, and a function that runs
    those clients (one thread each, ROUNDS checked requests) and returns their counts."""
    rep = make_socket("rep", bind="tcp://127.0.0.1:0")
    with ExitStack() as stack:
        socks = [stack.enter_context(pynng_socket("Req0", recv_timeout=10000)) for _ in range(CALLERS)]
        for s in socks:
            s.dial(rep.endpoints[0].url, block=True)
        wait_pipes(rep, CALLERS)
        yield rep, lambda: run_threads(lambda i: check_client(socks[i].send, socks[i].recv, b"nng %d" % i))


@pytest.mark.interop
def test_pynng_clients_share_nanopy_rep(nng_clients: tuple[nanopy.Socket, Callable[[], dict[int, Any]]]) -> None:
    rep, run_clients = nng_clients
    stop = threading.Event()
    workers = shared_rep_workers(rep, stop)
    try:
        assert sum(run_clients().values()) == CALLERS * ROUNDS
    finally:
        stop.set()
        for t in workers:
            t.join(5)


@pytest.mark.interop
def test_threads_share_nanopy_req_with_pynng_rep(make_socket: MakeSocket) -> None:
    req = make_socket("req", recv_timeout=10)
    with pynng_socket("Rep0", recv_timeout=200) as rep:
        url = req.bind("tcp://127.0.0.1:0").url
        rep.dial(url, block=True)
        wait_pipes(req)
        stop = threading.Event()

        def serve() -> None:  # pynng's REP answers one request at a time
            pynng = pytest.importorskip("pynng")
            while not stop.is_set():
                try:
                    request = rep.recv()
                except pynng.Timeout:
                    continue
                rep.send(b"re:" + request + b" by nng")

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        try:
            done = run_threads(lambda i: check_client(req.send, req.recv, b"thread %d" % i))
        finally:
            stop.set()
            server.join(5)
        assert sum(done.values()) == CALLERS * ROUNDS


@pytest.mark.interop
def test_trio_tasks_share_nanopy_rep_with_pynng_clients(
    nng_clients: tuple[nanopy.Socket, Callable[[], dict[int, Any]]],
) -> None:
    rep, run_clients = nng_clients

    async def server(i: int) -> None:
        while True:
            request = await rep.arecv()
            await trio.lowlevel.checkpoint()
            await rep.asend(b"re:" + request + b" by task %d" % i)

    async def main() -> None:
        with trio.fail_after(30):
            async with trio.open_nursery() as servers:
                for i in range(CALLERS):
                    servers.start_soon(server, i)
                done = await trio.to_thread.run_sync(run_clients)
                assert sum(done.values()) == CALLERS * ROUNDS
                servers.cancel_scope.cancel()

    trio.run(main)
