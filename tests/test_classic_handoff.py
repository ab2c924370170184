"""Classic calls handed between callers: one thread (task) sends, another receives.

nanomsg and NNG (without contexts) keep one request per socket, so a program may
``send()`` on a REQ from its main thread and ``recv()`` in a worker. nanopy keeps
classic state per caller and falls back to the socket-wide rule where that does
not decide: a caller with no request of its own takes the socket's oldest
unclaimed one (docs/api.md, "Classic calls are per caller").
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
import trio
from conftest import bind_url
from peers import pynng_socket

import nanopy
from nanopy.testing import wait_pipes

MakeSocket = Callable[..., nanopy.Socket]


def in_thread(target: Callable[[], Any]) -> Callable[[], Any]:
    """Start ``target`` in a thread; the returned function joins it and gives its result."""
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["value"] = target()
        except BaseException as exc:  # re-raised in the test's thread
            out["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()

    def join() -> Any:
        thread.join(20)
        assert not thread.is_alive(), "the thread hung"
        if "error" in out:
            raise out["error"]
        return out["value"]

    return join


@pytest.mark.parametrize("transport", ["tcp", "ipc", "inproc"])
def test_send_in_one_thread_recv_in_another_across_a_dead_rep(make_socket: MakeSocket, transport: str) -> None:
    req = make_socket("req", recv_timeout=20)
    url = req.bind(bind_url(transport, "handoff")).url
    first = make_socket("rep", connect=url, recv_timeout=10)
    wait_pipes(req)
    req.send(b"question")  # main thread sends ...
    assert first.recv() == b"question"
    received = in_thread(req.recv)  # ... a worker receives
    second = make_socket("rep", connect=url, recv_timeout=10)
    wait_pipes(req, 2)
    first.close(linger=0)  # dies without answering: REQ resends on the other pipe
    assert second.recv() == b"question"
    second.send(b"answer")
    assert received() == b"answer"
    assert req._core.outstanding == 0


def test_sender_thread_that_ended_leaves_its_request_to_the_receiver(make_socket: MakeSocket) -> None:
    rep = make_socket("rep", recv_timeout=10)
    req = make_socket("req", recv_timeout=10)
    req.connect(rep.bind(bind_url("inproc")).url)
    in_thread(lambda: req.send(b"from a worker"))()
    assert rep.recv() == b"from a worker"
    rep.send(b"to main")
    assert req.recv() == b"to main"


def test_oldest_unclaimed_request_goes_first(make_socket: MakeSocket) -> None:
    rep = make_socket("rep", recv_timeout=10)
    req = make_socket("req", recv_timeout=10)
    req.connect(rep.bind(bind_url("inproc")).url)
    done = threading.Event()
    senders = []
    for body in (b"one", b"two"):  # two live callers, each with a request it leaves
        sent = threading.Event()
        senders.append(in_thread(lambda body=body, sent=sent: (req.send(body), sent.set(), done.wait(20))))
        assert sent.wait(10)
    for _ in range(2):
        msg = rep.recv_msg()
        msg.reply(b"re:" + msg.body)
    assert [req.recv(), req.recv()] == [b"re:one", b"re:two"]
    done.set()
    for join in senders:
        join()
    with pytest.raises(nanopy.ProtocolError, match="send\\(\\) a request first"):
        req.recv(timeout=0)


def test_own_request_is_not_taken_by_another_caller(make_socket: MakeSocket) -> None:
    """A request whose sender is receiving it is claimed: another caller does not adopt it."""
    rep = make_socket("rep", recv_timeout=10)
    req = make_socket("req", recv_timeout=10)
    req.connect(rep.bind(bind_url("inproc")).url)
    req.send(b"mine")
    with pytest.raises(nanopy.Timeout):
        req.recv(timeout=0.01)  # claims it
    with pytest.raises(nanopy.ProtocolError):
        in_thread(lambda: req.recv(timeout=0))()
    rep.send(b"re:" + rep.recv())
    assert req.recv() == b"re:mine"


def test_trio_task_sends_another_receives(make_socket: MakeSocket) -> None:
    rep = make_socket("rep")
    req = make_socket("req", recv_timeout=10)
    req.connect(rep.bind(bind_url("tcp")).url)
    got: list[bytes] = []

    async def main() -> None:
        sent = trio.Event()

        async def sender() -> None:
            await req.asend(b"trio question")
            sent.set()

        async def receiver() -> None:
            await sent.wait()
            got.append(await req.arecv())

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(receiver)
                nursery.start_soon(sender)
                request = await rep.arecv()
                await rep.asend(b"re:" + request)

    trio.run(main)
    assert got == [b"re:trio question"]


def test_asyncio_task_sends_another_receives(make_socket: MakeSocket) -> None:
    rep = make_socket("rep")
    req = make_socket("req", recv_timeout=10)
    req.connect(rep.bind(bind_url("ipc")).url)

    async def main() -> bytes:
        sent = asyncio.Event()

        async def sender() -> None:
            await req.asend(b"aio question")
            sent.set()

        async def receiver() -> bytes:
            await sent.wait()
            return await req.arecv()

        async def server() -> None:
            request = await rep.arecv()
            await rep.asend(b"re:" + request)

        results = await asyncio.wait_for(asyncio.gather(receiver(), sender(), server()), 20)
        return results[0]

    assert asyncio.run(main()) == b"re:aio question"


@pytest.mark.interop
def test_send_in_one_thread_recv_in_another_with_pynng_rep(make_socket: MakeSocket) -> None:
    req = make_socket("req", recv_timeout=20)
    with pynng_socket("Rep0", recv_timeout=10000) as rep:
        url = req.bind("tcp://127.0.0.1:0").url
        rep.dial(url, block=True)
        wait_pipes(req)
        for n in range(3):
            req.send(b"q%d" % n)
            received = in_thread(req.recv)
            rep.send(b"re:" + rep.recv())
            assert received() == b"re:q%d" % n


@pytest.mark.interop
def test_handoff_across_a_dying_pynng_rep(make_socket: MakeSocket) -> None:
    req = make_socket("req", recv_timeout=20)
    url = req.bind("tcp://127.0.0.1:0").url
    with pynng_socket("Rep0", recv_timeout=10000) as first:
        first.dial(url, block=True)
        wait_pipes(req)
        req.send(b"again")
        assert first.recv() == b"again"
        received = in_thread(req.recv)
        with pynng_socket("Rep0", recv_timeout=10000) as second:
            second.dial(url, block=True)
            wait_pipes(req, 2)
            first.close()  # dies holding the request: REQ resends at once on the other pipe
            second.send(b"re:" + second.recv())
            assert received() == b"re:again"


@pytest.mark.parametrize("protocol", ["rep", "respondent"])
def test_recv_in_one_thread_send_in_another(make_socket: MakeSocket, protocol: str) -> None:
    peer_protocol = "req" if protocol == "rep" else "surveyor"
    server = make_socket(protocol, recv_timeout=10)
    peer = make_socket(peer_protocol, survey_deadline=10.0, recv_timeout=10)
    peer.connect(server.bind(bind_url("tcp")).url)
    wait_pipes(server)
    peer.send(b"question")
    assert in_thread(server.recv)() == b"question"  # a worker receives (and ends)
    server.send(b"answer")  # the main thread replies
    assert peer.recv() == b"answer"
    with pytest.raises(nanopy.ProtocolError, match="call recv\\(\\) first"):
        server.send(b"nothing to answer")
