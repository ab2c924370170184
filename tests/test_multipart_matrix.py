"""Every consumer of messages x {single frame, multipart} x {SP, ZMTP} (issue 32).

A ZeroMQ multipart message keeps its frames wherever it goes: every receive form
(``recv``, ``recv_msg``, ``recv_multipart``, ``recv_batch``, their async forms under
trio and asyncio, the Poller, ``request``), devices, ``nanopy cat``, the Spark
source, batch read and sink, and the Coordinator either deliver its frames or
refuse it up front with a nanopy error. Peers are real: libzmq through pyzmq on
``zmtp+tcp://``, NNG through pynng on ``tcp://``. An SP pipe carries one frame per
message, so the SP x multipart cells are the sender's refusal
(:func:`test_sp_endpoints_refuse_multipart_in_every_send_form`) and the device's.

Each receive is tried with the messages already queued (a multipart message first
in a batch and behind others) and with the receiver waiting when they arrive (the
direct read of the only pipe).
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import trio
from conftest import wait_until
from peers import pynng_socket

import nanopy
from nanopy.testing import wait_pipes
from nanopy.zmtp import Multipart

zmq = pytest.importorskip("zmq")

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

MakeSocket = Callable[..., nanopy.Socket]
Frames = list[bytes]

SINGLE: list[Frames] = [[b"one"], [b"two" * 100], [b""], [b"x" * 70_000]]
MIXED: list[Frames] = [[b"one"], [b"k", b"v"], [b"a", b"", b"c" * 300], [b"two"],
                       [b"big" * 30_000, b"tail"], [b""], [b"t", b"u", b"v", b"w"]]


def frames_of(body: bytes) -> Frames:
    """A received body as its frames; a single-frame message must be plain bytes."""
    if isinstance(body, Multipart):
        assert len(body.parts) > 1 and bytes(body) == b"".join(body.parts)
        return list(body.parts)
    assert body.__class__ is bytes, type(body)
    return [body]


# -- the peers ----------------------------------------------------------------------------
@dataclass
class Link:
    """A nanopy socket and a real peer sending it messages."""

    wire: str  # "sp" (pynng on tcp://) or "zmtp" (pyzmq on zmtp+tcp://)
    sock: nanopy.Socket
    send: Callable[[Frames], None]
    messages: list[Frames]


@pytest.fixture
def zctx() -> Iterator[Any]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def zsocket(zctx: Any, kind: int) -> Any:
    sock = zctx.socket(kind)
    sock.linger = 0
    sock.rcvtimeo = sock.sndtimeo = 10_000
    return sock


def zmtp_pull(make_socket: MakeSocket, zctx: Any, protocol: str = "pull", **options: Any) -> tuple[nanopy.Socket, Any]:
    """A nanopy socket bound on zmtp+tcp with a libzmq peer (PUSH, or PUB for SUB) connected."""
    sock = make_socket(protocol, recv_timeout=10, **options)
    url = sock.bind("zmtp+tcp://127.0.0.1:0").url
    peer = zsocket(zctx, {"pull": zmq.PUSH, "sub": zmq.PUB, "pair": zmq.PAIR}[protocol])
    peer.connect(url.removeprefix("zmtp+"))
    wait_pipes(sock)
    return sock, peer


@pytest.fixture(params=["sp", "zmtp"])
def link(request: pytest.FixtureRequest, make_socket: MakeSocket, zctx: Any) -> Iterator[Link]:
    if request.param == "zmtp":
        pull, zpush = zmtp_pull(make_socket, zctx)
        yield Link("zmtp", pull, zpush.send_multipart, MIXED)
        return
    pull = make_socket("pull", recv_timeout=10)
    url = pull.bind("tcp://127.0.0.1:0").url
    with pynng_socket("Push0", send_timeout=10_000) as push:
        push.dial(url, block=True)
        wait_pipes(pull)

        def send(frames: Frames) -> None:
            (body,) = frames  # an SP pipe has no multipart messages
            push.send(body)

        yield Link("sp", pull, send, SINGLE)


# -- the receive forms ----------------------------------------------------------------------
def by_recv(sock: nanopy.Socket, n: int) -> list[Frames]:
    """recv(); a multipart message is refused, left first in line, and taken with recv_multipart()."""
    out: list[Frames] = []
    while len(out) < n:
        try:
            out.append(frames_of(sock.recv()))
        except nanopy.ProtocolError as exc:
            assert "frames" in str(exc) and "still queued" in str(exc)
            frames = sock.recv_multipart()
            assert len(frames) > 1  # only a multipart message is refused
            out.append(frames)
    return out


def by_recv_msg(sock: nanopy.Socket, n: int) -> list[Frames]:
    out = []
    for _ in range(n):
        msg = sock.recv_msg()
        assert msg.parts == frames_of(msg.body) and msg.pipe is not None
        out.append(msg.parts)
    return out


def by_recv_multipart(sock: nanopy.Socket, n: int) -> list[Frames]:
    return [sock.recv_multipart() for _ in range(n)]


def batches(size: int) -> Callable[[nanopy.Socket, int], list[Frames]]:
    def by_recv_batch(sock: nanopy.Socket, n: int) -> list[Frames]:
        out: list[Frames] = []
        while len(out) < n:
            out.extend(frames_of(body) for body in sock.recv_batch(min(size, n - len(out))))
        return out

    return by_recv_batch


def by_poller(sock: nanopy.Socket, n: int) -> list[Frames]:
    poller = nanopy.Poller()
    poller.register(sock, nanopy.POLLIN)
    out = []
    while len(out) < n:
        assert poller.poll(timeout=10) == [(sock, nanopy.POLLIN)]
        out.append(sock.recv_msg(timeout=0).parts)
    return out


async def a_recv(sock: nanopy.Socket, n: int) -> list[Frames]:
    out: list[Frames] = []
    while len(out) < n:
        try:
            out.append(frames_of(await sock.arecv()))
        except nanopy.ProtocolError:
            out.append(await sock.arecv_multipart())
    return out


async def a_recv_msg(sock: nanopy.Socket, n: int) -> list[Frames]:
    return [(await sock.arecv_msg()).parts for _ in range(n)]


async def a_recv_multipart(sock: nanopy.Socket, n: int) -> list[Frames]:
    return [await sock.arecv_multipart() for _ in range(n)]


async def a_recv_batch(sock: nanopy.Socket, n: int) -> list[Frames]:
    out: list[Frames] = []
    while len(out) < n:
        out.extend(frames_of(body) for body in await sock.arecv_batch(n - len(out)))
    return out


async def a_poll(sock: nanopy.Socket, n: int) -> list[Frames]:
    poller = nanopy.Poller()
    poller.register(sock, nanopy.POLLIN)
    out = []
    while len(out) < n:
        assert await poller.apoll(timeout=10) == [(sock, nanopy.POLLIN)]
        out.append((await sock.arecv_msg(timeout=0)).parts)
    return out


def in_trio(fn: Callable[..., Any]) -> Callable[[nanopy.Socket, int], list[Frames]]:
    return lambda sock, n: trio.run(fn, sock, n)


def in_asyncio(fn: Callable[..., Any]) -> Callable[[nanopy.Socket, int], list[Frames]]:
    return lambda sock, n: asyncio.run(fn(sock, n))


CONSUMERS: dict[str, Callable[[nanopy.Socket, int], list[Frames]]] = {
    "recv": by_recv,
    "recv_msg": by_recv_msg,
    "recv_multipart": by_recv_multipart,
    "recv_batch-1": batches(1),
    "recv_batch-64": batches(64),
    "poller": by_poller,
    **{f"{fn.__name__.replace('a_', 'a')}-trio": in_trio(fn)
       for fn in (a_recv, a_recv_msg, a_recv_multipart, a_recv_batch, a_poll)},
    **{f"{fn.__name__.replace('a_', 'a')}-asyncio": in_asyncio(fn)
       for fn in (a_recv, a_recv_msg, a_recv_multipart, a_recv_batch, a_poll)},
}


def receiving(sock: nanopy.Socket) -> bool:
    """A receiver is waiting on ``sock`` (parked, or reading its only pipe itself)."""
    driver = sock._driver
    return bool(driver.direct.users or driver.recv_q.waiters or driver.watchers)


@pytest.mark.parametrize("when", ["queued", "waiting"])
@pytest.mark.parametrize("consumer", list(CONSUMERS))
def test_every_receive_form_keeps_the_frames(link: Link, consumer: str, when: str) -> None:
    receive = CONSUMERS[consumer]
    n = len(link.messages)
    if when == "queued":  # all sent first: multipart messages first in a batch and behind others
        for frames in link.messages:
            link.send(frames)
        wait_until(lambda: link.sock._driver.readable(), 10, "the first message")
        got = receive(link.sock, n)
    else:  # the receiver waits; each message arrives while it does
        result: list[list[Frames]] = []
        thread = threading.Thread(target=lambda: result.append(receive(link.sock, n)), daemon=True)
        thread.start()
        for frames in link.messages:
            wait_until(lambda: receiving(link.sock) or not thread.is_alive(), 10, "a waiting receiver")
            link.send(frames)
        thread.join(30)
        assert result, "the receiver did not finish"
        got = result[0]
    assert got == link.messages
    with pytest.raises(nanopy.Timeout):  # nothing more, nothing duplicated
        link.sock.recv_msg(timeout=0)


def test_recv_batch_never_raises_on_a_multipart_message_first_or_not(make_socket: MakeSocket, zctx: Any) -> None:
    """The issue's case: recv() refuses it and leaves it first; recv_batch() then returns it."""
    pull, zpush = zmtp_pull(make_socket, zctx)
    zpush.send_multipart([b"k", b"v"])
    zpush.send(b"plain")
    zpush.send_multipart([b"k2", b"v2"])
    wait_until(lambda: pull._driver.readable(), 10)
    with pytest.raises(nanopy.ProtocolError, match="recv_batch"):
        pull.recv()
    got: list[bytes] = []
    while len(got) < 3:
        got += pull.recv_batch(10)
    assert [frames_of(b) for b in got] == [[b"k", b"v"], [b"plain"], [b"k2", b"v2"]]
    assert isinstance(got[0], Multipart) and isinstance(got[2], Multipart)


