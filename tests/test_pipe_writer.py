"""One writer per pipe: the pipe driver owns unwritten data, on every transport.

The transport contract these tests hold the engine to: a connection is a channel
(frame / write_nowait / write_all) written by its pipe's driver alone, credit comes
back from the sender's own writes, and no connection calls into a socket.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import pytest
from conftest import bind_url, send_until_full, tcp_plugin, wait_until
from tls_certs import tls_files

import nanopy
from nanopy.pipe import driver as _pipe
from nanopy.pipe import writer as _writer
from nanopy.pipe.outbox import FRAME_ALLOWANCE, UNCUT, WRITE_CHUNK_BYTES, Outbox
from nanopy.transports import ChannelConnection, inproc
from nanopy.transports._stream import StreamConnection
from nanopy.transports._ws_conn import WsConnection
from nanopy.transports.tls import TlsConnection

Factory = Callable[..., nanopy.Socket]

BUILTIN_CONNECTIONS = [StreamConnection, TlsConnection, WsConnection, inproc.InprocConnection]


@pytest.mark.parametrize("cls", BUILTIN_CONNECTIONS, ids=lambda c: c.__name__)
def test_builtin_connections_are_channels_without_side_channels(cls: type) -> None:
    assert issubclass(cls, ChannelConnection)
    for name in ("has_pending", "manages_credit", "release_credit", "try_send", "try_send_batch"):
        assert not hasattr(cls, name), f"{cls.__name__}.{name} is gone from the contract"


def _url(transport: str, tag: str) -> str:
    if transport == "ws":
        return "ws://127.0.0.1:0/pw"
    return bind_url(transport, f"pipe-writer-{tag}")


def _connect(push: nanopy.Socket, pull: nanopy.Socket, transport: str, tag: str) -> None:
    """``push`` dials ``pull`` over ``transport`` (TLS ones with the test certificates);
    returns once both see the pipe."""
    if transport in ("tls+tcp", "wss"):
        t = tls_files()
        url = "tls+tcp://127.0.0.1:0" if transport == "tls+tcp" else f"wss://127.0.0.1:0/{tag}"
        ep = pull.bind(url, ssl_context=t.server_ctx)
        push.connect(ep.url.replace("127.0.0.1", "localhost"), ssl_context=t.client_ctx)
    else:
        push.connect(pull.bind(_url(transport, tag)).url)
    wait_until(lambda: len(push.pipes) == 1 and len(pull.pipes) == 1, what="the pipe")


def test_inproc_push_to_a_non_reading_pull_stops_after_a_bounded_number(make_socket: Factory) -> None:
    """The inbox is a bounded buffer: a full one stops the sender's writes, and the
    sender's credit (from its own writes) stops the sender."""
    push = make_socket("push", send_buffer=4)
    pull = make_socket("pull", recv_buffer=4)
    push.connect(pull.bind(_url("inproc", "bound")).url)
    wait_until(lambda: len(push.pipes) == 1 and len(pull.pipes) == 1, what="the pipe")
    sent = 0
    with pytest.raises(nanopy.Timeout):
        for sent in range(10_000):  # noqa: B007 - the count is the result
            push.send(b"%d" % sent, timeout=0.3)
    # The receiving core takes a delivered batch whole (and then pauses), so it may hold
    # up to one inbox's worth beyond recv_buffer: bounded, not exact.
    assert inproc.INBOX_SIZE <= sent <= 4 + 4 + 2 * inproc.INBOX_SIZE
    assert [pull.recv(timeout=5) for _ in range(sent)] == [b"%d" % i for i in range(sent)]
    push.send(b"again", timeout=5)  # room again once the receiver read
    assert pull.recv(timeout=5) == b"again"


