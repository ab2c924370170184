"""ZMTP 3.1 heartbeats driven by ``dead_peer_timeout`` (issue 25, item 5).

Most tests run a tcp and an ipc pipe side by side on one nanopy socket (one wait
covers both transports):

* a peer that completes the handshake and then says nothing is found by our PINGs
  (its kernel still answers TCP, so only the PINGs can tell) and counted as dead;
* a peer's PING TTL is honoured: the pipe ends once that peer is silent that long;
* libzmq answers our PINGs (an idle pipe outlives several timeouts), and with its
  own heartbeats on (ZMQ_HEARTBEAT_IVL/TTL) it keeps a pipe alive through our PONGs;
* no PINGs when the option is None, nor to a ZMTP 3.0 peer (3.0 has no PING);
* a paused pipe (full queue) keeps PINGing, so libzmq does not drop it (tcp only);
* so does a pipe that only receives: libzmq times us out by our TTL from our last
  PING on, whatever it sends itself.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from itertools import count
from typing import Any

import pytest
from conftest import send_until_full, wait_until
from test_zmtp_hostile import greeting, read_exact, ready

import nanopy
from nanopy.testing import wait_no_pipes, wait_pipes
from nanopy.transports.zmtp import _codec as codec

zmq = pytest.importorskip("zmq")

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

MakeSocket = Callable[..., nanopy.Socket]
TRANSPORTS = ("tcp", "ipc")
_paths = count()


def ipc_path() -> str:
    return f"{tempfile.gettempdir()}/npzh-{os.getpid()}-{next(_paths)}.ipc"


class QuietPeer:
    """A ZMTP PULL that accepts one connection, completes the handshake (as a 3.1
    or 3.0 peer), optionally sends one PING with a TTL, then reads and says nothing."""

    def __init__(self, transport: str, minor: int = 1, ping_ttl: int | None = None) -> None:
        self.minor = minor
        self.ping_ttl = ping_ttl  # deciseconds
        self.received = b""  # what came after the handshake
        self.done = threading.Event()
        self.path = ""
        if transport == "tcp":
            self.listener = socket.create_server(("127.0.0.1", 0))
            self.url = f"zmtp+tcp://127.0.0.1:{self.listener.getsockname()[1]}"
            self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        else:
            self.path = ipc_path()
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(self.path)
            self.listener.listen(1)
            self.url = self.address = f"zmtp+ipc://{self.path}"
        self.listener.settimeout(10)
        self.conn: socket.socket | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
            self.conn = conn
            conn.settimeout(30)
            conn.sendall(greeting(minor=self.minor) + ready(b"PULL"))
            read_exact(conn, 64)
            head = read_exact(conn, 2)
            read_exact(conn, head[1])  # nanopy's READY
            if self.ping_ttl is not None:
                conn.sendall(codec.encode_command(b"PING", self.ping_ttl.to_bytes(2, "big") + b"ctx"))
            while data := conn.recv(65536):
                self.received += data
        except OSError:
            pass
        finally:
            self.done.set()

    def ping_ttls(self) -> list[int]:
        """The TTLs (deciseconds) of the PINGs received."""
        data, found = self.received, []
        at = data.find(b"\x04PING")
        while at >= 0:
            found.append(int.from_bytes(data[at + 5 : at + 7], "big"))
            at = data.find(b"\x04PING", at + 1)
        return found

    def close(self) -> None:
        self.listener.close()
        if self.conn is not None:
            self.conn.close()
        self._thread.join(timeout=5)
        if self.path:
            try:
                os.unlink(self.path)
            except OSError:
                pass


@pytest.fixture
def quiet_peers() -> Iterator[Callable[..., list[QuietPeer]]]:
    made: list[QuietPeer] = []

    def make(**kwargs: Any) -> list[QuietPeer]:
        peers = [QuietPeer(t, **kwargs) for t in TRANSPORTS]
        made.extend(peers)
        return peers

    yield make
    for peer in made:
        peer.close()


def pipe_removed(sock: nanopy.Socket) -> threading.Event:
    removed = threading.Event()
    sock.on_pipe_removed(lambda pipe: removed.set())
    return removed


def connections(sock: nanopy.Socket) -> list[Any]:
    return [d.conn for d in sock._driver.pipe_drivers()]  # type: ignore[attr-defined]


def test_silent_peer_is_found_by_pings(
    make_socket: MakeSocket, quiet_peers: Callable[..., list[QuietPeer]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nanopy")
    peers = quiet_peers()
    push = make_socket("push", dead_peer_timeout=1, reconnect_interval=30)
    for peer in peers:
        push.connect(peer.url)
    wait_pipes(push, 2)
    started = time.monotonic()
    wait_no_pipes(push, timeout=5)  # (a PING at 0.5 s, given up on at 1 s)
    assert time.monotonic() - started > 0.8
    assert push.stats().dead_pipes == 2
    dead = [r for r in caplog.records if "stopped answering" in r.getMessage()]
    assert len(dead) == 2 and all(r.levelno == logging.INFO for r in dead)
    for peer in peers:
        assert any(peer.address.removeprefix("zmtp+ipc://") in r.getMessage() for r in dead)
        assert peer.done.wait(5)
        assert peer.ping_ttls() and set(peer.ping_ttls()) == {20}  # twice our timeout as the TTL


def test_peer_ttl_is_honoured(make_socket: MakeSocket, quiet_peers: Callable[..., list[QuietPeer]]) -> None:
    """The peer's PING asks for 0.3 s: silent after it, it is given up on long
    before our own timeout (10 s) would."""
    peers = quiet_peers(ping_ttl=3)
    push = make_socket("push", dead_peer_timeout=10, reconnect_interval=30)
    for peer in peers:
        push.connect(peer.url)
    # (the pipes may come and go before a wait_pipes could see them)
    wait_until(lambda: push.stats().dead_pipes == 2, timeout=4, what="both pipes given up on")
    for peer in peers:
        assert peer.done.wait(5)
        assert b"\x04PONG" + b"ctx" in peer.received  # answered with its context
        assert peer.ping_ttls() == []  # our first PING would have come after 5 s


@pytest.mark.parametrize(("timeout", "minor"), [(None, 1), (0.4, 0)], ids=["option-off", "zmtp-3.0-peer"])
def test_no_pings(
    make_socket: MakeSocket, quiet_peers: Callable[..., list[QuietPeer]], timeout: float | None, minor: int
) -> None:
    peers = quiet_peers(minor=minor)
    push = make_socket("push", dead_peer_timeout=timeout)
    for peer in peers:
        push.connect(peer.url)
    wait_pipes(push, 2)
    assert all(conn.keepalive is None for conn in connections(push))
    assert not pipe_removed(push).wait(1.2)  # three times 0.4 s of silence
    push.send(b"after the silence")  # (to the first pipe; the other keeps its silence)
    push.close(linger=1)
    for peer in peers:
        assert peer.done.wait(5)
        assert peer.ping_ttls() == []
    assert push.stats().dead_pipes == 0


def zmq_pull(zctx: Any, transport: str, **opts: int) -> tuple[Any, str]:
    zsock = zctx.socket(zmq.PULL)
    zsock.linger = 0
    zsock.rcvtimeo = 5000
    for name, value in opts.items():
        zsock.setsockopt(getattr(zmq, name.upper()), value)
    if transport == "tcp":
        url = f"tcp://127.0.0.1:{zsock.bind_to_random_port('tcp://127.0.0.1')}"
    else:
        url = f"ipc://{ipc_path()}"
        zsock.bind(url)
    return zsock, "zmtp+" + url


@pytest.fixture
def zctx() -> Iterator[Any]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def test_libzmq_answers_our_pings(make_socket: MakeSocket, zctx: Any) -> None:
    """An idle pipe to libzmq outlives several timeouts: libzmq PONGs our PINGs."""
    pulls = [zmq_pull(zctx, t) for t in TRANSPORTS]
    push = make_socket("push", dead_peer_timeout=0.5)
    for _, url in pulls:
        push.connect(url)
    wait_pipes(push, 2)
    assert not pipe_removed(push).wait(2.0)
    assert all(conn._pings_sent >= 2 for conn in connections(push))
    for _ in pulls:
        push.send(b"after the silence")
    assert sorted(z.recv() for z, _ in pulls) == [b"after the silence"] * 2
    assert push.stats().dead_pipes == 0


def test_libzmq_heartbeats_keep_the_pipe(make_socket: MakeSocket, zctx: Any) -> None:
    """libzmq with heartbeats on (a PING every 50 ms, 0.2 s to answer, TTL 0.5 s):
    our PONGs keep libzmq from dropping us, its PINGs keep us from PINGing, and
    its TTL shortens our limit."""
    pulls = [zmq_pull(zctx, t, heartbeat_ivl=50, heartbeat_timeout=200, heartbeat_ttl=500) for t in TRANSPORTS]
    push = make_socket("push", dead_peer_timeout=1)
    for _, url in pulls:
        push.connect(url)
    wait_pipes(push, 2)
    conns = connections(push)
    assert not pipe_removed(push).wait(1.2)
    assert all(conn._watch.limit() == 0.5 for conn in conns)
    # Its PINGs keep ours away; one may still go out when the watch happens to look
    # while our PONG is being written (a busy pipe PINGs: seen once under load).
    assert all(conn._pings_sent <= 1 for conn in conns)
    for _ in pulls:
        push.send(b"still here")
    assert sorted(z.recv() for z, _ in pulls) == [b"still here"] * 2
    assert push.stats().dead_pipes == 0


def test_paused_pipe_keeps_pinging(make_socket: MakeSocket, zctx: Any) -> None:
    """A nanopy PULL that reads nothing (its queue full) cannot answer libzmq's
    PINGs; its own PINGs, which go on while it is paused, are what keep libzmq
    (heartbeat timeout 0.8 s) from dropping the pipe and the messages in it."""
    zpush = zctx.socket(zmq.PUSH)
    zpush.linger = 0
    zpush.sndhwm = 10
    zpush.sndtimeo = 500
    zpush.heartbeat_ivl = 100
    zpush.heartbeat_timeout = 800
    url = f"zmtp+tcp://127.0.0.1:{zpush.bind_to_random_port('tcp://127.0.0.1')}"
    pull = make_socket("pull", dead_peer_timeout=1, recv_buffer=8)
    pull.connect(url)
    wait_pipes(pull)
    conn = connections(pull)[0]
    sent = send_until_full(zpush.send, zmq.Again, b"x" * 60000)
    assert not pipe_removed(pull).wait(2.0)
    assert conn._pings_sent >= 2  # (none before: libzmq's PINGs kept the pipe from silence)
    assert [int(pull.recv(timeout=5)[:6]) for _ in range(sent)] == list(range(sent))
    assert pull.stats().disconnects == pull.stats().dead_pipes == 0


def test_a_pipe_that_only_receives_keeps_our_ttl(make_socket: MakeSocket, zctx: Any) -> None:
    """libzmq keeps our TTL from our last PING until any other frame of ours comes;
    a nanopy PULL writes nothing else, so it PINGs every half timeout although the
    PUSH never falls silent: libzmq (no heartbeats of its own) does not drop it."""
    zpush = zctx.socket(zmq.PUSH)
    zpush.linger = 0
    url = f"zmtp+tcp://127.0.0.1:{zpush.bind_to_random_port('tcp://127.0.0.1')}"
    monitor = zpush.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    pull = make_socket("pull", dead_peer_timeout=0.4, recv_timeout=5)  # (our TTL: 0.8 s)
    pull.connect(url)
    wait_pipes(pull)
    conn = connections(pull)[0]
    wait_until(lambda: conn._pings_sent >= 1, what="our first PING (the PUSH is silent so far)")
    for i in range(40):  # 2 s of traffic, never silent for a PING's worth
        zpush.send(b"%d" % i)
        assert pull.recv() == b"%d" % i
        time.sleep(0.05)  # (the traffic's pace)
    assert conn._pings_sent >= 4
    assert not monitor.poll(0), "libzmq dropped a pipe that only receives"
    assert pull.stats().disconnects == 0