@pytest.mark.parametrize("protocol", ["sub", "pair"])
def test_sub_and_pair_receive_frames(make_socket: MakeSocket, zctx: Any, protocol: str) -> None:
    """SUB filters a multipart message on its bytes (the first frame first) and keeps its frames."""
    sock, peer = zmtp_pull(make_socket, zctx, protocol)
    if protocol == "sub":
        sock.subscribe(b"top")
        wait_until(lambda: _delivered(peer, sock), 10, "the subscription at the publisher")
    messages = [[b"topic", b"body"], [b"top"], [b"other", b"x"], [b"top", b"", b"z"]]
    for frames in messages:
        peer.send_multipart(frames)
    wanted = [m for m in messages if protocol == "pair" or b"".join(m).startswith(b"top")]
    got: list[Frames] = []
    while len(got) < len(wanted):
        got += [f for f in map(frames_of, sock.recv_batch(8)) if f != [b"top-probe"]]  # (late probes)
    assert got == wanted


def _delivered(pub: Any, sub: nanopy.Socket) -> bool:
    """Publish a probe until the SUB gets one (the subscription travels asynchronously)."""
    pub.send(b"top-probe")
    try:
        return sub.recv(timeout=0.05) == b"top-probe"
    except nanopy.Timeout:
        return False


