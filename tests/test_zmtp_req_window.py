"""A ZMTP REQ pipe's write window: one request on the wire, the next in the outbox.

The wire has no request id, so a REQ pipe writes one request until its reply
comes (``WriteWindow``). The requests behind it wait in the pipe's outbox like
any queued message: counted in ``queued_out``, holding their send credit, and
sent again on another pipe when theirs dies. Against real libzmq sockets (pyzmq).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from conftest import wait_until
from test_zmtp_drops import MakeSocket, zctx, zmq
from test_zmtp_drops import zsocket as unbound

import nanopy
from nanopy.testing import wait_pipes

pytestmark = pytest.mark.interop
__all__ = ["zctx"]  # (the fixture, shared with test_zmtp_drops)


def zsocket(zctx: Any, kind: int) -> tuple[Any, str]:
    """A libzmq socket bound to a loopback port, and the URL a nanopy socket dials."""
    sock = unbound(zctx, kind)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"zmtp+tcp://127.0.0.1:{port}"


def ask_in_threads(req: nanopy.Socket, bodies: list[bytes]) -> tuple[list[threading.Thread], dict[bytes, bytes]]:
    """Each body a request from its own thread; the replies land in the dict."""
    replies: dict[bytes, bytes] = {}

    def ask(body: bytes) -> None:
        replies[body] = req.request(body, timeout=10)

    threads = [threading.Thread(target=ask, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    return threads, replies


def queued(req: nanopy.Socket) -> int:
    return sum(p.queued_out for p in req.pipes())


def test_the_next_request_waits_in_the_outbox(make_socket: MakeSocket, zctx: Any) -> None:
    """A second request on a pipe whose first is unanswered is queued and counted,
    not written; the reply lets it go."""
    req = make_socket("req", recv_timeout=5)
    router, url = zsocket(zctx, zmq.ROUTER)
    req.connect(url)
    wait_pipes(req)
    threads, replies = ask_in_threads(req, [b"a", b"b"])
    identity, _, first = router.recv_multipart()
    wait_until(lambda: queued(req) == 1, what="the second request counted in queued_out")
    assert req.stats().queued_out == 1
    with pytest.raises(zmq.Again):  # not on the wire
        router.recv_multipart(zmq.NOBLOCK)
    router.send_multipart([identity, b"", first + b"!"])
    identity, _, second = router.recv_multipart()
    assert {first, second} == {b"a", b"b"}
    assert queued(req) == 0
    router.send_multipart([identity, b"", second + b"!"])
    for t in threads:
        t.join(10)
    assert replies == {b"a": b"a!", b"b": b"b!"}
    assert not any(req.stats().drops.values())


def test_a_dead_pipe_hands_its_requests_to_another(make_socket: MakeSocket, zctx: Any) -> None:
    """Two REP peers; the one holding a request in flight and one queued behind it
    dies: both requests reach the other peer and are answered."""
    req = make_socket("req", recv_timeout=5)
    doomed, doomed_url = zsocket(zctx, zmq.REP)
    req.connect(doomed_url)
    wait_pipes(req)
    threads, replies = ask_in_threads(req, [b"x", b"y"])
    assert doomed.recv() in (b"x", b"y")  # in flight there, never answered
    wait_until(lambda: queued(req) == 1, what="the other request queued on the same pipe")
    survivor, survivor_url = zsocket(zctx, zmq.REP)
    req.connect(survivor_url)
    wait_pipes(req, 2)
    doomed.close(linger=0)  # killed mid-request
    got = []
    for _ in range(2):
        body = survivor.recv()
        got.append(body)
        survivor.send(body + b"!")
    for t in threads:
        t.join(10)
    assert sorted(got) == [b"x", b"y"]
    assert replies == {b"x": b"x!", b"y": b"y!"}


def test_a_resend_of_the_request_on_the_wire_is_not_written_twice(make_socket: MakeSocket, zctx: Any) -> None:
    """With one pipe, a resend (resend_interval) of the unanswered request waits
    in the outbox and, once the reply came, is not written: the peer sees it once."""
    req = make_socket("req", recv_timeout=5, resend_interval=0.05)
    router, url = zsocket(zctx, zmq.ROUTER)
    req.connect(url)
    wait_pipes(req)
    threads, replies = ask_in_threads(req, [b"once"])
    identity, _, body = router.recv_multipart()
    wait_until(lambda: queued(req) >= 1, what="a resend queued behind the request")
    router.send_multipart([identity, b"", body + b"!"])
    for t in threads:
        t.join(10)
    assert replies == {b"once": b"once!"}
    wait_until(lambda: queued(req) == 0, what="the resend taken from the outbox")
    # A request after it goes out at once: nothing of the old one stands in its way.
    threads, replies = ask_in_threads(req, [b"next"])
    identity, _, body = router.recv_multipart()
    assert body == b"next"
    router.send_multipart([identity, b"", body + b"!"])
    for t in threads:
        t.join(10)
    assert replies == {b"next": b"next!"}
