"""Hostile and broken peers on a nanopy listener: each is disconnected (within the
handshake timeout where it stalls), counted in stats().protocol_errors, and disturbs
nobody else -- a good pynng peer on the same listener keeps exchanging messages."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from conftest import wait_until
from peers import pynng_dial, pynng_socket

import nanopy
from nanopy.core.wire import encode_header
from nanopy.testing import ipc_url, wait_pipes

HANDSHAKE_TIMEOUT = 0.5
PUSH_HEADER = encode_header(0x50)  # what a PULL listener expects from its peer
PULL_HEADER = encode_header(0x51)  # what the PULL listener sends at once


@pytest.fixture
def listener() -> Iterator[nanopy.Socket]:
    pull = nanopy.Socket("pull", handshake_timeout=HANDSHAKE_TIMEOUT)
    try:
        yield pull
    finally:
        pull.close(linger=0)


def raw_client(url: str) -> socket.socket:
    if url.startswith("tcp://"):
        host, port = url[len("tcp://") :].rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=5)
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(url[len("ipc://") :])
    return s


def wait_disconnected(s: socket.socket, limit: float) -> tuple[bytes, float]:
    """Read until the server closes; return what it sent and how long that took."""
    t0 = time.monotonic()
    s.settimeout(limit)
    got = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"not disconnected within {limit}s (received {got!r})")
    return got, time.monotonic() - t0


class GoodPeer:
    """A pynng PUSH on the same listener; ``check()`` proves it still gets through."""

    def __init__(self, peer: object, pull: nanopy.Socket) -> None:
        self.peer = peer
        self.pull = pull
        self.n = 0

    def check(self) -> None:
        body = b"good %d" % self.n
        self.n += 1
        self.peer.send(body)  # type: ignore[attr-defined]
        assert self.pull.recv(timeout=5) == body


@pytest.fixture
def good_peer(listener: nanopy.Socket) -> Callable[[str], GoodPeer]:
    peers: list[object] = []
    stack: list[object] = []

    def start(url: str) -> GoodPeer:
        cm = pynng_socket("Push0", send_timeout=5000)
        peer = cm.__enter__()
        stack.append(cm)
        peers.append(peer)
        pynng_dial(peer, url)
        wait_pipes(listener)
        good = GoodPeer(peer, listener)
        good.check()
        return good

    yield start  # type: ignore[misc]
    for cm in stack:
        cm.__exit__(None, None, None)  # type: ignore[attr-defined]


HOSTILE = {
    # name: bytes the client sends (then it waits to be dropped)
    "http-request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "garbage": bytes(range(256)) * 4,
    "wrong-protocol": encode_header(0x10),  # a PAIR talking to a PULL
    "reserved-bytes": b"\x00SP\x00\x00\x50\x01\x01",
    "huge-length": PUSH_HEADER + struct.pack(">Q", 2**63),
    "huge-length-after-a-message": PUSH_HEADER + struct.pack(">Q", 3) + b"abc" + struct.pack(">Q", 2**63),
}


def _bind_beside_good_peer(
    listener: nanopy.Socket, good_peer: Callable[[str], GoodPeer], addr: str
) -> tuple[str, GoodPeer]:
    """Bind ``listener`` at ``addr`` and connect a well-behaved peer to it."""
    url = listener.bind(addr).url
    return url, good_peer(url)


def _wait_one_protocol_error(listener: nanopy.Socket) -> None:
    wait_until(lambda: listener.stats().protocol_errors == 1, what="protocol error counted")


@pytest.mark.interop
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_tcp_client_is_dropped(
    listener: nanopy.Socket, good_peer: Callable[[str], GoodPeer], name: str
) -> None:
    url, good = _bind_beside_good_peer(listener, good_peer, "tcp://127.0.0.1:0")
    with raw_client(url) as s:
        s.sendall(HOSTILE[name])
        got, took = wait_disconnected(s, HANDSHAKE_TIMEOUT + 2)
    assert got == PULL_HEADER  # its header, sent at once, then nothing
    assert took < HANDSHAKE_TIMEOUT + 1
    if name == "huge-length-after-a-message":
        # The complete message before the bad frame is delivered, then the pipe closes.
        assert listener.recv(timeout=5) == b"abc"
    _wait_one_protocol_error(listener)
    good.check()
    assert listener.stats().pipes == 1


@pytest.mark.interop
@pytest.mark.parametrize("sent", [b"", b"\x00SP\x00"], ids=["silent", "half-header"])
def test_stalled_handshake_is_dropped_after_the_timeout(
    listener: nanopy.Socket, good_peer: Callable[[str], GoodPeer], sent: bytes
) -> None:
    url, good = _bind_beside_good_peer(listener, good_peer, "tcp://127.0.0.1:0")
    with raw_client(url) as s:
        s.sendall(sent)
        # Meanwhile the good peer is not held up by the stalled handshake.
        good.check()
        got, took = wait_disconnected(s, HANDSHAKE_TIMEOUT + 2)
    assert got == PULL_HEADER
    assert took < HANDSHAKE_TIMEOUT + 1
    _wait_one_protocol_error(listener)
    good.check()


@pytest.mark.interop
def test_many_hostile_clients_at_once(listener: nanopy.Socket, good_peer: Callable[[str], GoodPeer]) -> None:
    url, good = _bind_beside_good_peer(listener, good_peer, "tcp://127.0.0.1:0")
    clients = [raw_client(url) for _ in range(20)]
    # (Without the one that also carries a valid message: the good peer's
    # checks below expect only their own messages.)
    payloads = [v for k, v in HOSTILE.items() if k != "huge-length-after-a-message"] + [b"", b"\x00S"]
    errors: list[BaseException] = []

    def run(s: socket.socket, data: bytes) -> None:
        try:
            with s:
                s.sendall(data)
                got, took = wait_disconnected(s, HANDSHAKE_TIMEOUT + 3)
                assert got == PULL_HEADER and took < HANDSHAKE_TIMEOUT + 2
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(s, payloads[i % len(payloads)])) for i, s in enumerate(clients)
    ]
    for t in threads:
        t.start()
    for _ in range(10):
        good.check()  # keeps flowing while 20 bad connections are pending
    for t in threads:
        t.join(10)
    assert errors == []
    wait_until(lambda: listener.stats().protocol_errors == 20, what="20 protocol errors")
    good.check()


@pytest.mark.interop
def test_ipc_bad_message_type_is_dropped(listener: nanopy.Socket, good_peer: Callable[[str], GoodPeer]) -> None:
    url, good = _bind_beside_good_peer(listener, good_peer, ipc_url("hostile"))
    with raw_client(url) as s:
        s.sendall(PUSH_HEADER + b"\x01" + struct.pack(">Q", 2) + b"ok" + b"\x02" + struct.pack(">Q", 1) + b"x")
        got, _ = wait_disconnected(s, HANDSHAKE_TIMEOUT + 2)
    assert got == PULL_HEADER
    assert listener.recv(timeout=5) == b"ok"
    _wait_one_protocol_error(listener)
    good.check()


@pytest.mark.interop
def test_ipc_stalled_handshake(listener: nanopy.Socket, good_peer: Callable[[str], GoodPeer]) -> None:
    url, good = _bind_beside_good_peer(listener, good_peer, ipc_url("hostile"))
    with raw_client(url) as s:
        s.sendall(b"\x00SP")
        good.check()
        got, took = wait_disconnected(s, HANDSHAKE_TIMEOUT + 2)
    assert got == PULL_HEADER and took < HANDSHAKE_TIMEOUT + 1
    _wait_one_protocol_error(listener)


def test_port_probe_is_not_a_protocol_error(listener: nanopy.Socket) -> None:
    # Health checks connect and leave: a plain disconnect, no warning, no count.
    url = listener.bind("tcp://127.0.0.1:0").url
    for _ in range(3):
        with raw_client(url) as s:
            assert s.recv(8) == PULL_HEADER
    # A half header and then leaving is a protocol error.
    with raw_client(url) as s:
        s.sendall(b"\x00SP")
        assert s.recv(8) == PULL_HEADER
    wait_until(lambda: listener.stats().protocol_errors == 1, what="half header counted")
    good = nanopy.Socket("push", connect=url)
    try:
        good.send(b"fine", timeout=5)
        assert listener.recv(timeout=5) == b"fine"
    finally:
        good.close()
    assert listener.stats().protocol_errors == 1


def test_peer_that_dies_mid_message(listener: nanopy.Socket) -> None:
    url = listener.bind("tcp://127.0.0.1:0").url
    with raw_client(url) as s:
        s.sendall(PUSH_HEADER + struct.pack(">Q", 1) + b"1" + struct.pack(">Q", 100) + b"partial")
        assert s.recv(8) == PULL_HEADER
        assert listener.recv(timeout=5) == b"1"
    wait_until(lambda: listener.stats().disconnects == 1, what="pipe closed")
    # The partial message is never delivered: its pipe is gone, and it delivered
    # everything it would before going, so nothing can be on its way.
    with pytest.raises(nanopy.Timeout):
        listener.recv(timeout=0)


def test_push_listener_drops_a_peer_that_sends_data() -> None:
    # A PULL peer must not send anything to PUSH: its pipe is closed.
    with nanopy.Socket("push", handshake_timeout=HANDSHAKE_TIMEOUT) as push:
        url = push.bind("tcp://127.0.0.1:0").url
        with raw_client(url) as s:
            s.sendall(encode_header(0x51) + struct.pack(">Q", 1) + b"?")
            got, _ = wait_disconnected(s, 5)
        assert got == encode_header(0x50)
        wait_until(lambda: push.stats().protocol_errors == 1, what="protocol error counted")


def test_dialer_to_a_non_sp_server_retries(make_socket: Callable[..., nanopy.Socket]) -> None:
    # A server that answers with garbage: the dialer drops it and keeps retrying.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(5)
    port = srv.getsockname()[1]
    push = make_socket("push", reconnect_interval=0.02, reconnect_interval_max=0.05)
    push.connect(f"tcp://127.0.0.1:{port}")
    try:
        for _ in range(2):
            conn, _ = srv.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                assert conn.recv(8) == PUSH_HEADER
                conn.settimeout(5)
                try:
                    assert conn.recv(100) == b""  # dropped by the dialer
                except ConnectionResetError:
                    pass  # dropped with our unread bytes still queued: a reset
    finally:
        srv.close()
    assert push.stats().protocol_errors >= 2
    assert push.stats().pipes == 0


def test_dialer_gives_up_on_a_server_that_never_answers(make_socket: Callable[..., nanopy.Socket]) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(5)
    port = srv.getsockname()[1]
    push = make_socket(
        "push", handshake_timeout=0.3, reconnect_interval=0.01, reconnect_interval_max=0.02
    )
    push.connect(f"tcp://127.0.0.1:{port}")
    try:
        conn, _ = srv.accept()
        with conn:
            assert conn.recv(8) == PUSH_HEADER
            t0 = time.monotonic()
            conn.settimeout(5)
            assert conn.recv(100) == b""  # silent server: the dialer hangs up...
            assert 0.2 < time.monotonic() - t0 < 2  # ...after its handshake timeout
        conn2, _ = srv.accept()  # and dials again
        conn2.close()
    finally:
        srv.close()
    wait_until(lambda: push.stats().protocol_errors >= 1, what="timeout counted")
