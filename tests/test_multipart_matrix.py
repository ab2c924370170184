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
    return bool(driver._direct_users or driver.recv_q.waiters or driver.watchers)


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
    assert batches(8)(sock, len(wanted)) == wanted


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