def test_requests_and_replies_keep_frames(make_socket: MakeSocket, zctx: Any) -> None:
    """REQ: request() and recv_msg() give a multipart reply as a Multipart; REP: a
    multipart request's frames, and a multipart reply, reach a libzmq REQ."""
    router = zsocket(zctx, zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    req = make_socket("req", recv_timeout=10)
    req.connect(f"zmtp+tcp://127.0.0.1:{port}")
    wait_pipes(req)
    for reply in ([b"r1", b"r2"], [b"single"]):
        answer: list[bytes] = []
        asker = threading.Thread(target=lambda: answer.append(req.request(Multipart([b"q1", b"q2"]))))
        asker.start()
        identity, empty, *body = router.recv_multipart()
        assert body == [b"q1", b"q2"]
        router.send_multipart([identity, empty, *reply])
        asker.join(10)
        assert frames_of(answer[0]) == reply
    req.send(b"classic")
    identity, empty, _ = router.recv_multipart()
    router.send_multipart([identity, empty, b"a", b"b"])
    with pytest.raises(nanopy.ProtocolError):
        req.recv()
    assert req.recv_msg().parts == [b"a", b"b"]

    rep = make_socket("rep", recv_timeout=10)
    url = rep.bind("zmtp+tcp://127.0.0.1:0").url
    zreq = zsocket(zctx, zmq.REQ)
    zreq.connect(url.removeprefix("zmtp+"))
    zreq.send_multipart([b"m", b"n"])
    msg = rep.recv_msg()
    assert msg.parts == [b"m", b"n"]
    msg.reply(Multipart([b"M", b"N"]))
    assert zreq.recv_multipart() == [b"M", b"N"]
    zreq.send_multipart([b"p", b"q"])
    assert rep.recv_batch(4) == [Multipart([b"p", b"q"])]
    rep.send(b"answered")  # the classic reply still answers a request taken by recv_batch
    assert zreq.recv_multipart() == [b"answered"]


def test_sp_endpoints_refuse_multipart_in_every_send_form(make_socket: MakeSocket) -> None:
    """The SP x multipart column: nothing joins frames; every send form says why."""
    push = make_socket("push", connect="tcp://127.0.0.1:1")
    frames = [b"a", b"b"]
    for send in (lambda: push.send_multipart(frames), lambda: push.send(Multipart(frames)),
                 lambda: push.send_msg(nanopy.Message(Multipart(frames))),
                 lambda: trio.run(push.asend_multipart, frames),
                 lambda: asyncio.run(push.asend_msg(nanopy.Message(Multipart(frames))))):
        with pytest.raises(nanopy.ProtocolError, match="SP pipes carry one frame"):
            send()
    req = make_socket("req", connect="tcp://127.0.0.1:1")
    with pytest.raises(nanopy.ProtocolError, match="SP pipes carry one frame"):
        req.request(Multipart(frames), timeout=1)


# -- devices ---------------------------------------------------------------------------------
def run_device(a: nanopy.Socket, b: nanopy.Socket) -> threading.Thread:
    thread = threading.Thread(target=nanopy.device, args=(a, b), daemon=True)
    thread.start()
    return thread


def test_device_between_zmtp_sockets_keeps_frames(make_socket: MakeSocket, zctx: Any) -> None:
    """libzmq PUSH -> raw PULL (zmtp+tcp) -> device -> raw PUSH (zmtp+ipc) -> libzmq PULL."""
    front = make_socket("pull", raw=True)
    back = make_socket("push", raw=True)
    front_url = front.bind("zmtp+tcp://127.0.0.1:0").url
    back_url = back.bind(f"zmtp+ipc:///tmp/npmp-{os.getpid()}.ipc").url
    zpush, zpull = zsocket(zctx, zmq.PUSH), zsocket(zctx, zmq.PULL)
    zpush.connect(front_url.removeprefix("zmtp+"))
    zpull.connect(back_url.removeprefix("zmtp+"))
    wait_pipes(front)
    wait_pipes(back)
    dev = run_device(front, back)
    for frames in MIXED:
        zpush.send_multipart(frames)
    assert [zpull.recv_multipart() for _ in MIXED] == MIXED
    with pytest.raises(nanopy.AddressError, match="would break a running device"):
        back.connect("tcp://127.0.0.1:1")  # an SP pipe there could not carry them
    assert [ep.url for ep in back.endpoints] == [back_url]
    front.close()
    dev.join(10)
    assert not dev.is_alive()


def test_forwarder_device_between_libzmq_pub_and_sub_keeps_frames(make_socket: MakeSocket, zctx: Any) -> None:
    """libzmq PUB -> raw SUB (subscribed to everything) -> device -> raw PUB -> libzmq SUB."""
    front = make_socket("sub", raw=True, recv_timeout=10)
    back = make_socket("pub", raw=True)
    zpub, zsub = zsocket(zctx, zmq.PUB), zsocket(zctx, zmq.SUB)
    zpub.connect(front.bind("zmtp+tcp://127.0.0.1:0").url.removeprefix("zmtp+"))
    zsub.connect(back.bind("zmtp+tcp://127.0.0.1:0").url.removeprefix("zmtp+"))
    zsub.setsockopt(zmq.SUBSCRIBE, b"t")
    wait_pipes(front)
    wait_pipes(back)
    dev = run_device(front, back)

    def through() -> bool:  # both subscriptions have reached their publishers
        zpub.send(b"t-probe")
        try:
            return zsub.recv(zmq.NOBLOCK) == b"t-probe"
        except zmq.Again:
            return False

    wait_until(through, 10, "a probe through the device")
    messages = [[b"t1", b"body"], [b"other", b"x"], [b"t2"], [b"t3", b"", b"z"]]
    for frames in messages:
        zpub.send_multipart(frames)
    got: list[Frames] = []
    while len(got) < 3:
        frames = zsub.recv_multipart()
        if frames != [b"t-probe"]:  # (probes still on their way)
            got.append(frames)
    assert got == [m for m in messages if m[0].startswith(b"t")]
    front.close()
    dev.join(10)
    assert not dev.is_alive()


def test_device_between_sp_sockets(make_socket: MakeSocket) -> None:
    front = make_socket("pull", raw=True)
    back = make_socket("push", raw=True)
    front_url = front.bind("tcp://127.0.0.1:0").url
    back_url = back.bind("tcp://127.0.0.1:0").url
    with pynng_socket("Push0", send_timeout=10_000) as push, pynng_socket("Pull0", recv_timeout=10_000) as pull:
        push.dial(front_url, block=True)
        pull.dial(back_url, block=True)
        wait_pipes(back)
        dev = run_device(front, back)
        for (body,) in SINGLE:
            push.send(body)
        assert [pull.recv_msg().bytes for _ in SINGLE] == [f[0] for f in SINGLE]
        with pytest.raises(nanopy.AddressError, match="would break a running device"):
            front.bind("zmtp+tcp://127.0.0.1:0")  # multipart messages could come in there
        front.close()
        dev.join(10)
        assert not dev.is_alive()


def test_device_from_zmtp_to_sp_is_refused_when_built(make_socket: MakeSocket) -> None:
    front = make_socket("pull", raw=True, bind="zmtp+tcp://127.0.0.1:0")
    back = make_socket("push", raw=True, bind="tcp://127.0.0.1:0")
    with pytest.raises(nanopy.ProtocolError, match="SP pipe that carries one frame per message"):
        nanopy.device(front, back)
    with pytest.raises(nanopy.ProtocolError, match="frames would be lost"):
        trio.run(nanopy.adevice, front, back)
    # SP -> ZMTP loses nothing (single frames fit anywhere): only the other way is refused.
    sub = make_socket("sub", raw=True, bind="tcp://127.0.0.1:0")
    pub = make_socket("pub", raw=True, bind="zmtp+tcp://127.0.0.1:0")
    dev = run_device(sub, pub)
    sub.close()
    dev.join(10)
    assert not dev.is_alive()
    # Raw REQ/REP headers have no ZeroMQ form: refused at bind, naming what works.
    with pytest.raises(nanopy.AddressError, match="raw pair, push, pull, pub, sub"):
        make_socket("rep", raw=True).bind("zmtp+tcp://127.0.0.1:0")


# -- nanopy cat --------------------------------------------------------------------------------
# What each output format prints for MIXED_CAT (a single-frame message as nanocat would).
MIXED_CAT: list[Frames] = [[b"one"], [b"k\t", b"v\n"], [b"", b"x"]]
CAT_OUTPUT = {
    "raw": b"onek\tv\nx",
    "ascii": b"one\nk.\tv.\n\tx\n",
    "quoted": b'"one"\n"k\\x09" "v\\n"\n"" "x"\n',
    "hex": b'"\\x6f\\x6e\\x65"\n"\\x6b\\x09" "\\x76\\x0a"\n"" "\\x78"\n',
    "msgpack": b"\xc4\x03one" + b"\x92\xc4\x02k\t\xc4\x02v\n" + b"\x92\xc4\x00\xc4\x01x",
    "no": b"",
}


@pytest.mark.parametrize("fmt", list(CAT_OUTPUT))
@pytest.mark.parametrize("wire", ["sp", "zmtp"])
def test_nanopy_cat_prints_one_record_per_message(zctx: Any, fmt: str, wire: str) -> None:
    from nanopy._cli.cat import Cat, parse

    out = io.BytesIO()
    if wire == "zmtp":
        zpush = zsocket(zctx, zmq.PUSH)
        port = zpush.bind_to_random_port("tcp://127.0.0.1")
        url, messages = f"zmtp+tcp://127.0.0.1:{port}", MIXED_CAT
        send: Callable[[Frames], None] = zpush.send_multipart
        expected = CAT_OUTPUT[fmt]
    else:
        url, messages = "tcp://127.0.0.1:0", [[b"one"], [b"k\t"]]
    cat = Cat(parse(["--pull", "--connect" if wire == "zmtp" else "--bind", url, "--recv-timeout", "1",
                     "--format", fmt]), out)
    try:
        cat.open()
        if wire == "sp":
            from nanopy._cli.formats import FORMATTERS

            ctx = pynng_socket("Push0", send_timeout=10_000)
            push = ctx.__enter__()
            push.dial(cat.sock.endpoints[0].url, block=True)
            send = lambda frames: push.send(frames[0])  # noqa: E731
            expected = b"".join(FORMATTERS[fmt](f[0]) for f in messages)
        wait_pipes(cat.sock)
        for frames in messages:
            send(frames)
        cat.run()  # prints until --recv-timeout passes without a message
    finally:
        cat.close(linger=0)
        if wire == "sp":
            ctx.__exit__(None, None, None)
    assert out.getvalue() == expected


def test_nanopy_cat_reply_loop_answers_a_multipart_request(zctx: Any) -> None:
    """REP with --data: a multipart request is printed as one record and answered."""
    import subprocess

    zreq = zsocket(zctx, zmq.REQ)
    port = zreq.bind_to_random_port("tcp://127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nanopy", "cat", "--rep", "--connect", f"zmtp+tcp://127.0.0.1:{port}",
         "--data", "pong", "--quoted"], stdout=subprocess.PIPE)
    try:
        zreq.send_multipart([b"pi", b"ng"])
        assert zreq.recv_multipart() == [b"pong"]
        assert proc.stdout is not None
        assert proc.stdout.readline() == b'"pi" "ng"\n'
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


