"""A stall of our own process is not a dead peer (issue 32, Done means 3), against
libzmq through pyzmq.

Our ZMTP PINGs announce a TTL of twice ``dead_peer_timeout`` and go out whenever we
wrote nothing for half the timeout, so the libzmq peer drops us only after a stall
longer than the TTL less that half (docs/partitions.md, "Stalls"):

* our process frozen (SIGSTOP) for half the TTL keeps its pipe: the peer's messages
  sent meanwhile all come back echoed, nobody disconnects;
* frozen for twice the TTL, libzmq drops the pipe (its monitor says so while we are
  still frozen); we count it in ``dead_pipes`` and log it once at INFO as the peer
  taking us for dead, then redial;
* our own watch never ends a pipe for silence that was our stall: frozen (SIGSTOP,
  or the engine thread stuck behind a C call holding the GIL) for several times
  ``dead_peer_timeout`` while libzmq PINGs us, the pipe stays; so does a ws or tcp
  pipe to a quiet nanopy peer.

The nanopy side that is frozen runs in a child process (tests/stall_peer.py). The
``time.sleep`` calls here are the stalls under test, not waits for a condition.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from netns import Process

import nanopy
from nanopy.testing import wait_pipes
from nanopy.transports.zmtp._conn import announced_ttl

zmq = pytest.importorskip("zmq")
from zmq.utils.monitor import recv_monitor_message  # noqa: E402

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

PEER = Path(__file__).with_name("stall_peer.py")


class Peer:
    """A libzmq DEALER bound on loopback (the client of a nanopy REP), with a
    monitor of its connections."""

    def __init__(self, ctx: Any, **heartbeats: int) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.rcvtimeo = self.sock.sndtimeo = 5000
        for name, value in heartbeats.items():
            self.sock.setsockopt(getattr(zmq, name.upper()), value)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"127.0.0.1:{port}"
        self.url = f"zmtp+tcp://{self.address}"
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def send(self, body: bytes) -> None:
        self.sock.send_multipart([b"", body])

    def recv(self) -> bytes:
        empty, body = self.sock.recv_multipart()
        assert empty == b""
        return bytes(body)

    def exchange(self, body: bytes) -> None:
        self.send(body)
        assert self.recv() == b"echo:" + body

    def disconnected(self, timeout: float) -> bool:
        """Whether libzmq dropped a connection (waits up to ``timeout`` for it)."""
        if not self.monitor.poll(int(timeout * 1000)):
            return False
        return bool(recv_monitor_message(self.monitor)["event"] == zmq.EVENT_DISCONNECTED)


@pytest.fixture
def zctx() -> Iterator[Any]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


class Stalled:
    """tests/stall_peer.py in a child process: a nanopy REP that echoes."""

    def __init__(self, url: str, dead_peer_timeout: float, log: Path) -> None:
        self.log = log
        with open(log, "w") as err:
            popen = subprocess.Popen([sys.executable, "-u", str(PEER), url, str(dead_peer_timeout)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        self.proc = Process("stall_peer", popen)
        self.pid = popen.pid
        self.proc.expect("^ready", timeout=30)

    def stats(self) -> dict[str, Any]:
        self.proc.send("stats")
        result: dict[str, Any] = json.loads(self.proc.expect("^stats ").string[6:])
        return result

    def pings(self) -> int:
        self.proc.send("pings")
        return int(self.proc.expect("^pings ").string.split()[1])

    def watching(self) -> bool:
        """Whether every dead-peer watch of the child waits on its timer (its engine
        thread may not have run a new pipe's watch yet on a loaded machine)."""
        self.proc.send("watching")
        armed, total = self.proc.expect("^watching ").string.split()[1:3]
        return armed == total

    def freeze(self, seconds: float, during: Any = None) -> None:
        """Stop the process for ``seconds``; ``during()`` runs while it is stopped."""
        wait_until(self.watching, timeout=5, what="the child's dead-peer watches on their timers")
        started = time.monotonic()
        os.kill(self.pid, signal.SIGSTOP)
        try:
            if during is not None:
                during()
            time.sleep(max(0.0, started + seconds - time.monotonic()))  # (the stall itself)
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def log_lines(self, text: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if text in line]

    def close(self) -> None:
        self.proc.kill()


@pytest.fixture
def stalled(tmp_path: Path) -> Iterator[Any]:
    made: list[Stalled] = []

    def make(url: str, dead_peer_timeout: float) -> Stalled:
        child = Stalled(url, dead_peer_timeout, tmp_path / f"stalled-{len(made)}.log")
        made.append(child)
        return child

    yield make
    for child in made:
        child.close()


def test_frozen_for_half_the_ttl_keeps_the_pipe(zctx: Any, stalled: Any) -> None:
    peer = Peer(zctx)  # (no heartbeats of its own: it judges us by our TTL alone)
    timeout = 2.0
    ttl = announced_ttl(timeout)
    child = stalled(peer.url, timeout)
    peer.exchange(b"before")

    def send_while_frozen() -> None:
        for i in range(20):
            peer.send(b"frozen %d" % i)

    child.freeze(ttl / 2, send_while_frozen)
    assert [peer.recv() for _ in range(20)] == [b"echo:frozen %d" % i for i in range(20)]
    peer.exchange(b"after")
    assert not peer.disconnected(0)
    stats = child.stats()
    assert stats["disconnects"] == stats["dead_pipes"] == 0
    assert stats["connects"] == 1


def test_frozen_for_twice_the_ttl_is_a_dead_pipe(zctx: Any, stalled: Any) -> None:
    peer = Peer(zctx)
    timeout = 1.0
    ttl = announced_ttl(timeout)
    child = stalled(peer.url, timeout)
    peer.exchange(b"before")
    # libzmq keeps a TTL only from a PING on (any other frame cancels it): wait for
    # the PINGs our watch sends once we have written nothing for half the timeout
    # (two: the second is queued only once the first was written).
    pings = child.pings()
    wait_until(lambda: child.pings() >= pings + 2, timeout=5, what="a PING after our last message")
    dropped: list[float] = []
    frozen = time.monotonic()

    def watch_libzmq() -> None:
        if peer.disconnected(2 * ttl):
            dropped.append(time.monotonic() - frozen)

    child.freeze(2 * ttl, watch_libzmq)
    assert dropped and dropped[0] < 2 * ttl, "libzmq did not drop the frozen peer"
    # Our side: the peer's close after our silence past the TTL is a dead pipe,
    # logged once at INFO with the peer's address and the reason.
    wait_until(lambda: child.stats()["dead_pipes"] == 1, timeout=5, what="the pipe counted as dead")
    lines = child.log_lines("took us for dead")
    assert len(lines) == 1 and lines[0].startswith("INFO")
    assert peer.address in lines[0] and "TTL our PINGs announce" in lines[0]
    assert "stood still" in lines[0]  # (our watch saw the stall)
    # The dialer comes back and the two talk again.
    peer.exchange(b"after")
    stats = child.stats()
    assert stats["disconnects"] == 1 and stats["connects"] == 2


def test_our_stall_under_libzmq_pings_keeps_the_pipe(zctx: Any, stalled: Any) -> None:
    """Frozen for three times our timeout while libzmq PINGs us (and sends): when we
    wake, its PINGs and messages wait unread, and we do not take it for dead."""
    peer = Peer(zctx, heartbeat_ivl=100, heartbeat_timeout=30000)
    child = stalled(peer.url, 1.0)
    peer.exchange(b"before")

    def send_while_frozen() -> None:
        for i in range(5):
            peer.send(b"frozen %d" % i)

    child.freeze(3.0, send_while_frozen)
    assert [peer.recv() for _ in range(5)] == [b"echo:frozen %d" % i for i in range(5)]
    peer.exchange(b"after")
    stats = child.stats()
    assert stats["disconnects"] == stats["dead_pipes"] == 0
    assert not child.log_lines("closing it")


def test_engine_stuck_behind_the_gil_keeps_the_pipe(zctx: Any) -> None:
    """The engine thread cannot run while a C call holds the GIL (here: 2 s, four
    times our timeout); libzmq's PINGs pile up unread. Our watch sees its timer fire
    late, so the peer gets a fresh grace period instead of being taken for dead."""
    peer = Peer(zctx, heartbeat_ivl=100, heartbeat_timeout=30000)
    with nanopy.Socket("rep", dead_peer_timeout=0.5, recv_timeout=5) as rep:
        removed = threading.Event()
        rep.on_pipe_removed(lambda pipe: removed.set())
        rep.connect(peer.url)
        wait_pipes(rep)

        def serve(count: int) -> None:
            for _ in range(count):
                msg = rep.recv_msg()
                msg.reply(b"echo:" + msg.body)

        peer.send(b"before")
        serve(1)
        assert peer.recv() == b"echo:before"
        # The watch runs on the engine thread, which a loaded machine may not have
        # scheduled yet (the exchange above needs no engine: this thread read and
        # wrote the pipe itself): a stall before the watch began is none it could see.
        watch = next(rep._driver.pipe_drivers()).conn._watch  # type: ignore[attr-defined]
        wait_until(lambda: watch._due != math.inf, timeout=5, what="the dead-peer watch waiting on its timer")
        peer.send(b"during")  # (it waits unread with libzmq's PINGs)
        ctypes.PyDLL(None).usleep(2_000_000)  # (holds the GIL: every Python thread stops)
        serve(1)
        assert peer.recv() == b"echo:during"
        assert not removed.is_set()
        assert rep.stats().dead_pipes == rep.stats().disconnects == 0
        assert watch.stalled_for() > 1.0  # (seen, or under way when the watch has not woken yet)


@pytest.mark.parametrize("scheme", ["ws", "tcp"])
def test_our_stall_keeps_a_quiet_pipe_over_other_transports(
    make_socket: Any, stalled: Any, scheme: str
) -> None:
    """The same over ws (our PINGs) and tcp (the kernel's keepalive, which runs on
    while we are stopped): the frozen side, whose timeout is a third of its stall,
    finds its quiet peer alive when it wakes."""
    if scheme == "ws":
        pytest.importorskip("websockets")
    req = make_socket("req", dead_peer_timeout=None, recv_timeout=5)  # (quiet: no PINGs)
    url = req.bind(f"{scheme}://127.0.0.1:0" + ("/stall" if scheme == "ws" else "")).url
    child = stalled(url, 1.0)
    assert req.request(b"before") == b"echo:before"
    child.freeze(3.0)
    assert req.request(b"after") == b"echo:after"
    stats = child.stats()
    assert stats["disconnects"] == stats["dead_pipes"] == 0
