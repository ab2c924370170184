"""Socket.send_batch / asend_batch: many sends in one call, as send() would make them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest
import trio
from conftest import bind_url, wait_until
from peers import pynng_socket

import nanopy
from nanopy.testing import connect_pair, local_url, wait_pipes

Factory = Callable[..., nanopy.Socket]

# (sender, receiver, sender options) of every protocol where a run of sends means something
PROTOCOLS = {
    "push": ("push", "pull", {}),
    "pub": ("pub", "sub", {}),
    "pair": ("pair", "pair", {}),
    "pair1": ("pair1", "pair1", {}),
    "bus": ("bus", "bus", {}),
    "raw-push": ("push", "pull", {"raw": True}),
    "raw-pair": ("pair", "pair", {"raw": True}),
}
ZMTP = {"push", "pub", "pair", "raw-push", "raw-pair"}  # (the types with a ZeroMQ counterpart)
CASES = [
    pytest.param(kind, transport, id=f"{kind}-{transport}")
    for kind in PROTOCOLS
    for transport in ("tcp", "ipc", "inproc", "ws", "zmtp+tcp")
    if transport != "zmtp+tcp" or kind in ZMTP
]


def linked(make_socket: Factory, kind: str, transport: str) -> tuple[nanopy.Socket, nanopy.Socket]:
    """A sender of ``kind`` and its receiver, joined on ``transport``, ready to deliver."""
    out, into, opts = PROTOCOLS[kind]
    # (SUB and BUS drop what overflows their queue, however it was sent: room for the whole test)
    receiver = make_socket(into, recv_timeout=5, **({"recv_buffer": 8192} if into in ("sub", "bus") else {}))
    sender = make_socket(out, send_timeout=5, **opts)
    if into == "sub":
        receiver.subscribe(b"")
    connect_pair(receiver, sender, local_url(transport, "sb"))
    if into == "sub":  # (zmtp forwards the subscription: probe until it has arrived)
        def through() -> bool:
            sender.send(b"probe")
            try:
                return receiver.recv(timeout=0.02) == b"probe"
            except nanopy.Timeout:
                return False

        wait_until(through, what="the subscription reached the PUB")
        while True:  # (the probes still on their way)
            try:
                receiver.recv(timeout=0.1)
            except nanopy.Timeout:
                break
    return sender, receiver


def take(sock: nanopy.Socket, n: int) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < n:
        got += sock.recv_batch(n - len(got), timeout=5)
    return got


@pytest.mark.parametrize(("kind", "transport"), CASES)
def test_every_protocol_and_transport_keeps_order_and_counts(make_socket: Factory, kind: str, transport: str) -> None:
    sender, receiver = linked(make_socket, kind, transport)
    before = sender.stats().messages_sent
    bodies = [b"m%05d" % i + b"x" * (i % 50) for i in range(3000)]
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.extend(take(receiver, len(bodies))))
    reader.start()
    assert sender.send_batch(bodies, timeout=10) == len(bodies)
    assert sender.send_batch(iter([b"a", bytearray(b"b"), memoryview(b"c")])) == 3  # any bytes-like, any iterable
    reader.join(20)
    assert got == bodies  # in order, nothing lost or twice
    assert take(receiver, 3) == [b"a", b"b", b"c"]
    stats = sender.stats()
    assert stats.messages_sent - before == len(bodies) + 3
    assert stats.dropped == 0


def test_pub_without_subscribers_drops_as_send_does(make_socket: Factory) -> None:
    pub = make_socket("pub")
    assert pub.send_batch([b"a", b"b", b"c"], timeout=0) == 3
    for _ in range(2):
        pub.send(b"d")
    stats = pub.stats()
    assert stats.messages_sent == 5


def test_raw_messages_carry_their_header(make_socket: Factory, transport: str) -> None:
    rep = make_socket("rep", recv_timeout=5, send_timeout=5)
    req = make_socket("req", raw=True, recv_timeout=5, send_timeout=5)
    connect_pair(rep, req, bind_url(transport))
    ids = [0x80000001 + i for i in range(5)]
    batch = [nanopy.Message(b"q%d" % i, header=ids[i].to_bytes(4, "big")) for i in range(5)]
    assert req.send_batch(batch) == 5
    for i in range(5):  # a cooked REP answers each request in turn, by its id
        assert rep.recv() == b"q%d" % i
        rep.send(b"r%d" % i)
        answer = req.recv_msg()
        assert (answer.body, answer.header) == (b"r%d" % i, ids[i].to_bytes(4, "big"))


@pytest.mark.parametrize("protocol", ["req", "rep", "surveyor", "respondent"])
def test_cooked_exchange_protocols_refuse(make_socket: Factory, protocol: str) -> None:
    sock = make_socket(protocol)
    with pytest.raises(nanopy.ProtocolError, match=r"send\(\) in a loop"):
        sock.send_batch([b"a"])
    with pytest.raises(nanopy.ProtocolError, match=r"send\(\) in a loop"):
        trio.run(sock.asend_batch, [b"a"])
    raw = make_socket(protocol, raw=True)
    assert raw.send_batch([]) == 0  # raw sockets take batches


def test_receive_only_protocols_refuse_as_send_does(make_socket: Factory) -> None:
    for protocol in ("pull", "sub"):
        sock = make_socket(protocol)
        with pytest.raises(nanopy.ProtocolError, match="cannot send"):
            sock.send_batch([b"a"], timeout=0)


def test_misuse_and_edges(make_socket: Factory) -> None:
    push, pull = make_socket("push"), make_socket("pull", recv_timeout=5)
    assert push.send_batch([]) == 0  # at once, even with no peer
    assert push.send_batch(iter(())) == 0
    for bad in (3, None, b"abc", "abc"):
        with pytest.raises(TypeError, match="iterable of messages"):
            push.send_batch(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not str"):
        push.send_batch([b"ok", "text"])
    with pytest.raises(TypeError):
        push.send_batch([b"ok", 12])
    with pytest.raises(ValueError, match="timeout"):
        push.send_batch([b"a"], timeout=-1)
    with pytest.raises(TypeError, match="timeout"):
        push.send_batch([b"a"], timeout="1")  # type: ignore[arg-type]
    connect_pair(pull, push, bind_url("inproc"))
    with pytest.raises(nanopy.ProtocolError, match="multipart"):  # (an SP pipe: as send() refuses it)
        push.send_batch([b"ok", nanopy.zmtp.Multipart([b"a", b"b"])])
    push.send(b"first")
    assert pull.recv() == b"first"  # none of the refused batches sent anything
    with pytest.raises(nanopy.Timeout):
        pull.recv(timeout=0.05)
    push.close()
    with pytest.raises(nanopy.Closed):
        push.send_batch([b"a"])
    with pytest.raises(nanopy.Closed):
        push.send_batch([])


def test_no_room_times_out_with_the_count(make_socket: Factory) -> None:
    push = make_socket("push")  # no peer: no room
    for timeout in (0, 0.05):
        with pytest.raises(nanopy.Timeout) as info:
            push.send_batch([b"a", b"b"], timeout=timeout)
        assert info.value.sent == 0
        assert "0 of 2" in str(info.value)
    assert push.stats().messages_sent == 0


@pytest.mark.parametrize("transport", ["tcp", "ipc", "inproc"])
def test_back_pressure_sends_what_fits_then_times_out(make_socket: Factory, transport: str) -> None:
    pull = make_socket("pull", recv_timeout=5, recv_buffer=4)
    push = make_socket("push", send_buffer=4)
    connect_pair(pull, push, bind_url(transport))
    pad = b"p" * 8192
    bodies = [b"%06d" % i + pad for i in range(6000)]  # (~48 MB: more than every buffer on the way)
    with pytest.raises(nanopy.Timeout) as info:
        push.send_batch(bodies, timeout=0.5)  # the PULL reads nothing meanwhile
    sent = info.value.sent
    assert sent is not None and 0 < sent < len(bodies)
    assert push.stats().messages_sent == sent
    got = take(pull, sent)
    assert got == bodies[:sent]  # exactly the first ``sent``, in order
    with pytest.raises(nanopy.Timeout):
        pull.recv(timeout=0.2)  # and nothing more
    rest = bodies[sent:]
    later: list[bytes] = []
    reader = threading.Thread(target=lambda: later.extend(take(pull, len(rest))))
    reader.start()
    assert push.send_batch(rest, timeout=30) == len(rest)
    reader.join(30)
    assert later == rest
    assert push.stats().messages_sent == len(bodies)


@pytest.fixture
def pynng_pull() -> Iterator[object]:
    with pynng_socket("Pull0", recv_timeout=5000) as sock:
        yield sock


def test_interop_pynng_pull_gets_every_message_in_order(make_socket: Factory, pynng_pull: object) -> None:
    url = local_url("tcp", "sb")
    pull: object = pynng_pull
    push = make_socket("push", send_timeout=5)
    ep = push.bind(url)
    pull.dial(ep.url, block=True)  # type: ignore[attr-defined]
    wait_pipes(push)
    bodies = [b"n%05d" % i for i in range(2000)]
    got: list[bytes] = []

    def read() -> None:
        for _ in bodies:
            got.append(pull.recv())  # type: ignore[attr-defined]

    reader = threading.Thread(target=read)
    reader.start()
    assert push.send_batch(bodies, timeout=10) == len(bodies)
    reader.join(20)
    assert got == bodies


def test_interop_pyzmq_pull_over_zmtp(make_socket: Factory) -> None:
    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context()
    zpull = ctx.socket(zmq.PULL)
    zpull.linger = 0
    zpull.rcvtimeo = 5000
    try:
        port = zpull.bind_to_random_port("tcp://127.0.0.1")
        push = make_socket("push", send_timeout=5)
        push.connect(f"zmtp+tcp://127.0.0.1:{port}")
        wait_pipes(push)
        bodies = [b"z%05d" % i for i in range(2000)]
        got: list[bytes] = []

        def read() -> None:
            for _ in bodies:
                got.append(zpull.recv())

        reader = threading.Thread(target=read)
        reader.start()
        assert push.send_batch(bodies, timeout=10) == len(bodies)
        reader.join(20)
        assert got == bodies
        frames = [nanopy.zmtp.Multipart([b"k", b"v%d" % i]) for i in range(3)]
        assert push.send_batch(frames) == 3
        assert [zpull.recv_multipart() for _ in range(3)] == [[b"k", b"v%d" % i] for i in range(3)]
    finally:
        zpull.close()
        ctx.term()


def test_asend_batch_under_trio(make_socket: Factory, transport: str) -> None:
    push = make_socket("push", send_timeout=5)
    pull = make_socket("pull", recv_timeout=5)
    connect_pair(pull, push, bind_url(transport))
    bodies = [b"t%05d" % i for i in range(2000)]

    async def main() -> list[bytes]:
        got: list[bytes] = []

        async def read() -> None:
            while len(got) < len(bodies):
                got.extend(await pull.arecv_batch(len(bodies) - len(got)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            assert await push.asend_batch(bodies) == len(bodies)
            assert await push.asend_batch([]) == 0
        return got

    assert trio.run(main) == bodies
    lonely = make_socket("push")
    with pytest.raises(nanopy.Timeout) as info:
        trio.run(lambda: lonely.asend_batch([b"a"], timeout=0.05))
    assert info.value.sent == 0


def test_asend_batch_under_asyncio(make_socket: Factory) -> None:
    push, pull = make_socket("push"), make_socket("pull", recv_timeout=5)
    connect_pair(pull, push, bind_url("tcp"))

    async def main() -> int:
        return await push.asend_batch([b"x%d" % i for i in range(100)], timeout=5)

    assert asyncio.run(main()) == 100
    assert take(pull, 100) == [b"x%d" % i for i in range(100)]


@pytest.mark.parametrize("transport", ["tcp", "inproc"])
def test_pub_batch_larger_than_its_buffer_is_not_dropped_for_its_size(make_socket: Factory, transport: str) -> None:
    sub = make_socket("sub", recv_timeout=5, recv_buffer=8192)
    sub.subscribe(b"")
    pub = make_socket("pub", send_buffer=16)  # (a round of more than 16 would overrun it)
    connect_pair(sub, pub, bind_url(transport))
    bodies = [b"s%04d" % i for i in range(600)]
    assert pub.send_batch(bodies) == len(bodies)
    assert take(sub, len(bodies)) == bodies
    assert pub.stats().drops["queue_full"] == 0


@pytest.mark.parametrize("transport", ["tcp", "ipc", "inproc"])
def test_one_round_is_one_write_per_pipe(make_socket: Factory, transport: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from nanopy.pipe.driver import PipeDriver

    push, pull = make_socket("push"), make_socket("pull", recv_timeout=5)
    connect_pair(pull, push, bind_url(transport))
    writes: list[int] = []
    plain = PipeDriver._write_claimed

    def counted(self: PipeDriver, batch: list[bytes], *args: object) -> int:
        if self.sock is push._driver:
            writes.append(len(batch))
        return plain(self, batch, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(PipeDriver, "_write_claimed", counted)
    bodies = [b"w%03d" % i for i in range(200)]
    assert push.send_batch(bodies) == 200
    assert writes == [200]  # one framed write, not one per message
    assert take(pull, 200) == bodies


def test_asend_batch_cancelled_while_waiting_keeps_what_went(make_socket: Factory) -> None:
    pull = make_socket("pull", recv_timeout=5, recv_buffer=4)
    push = make_socket("push", send_buffer=4)
    connect_pair(pull, push, bind_url("tcp"))
    pad = b"c" * 8192
    bodies = [b"%06d" % i + pad for i in range(6000)]

    async def main() -> bool:
        with trio.move_on_after(0.5) as scope:
            await push.asend_batch(bodies, timeout=None)  # the PULL reads nothing meanwhile
        return scope.cancelled_caught

    assert trio.run(main)
    sent = push.stats().messages_sent
    assert 0 < sent < len(bodies)
    assert take(pull, sent) == bodies[:sent]  # the messages before the wait, in order
    with pytest.raises(nanopy.Timeout):
        pull.recv(timeout=0.2)  # and none of the rest