# -- Spark: the Coordinator and the sink's checks (no session needed) ---------------------------
def test_coordinator_refuses_a_zmtp_bind_up_front() -> None:
    pytest.importorskip("pyspark")
    from nanopy.spark import Coordinator

    with pytest.raises(nanopy.AddressError, match="tasks speaking single-frame SP messages"):
        Coordinator(range(3), bind="zmtp+tcp://127.0.0.1:0", progress=False)


# -- Spark: rows from frames, without a session (fast) --------------------------------------
def test_rows_keep_frames_and_kafka_takes_first_and_last() -> None:
    pa = pytest.importorskip("pyarrow")
    from nanopy.spark._rows import PARTS_TYPE, full_rows, make_batch, to_kafka

    schema = pa.schema([("payload", pa.binary()), ("topic", pa.string()),
                        ("received", pa.timestamp("us", tz="UTC")), ("seq", pa.int64()),
                        ("parts", PARTS_TYPE)])
    bodies = [b"one", Multipart([b"k", b"v"]), Multipart([b"a", b"", b"c"]), b"", Multipart([b"t", b"u"])]
    stored = make_batch(10, bodies, 1.5e9, [b"a", b"k"], schema)
    # The spool keeps a multipart message's frames once: payload null there.
    assert stored.column("payload").to_pylist() == [b"one", None, None, b"", None]
    for batch in (stored, stored.slice(1)):  # (a spool read cuts batches by position)
        first = 5 - batch.num_rows
        rows = full_rows(batch).to_pylist()
        assert [r["payload"] for r in rows] == [bytes(b) for b in bodies][first:]
        assert [r["parts"] for r in rows] == [list(b.parts) if isinstance(b, Multipart) else None
                                              for b in bodies][first:]
        assert [r["seq"] for r in rows] == list(range(11 + first, 16))
        # Subscriptions match a multipart message's bytes, as the SUB socket does.
        assert [r["topic"] for r in rows] == [None, "k", "a", None, None][first:]
        kafka = to_kafka(batch).to_pylist()
        assert [(r["key"], r["value"]) for r in kafka] == [
            (None, b"one"), (b"k", b"v"), (b"a", b"c"), (None, b""), (b"t", b"u")][first:]
        assert [r["offset"] for r in kafka] == list(range(11 + first, 16))
    # No zmtp+ URL: the messages are not inspected, and nothing is multipart.
    plain = make_batch(0, [b"x", b"y"], 1.5e9, [], schema, multipart=False)
    assert plain.column("parts").null_count == 2 and full_rows(plain) is plain