@pytest.mark.parametrize("transport", ["tcp", "ipc", "inproc", "ws"])
def test_many_sending_threads_share_one_pipe(make_socket: Factory, transport: str) -> None:
    """Sending threads and the writer task all write through the pipe's driver:
    every message arrives once, each thread's in its order."""
    pull = make_socket("pull", recv_timeout=10)
    push = make_socket("push", send_timeout=10)
    push.connect(pull.bind(_url(transport, "threads")).url)
    wait_until(lambda: len(push.pipes) == 1 and len(pull.pipes) == 1, what="the pipe")
    threads, each = 4, 3000

    def sender(t: int) -> None:
        for i in range(each):
            push.send(b"%d:%d" % (t, i))

    workers = [threading.Thread(target=sender, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    got: dict[int, list[int]] = {t: [] for t in range(threads)}
    for _ in range(threads * each):
        t, i = pull.recv().split(b":")
        got[int(t)].append(int(i))
    for w in workers:
        w.join(10)
    assert got == {t: list(range(each)) for t in range(threads)}


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_a_slow_sender_writes_its_own_batch_once_the_oldest_message_is_old(
    make_socket: Factory, transport: str
) -> None:
    """A sender slower than 256 messages per CALLER_HOLD (a trio task pays one
    schedule point per send) writes a batch itself as soon as the oldest message
    has waited CALLER_HOLD, instead of leaving it to the writer task's MAX_HOLD."""
    pull = make_socket("pull", recv_timeout=10)
    push = make_socket("push", send_timeout=10)
    push.connect(pull.bind(_url(transport, "slow")).url)
    wait_until(lambda: len(push.pipes) == 1 and len(push._driver.pipes) == 1, what="the pipe")
    (pipe,) = push._driver.pipes.values()
    step = _pipe.CALLER_HOLD / 50  # the pipe's clock moves this much per send
    assert _pipe.CALLER_HOLD < _pipe.CALLER_BATCH * step < _writer.MAX_HOLD
    clock = [0.0]
    pipe.now = lambda: clock[0]
    me = threading.get_ident()
    own_batches: list[int] = []
    write_nowait = pipe.channel.write_nowait

    def counted(chunk: bytes | memoryview) -> int:
        if threading.get_ident() == me:
            own_batches.append(len(chunk) // (len(b"0000") + (9 if transport == "ipc" else 8)))
        return write_nowait(chunk)

    pipe.channel.write_nowait = counted
    total = 10 * _pipe.CALLER_BATCH
    for i in range(total):
        clock[0] += step
        push.send(b"%04d" % i)
    assert [pull.recv() for _ in range(total)] == [b"%04d" % i for i in range(total)]
    # Without CALLER_HOLD this thread would write only at 256 messages (or never,
    # the writer task flushing first): here it writes batches of 64.
    assert _pipe.CALLER_BATCH in own_batches, own_batches
    assert max(own_batches) < _pipe.CALLER_BATCH_MAX, own_batches


def test_inproc_both_directions_at_once_never_deadlock(make_socket: Factory) -> None:
    """inproc delivers from the sending thread into the peer socket; two threads
    sending on both ends of one pipe (each delivery may send back on the same
    thread) must never lock each other out."""
    a = make_socket("pair", send_timeout=10, recv_timeout=10)
    b = make_socket("pair", send_timeout=10, recv_timeout=10)
    b.connect(a.bind(_url("inproc", "both")).url)
    wait_until(lambda: len(a.pipes) == 1 and len(b.pipes) == 1, what="the pipe")
    n = 20_000
    received: dict[str, list[bytes]] = {"a": [], "b": []}

    def send(sock: nanopy.Socket) -> None:
        for i in range(n):
            sock.send(b"%d" % i)

    def recv(sock: nanopy.Socket, key: str) -> None:
        received[key] = [sock.recv() for _ in range(n)]

    workers = [
        threading.Thread(target=send, args=(a,)),
        threading.Thread(target=send, args=(b,)),
        threading.Thread(target=recv, args=(a, "a")),
        threading.Thread(target=recv, args=(b, "b")),
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert not any(w.is_alive() for w in workers), "a sender or receiver is stuck"
    expected = [b"%d" % i for i in range(n)]
    assert received == {"a": expected, "b": expected}


# -- a plug-in channel: partial writes and control frames ----------------------------------
class _TrickleChannel(ChannelConnection):
    """A third-party channel over a tcp connection whose non-blocking write takes at
    most 7 bytes (every direct write cuts a frame: the pipe must finish the rest
    before anything else) and which keeps the pipe's control-frame writer."""

    def __init__(self, inner: StreamConnection) -> None:
        self.inner = inner
        self.remote_address = inner.remote_address
        self.send_control: Callable[[bytes], bool] | None = None

    async def handshake(self) -> None:
        await self.inner.handshake()

    def frame(self, payloads: list[bytes]) -> bytes:
        return self.inner.frame(payloads)

    def write_nowait(self, chunk: bytes | memoryview) -> int:
        return self.inner.write_nowait(chunk[:7])

    async def write_all(self, chunk: bytes | memoryview) -> None:
        await self.inner.write_all(chunk)

    def attach_control(self, send_control: Callable[[bytes], bool]) -> None:
        self.send_control = send_control

    async def receive(self) -> list[bytes]:
        return await self.inner.receive()

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_plugin_channel_with_partial_writes_and_control_frames(make_socket: Factory) -> None:
    with tcp_plugin("trickle", _TrickleChannel) as made:
        pull = make_socket("pull", recv_timeout=10)
        push = make_socket("push", send_timeout=10)
        push.connect(pull.bind("trickle://127.0.0.1:0").url)
        wait_until(lambda: len(push.pipes) == 1 and len(pull.pipes) == 1, what="the pipe")
        (conn,) = made
        assert conn.send_control is not None and push.pipes[0]._driver.channel is conn
        # Every direct write leaves the rest of a frame: the pipe finishes it first.
        n = 500
        for i in range(n):
            push.send(b"message %d" % i)
        assert [pull.recv() for _ in range(n)] == [b"message %d" % i for i in range(n)]
        # Two control frames in one engine step: the second replaces the first
        # (never written), and it goes out on a frame boundary.
        answers: list[bool] = []
        done = threading.Event()
        send_control = conn.send_control

        def in_engine() -> None:
            answers.append(send_control(conn.frame([b"control 1"])))
            answers.append(send_control(conn.frame([b"control 2"])))
            done.set()

        push._engine.call_soon(in_engine)
        assert done.wait(5)
        assert answers == [False, True]
        push.send(b"after")
        assert [pull.recv(), pull.recv()] == [b"control 2", b"after"]


@pytest.mark.parametrize("transport", ["tcp", "ipc", "inproc", "ws"])
@pytest.mark.parametrize("count", [3, 700])
def test_fan_out_burst_reaches_every_subscriber_in_order(make_socket: Factory, transport: str, count: int) -> None:
    """A PUB's burst to several pipes is queued and written by the socket's flush
    round (or the sender, in full batches): a short burst's rest is not stranded,
    a long one arrives whole and in order, on every pipe."""
    pub = make_socket("pub", overflow="block", send_timeout=10)
    url = pub.bind(_url(transport, f"fanout-{count}")).url
    subs = [make_socket("sub", overflow="block", recv_timeout=10) for _ in range(3)]
    for sub in subs:
        sub.subscribe(b"")
        sub.connect(url)
    wait_until(lambda: len(pub.pipes) == 3 and all(len(s.pipes) == 1 for s in subs), what="the pipes")
    for round_ in range(2):  # the second burst follows the first within the burst gap
        for i in range(count):
            pub.send(b"%d:%d" % (round_, i))
        for sub in subs:
            assert [sub.recv() for _ in range(count)] == [b"%d:%d" % (round_, i) for i in range(count)]


def test_stream_pipes_share_framing_and_frame_equal_chunks(make_socket: Factory) -> None:
    """tcp pipes declare one framing (a fan-out batch is framed once for all of
    them); ipc differs from tcp; ws and inproc declare none."""
    keys: dict[str, object] = {}
    for transport in ("tcp", "ipc", "ws", "inproc"):
        pub = make_socket("pub")
        url = pub.bind(_url(transport, "framing")).url
        subs = [make_socket("sub", connect=url) for _ in range(2)]
        wait_until(lambda: len(pub.pipes) == 2 and all(len(s.pipes) == 1 for s in subs), what="the pipes")
        drivers = list(pub._driver.pipes.values())
        assert drivers[0].framing == drivers[1].framing
        keys[transport] = drivers[0].framing
        if drivers[0].framing is not None:
            batch = [b"a", b"bc" * 100]
            assert drivers[0].channel.frame(batch) == drivers[1].channel.frame(batch)
    assert keys["tcp"] is not None and keys["ipc"] is not None and keys["tcp"] != keys["ipc"]
    assert keys["ws"] is None and keys["inproc"] is None


class _InterruptedChannel(_TrickleChannel):
    """A channel whose first direct write is interrupted as Ctrl-C would interrupt it."""

    interrupted = False

    def write_nowait(self, chunk: bytes | memoryview) -> int:
        if not _InterruptedChannel.interrupted:
            _InterruptedChannel.interrupted = True
            raise KeyboardInterrupt
        return self.inner.write_nowait(chunk)


def test_ctrl_c_inside_a_write_ends_that_pipe_and_the_socket_goes_on(make_socket: Factory) -> None:
    """How much of an interrupted write went out is unknown: the pipe is closed (its
    claim on the channel given back, so closing it does not wait), the caller gets
    the KeyboardInterrupt, and the socket reconnects and sends on."""
    _InterruptedChannel.interrupted = False
    with tcp_plugin("interrupted", _InterruptedChannel) as made:
        pull = make_socket("pull", recv_timeout=10)
        push = make_socket("push", send_timeout=10, reconnect_interval=0.01)
        push.connect(pull.bind("interrupted://127.0.0.1:0").url)
        wait_until(lambda: len(push.pipes) == 1, what="the pipe")
        with pytest.raises(KeyboardInterrupt):
            push.send(b"interrupted")
        wait_until(lambda: len(made) == 2 and len(push.pipes) == 1, what="a new pipe")
        push.send(b"after")
        assert pull.recv() == b"after"
        push.close(linger=0)


@pytest.mark.parametrize("transport", ["tcp", "ipc", "ws", "tls+tcp", "wss"])
def test_a_stalled_peer_costs_its_queue_not_a_framed_copy_of_it(
    make_socket: Factory, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer that stops reading leaves its whole send window queued on the pipe;
    no write frames more than about WRITE_CHUNK_BYTES of it at once (a write that
    took the whole outbox held a framed copy of all of it), and every message
    still arrives once, in order, when the peer reads again."""
    framed: list[int] = []
    payload_bytes = _pipe._payload_bytes

    def recording(batch: list[bytes], chunk: object, prefix: int) -> int:
        framed.append(len(chunk))  # type: ignore[arg-type]
        return payload_bytes(batch, chunk, prefix)

    monkeypatch.setattr(_pipe, "_payload_bytes", recording)
    monkeypatch.setattr(_writer, "payload_bytes", recording)  # (the writer task's writes)
    body = b"m" * 4000  # distinct payloads: what a real sender queues
    pull = make_socket("pull", recv_buffer=1)
    push = make_socket("push", send_buffer=1024, send_timeout=0.5)
    _connect(push, pull, transport, "stall")
    sent = send_until_full(push.send, nanopy.Timeout, body)
    assert sent >= 1024  # the send window, and what the kernels took
    (pipe,) = push.pipes
    stalled = pipe.stats()
    assert stalled.queued_out > 256  # the peer left a good part of the window queued
    assert stalled.messages_sent + stalled.queued_out == sent  # a waiting write is queued, not sent
    limit = WRITE_CHUNK_BYTES + len(body) + 64  # one message over, and its framing
    assert [pull.recv(timeout=10) for _ in range(sent)] == [b"%06d" % n + body for n in range(sent)]
    assert max(framed) <= limit, f"a write framed {max(framed)} bytes"


def test_one_write_takes_about_write_chunk_bytes_and_learns_its_step() -> None:
    box = Outbox()
    big = [b"%04d" % i + b"x" * 8188 for i in range(100)]  # 8 KiB each
    box.outbox = list(big)
    first = box.take_batch()  # judged by its oldest message
    assert len(first) == WRITE_CHUNK_BYTES // (8192 + FRAME_ALLOWANCE) == 31
    assert first + box.outbox == big  # the rest stays, in order
    box.note_write(len(first), 31 * 8192)
    assert box.write_step == 31
    box.write_step = 4
    box.note_write(4, 4 * 1024)  # a full step of small messages: many more fit
    assert box.write_step == 4 * WRITE_CHUNK_BYTES // (4 * 1024 + 4 * FRAME_ALLOWANCE)
    box.outbox = [b"y"] * 10
    assert box.take_batch() == [b"y"] * 10 and box.outbox == []
    uncut = Outbox()
    uncut.write_step = UNCUT  # inproc, a plug-in's send: the batch is the chunk
    uncut.outbox = list(big)
    uncut.note_write(100, 100 * 8192)
    assert uncut.take_batch() == big and uncut.write_step == UNCUT


@pytest.mark.parametrize("transport", ["tcp", "ipc", "inproc", "ws", "tls+tcp", "wss", "zmtp+tcp"])
def test_what_the_peer_received_is_counted_as_written(make_socket: Factory, transport: str) -> None:
    """The sender counts a write as done before the peer can have it: once the
    receiver holds every message, the sender's ``queued_out`` is 0 and its pipe's
    ``messages_sent`` counts them all, at once (no wait), whether the sending
    thread wrote the burst itself or left it to the writer task."""
    pull = make_socket("pull", recv_timeout=10)
    push = make_socket("push", send_timeout=10)
    _connect(push, pull, transport, "counted")
    (pipe,) = push.pipes
    total = 0
    for burst in (1, 5, 60, 700) * 6:
        for i in range(burst):
            push.send(b"%d" % i)
        assert [pull.recv() for _ in range(burst)] == [b"%d" % i for i in range(burst)]
        total += burst
        assert push.stats().queued_out == 0
        assert pipe.stats().messages_sent == total


def test_a_write_counts_as_sent_unless_it_waits_for_room() -> None:
    """Outbox's accounting rule: a write under way counts as sent (a peer may
    already hold it), except while its channel says it waits for room; a channel
    that cannot say counts it as queued until the write returns."""

    class Channel:
        waiting_for_room = False

    box = Outbox()
    box.lock = threading.Lock()
    box.channel = Channel()
    box.reports_wait = True
    box.outbox, box.tail, box.tail_credit = [b"q"] * 3, None, 0
    box.in_write, box.in_write_bytes = 4, 40  # a write of 4 messages, counted from its start
    box.tx_msgs, box.tx_bytes = 10, 100
    assert (box.queued_out(), box.sent_counts()) == (3, (10, 100))
    box.channel.waiting_for_room = True
    assert (box.queued_out(), box.sent_counts()) == (7, (6, 60))
    box.channel.waiting_for_room = False
    box.reports_wait = False
    assert (box.queued_out(), box.sent_counts()) == (7, (6, 60))
    box.in_write = box.in_write_bytes = 0  # the write returned
    assert (box.queued_out(), box.sent_counts()) == (3, (10, 100))


class _RetakingChannel(_TrickleChannel):
    """Writes whole; ``on_write`` (once) runs inside the next direct write, as
    another thread's round could run while this one writes."""

    on_write: Callable[[], None] | None = None

    def write_nowait(self, chunk: bytes | memoryview) -> int:
        hook, self.on_write = self.on_write, None
        if hook is not None:
            hook()
        return self.inner.write_nowait(chunk)


def test_a_lane_taken_back_during_a_direct_write_counts_that_send_once(make_socket: Factory) -> None:
    """An idle lane send written whole keeps its credit on the lane (``lane_kept``),
    unless the lane was taken back while it wrote: then the credit goes to the
    socket as before (none is left on a revoked lane, where the core could not
    get it back), also when the lane was granted again meanwhile; every send is
    counted once."""
    with tcp_plugin("retaking", _RetakingChannel) as made:
        echo = make_socket("pair", recv_timeout=10)
        caller = make_socket("pair", recv_timeout=10)
        caller.connect(echo.bind("retaking://127.0.0.1:0").url)
        wait_until(lambda: len(caller.pipes) == 1 and len(echo.pipes) == 1, what="the pipe")
        driver = caller._driver
        pipe = caller.pipes[0]._driver
        channel = pipe.channel
        assert isinstance(channel, _RetakingChannel) and channel in made

        def retake(grant_again: bool) -> None:
            with driver.lock:
                driver.lanes.revoke_lane()
                if grant_again:
                    driver.lanes._grant_lane()  # (to the same pipe)

        n = 40
        for i in range(n):
            if i in (10, 25):
                channel.on_write = functools.partial(retake, i == 10)
            caller.send(b"%d" % i)
            if i == 25:
                assert driver.lane is None and pipe.lane_credit == 0 and pipe.lane_kept == 0
            echo.send(echo.recv())
            assert caller.recv() == b"%d" % i
            assert caller.stats().messages_sent == i + 1
        assert driver.lane is pipe and pipe.lane_kept > 0
        caller.close()
        assert caller.stats().messages_sent == n
