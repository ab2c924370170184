"""Hostile ZMTP input closes only the pipe it came on; the codec in isolation."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nanopy
from nanopy.core.errors import MessageTooLarge, RemoteProtocolError
from nanopy.testing import wait_pipes
from nanopy.transports.zmtp import _codec as codec

MakeSocket = Callable[..., nanopy.Socket]


def greeting(mechanism: bytes = b"NULL", major: int = 3, minor: int = 1) -> bytes:
    return b"\xff" + bytes(8) + b"\x7f" + bytes((major, minor)) + mechanism.ljust(20, b"\0") + bytes(32)


def ready(socket_type: bytes) -> bytes:
    return codec.encode_command(b"READY", codec.encode_metadata([(b"Socket-Type", socket_type)]))


def read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


class RawPeer:
    """A hand-driven ZMTP peer over a plain socket."""

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("zmtp+tcp://").rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=5)

    def handshake(self, socket_type: bytes = b"PUSH", minor: int = 1) -> None:
        self.sock.sendall(greeting(minor=minor) + ready(socket_type))
        assert read_exact(self.sock, 64)[:10] == greeting()[:10]
        head = read_exact(self.sock, 2)
        assert head[0] == codec.COMMAND
        assert read_exact(self.sock, head[1])[:6] == b"\x05READY"

    def closed_by_peer(self) -> bool:
        """True once the other side closed the connection (reads to the end)."""
        try:
            while self.sock.recv(65536):
                pass
        except ConnectionResetError:
            return True  # (closed with our bytes unread: a reset)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def victim(make_socket: MakeSocket) -> Iterator[tuple[nanopy.Socket, str, Any]]:
    """A nanopy PULL on zmtp+tcp with a well-behaved nanopy PUSH: it must keep working."""
    pull = make_socket("pull", recv_timeout=5, recv_max_size=1024)
    url = pull.bind("zmtp+tcp://127.0.0.1:0").url
    good = make_socket("push")
    good.connect(url)
    wait_pipes(pull)
    yield pull, url, good


def still_works(pull: nanopy.Socket, good: nanopy.Socket, errors: int) -> None:
    wait_until(lambda: pull.stats().protocol_errors >= errors, what=f"{errors} protocol error(s) counted")
    good.send(b"still fine")
    assert pull.recv() == b"still fine"
    # (the hostile peer's pipe ends a moment after its connection does)
    wait_until(lambda: len(pull.pipes) == 1, what="only the good peer's pipe left")


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (b"GET / HTTP/1.1\r\n\r\n" + bytes(60), "not a ZMTP peer"),
        (b"\x00SP\x00\x00\x50\x00\x00" + bytes(60), "speaks SP"),
        (greeting(major=2), "ZMTP 2.x"),
        (greeting(b"PLAIN"), "mechanism mismatch"),
        (greeting() + codec.encode_command(b"HELLO"), "expected READY"),
        (greeting() + b"\x00\x01x", "expected a ZMTP command"),
        (greeting() + ready(b"PULL"), "a ZeroMQ PULL socket is not a valid peer"),
        (greeting() + codec.encode_command(b"READY", b"\x05bogus"), "malformed ZMTP metadata"),
    ],
)
def test_bad_handshakes_close_that_connection_only(
    victim: tuple[nanopy.Socket, str, Any], caplog: pytest.LogCaptureFixture, data: bytes, what: str
) -> None:
    pull, url, good = victim
    peer = RawPeer(url)
    peer.sock.sendall(data)
    assert peer.closed_by_peer()
    peer.close()
    still_works(pull, good, 1)
    assert what in caplog.text


@pytest.mark.parametrize(
    ("frames", "what"),
    [
        (b"\x02" + struct.pack(">Q", 1 << 40), "1099511627776-byte frame"),
        (b"\x02" + struct.pack(">Q", 4096), "recv_max_size is 1024"),
        (b"\x01\xc8" + bytes(200) + b"\x01\xc8" + bytes(200) + b"\x02" + struct.pack(">Q", 700) + bytes(700),
         "multipart message of over 1100 bytes; recv_max_size is 1024"),
        (b"\x08\x00", "reserved flag bits"),
        (codec.encode_command(b"READY"), "READY command after the handshake"),
        (codec.encode_command(b"ERROR", b"\x04oops"), "sent ERROR: oops"),
        (b"\x05\x00", "command frame with the MORE flag"),
        (b"\x01\x01a" + codec.encode_command(b"PING", b"\x00\x00"), "command frame inside a multipart"),
        (b"\x04\x04\x09SUB", "malformed ZMTP command"),
    ],
)
def test_bad_frames_after_the_handshake_close_that_pipe_only(
    victim: tuple[nanopy.Socket, str, Any], caplog: pytest.LogCaptureFixture, frames: bytes, what: str
) -> None:
    pull, url, good = victim
    peer = RawPeer(url)
    peer.handshake()
    wait_pipes(pull, 2)
    peer.sock.sendall(b"\x00\x02ok" + frames)
    assert pull.recv() == b"ok"  # what came before the bad frame is delivered
    assert peer.closed_by_peer()
    peer.close()
    still_works(pull, good, 1)
    assert what in caplog.text


def test_ping_is_answered_with_its_context(victim: tuple[nanopy.Socket, str, Any]) -> None:
    pull, url, good = victim
    peer = RawPeer(url)
    peer.handshake()
    peer.sock.sendall(codec.encode_command(b"PING", b"\x00\x0acontext"))
    pong = codec.encode_command(b"PONG", b"context")
    assert read_exact(peer.sock, len(pong)) == pong
    peer.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(noise=st.lists(st.binary(max_size=40), min_size=1, max_size=6))
def test_random_frames_after_a_good_handshake(victim: tuple[nanopy.Socket, str, Any], noise: list[bytes]) -> None:
    """Whatever follows a good handshake, the socket and its other peer go on."""
    pull, url, good = victim
    peer = RawPeer(url)
    try:
        peer.handshake()
        for chunk in noise:
            peer.sock.sendall(chunk)
    except OSError:
        pass  # already closed on us
    finally:
        peer.close()
    while True:  # drain what the noise delivered as messages
        try:
            pull.recv(timeout=0)
        except nanopy.Timeout:
            break
        except nanopy.ProtocolError:  # a multipart message among them
            pull.recv_msg(timeout=0)
    good.send(b"after the noise")
    got = pull.recv()
    while got != b"after the noise":  # (noise still arriving as messages)
        got = pull.recv_msg().body


@pytest.mark.parametrize("minor", [0, 1])
def test_subscriptions_in_the_peers_dialect(make_socket: MakeSocket, minor: int) -> None:
    """SUB tells a 3.1 publisher with SUBSCRIBE/CANCEL commands and a 3.0 one with
    0x01/0x00 messages; PUB understands both from its subscribers."""
    sub = make_socket("sub")
    sub.subscribe(b"a")
    url = sub.bind("zmtp+tcp://127.0.0.1:0").url
    peer = RawPeer(url)
    peer.handshake(b"PUB", minor)
    told = codec.encode_command(b"SUBSCRIBE", b"a") if minor else b"\x00\x02\x01a"
    assert read_exact(peer.sock, len(told)) == told
    sub.unsubscribe(b"a")
    told = codec.encode_command(b"CANCEL", b"a") if minor else b"\x00\x02\x00a"
    assert read_exact(peer.sock, len(told)) == told
    peer.close()

    pub = make_socket("pub")
    url = pub.bind("zmtp+tcp://127.0.0.1:0").url
    peer = RawPeer(url)
    peer.handshake(b"SUB", minor)
    wait_pipes(pub)
    peer.sock.sendall(codec.encode_command(b"SUBSCRIBE", b"k") if minor else b"\x00\x02\x01k")
    wanted = b"\x00\x04keep"
    got = b""
    for _ in range(500):  # the subscription reaches the PUB a moment after it was sent
        pub.send(b"drop")
        pub.send(b"keep")
        peer.sock.settimeout(0.01)
        try:
            got += peer.sock.recv(4096)
        except TimeoutError:
            continue
        if got:
            break
    peer.sock.settimeout(5)
    got += read_exact(peer.sock, max(0, len(wanted) - len(got)))
    assert got.startswith(wanted) and b"drop" not in got
    peer.close()


# -- the codec alone ------------------------------------------------------------------------
def decoder(limit: int = 0) -> tuple[codec.ZmtpDecoder, list[Any]]:
    seen: list[Any] = []
    dec = codec.ZmtpDecoder(limit, lambda frames: b"|".join(frames), lambda n, d: seen.append((n, d)))
    return dec, seen


@given(
    messages=st.lists(st.lists(st.binary(max_size=600), min_size=1, max_size=4), max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=50), max_size=20),
)
def test_decoder_reassembles_whatever_the_cuts(messages: list[list[bytes]], cuts: list[int]) -> None:
    wire = b"".join(codec.encode_message(m) for m in messages)
    dec, _ = decoder()
    got: list[bytes] = []
    pos = 0
    for cut in cuts:
        got += dec.feed(wire[pos : pos + cut])
        pos += cut
    got += dec.feed(wire[pos:]) if pos < len(wire) else []
    assert got == [b"|".join(m) if len(m) > 1 else m[0] for m in messages]
    assert dec.pending == 0


def test_decoder_refuses_before_buffering() -> None:
    dec, _ = decoder(limit=100)
    with pytest.raises(MessageTooLarge):
        dec.feed(b"\x02" + struct.pack(">Q", 101))
    dec, _ = decoder()
    assert dec.feed(b"\x00\x01a\x08\x00") == [b"a"]  # the good frame first, the error next
    with pytest.raises(RemoteProtocolError):
        dec.feed(b"")


def test_a_zeromq_greeting_on_an_sp_url_is_named() -> None:
    """(libzmq may close before its greeting is read, so this is checked on the parser.)"""
    from nanopy.core.wire import parse_header

    with pytest.raises(RemoteProtocolError, match=r"speaks ZeroMQ \(ZMTP\), not SP.*use a zmtp\+tcp://"):
        parse_header(greeting()[:8], 0x51)


def _ping_burst(count: int) -> bytes:
    return codec.encode_command(b"PING", b"\x00\x00ctx") * count


def test_a_reader_bursting_pings_stays_open_with_pongs(victim: tuple[nanopy.Socket, str, Any]) -> None:
    """PINGs parsed from one read before our PONG could go out are no flood: a peer
    that reads everything may burst 20,000 PINGs and gets PONGs, never a close."""
    pull, url, good = victim
    peer = RawPeer(url)
    peer.handshake()
    pong = codec.encode_command(b"PONG", b"ctx")
    for _ in range(200):
        peer.sock.sendall(_ping_burst(100))
        got = peer.sock.recv(65536)  # at least one PONG per burst comes back
        assert got and got.startswith(pong[:1]), got[:20]
    peer.sock.settimeout(0.3)
    try:
        while peer.sock.recv(65536):
            pass
    except TimeoutError:
        pass  # drained, and still open
    peer.close()
    still_works(pull, good, 0)
    assert pull.stats().protocol_errors == 0


def test_a_peer_pinging_while_reading_nothing_costs_bounded_memory(
    victim: tuple[nanopy.Socket, str, Any],
) -> None:
    """A peer that floods PINGs and never reads our PONGs: past MAX_UNANSWERED_PINGS
    unwritten PONGs no more are queued, so memory stays bounded whatever the rate
    (once the kernel's buffers are full too, the pipe is closed as a flood after
    PONG_PATIENCE); the socket and its other peer go on meanwhile."""
    from faults import rss_bytes

    from nanopy.transports._keepalive import MAX_UNANSWERED_PINGS

    pull, url, good = victim
    host, _, port = url.removeprefix("zmtp+tcp://").rpartition(":")
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (before connect: a small window)
    raw.connect((host, int(port)))
    raw.settimeout(5)
    peer = RawPeer.__new__(RawPeer)
    peer.sock = raw
    peer.handshake()
    wait_pipes(pull, 2)
    (pipe,) = [p for p in pull._driver.pipe_drivers() if p.conn.remote_address.endswith(str(raw.getsockname()[1]))]
    pong = len(codec.encode_command(b"PONG", b"ctx"))
    before = rss_bytes()
    burst = _ping_burst(1000)
    most = 0
    deadline = time.monotonic() + 3
    try:
        while time.monotonic() < deadline:
            raw.sendall(burst)
            most = max(most, len(pipe.control or b""))
    except OSError:
        pass  # closed as a flood: fine too
    assert most <= (MAX_UNANSWERED_PINGS + 2) * pong
    assert rss_bytes() - before < 64 << 20
    good.send(b"during the flood")
    assert pull.recv() == b"during the flood"
    peer.close()