def test_a_message_no_row_can_hold_is_dropped_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    pa = pytest.importorskip("pyarrow")
    from nanopy.spark._rows import OVERSIZED, UNREPRESENTABLE, DropLog, build_or_drop

    drops = DropLog("zmtp+tcp://feed:1", interval=3600)
    caplog.set_level("WARNING", "nanopy.spark")
    # (an int stands for whatever Arrow cannot make a binary value of)
    kept, made = build_or_drop([b"ok", 5, b"ok2"], lambda group: pa.array(group, pa.binary()), drops)
    assert kept == [b"ok", b"ok2"] and made.to_pylist() == kept
    assert drops.keep([b"a" * 10, Multipart([b"b" * 6, b"c" * 6]), b"d"], 11) == [b"a" * 10, b"d"]
    assert drops.keep([b"e" * 50], 11) == []
    assert drops.snapshot() == {UNREPRESENTABLE: 1, OVERSIZED: 2}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # once per reason within the interval, whatever the count
    assert "(oversized)" in lines[1] and "recvMaxSize=11" in lines[1] and "zmtp+tcp://feed:1" in lines[1]


def test_spool_files_without_parts_still_read(tmp_path: Any) -> None:
    """A spool written before the parts column existed is read with parts null."""
    pa = pytest.importorskip("pyarrow")
    from nanopy.spark._rows import PARTS_TYPE, make_batch
    from nanopy.spark._spool import Spool

    old = pa.schema([("payload", pa.binary()), ("topic", pa.string()),
                     ("received", pa.timestamp("us", tz="UTC")), ("seq", pa.int64())])
    spool = Spool(str(tmp_path / "spool"))
    spool.prepare()
    spool.write(0, 2, make_batch(0, [b"a", b"b"], 1.5e9, [], old))
    (got,) = spool.read(0, 2, old.append(pa.field("parts", PARTS_TYPE)))
    assert got.column("payload").to_pylist() == [b"a", b"b"] and got.column("parts").null_count == 2


