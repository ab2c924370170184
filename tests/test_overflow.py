"""The ``overflow`` option of PUB and SUB: drop (default), drop-newest, block (lossless)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from conftest import bind_url, wait_until

import nanopy
from nanopy.protocols.pubsub import Pub0, Sub0
from nanopy.testing import wait_pipes

MakeSocket = Callable[..., nanopy.Socket]
COUNT = 20_000


# -- validation -------------------------------------------------------------------------


def test_overflow_is_validated_per_protocol(make_socket: MakeSocket) -> None:
    assert make_socket("pub").overflow == "drop"
    assert make_socket("sub", overflow="drop-newest").overflow == "drop-newest"
    pub = make_socket("pub", overflow="block")
    assert pub.overflow == "block"
    with pytest.raises(ValueError, match="drop-newest"):
        pub.overflow = "drop-newest"  # SUB only
    assert pub.overflow == "block"  # a refused value changes nothing
    with pytest.raises(ValueError, match="one of"):
        make_socket("sub", overflow="lossless")
    with pytest.raises(TypeError):
        make_socket("sub", overflow=True)
    with pytest.raises(ValueError, match="PUSH"):
        nanopy.Socket("push", overflow="block")
    make_socket("push", overflow="drop")  # the default is accepted everywhere


# -- the SUB core -------------------------------------------------------------------------


def core(cls: type, **opts: object) -> object:
    options = nanopy.Socket("sub")._options  # a fresh options object
    for key, value in opts.items():
        setattr(options, key, value)
    c = cls(options)
    from nanopy.core.base import PipeInfo

    c.add_pipe(PipeInfo(1, None, 8, 8), 4)
    if cls is Sub0:
        c.subscribe(b"")
    return c


@pytest.mark.parametrize(
    "mode,kept,dropped,keep_reading",
    [
        ("drop", [b"2", b"3", b"4"], 2, True),
        ("drop-newest", [b"0", b"1", b"2"], 2, True),
        ("block", [b"0", b"1", b"2", b"3", b"4"], 0, False),
    ],
)
def test_sub_core_modes(mode: str, kept: list[bytes], dropped: int, keep_reading: bool) -> None:
    sub = core(Sub0, recv_buffer=3, overflow=mode)
    assert sub.messages_received(1, [b"%d" % i for i in range(5)]) is keep_reading
    assert sub.dropped == dropped
    got = []
    while sub.can_recv():
        got.append(sub.recv_body())
    assert got == kept
    if mode == "block":
        assert (nanopy.core.base.RESUME_READ, 1) in sub.actions


def test_sub_core_drop_that_empties_a_queue_leaves_nothing_to_receive() -> None:
    # recv_buffer lowered below what a run holds: the next arrival discards the whole
    # queue, and the pipe must stop counting as ready (it once stayed ready: IndexError)
    sub = core(Sub0, recv_buffer=8, overflow="drop")
    sub.messages_received(1, [b"a", b"b", b"c", b"d"])
    fq = sub._fq
    fq.run.extend(fq.take_run(4))  # as the engine does: these wait for the user
    sub.messages_received(1, [b"e"])
    sub.options.recv_buffer = 2
    assert sub.messages_received(1, [b"f"]) is True
    assert sub.dropped == 2
    assert not sub.can_recv()
    assert list(fq.run) == [b"a", b"b", b"c", b"d"]


def test_pub_core_block_waits_for_every_pipe() -> None:
    from nanopy.core.base import PipeInfo
    from nanopy.core.errors import WouldBlock

    pub = core(Pub0, overflow="block")
    pub.add_pipe(PipeInfo(2, None, 8, 8), 1)
    pub.send(b"a")  # both pipes had credit
    assert not pub.can_send()
    with pytest.raises(WouldBlock):
        pub.send(b"b")
    assert pub.dropped == 0
    pub.pipe_credit(2, 1)
    assert pub.can_send()
    pub.options.overflow = "drop"  # switching back: full pipes are skipped again
    pub.actions.clear()
    for _ in range(4):
        pub.send(b"c")
    assert pub.dropped == 1 + 3  # pipe 1 had 3 credits left, pipe 2 had 1


# -- sockets ------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["tcp", "ipc", "inproc"])
def test_block_is_lossless_with_a_slow_subscriber(make_socket: MakeSocket, transport: str) -> None:
    pub = make_socket("pub", overflow="block", send_buffer=64, send_timeout=30)
    url = pub.bind(bind_url(transport, "lossless")).url
    subs = [make_socket("sub", overflow="block", recv_buffer=64, recv_timeout=30, connect=url) for _ in range(2)]
    for sub in subs:
        sub.subscribe(b"")
    wait_pipes(pub, 2)
    results: dict[int, list[int]] = {}

    def read(i: int, slow: bool) -> None:
        got = []
        for n in range(COUNT):
            got.append(int(subs[i].recv()))
            if slow and n % 500 == 0:
                time.sleep(0.01)  # a subscriber that falls behind now and then
        results[i] = got

    readers = [threading.Thread(target=read, args=(i, i == 1), daemon=True) for i in range(2)]
    for t in readers:
        t.start()
    for n in range(COUNT):
        pub.send(b"%d" % n)
    for t in readers:
        t.join(60)
    expected = list(range(COUNT))
    assert results == {0: expected, 1: expected}
    assert pub.stats().messages_dropped == 0
    assert all(sub.stats().messages_dropped == 0 for sub in subs)


@pytest.mark.parametrize("transport", ["ipc", "inproc"])
def test_a_stalled_subscriber_makes_send_time_out(make_socket: MakeSocket, transport: str) -> None:
    pub = make_socket("pub", overflow="block", send_buffer=4, send_timeout=0.3)
    url = pub.bind(bind_url(transport, "stall")).url
    sub = make_socket("sub", overflow="block", recv_buffer=4, connect=url)
    sub.subscribe(b"")
    wait_pipes(pub)
    body = b"x" * 65536  # fills socket buffers quickly on a stream transport
    sent = 0
    with pytest.raises(nanopy.Timeout):
        while True:
            start = time.monotonic()
            pub.send(body)
            sent += 1
            assert sent < 10_000, "a stalled subscriber never stopped the publisher"
    assert time.monotonic() - start >= 0.29
    assert pub.stats().messages_dropped == 0
    # The subscriber reads again: the publisher goes on, nothing was lost.
    received = 0
    for _ in range(sent):
        assert sub.recv(timeout=10) == body
        received += 1
    pub.send(b"again", timeout=10)
    assert sub.recv(timeout=10) == b"again"


def test_block_publisher_goes_on_when_the_stalled_subscriber_leaves(make_socket: MakeSocket) -> None:
    pub = make_socket("pub", overflow="block", send_buffer=2)
    url = pub.bind(bind_url("inproc", "leave")).url
    sub = make_socket("sub", overflow="block", recv_buffer=2, connect=url)
    sub.subscribe(b"")
    wait_pipes(pub)
    while nanopy.poll([(pub, nanopy.POLLOUT)], timeout=0.2):
        pub.send(b"m", timeout=0)
    outcome: list[object] = []
    t = threading.Thread(target=lambda: outcome.append(pub.send(b"last", timeout=10)), daemon=True)
    t.start()
    wait_until(lambda: bool(pub._driver.send_q.waiters), what="the blocked send")
    sub.close(linger=0)
    t.join(10)
    assert outcome == [None]


def test_sub_drop_newest_keeps_the_oldest(make_socket: MakeSocket) -> None:
    sub = make_socket("sub", overflow="drop-newest", recv_buffer=8)
    pub = make_socket("pub")
    url = sub.bind(bind_url("inproc", "newest")).url
    sub.subscribe(b"")
    pub.connect(url)
    wait_pipes(pub)
    for n in range(50):
        pub.send(b"%d" % n)
    wait_until(lambda: sub.stats().messages_dropped == 42, what="42 drops")
    assert [sub.recv(timeout=0) for _ in range(8)] == [b"%d" % n for n in range(8)]
