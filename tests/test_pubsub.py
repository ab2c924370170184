"""PUB/SUB: core semantics (Sans-I/O) and sockets over every transport."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import bind_url, wait_until

import nanopy
from nanopy.core.base import TRANSMIT, PipeInfo
from nanopy.core.errors import WouldBlock
from nanopy.core.options import new_options
from nanopy.protocols.pubsub import Pub0, Sub0
from nanopy.testing import wait_pipes

MakeSocket = Callable[..., nanopy.Socket]


# -- cores -------------------------------------------------------------------------------
def sub_core(recv_buffer: int = 1024, raw: bool = False) -> Sub0:
    opts = new_options("sub")
    opts.recv_buffer = recv_buffer
    core = Sub0(opts, raw=raw)
    core.add_pipe(PipeInfo(1, "p1", 8, 8), 16)
    return core


def drain(core: Sub0) -> list[bytes]:
    out = []
    while core.can_recv():
        out.append(core.recv().body)
    return out


def test_pub_sends_to_every_pipe_with_credit_and_counts_misses() -> None:
    pub = Pub0(new_options("pub"))
    pub.add_pipe(PipeInfo(1, "a", 8, 8), 1)
    pub.add_pipe(PipeInfo(2, "b", 8, 8), 0)
    assert pub.can_send()
    pub.send(b"m1")
    assert pub.actions == [(TRANSMIT, 1, b"m1")]
    assert pub.dropped == 1  # pipe 2 had no credit
    pub.actions.clear()
    pub.send(b"m2")  # both out of credit now: nothing sent, nothing raised
    assert pub.actions == [] and pub.dropped == 3
    pub.pipe_credit(2, 1)
    pub.send(b"m3")
    assert pub.actions == [(TRANSMIT, 2, b"m3")] and pub.dropped == 4


def test_blocking_pub_waits_exactly_while_some_pipe_has_no_credit() -> None:
    # PUB keeps a count of pipes without credit rather than scanning them per
    # send; drive it through random pipe events and compare with the scan.
    import random

    rng = random.Random(7)
    opts = new_options("pub")
    opts.overflow = "block"
    pub = Pub0(opts)
    credit: dict[int, int] = {}
    next_pid = 1
    for _ in range(5000):
        op = rng.random()
        if op < 0.1 or not credit:
            c = rng.randint(0, 3)
            pub.add_pipe(PipeInfo(next_pid, str(next_pid), 8, 8), c)
            credit[next_pid] = c
            next_pid += 1
        elif op < 0.2:
            pid = rng.choice(list(credit))
            pub.remove_pipe(pid)
            del credit[pid]
        elif op < 0.5:
            pid = rng.choice(list(credit))
            n = rng.randint(1, 2)
            pub.pipe_credit(pid, n)
            credit[pid] += n
        else:
            expect_block = any(c <= 0 for c in credit.values())
            assert pub.can_send() is not expect_block
            try:
                pub.send(b"m")
            except WouldBlock:
                assert expect_block
            else:
                assert not expect_block
                assert sorted(a[1] for a in pub.actions) == sorted(credit)
                for pid in credit:
                    credit[pid] -= 1
            pub.actions.clear()
    opts.overflow = "drop"  # the option may change at any time: never blocks then
    assert pub.can_send()


def test_pub_with_no_pipes_never_blocks() -> None:
    pub = Pub0(new_options("pub"))
    pub.send(b"into the void")
    # Silent to the sender (as nanomsg and NNG), but counted: nobody got it.
    assert pub.actions == [] and pub.dropped == 1 and pub.drops["no_peer"] == 1


def test_pub_ignores_what_a_sub_sends() -> None:
    pub = Pub0(new_options("pub"))
    pub.add_pipe(PipeInfo(1, "a", 8, 8), 1)
    assert pub.messages_received(1, [b"noise"]) is True
    assert pub.protocol_errors == 0 and not pub.actions


def test_sub_without_subscription_receives_nothing() -> None:
    core = sub_core()
    core.messages_received(1, [b"a", b"", b"anything"])
    assert not core.can_recv()


def test_sub_filters_by_prefix_and_empty_topic_matches_all() -> None:
    core = sub_core()
    core.subscribe(b"ab")
    core.messages_received(1, [b"a", b"ab", b"abc", b"b", b"xab"])
    assert drain(core) == [b"ab", b"abc"]
    core.subscribe(b"")
    core.messages_received(1, [b"", b"zz"])
    assert drain(core) == [b"", b"zz"]


def test_topic_subscribed_twice_needs_two_unsubscribes() -> None:
    core = sub_core()
    core.subscribe(b"t")
    core.subscribe(b"t")
    core.unsubscribe(b"t")
    core.messages_received(1, [b"t1"])
    assert drain(core) == [b"t1"]
    core.unsubscribe(b"t")
    core.messages_received(1, [b"t2"])
    assert drain(core) == []
    with pytest.raises(ValueError, match="not subscribed"):
        core.unsubscribe(b"t")


def test_full_sub_queue_drops_the_oldest_and_keeps_reading() -> None:
    core = sub_core(recv_buffer=3)
    core.subscribe(b"")
    keep_reading = core.messages_received(1, [b"1", b"2", b"3", b"4", b"5"])
    assert keep_reading is True
    assert core.dropped == 2
    assert drain(core) == [b"3", b"4", b"5"]


def test_raw_sub_delivers_everything_and_has_no_subscriptions() -> None:
    core = sub_core(raw=True)
    core.messages_received(1, [b"a", b"b"])
    assert drain(core) == [b"a", b"b"]
    with pytest.raises(nanopy.ProtocolError, match="raw SUB"):
        core.subscribe(b"a")


def test_sub_recv_priority_serves_preferred_pipe_first() -> None:
    core = sub_core()
    core.add_pipe(PipeInfo(2, "p2", 8, 1), 16)  # recv_priority 1 beats pipe 1's 8
    core.subscribe(b"")
    core.messages_received(1, [b"low1", b"low2"])
    core.messages_received(2, [b"high1", b"high2"])
    assert drain(core) == [b"high1", b"high2", b"low1", b"low2"]


# -- sockets -----------------------------------------------------------------------------
def pub_sub(make_socket: MakeSocket, transport: str, **sub_opts: Any) -> tuple[nanopy.Socket, nanopy.Socket]:
    pub = make_socket("pub")
    ep = pub.bind(bind_url(transport, "ps"))
    sub = make_socket("sub", recv_timeout=5.0, **sub_opts)
    sub.connect(ep.url)
    wait_pipes(pub)
    wait_pipes(sub)
    return pub, sub


def test_socket_filtering(make_socket: MakeSocket, transport: str) -> None:
    pub, sub = pub_sub(make_socket, transport)
    sub.subscribe("news.")  # str is UTF-8 encoded
    sub.subscribe(b"\x00bin")
    for body in (b"sport.1", b"news.1", b"\x00bin", b"news", b"\x00bi", b"news.2"):
        pub.send(body)
    assert [sub.recv(), sub.recv(), sub.recv()] == [b"news.1", b"\x00bin", b"news.2"]
    # Unsubscribing takes effect for messages that arrive afterwards.
    sub.unsubscribe("news.")
    pub.send(b"news.3")
    pub.send(b"\x00bin2")
    assert sub.recv() == b"\x00bin2"
    assert pub.stats().messages_sent == 8


def test_socket_errors(make_socket: MakeSocket) -> None:
    pub = make_socket("pub")
    sub = make_socket("sub")
    with pytest.raises(nanopy.ProtocolError):
        sub.send(b"x")
    with pytest.raises(nanopy.ProtocolError):
        pub.recv(timeout=0)
    with pytest.raises(nanopy.ProtocolError):
        pub.subscribe(b"x")
    with pytest.raises(ValueError, match="not subscribed"):
        sub.unsubscribe(b"never")
    with pytest.raises(TypeError):
        sub.subscribe(123)  # type: ignore[arg-type]
    pub.send(b"nobody listens", timeout=0)  # no pipes: silently nowhere
    sub.close()
    with pytest.raises(nanopy.Closed):
        sub.subscribe(b"x")


def test_raw_sub_socket_receives_unfiltered(make_socket: MakeSocket) -> None:
    pub, sub = pub_sub(make_socket, "inproc", raw=True)
    with pytest.raises(nanopy.ProtocolError):
        sub.subscribe(b"a")
    pub.send(b"anything")
    assert sub.recv() == b"anything"


def test_pub_fans_out_to_all_subscribers(make_socket: MakeSocket, stream_transport: str) -> None:
    pub = make_socket("pub")
    ep = pub.bind(bind_url(stream_transport, "fan"))
    subs = [make_socket("sub", recv_timeout=5.0) for _ in range(3)]
    for i, sub in enumerate(subs):
        sub.subscribe(b"" if i == 0 else b"x")
        sub.connect(ep.url)
    wait_pipes(pub, 3)
    pub.send(b"x1")
    pub.send(b"y1")
    assert [s.recv() for s in subs] == [b"x1", b"x1", b"x1"]
    assert subs[0].recv() == b"y1"


def test_slow_subscriber_never_blocks_pub_or_others(make_socket: MakeSocket) -> None:
    """100,000 sends with send_timeout=0 while one SUB never reads: no error, others served."""
    pub = make_socket("pub", send_timeout=0)
    ep = pub.bind("tcp://127.0.0.1:0")
    slow = make_socket("sub", recv_buffer=100)
    fast = make_socket("sub", recv_timeout=10.0)
    for s in (slow, fast):
        s.subscribe(b"")
        s.connect(ep.url)
    wait_pipes(pub, 2)

    got: list[bytes] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while True:
                body = fast.recv()
                if body == b"end":
                    break
                got.append(body)
        finally:
            done.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    payload = b"m" * 16
    started = time.monotonic()
    for _ in range(100_000):
        pub.send(payload)  # must never raise Timeout
    elapsed = time.monotonic() - started
    # The end marker itself may miss a full pipe: resend until the reader has it.
    deadline = time.monotonic() + 20
    while not done.wait(0.05):
        assert time.monotonic() < deadline, "fast subscriber never saw the end marker"
        pub.send(b"end")
    t.join(5)
    assert pub.stats().messages_sent >= 100_000
    assert len(got) > 100, f"fast subscriber got only {len(got)} messages"
    # The slow subscriber holds at most its recv_buffer; the rest were dropped somewhere.
    wait_until(
        lambda: slow.stats().messages_dropped + pub.stats().messages_dropped > 0,
        what="drops for the slow subscriber",
    )
    assert slow._core._fq.queued() <= 100
    assert slow.recv(timeout=1.0) == payload  # and it can still catch up
    assert elapsed < 30


@pytest.mark.trio
async def test_async_pub_sub(make_socket: MakeSocket) -> None:
    pub, sub = pub_sub(make_socket, "inproc")
    sub.subscribe(b"a")
    await pub.asend(b"b")
    await pub.asend(b"a!")
    assert await sub.arecv(timeout=5.0) == b"a!"


def test_messages_from_a_departed_pub_stay_readable() -> None:
    core = sub_core()
    core.subscribe(b"")
    core.messages_received(1, [b"last words"])
    core.remove_pipe(1)
    msg = core.recv()
    assert msg.body == b"last words" and msg.pipe == "p1"
    assert not core.can_recv()