def test_receiver_spools_zmtp_frames_and_checks_zmtp_urls(tmp_path: Any, zctx: Any) -> None:
    """The source's receiver behind a libzmq PUSH: every message with its frames, a
    multipart message first in line included; an oversized one dropped and counted."""
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from nanopy.spark import _options as opt
    from nanopy.spark._receiver import Limits, Receiver
    from nanopy.spark._rows import full_rows
    from nanopy.spark._source import _source_schema, arrow_schema
    from nanopy.spark._spool import Spool

    for url, error in (("zmtp+tcp://127.0.0.1", "has no valid port"), ("zmtp+tcp://127.0.0.1:0", "port 0 is out"),
                       ("zmtp+tcp://*:5555", "needs the producer's host name"),
                       ("zmtp+tcp://no-such-host.invalid:5555", "cannot resolve host"),
                       ("zmtp+ipc://", "ipc needs a path")):
        with pytest.raises(opt.SourceOptionError, match=error):
            opt.check_addresses([url], "connect", "source")
    zpush = zsocket(zctx, zmq.PUSH)
    port = zpush.bind_to_random_port("tcp://127.0.0.1")
    options = {"url": f"zmtp+tcp://127.0.0.1:{port}", "recvmaxsize": "1000"}
    schema = arrow_schema(_source_schema())
    spool = Spool(str(tmp_path / "spool"))
    rx = Receiver(options, 0, spool, schema, Limits(options))
    try:
        zpush.send_multipart([b"first", b"multi"])  # the first message of the first batch
        zpush.send_multipart([b"too", b"big" * 400])  # over recvMaxSize: dropped, counted
        for frames in MIXED[:4]:
            zpush.send_multipart(frames)
        assert rx.wait_past(4, 20) == 5
        rows = pa.Table.from_batches([full_rows(b) for b in spool.read(0, 5, schema)]).to_pylist()
        wanted = [[b"first", b"multi"], *MIXED[:4]]
        assert [r["parts"] or [r["payload"]] for r in rows] == wanted
        assert [r["payload"] for r in rows] == [b"".join(f) for f in wanted]
        metrics = rx.metrics()
        assert metrics["multipart"] == 3 and metrics["droppedByReason"] == {"oversized": 1}
        assert metrics["oversized"] == 1 and metrics["received"] == 5
    finally:
        rx.close()


