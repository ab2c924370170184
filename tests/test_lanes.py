"""Send lanes and receive runs over real sockets, on every transport.

A sole pipe's sends spend credit handed to the pipe in bulk, a publisher's burst
to several pipes takes the fan-out lane, and a receive takes a run of a sole
ready pipe (nanopy/driver/socket_driver.py). None of it may change what a user sees: order,
completeness, back-pressure, who gets a message, statistics.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from typing import Any

import pytest
from conftest import bind_url, wait_until

import nanopy
from nanopy.testing import wait_pipes

MakeSocket = Callable[..., nanopy.Socket]
SEQ = struct.Struct(">I")


def numbered(i: int) -> bytes:
    """Message ``i``: its number, then 0 to 2999 filler bytes (batches end by size and by count)."""
    return SEQ.pack(i) + b"f" * (i * 7919 % 3000)


def seqs(bodies: list[bytes]) -> list[int]:
    return [SEQ.unpack_from(b)[0] for b in bodies]


def subscribers(make_socket: MakeSocket, url: str, n: int, **opts: Any) -> list[nanopy.Socket]:
    subs = [make_socket("sub", recv_timeout=10, **opts) for _ in range(n)]
    for sub in subs:
        sub.subscribe(b"")
        sub.connect(url)
    return subs


def read_into(sock: nanopy.Socket, out: list[bytes], limit: int | None = None) -> threading.Thread:
    """A thread reading into ``out`` until ``limit`` messages, a 2 s silence, or close."""

    def run() -> None:
        while limit is None or len(out) < limit:
            try:
                out.append(sock.recv(timeout=2))
            except (nanopy.Timeout, nanopy.Closed):
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def fan_out(
    make_socket: MakeSocket, pub: nanopy.Socket, transport: str, tag: str, subs: int, n: int
) -> tuple[str, list[nanopy.Socket], list[list[bytes]], list[threading.Thread]]:
    """Bind a lossless ``pub``, connect ``subs`` lossless subscribers, each read by a
    thread expecting ``n`` messages: (url, subscribers, what each got, threads)."""
    url = pub.bind(bind_url(transport, tag)).url
    socks = subscribers(make_socket, url, subs, overflow="block")
    wait_pipes(pub, subs)
    got: list[list[bytes]] = [[] for _ in socks]
    threads = [read_into(sub, out, n) for sub, out in zip(socks, got, strict=True)]
    return url, socks, got, threads


def test_burst_to_several_subscribers_arrives_whole_and_in_order(make_socket: MakeSocket, transport: str) -> None:
    pub = make_socket("pub", overflow="block", send_timeout=10)
    n = 6000
    _, _, got, threads = fan_out(make_socket, pub, transport, "fan", 3, n)
    for i in range(n):
        pub.send(numbered(i))
    for thread in threads:
        thread.join(20)
    for out in got:
        assert seqs(out) == list(range(n))
        assert out[-1] == numbered(n - 1)
    stats = pub.stats()
    assert stats.messages_sent == n
    assert stats.bytes_sent == sum(len(numbered(i)) for i in range(n))


@pytest.mark.parametrize("change", ["join", "leave"])
def test_subscribers_joining_or_leaving_mid_burst_cost_the_others_nothing(
    make_socket: MakeSocket, transport: str, change: str
) -> None:
    pub = make_socket("pub", overflow="block", send_timeout=10)
    url = pub.bind(bind_url(transport, "fanchange")).url
    stay = subscribers(make_socket, url, 2, overflow="block")
    n, at = 8000, 3000
    other: nanopy.Socket | None = None
    theirs: list[bytes] = []
    if change == "leave":
        other = subscribers(make_socket, url, 1, overflow="block")[0]
        # It reads part of the burst, then stops (a few hundred messages behind,
        # well within what the buffers hold, so the lossless PUB need not wait
        # for it), then leaves.
        read_into(other, theirs, limit=at - 300)
    wait_pipes(pub, 3 if other is not None else 2)
    got: list[list[bytes]] = [[] for _ in stay]
    threads = [read_into(sub, out, n) for sub, out in zip(stay, got, strict=True)]
    for i in range(n):
        if i == at:
            if other is None:  # a subscriber joins in the middle of the burst
                other = subscribers(make_socket, url, 1, overflow="block")[0]
                late = read_into(other, theirs)
                wait_pipes(pub, 3)
            else:  # one leaves (once its reader has run: a loaded machine may not have
                # scheduled that thread yet while this one sent the first 3000)
                wait_until(lambda: bool(theirs), what="the leaving subscriber reading")
                other.close(linger=0)
                wait_pipes(pub, 2)
        pub.send(numbered(i))
    for thread in threads:
        thread.join(20)
    for out in got:
        assert seqs(out) == list(range(n))
    if change == "join":
        late.join(20)
        # The newcomer gets an unbroken run of the burst, to its end.
        first = seqs(theirs)[0]
        assert first <= at
        assert seqs(theirs) == list(range(first, n))
    else:
        assert theirs and seqs(theirs) == list(range(len(theirs)))  # (it may fall behind before it leaves)


def test_close_right_after_a_fan_out_burst_delivers_everything(make_socket: MakeSocket, transport: str) -> None:
    pub = nanopy.Socket("pub", overflow="block", send_timeout=10)
    n = 3000
    _, _, got, threads = fan_out(make_socket, pub, transport, "fanclose", 2, n)
    for i in range(n):
        pub.send(numbered(i))
    pub.close(linger=10)  # what the lane still holds goes out within the linger
    for thread in threads:
        thread.join(20)
    for out in got:
        assert seqs(out) == list(range(n))


def test_a_dropping_pub_keeps_every_subscribers_stream_in_order(make_socket: MakeSocket, transport: str) -> None:
    # Best-effort PUB and SUBs: a subscriber that reads nothing loses messages
    # (counted), the one that reads gets an increasing sequence, never a reordered one.
    pub = make_socket("pub")
    url = pub.bind(bind_url(transport, "fandrop")).url
    reader, idle = subscribers(make_socket, url, 2, recv_buffer=64)
    wait_pipes(pub, 2)
    n = 20000
    for i in range(n):
        pub.send(numbered(i))
    pub.send(SEQ.pack(n))  # an end marker (it may be dropped too: the reader stops on a timeout)
    got: list[int] = []
    while True:
        try:
            got.append(SEQ.unpack_from(reader.recv(timeout=1))[0])
        except nanopy.Timeout:
            break
    assert got == sorted(set(got)) and got
    # (the idle SUB drops its oldest, or the PUB skips that pipe: counted either way)
    wait_until(
        lambda: pub.stats().messages_dropped + idle.stats().messages_dropped > 0,
        what="the idle subscriber's misses counted",
    )
    assert pub.stats().messages_sent == n + 1
    kept = []
    while True:
        try:
            kept.append(SEQ.unpack_from(idle.recv(timeout=0.2))[0])
        except nanopy.Timeout:
            break
    assert kept == sorted(set(kept))


@pytest.mark.parametrize("protocol", ["push", "pair"])
def test_a_sole_pipe_stream_arrives_whole_and_counted(make_socket: MakeSocket, transport: str, protocol: str) -> None:
    peer = {"push": "pull", "pair": "pair"}[protocol]
    receiver = make_socket(peer, recv_timeout=10)
    url = receiver.bind(bind_url(transport, "lane")).url
    sender = make_socket(protocol, connect=url, send_timeout=10)
    wait_pipes(sender, 1)
    n = 5000
    got: list[bytes] = []
    thread = read_into(receiver, got, n)
    for i in range(n):
        sender.send(numbered(i))
    thread.join(20)
    assert seqs(got) == list(range(n))
    total = sum(len(numbered(i)) for i in range(n))
    assert sender.stats().messages_sent == n and sender.stats().bytes_sent == total
    assert receiver.stats().messages_received == n and receiver.stats().bytes_received == total


def test_a_second_pusher_pipe_gets_its_share_at_once(make_socket: MakeSocket, transport: str) -> None:
    # A lone PUSH pipe spends lane credit; a second pipe joining must take every
    # other message from then on (round robin per message), not wait for the lane to dry.
    a = make_socket("pull", recv_timeout=5)
    url_a = a.bind(bind_url(transport, "rr-a")).url
    b = make_socket("pull", recv_timeout=5)
    url_b = b.bind(bind_url(transport, "rr-b")).url
    push = make_socket("push", connect=url_a)
    wait_pipes(push, 1)
    for i in range(10):
        push.send(numbered(i))
    push.connect(url_b)
    wait_pipes(push, 2)
    for i in range(10, 30):
        push.send(numbered(i))
    got_a = seqs([a.recv() for _ in range(20)])
    got_b = seqs([b.recv() for _ in range(10)])
    assert got_a == list(range(10)) + list(range(10, 30, 2)) or got_a == list(range(10)) + list(range(11, 30, 2))
    assert sorted(got_a[10:] + got_b) == list(range(10, 30))


def test_a_run_mixes_with_recv_msg_recv_batch_and_poll_in_order(make_socket: MakeSocket, transport: str) -> None:
    pull = make_socket("pull", recv_timeout=5)
    url = pull.bind(bind_url(transport, "run")).url
    push = make_socket("push", connect=url)
    wait_pipes(pull, 1)
    n = 600
    for i in range(n):
        push.send(numbered(i))
    assert nanopy.poll([(pull, nanopy.POLLIN)], timeout=5) == [(pull, nanopy.POLLIN)]
    fq = pull._driver.core._fq  # (how much has arrived is not public)
    wait_until(lambda: fq.queued() == n, what="every message queued")
    got = [pull.recv()]  # takes a run
    assert nanopy.poll([(pull, nanopy.POLLIN)], timeout=0) == [(pull, nanopy.POLLIN)]
    msg = pull.recv_msg()
    got.append(msg.body)
    assert msg.pipe is not None
    got += pull.recv_batch(100)
    assert pull.stats().messages_received == len(got)
    while len(got) < n:
        got.append(pull.recv())
    assert seqs(got) == list(range(n))
    assert pull.stats().messages_received == n
    assert nanopy.poll([(pull, nanopy.POLLIN)], timeout=0) == []


@pytest.mark.parametrize(("receiver", "sender"), [("pull", "push"), ("sub", "pub")])
def test_a_better_pipe_is_served_first_even_after_a_run_was_taken(
    make_socket: MakeSocket, transport: str, receiver: str, sender: str
) -> None:
    pull = make_socket(receiver, recv_timeout=5)
    if receiver == "sub":
        pull.subscribe(b"")
    low_url = pull.bind(bind_url(transport, "prio-low"), recv_priority=8).url
    high_url = pull.bind(bind_url(transport, "prio-high"), recv_priority=1).url
    low = make_socket(sender, connect=low_url)
    high = make_socket(sender, connect=high_url)
    wait_pipes(pull, 2)
    wait_pipes(low, 1)
    wait_pipes(high, 1)
    fq = pull._driver.core._fq  # (how much has arrived is not public)
    for i in range(10):
        low.send(b"low%d" % i)
    wait_until(lambda: fq.queued() == 10, what="the low pipe's messages queued")
    assert pull.recv() == b"low0"
    assert len(pull._driver.run) == 9  # the low pipe alone had messages: a run was taken
    for i in range(3):
        high.send(b"high%d" % i)
    # The high pipe's first message hands the run back to the low pipe's queue.
    wait_until(lambda: fq.queued() == 12, what="the high pipe's messages queued, the run given back")
    assert not pull._driver.run
    got = [pull.recv() for _ in range(12)]
    assert got[:3] == [b"high0", b"high1", b"high2"]
    assert got[3:] == [b"low%d" % i for i in range(1, 10)]
    assert pull.stats().messages_received == 13


def test_idle_lane_sends_keep_their_credit_and_stay_counted(make_socket: MakeSocket, transport: str) -> None:
    # A ping-pong's sends are written directly and whole: their credit stays on the
    # lane (no round gives it back) and ``lane_kept`` counts them, so the sent count
    # is exact while the lane is open and after close takes the lane back.
    echo = make_socket("pair", recv_timeout=10)
    url = echo.bind(bind_url(transport, "kept")).url
    caller = make_socket("pair", connect=url, recv_timeout=10)
    wait_pipes(caller, 1)
    n = 200
    for i in range(n):
        caller.send(numbered(i))
        echo.send(echo.recv())
        assert seqs([caller.recv()]) == [i]
    lane = caller._driver.lane
    assert lane is not None and lane.lane_kept > 0
    total = sum(len(numbered(i)) for i in range(n))
    stats = caller.stats()
    assert stats.messages_sent == n and stats.bytes_sent == total
    caller.close()
    stats = caller.stats()
    assert stats.messages_sent == n and stats.bytes_sent == total
