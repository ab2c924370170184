"""Every protocol's traffic over every registered transport (issue 10, Done means 2).

Empty, one-byte and multi-byte payloads (and SUB topics) for every protocol pair
over tcp, ipc, inproc, ws, wss and tls+tcp, plus NNG (pynng) peers on ws. Every
payload a transport hands a core is checked to be exactly ``bytes`` (the
transport -> core contract, docs/transports.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import bind_url, wait_until
from peers import free_tcp_port, pynng_dial, pynng_peer
from tls_certs import tls_files

import nanopy
from nanopy.testing import wait_pipes
from nanopy.transports import _stream, _ws_conn, inproc

MakeSocket = Callable[..., nanopy.Socket]
ALL_TRANSPORTS = ["tcp", "ipc", "inproc", "ws", "wss", "tls+tcp"]
BODIES = [b"", b"a", b"multi-byte \x00\xff payload" * 50]
TOPICS = [b"", b"a", b"ab"]
PUBLISHED = [b"", b"a", b"ab", b"abc", b"b", b"ba"]
OPTS = {"recv_timeout": 10, "send_timeout": 10}


@pytest.fixture
def payload_classes(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[type]]:
    """The classes of every payload the built-in connections return from receive()."""
    seen: set[type] = set()
    for cls in (_stream.FramedConnection, inproc.InprocConnection, _ws_conn.WsConnection):
        original = cls.receive

        async def receive(self: Any, _original: Any = original) -> list[bytes]:
            payloads = await _original(self)
            seen.update(p.__class__ for p in payloads)
            return payloads

        monkeypatch.setattr(cls, "receive", receive)
    # The engine reads streams with read_nowait (the read role) and inproc hands
    # payloads to a sink from the sender's thread: watch those paths too.
    read_nowait = _stream.StreamConnection.read_nowait

    def seeing_read(self: Any, _original: Any = read_nowait) -> list[bytes] | None:
        payloads = _original(self)
        if payloads:
            seen.update(p.__class__ for p in payloads)
        return payloads  # type: ignore[no-any-return]

    monkeypatch.setattr(_stream.StreamConnection, "read_nowait", seeing_read)
    attach_sink = inproc.InprocConnection.attach_sink

    def seeing_attach(self: Any, sink: Any, paused: Any, _original: Any = attach_sink) -> None:
        def seeing_sink(payloads: list[bytes]) -> Any:
            seen.update(p.__class__ for p in payloads)
            return sink(payloads)

        _original(self, seeing_sink, paused)

    monkeypatch.setattr(inproc.InprocConnection, "attach_sink", seeing_attach)
    yield seen


def _listen(sock: nanopy.Socket, transport: str) -> tuple[str, dict[str, Any]]:
    """Bind ``sock`` on ``transport``; return (url to connect, connect options)."""
    if transport in ("tcp", "ipc", "inproc"):
        return sock.bind(bind_url(transport, "matrix")).url, {}
    if transport == "ws":
        return sock.bind("ws://127.0.0.1:0/matrix").url, {}
    t = tls_files()
    url = "wss://127.0.0.1:0/matrix" if transport == "wss" else "tls+tcp://127.0.0.1:0"
    bound = sock.bind(url, ssl_context=t.server_ctx).url
    return bound.replace("127.0.0.1", "localhost"), {"ssl_context": t.client_ctx}  # the name in the cert


def _pair(make_socket: MakeSocket, transport: str, binder: str, dialer: str) -> tuple[nanopy.Socket, nanopy.Socket]:
    a = make_socket(binder, **OPTS)
    url, opts = _listen(a, transport)
    b = make_socket(dialer, **OPTS)
    b.connect(url, **opts)
    wait_pipes(a)
    wait_pipes(b)
    return a, b


@pytest.fixture(params=ALL_TRANSPORTS)
def any_transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.mark.parametrize(
    ("sender", "receiver"), [("push", "pull"), ("pair", "pair"), ("pair1", "pair1"), ("bus", "bus")]
)
def test_one_way_and_symmetric_protocols(
    make_socket: MakeSocket, any_transport: str, sender: str, receiver: str, payload_classes: set[type]
) -> None:
    a, b = _pair(make_socket, any_transport, receiver, sender)
    _send_bodies(b, a)
    if sender == receiver:  # PAIR and BUS: the other way too
        _send_bodies(a, b)
    assert payload_classes == {bytes}


def _send_bodies(src: nanopy.Socket, dst: nanopy.Socket) -> None:
    for body in BODIES:
        src.send(body)
    assert [dst.recv() for _ in BODIES] == BODIES


@pytest.mark.parametrize(("asker", "answerer"), [("req", "rep"), ("surveyor", "respondent")])
def test_request_reply_protocols(
    make_socket: MakeSocket, any_transport: str, asker: str, answerer: str, payload_classes: set[type]
) -> None:
    server, client = _pair(make_socket, any_transport, answerer, asker)
    for body in BODIES:
        client.send(body)
        assert server.recv() == body
        server.send(body[::-1])
        assert client.recv() == body[::-1]
    assert payload_classes == {bytes}


@pytest.mark.parametrize("topic", TOPICS, ids=["empty-topic", "one-byte-topic", "two-byte-topic"])
def test_pub_sub_topics(make_socket: MakeSocket, any_transport: str, topic: bytes, payload_classes: set[type]) -> None:
    pub, sub = _pair(make_socket, any_transport, "pub", "sub")
    sub.subscribe(topic)
    for body in PUBLISHED:
        pub.send(body)
    pub.send(topic + b"-end")
    expected = [m for m in PUBLISHED if m.startswith(topic)] + [topic + b"-end"]
    assert [sub.recv() for _ in expected] == expected
    assert payload_classes == {bytes}


# -- NNG peers on ws ------------------------------------------------------------------------
NNG_OPTS = {"recv_timeout": 10_000, "send_timeout": 10_000}


@pytest.mark.interop
@pytest.mark.parametrize("topic", TOPICS, ids=["empty-topic", "one-byte-topic", "two-byte-topic"])
@pytest.mark.parametrize("nanopy_listens", [True, False], ids=["nanopy-listens", "nng-listens"])
def test_nng_pub_to_nanopy_sub_on_ws(make_socket: MakeSocket, topic: bytes, nanopy_listens: bool) -> None:
    """The reported case: pynng Pub0 on ws, nanopy SUB with a one-byte subscription."""
    with pynng_peer("Pub0", **NNG_OPTS) as pub:
        sub = make_socket("sub", **OPTS)
        sub.subscribe(topic)
        _attach(sub, pub, nanopy_listens)
        sentinel = topic + b"-sync"
        # PUB drops until NNG's pipe is fully up: resend the sentinel until one arrives.
        wait_until(lambda: pub.send(sentinel) or _got(sub, sentinel), timeout=10, what="the first message")
        _drain(sub, sentinel)
        for body in PUBLISHED:
            pub.send(body)
        pub.send(topic + b"-end")
        expected = [m for m in PUBLISHED if m.startswith(topic)] + [topic + b"-end"]
        assert [sub.recv() for _ in expected] == expected


@pytest.mark.interop
@pytest.mark.parametrize("topic", TOPICS, ids=["empty-topic", "one-byte-topic", "two-byte-topic"])
def test_nanopy_pub_to_nng_sub_on_ws(make_socket: MakeSocket, topic: bytes) -> None:
    with pynng_peer("Sub0", recv_timeout=10_000) as sub:
        sub.subscribe(topic)
        pub = make_socket("pub", **OPTS)
        _attach(pub, sub, nanopy_listens=True)
        for body in PUBLISHED:
            pub.send(body)
        pub.send(topic + b"-end")
        expected = [m for m in PUBLISHED if m.startswith(topic)] + [topic + b"-end"]
        assert [sub.recv_msg().bytes for _ in expected] == expected


@pytest.mark.interop
@pytest.mark.parametrize(
    ("ours", "theirs"),
    [("push", "Pull0"), ("pull", "Push0"), ("req", "Rep0"), ("rep", "Req0"), ("pair1", "Pair1"), ("bus", "Bus0"),
     ("surveyor", "Respondent0"), ("respondent", "Surveyor0")],
)
def test_nng_peers_on_ws_with_every_payload_size(make_socket: MakeSocket, ours: str, theirs: str) -> None:
    with pynng_peer(theirs, **NNG_OPTS) as peer:
        sock = make_socket(ours, **OPTS)
        _attach(sock, peer, nanopy_listens=True)
        for body in BODIES:
            if ours in ("push", "pair1", "bus"):
                sock.send(body)
                assert peer.recv_msg().bytes == body
            if ours in ("pull", "pair1", "bus"):
                peer.send(body)
                assert sock.recv() == body
            if ours in ("req", "surveyor"):
                sock.send(body)
                assert peer.recv_msg().bytes == body
                peer.send(body[::-1])
                assert sock.recv() == body[::-1]
            if ours in ("rep", "respondent"):
                peer.send(body)
                assert sock.recv() == body
                sock.send(body[::-1])
                assert peer.recv_msg().bytes == body[::-1]


def _attach(sock: nanopy.Socket, peer: Any, nanopy_listens: bool) -> None:
    if nanopy_listens:
        pynng_dial(peer, sock.bind("ws://127.0.0.1:0/matrix").url)
    else:
        url = f"ws://127.0.0.1:{free_tcp_port()}/matrix"
        peer.listen(url)
        sock.connect(url)
    wait_pipes(sock)
    wait_until(lambda: len(peer.pipes) == 1, what="pynng sees the pipe")


def _got(sub: nanopy.Socket, sentinel: bytes) -> bool:
    try:
        return sub.recv(timeout=0.05) == sentinel
    except nanopy.Timeout:
        return False


def _drain(sub: nanopy.Socket, sentinel: bytes) -> None:
    """Drop extra copies of the sentinel still in flight."""
    while True:
        try:
            assert sub.recv(timeout=0.2) == sentinel
        except nanopy.Timeout:
            return