# -- Spark: source, batch read and sink with a real session -------------------------------------
@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    import shutil

    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("Spark needs Java (17) on PATH or JAVA_HOME")
    import nanopy.spark

    session = nanopy.spark.local_session("local[2,3]", "nanopy-tests")  # (test_spark.py's, if it runs too)
    yield session
    session.stop()


def zmtp_messages(n: int, tag: bytes = b"z") -> list[Frames]:
    """One in three single-frame; the others of two or three frames, an empty one among them."""
    return [[tag + b"%05d" % i] if i % 3 == 0 else [tag + b"%05d" % i, b"", b"v%d" % i] if i % 3 == 1
            else [tag + b"%05d" % i, b"w" * (i % 50)] for i in range(n)]


def as_body(frames: Frames) -> bytes:
    return frames[0] if len(frames) == 1 else Multipart(frames)


def sender(send: Callable[[Frames], Any], messages: list[Frames]) -> threading.Thread:
    """Send ``messages`` in a thread (a producer's send waits until the source connects)."""
    thread = threading.Thread(target=lambda: [send(m) for m in messages], daemon=True)
    thread.start()
    return thread


class RowCollector:
    """A foreachBatch sink (runs in this process) keeping every row's columns."""

    def __init__(self, goal: int) -> None:
        self.goal = goal
        self.rows: list[dict[str, Any]] = []
        self.reached = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [r.asDict() for r in df.collect()]
        with self.lock:
            self.rows.extend(rows)
            if len(self.rows) >= self.goal:
                self.reached.set()


