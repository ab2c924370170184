"""REQ/REP sockets: classic semantics, concurrent request()/msg.reply(), resend, TTL, raw."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import trio
from conftest import bind_url, wait_until

import nanopy
from nanopy.testing import connect_pair, wait_no_pipes, wait_pipes

MakeSocket = Callable[..., nanopy.Socket]


def w(*words: int) -> bytes:
    return b"".join(struct.pack(">I", x) for x in words)


def serve(rep: nanopy.Socket, workers: int = 4, transform=lambda b: b"re:" + b) -> threading.Thread:
    """Answer every request through msg.reply() from a thread pool until rep closes."""
    pool = ThreadPoolExecutor(workers)

    def loop() -> None:
        try:
            while True:
                try:
                    msg = rep.recv_msg()
                except nanopy.Closed:
                    return
                pool.submit(msg.reply, transform(msg.body))
        finally:
            pool.shutdown(wait=False)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("transport", ["tcp", "inproc"])
def test_classic_send_recv(make_socket: MakeSocket, transport: str) -> None:
    rep = make_socket("rep", recv_timeout=5)
    req = make_socket("req", recv_timeout=5)
    connect_pair(rep, req, bind_url(transport))
    for i in range(3):
        req.send(b"ping %d" % i)
        assert rep.recv() == b"ping %d" % i
        rep.send(b"pong %d" % i)
        assert req.recv() == b"pong %d" % i
    s = req.stats()
    assert (s.messages_sent, s.messages_received) == (3, 3)


def test_out_of_order_calls_raise(make_socket: MakeSocket) -> None:
    rep = make_socket("rep")
    req = make_socket("req")
    with pytest.raises(nanopy.ProtocolError):
        req.recv(timeout=0)
    with pytest.raises(nanopy.ProtocolError):
        rep.send(b"x")
    connect_pair(rep, req, bind_url("inproc"))
    req.send(b"q")
    rep.recv(timeout=5)
    rep.send(b"a")
    with pytest.raises(nanopy.ProtocolError):
        rep.send(b"again")
    assert req.recv(timeout=5) == b"a"
    with pytest.raises(nanopy.ProtocolError):
        req.recv(timeout=0)
    with pytest.raises(nanopy.ProtocolError):
        rep.request(b"x")
    with pytest.raises(nanopy.ProtocolError):
        list(rep.survey(b"x"))


def test_new_send_cancels_previous_request(make_socket: MakeSocket) -> None:
    # A raw REP lets the test see both requests and answer them in any order.
    rep = make_socket("rep", raw=True, recv_timeout=5)
    req = make_socket("req", recv_timeout=5)
    connect_pair(rep, req, bind_url("tcp"))
    req.send(b"first")
    req.send(b"second")
    m1, m2 = rep.recv_msg(), rep.recv_msg()
    assert (m1.body, m2.body) == (b"first", b"second")
    assert m1.header[4:] != m2.header[4:]  # different request ids
    rep.send_msg(nanopy.Message(b"answer to first", header=m1.header))
    rep.send_msg(nanopy.Message(b"answer to second", header=m2.header))
    assert req.recv() == b"answer to second"
    wait_until(lambda: req.stats().messages_dropped == 1, what="stale reply dropped")


def test_request_ids_on_the_wire(make_socket: MakeSocket) -> None:
    rep = make_socket("rep", raw=True, recv_timeout=5)
    req = make_socket("req", recv_timeout=5)
    connect_pair(rep, req, bind_url("inproc"))
    req.send(b"a")
    req.send(b"b")
    h1, h2 = rep.recv_msg().header, rep.recv_msg().header
    pid = rep.pipes[0].id
    (p1, id1), (p2, id2) = struct.unpack(">II", h1), struct.unpack(">II", h2)
    assert p1 == p2 == pid  # raw REP prepends the incoming pipe id (top bit clear)
    assert id1 & 0x80000000 and id2 & 0x80000000
    assert id2 == ((id1 + 1) & 0x7FFFFFFF) | 0x80000000


def test_many_threads_request_concurrently(make_socket: MakeSocket) -> None:
    """Done means 3: 16 threads x 200 request() on one REQ, two REP servers, msg.reply()."""
    req = make_socket("req")
    reps = [make_socket("rep", name=f"rep{i}") for i in range(2)]
    for rep in reps:
        ep = rep.bind(bind_url("tcp"))
        req.connect(ep.url)
        tag = rep.name.encode()
        serve(rep, workers=4, transform=lambda b, n=tag: n + b"|" + b)
    wait_pipes(req, 2)
    errors: list[str] = []
    served = {b"rep0": 0, b"rep1": 0}
    lock = threading.Lock()

    def worker(t: int) -> None:
        for i in range(200):
            body = b"t%d-r%d" % (t, i)
            reply = req.request(body, timeout=10)
            server, _, echoed = reply.partition(b"|")
            if echoed != body:
                errors.append(f"{body!r} got {reply!r}")
            with lock:
                served[server] += 1

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert sum(served.values()) == 3200
    assert served[b"rep0"] > 0 and served[b"rep1"] > 0  # load balanced over both
    assert req._core.outstanding == 0


def test_request_independent_of_classic(make_socket: MakeSocket) -> None:
    rep = make_socket("rep")
    req = make_socket("req", recv_timeout=5)
    connect_pair(rep, req, bind_url("inproc"))
    serve(rep)
    req.send(b"classic")
    assert req.request(b"concurrent", timeout=5) == b"re:concurrent"
    assert req.recv() == b"re:classic"


def test_request_timeout_abandons_it(make_socket: MakeSocket) -> None:
    rep = make_socket("rep", recv_timeout=5)
    req = make_socket("req")
    connect_pair(rep, req, bind_url("tcp"))
    t0 = time.monotonic()
    with pytest.raises(nanopy.Timeout):
        req.request(b"slow", timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 2
    assert req._core.outstanding == 0
    msg = rep.recv_msg()
    msg.reply(b"too late")
    wait_until(lambda: req.stats().messages_dropped == 1, what="late reply dropped")
    serve(rep)
    assert req.request(b"next", timeout=5) == b"re:next"


def test_close_wakes_blocked_request(make_socket: MakeSocket) -> None:
    req = make_socket("req")
    result: list[BaseException] = []

    def run() -> None:
        try:
            req.request(b"nobody listens")
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: req._core.outstanding == 1, what="request queued")
    req.close()
    t.join(5)
    assert len(result) == 1 and isinstance(result[0], nanopy.Closed)


def test_resend_to_a_rep_that_connects_later(make_socket: MakeSocket) -> None:
    """Done means 2: the first REP dies unanswered; a second one answers."""
    req = make_socket("req", resend_interval=3.0)
    ep = req.bind(bind_url("tcp"))
    rep1 = make_socket("rep", recv_timeout=5, connect=ep.url)
    wait_pipes(req, 1)
    t0 = time.monotonic()
    req.send(b"job")
    assert rep1.recv() == b"job"  # taken, never answered
    rep1.close(linger=0)
    wait_no_pipes(req)
    rep2 = make_socket("rep", connect=ep.url)
    serve(rep2)
    assert req.recv(timeout=5) == b"re:job"
    assert time.monotonic() - t0 < 3.0  # the dead pipe triggered it, not the timer


def test_resend_after_interval(make_socket: MakeSocket) -> None:
    # The REP stays connected but ignores the first copy: the timer resends it.
    rep = make_socket("rep", raw=True, recv_timeout=5)
    req = make_socket("req", resend_interval=0.2, recv_timeout=5)
    connect_pair(rep, req, bind_url("tcp"))
    t0 = time.monotonic()
    req.send(b"again?")
    first = rep.recv_msg()
    second = rep.recv_msg()
    elapsed = time.monotonic() - t0
    assert first.body == second.body == b"again?"
    assert first.header == second.header  # a resend reuses the request id
    assert 0.19 < elapsed < 2.0
    rep.send_msg(nanopy.Message(b"done", header=second.header))
    assert req.recv() == b"done"


def test_rep_drops_too_many_hops_and_closes_on_garbage(make_socket: MakeSocket) -> None:
    rep = make_socket("rep", recv_timeout=5, max_ttl=4)
    raw = make_socket("req", raw=True, recv_timeout=5)
    connect_pair(rep, raw, bind_url("tcp"))
    ok = w(1, 2, 3, 0x80000001)  # 4 words: allowed with max_ttl=4
    raw.send_msg(nanopy.Message(b"far", header=w(1, 2, 3, 4, 0x80000002)))
    raw.send_msg(nanopy.Message(b"near", header=ok))
    msg = rep.recv_msg()
    assert msg.body == b"near"
    msg.reply(b"echo")
    back = raw.recv_msg()
    assert (back.header, back.body) == (ok, b"echo")  # the stack comes back verbatim
    assert rep.stats().messages_dropped == 1
    assert rep.stats().protocol_errors == 0
    raw.send_msg(nanopy.Message(b"", header=w(1, 2)))  # no request id word
    wait_until(lambda: rep.stats().protocol_errors == 1, what="protocol error counted")
    wait_until(lambda: rep.stats().disconnects == 1, what="garbage pipe closed")


def test_reply_through_message_any_order(make_socket: MakeSocket) -> None:
    rep = make_socket("rep", recv_timeout=5)
    req = make_socket("req")
    connect_pair(rep, req, bind_url("ipc"))
    results: dict[int, bytes] = {}

    def ask(i: int) -> None:
        results[i] = req.request(b"%d" % i, timeout=5)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    msgs = [rep.recv_msg() for _ in range(5)]
    for msg in reversed(msgs):
        msg.reply(b"r" + msg.body)
    for t in threads:
        t.join(5)
    assert results == {i: b"r%d" % i for i in range(5)}
    with pytest.raises(nanopy.ProtocolError):
        nanopy.Message(b"x").reply(b"y")


def test_arequest_trio_many_tasks(make_socket: MakeSocket) -> None:
    rep = make_socket("rep")
    req = make_socket("req")
    connect_pair(rep, req, bind_url("inproc"))

    async def server() -> None:
        while True:
            msg = await rep.arecv_msg()
            await msg.areply(msg.body[::-1])

    async def main() -> dict[int, bytes]:
        got: dict[int, bytes] = {}

        async def client(i: int) -> None:
            for j in range(20):
                body = b"%d-%d" % (i, j)
                assert await req.arequest(body, timeout=5) == body[::-1]
            got[i] = b"ok"

        async with trio.open_nursery() as outer:
            outer.start_soon(server)
            async with trio.open_nursery() as nursery:
                for i in range(50):
                    nursery.start_soon(client, i)
            outer.cancel_scope.cancel()
        return got

    assert len(trio.run(main)) == 50
    assert req._core.outstanding == 0


def test_arequest_asyncio_and_cancel(make_socket: MakeSocket) -> None:
    rep = make_socket("rep", recv_timeout=5)
    req = make_socket("req")
    connect_pair(rep, req, bind_url("tcp"))

    async def main() -> None:
        task = asyncio.ensure_future(req.arequest(b"never answered"))
        msg = await rep.arecv_msg()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert req._core.outstanding == 0
        await msg.areply(b"late")
        reply = asyncio.ensure_future(req.arequest(b"answered", timeout=5))
        msg2 = await rep.arecv_msg()
        await msg2.areply(b"yes")
        assert await reply == b"yes"

    asyncio.run(main())


def test_raw_req_rejects_request(make_socket: MakeSocket) -> None:
    raw = make_socket("req", raw=True)
    with pytest.raises(nanopy.ProtocolError, match="raw"):
        raw.request(b"x")