def latest_offsets(query: Any) -> list[dict[str, Any]]:
    import json

    out = []
    for p in query.recentProgress:
        raw = p["sources"][0].get("latestOffset")
        if raw:
            out.append(json.loads(raw) if isinstance(raw, str) else raw)
    return out


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_spark_source_maps_frames_to_columns_from_zmtp_and_sp_peers(spark: Any, tmp_path: Any, zctx: Any) -> None:
    """One query on a libzmq PUSH (zmtp+tcp) and an NNG PUSH (tcp): single-frame rows
    have parts null, multipart rows every frame (payload: the frames joined); an
    oversized multipart message is dropped and counted by reason; the stream goes on."""
    from peers import free_tcp_url

    n = 600
    zpush = zsocket(zctx, zmq.PUSH)
    zpush.sndtimeo = 120_000
    zurl = f"zmtp+tcp://127.0.0.1:{zpush.bind_to_random_port('tcp://127.0.0.1')}"
    zmtp = zmtp_messages(n)
    zmtp.insert(n // 2, [b"zbig", b"x" * 5000])  # over recvMaxSize=4096: dropped, counted
    sp_url = free_tcp_url()
    sp = [[b"s%05d" % i] for i in range(n)]
    sink = RowCollector(2 * n)
    with pynng_socket("Push0", listen=sp_url, send_timeout=120_000) as push:
        query = (spark.readStream.format("nanopy").option("urls", f"{zurl},{sp_url}")
                 .option("recvMaxSize", "4096").load()
                 .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(processingTime="0 seconds").start())
        try:
            threads = [sender(zpush.send_multipart, zmtp), sender(lambda f: push.send(f[0]), sp)]
            assert sink.reached.wait(180), f"{len(sink.rows)} of {2 * n} rows"
            for thread in threads:
                thread.join(30)
            wait_until(lambda: any(m.get("received") == 2 * n for m in latest_offsets(query)), 60,
                       "a progress report with every message")
            metrics = next(m for m in latest_offsets(query) if m.get("received") == 2 * n)
        finally:
            query.stop()
    assert sorted(r["seq"] for r in sink.rows) == list(range(1, 2 * n + 1))
    got = {bytes(r["payload"][:6]): r for r in sink.rows}
    for frames in [m for m in zmtp if m[0] != b"zbig"] + sp:
        row = got[frames[0][:6]]
        assert bytes(row["payload"]) == b"".join(frames)
        assert (None if len(frames) == 1 else [bytes(p) for p in row["parts"]]) == (
            None if len(frames) == 1 else frames)
        if len(frames) == 1:
            assert row["parts"] is None
    assert metrics["multipart"] == sum(len(m) > 1 for m in zmtp) - 1
    assert metrics["droppedByReason"] == {"oversized": 1} and metrics["oversized"] == 1


@pytest.mark.spark
def test_spark_batch_read_kafka_schema_takes_first_and_last_frame(spark: Any, zctx: Any) -> None:
    zpush = zsocket(zctx, zmq.PUSH)
    zpush.sndtimeo = 120_000
    url = f"zmtp+tcp://127.0.0.1:{zpush.bind_to_random_port('tcp://127.0.0.1')}"
    messages = zmtp_messages(300)
    thread = sender(zpush.send_multipart, messages)
    rows = (spark.read.format("nanopy").option("url", url).option("schema", "kafka")
            .option("count", "300").load().collect())
    thread.join(30)
    got = sorted((bytes(r.value if r.key is None else r.key), r.key is None, bytes(r.value)) for r in rows)
    assert got == sorted((m[0], len(m) == 1, m[-1]) for m in messages)
    assert sorted(r.offset for r in rows) == list(range(1, 301))


@pytest.mark.spark
def test_spark_sink_sends_frames_to_zmtp_and_refuses_them_for_sp_up_front(spark: Any, zctx: Any) -> None:
    from nanopy.spark import split_tag

    zpull = zsocket(zctx, zmq.PULL)
    url = f"zmtp+tcp://127.0.0.1:{zpull.bind_to_random_port('tcp://127.0.0.1')}"
    df = spark.createDataFrame(
        [(b"single", None), (b"ignored", [b"a", b"b"]), (None, [b"c", b"", b"d"]), (b"empty", [])],
        "payload binary, parts array<binary>").coalesce(1)
    df.write.format("nanopy").option("url", url).mode("append").save()
    got = [split_tag(as_body(zpull.recv_multipart()))[0] for _ in range(4)]
    assert [frames_of(b) for b in got] == [[b"single"], [b"a", b"b"], [b"c", b"", b"d"], [b"empty"]]
    # Explicitly one column: its bytes, as single frames (a multipart row's payload as given).
    df.write.format("nanopy").option("url", url).option("column", "payload").option("tag", "false") \
        .mode("append").save()
    assert [zpull.recv_multipart() for _ in range(3)] == [[b"single"], [b"ignored"], [b"empty"]]
    with nanopy.Socket("pull", bind="tcp://127.0.0.1:0") as pull:
        sp_url = pull.endpoints[0].url
        for options, text in (({}, "the DataFrame's 'parts' column (ZeroMQ frames"),
                              ({"column": "parts"}, '.option("column", \'parts\') sends multipart')):
            with pytest.raises(Exception) as excinfo:
                df.write.format("nanopy").option("url", sp_url).options(**options).mode("append").save()
            assert any(text in line and "carries one frame per message" in line
                       for line in str(excinfo.value).splitlines()), str(excinfo.value)[:2000]
        assert pull.stats().messages_received == 0


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_spark_source_to_sink_keeps_frames_end_to_end(spark: Any, tmp_path: Any, zctx: Any) -> None:
    """libzmq PUSH -> source (zmtp+tcp) -> sink (zmtp+tcp) -> libzmq PULL: every
    message arrives with its frames (the sink's tag after them)."""
    from nanopy.spark import Deduplicator

    n = 400
    zpush, zpull = zsocket(zctx, zmq.PUSH), zsocket(zctx, zmq.PULL)
    zpush.sndtimeo = 120_000
    zpull.rcvtimeo = 120_000
    src = f"zmtp+tcp://127.0.0.1:{zpush.bind_to_random_port('tcp://127.0.0.1')}"
    dst = f"zmtp+tcp://127.0.0.1:{zpull.bind_to_random_port('tcp://127.0.0.1')}"
    messages = zmtp_messages(n)
    query = (spark.readStream.format("nanopy").option("url", src).load()
             .writeStream.format("nanopy").option("url", dst)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="0 seconds").start())
    try:
        thread = sender(zpush.send_multipart, messages)
        dedup = Deduplicator()
        got: list[Frames] = []
        while len(got) < n:
            body = dedup.accept(as_body(zpull.recv_multipart()))
            if body is not None:
                got.append(frames_of(body))
        thread.join(30)
    finally:
        query.stop()
    assert sorted(got) == sorted(messages)
