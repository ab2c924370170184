"""Dead-peer detection and what a dying pipe saves, on loopback (issue 23; the
silent-partition cases across hosts are in tests/test_multihost_partitions.py).

* the option and the kernel settings it makes on dialed and accepted sockets;
* a WebSocket peer that goes silent is found by our PINGs (the kernel still
  acknowledges it, so only the PINGs can tell), and a live idle one is not;
* PUSH: the messages a dying pipe had not handed to the kernel go to the other
  pipe, in order; only what the kernel held is lost, and stats() says so;
* REQ: a resend goes to another pipe than the unanswering one.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import socket
import struct
import threading
import time
from typing import Any

import pytest
from conftest import send_until_full

import nanopy
from nanopy import platform
from nanopy.testing import ipc_url, wait_no_pipes, wait_pipes
from nanopy.transports.tcp import keepalive_settings

pytestmark = pytest.mark.timeout(60)


def test_option_defaults_and_validation() -> None:
    with nanopy.Socket("pair") as sock:
        assert sock.dead_peer_timeout == 10.0
        sock.dead_peer_timeout = None
        assert sock.dead_peer_timeout is None
        sock.dead_peer_timeout = 2
        assert sock.dead_peer_timeout == 2.0
        with pytest.raises(ValueError, match="dead_peer_timeout"):
            sock.dead_peer_timeout = 0
        with pytest.raises(TypeError, match="dead_peer_timeout"):
            sock.dead_peer_timeout = "2"  # type: ignore[assignment]


@pytest.mark.parametrize("timeout", [2, 2.5, 3, 5, 10, 10.5, 15, 60, 3600])
def test_keepalive_ticks_land_within_the_timeout(timeout: float) -> None:
    idle, interval, count, user_ms = keepalive_settings(timeout)
    assert idle >= 1 and interval >= 1 and count >= 1
    assert user_ms <= timeout * 1000
    # Linux gives up at the first tick at or after the user timeout; elsewhere after the count.
    ticks = [idle + k * interval for k in range(1, 1000)]
    assert next(t for t in ticks if t * 1000 >= user_ms) <= timeout
    assert idle + count * interval <= timeout


def _kernel_sockets(sock: nanopy.Socket) -> list[socket.socket]:
    return [d.conn.kernel_socket() for d in sock._driver.pipe_drivers()]  # type: ignore[attr-defined]


def _bind_and_connect(a: nanopy.Socket, b: nanopy.Socket, scheme: str) -> None:
    if scheme in ("tls+tcp", "wss"):
        from tls_certs import tls_files

        t = tls_files()
        url = a.bind(f"{scheme}://127.0.0.1:0", ssl_context=t.server_ctx).url
        b.connect(url.replace("127.0.0.1", "localhost"), ssl_context=t.client_ctx)  # (the name in the cert)
    else:
        b.connect(a.bind(f"{scheme}://127.0.0.1:0").url)
    wait_pipes(a)
    wait_pipes(b)


@pytest.mark.parametrize("scheme", ["tcp", "ws", "tls+tcp", "wss", "zmtp+tcp"])
def test_dialed_and_accepted_sockets_get_keepalive_and_user_timeout(scheme: str) -> None:
    with nanopy.Socket("pair", dead_peer_timeout=10) as a, nanopy.Socket("pair") as b:
        b.dead_peer_timeout = 10
        _bind_and_connect(a, b, scheme)
        for ks in _kernel_sockets(a) + _kernel_sockets(b):
            assert ks.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            idle = getattr(socket, "TCP_KEEPIDLE", None) or socket.TCP_KEEPALIVE  # (macOS names it so)
            assert ks.getsockopt(socket.IPPROTO_TCP, idle) == 6
            # a user timeout where the platform backend has one (Linux), else none set
            assert platform.user_timeout(ks) == (9000 if platform.CAPABILITIES.user_timeout else None)
    with nanopy.Socket("pair", dead_peer_timeout=None) as a, nanopy.Socket("pair", dead_peer_timeout=None) as b:
        _bind_and_connect(a, b, scheme)
        for ks in _kernel_sockets(a) + _kernel_sockets(b):
            assert ks.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0


def _ws_accept(conn: socket.socket, subprotocol: bytes) -> None:
    """Answer the WebSocket upgrade on ``conn`` (the dialer sends nothing before)."""
    head = b""
    while b"\r\n\r\n" not in head:
        head += conn.recv(4096)
    key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
               if line.lower().startswith(b"sec-websocket-key"))
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Accept: " + accept + b"\r\nSec-WebSocket-Protocol: " + subprotocol + b"\r\n\r\n")


def _silent_ws_server(listener: socket.socket, accepted: list[socket.socket]) -> None:
    """Answer one WebSocket upgrade for the pair protocol, then read and say nothing."""
    conn, _ = listener.accept()
    accepted.append(conn)
    _ws_accept(conn, b"pair.sp.nanomsg.org")
    try:
        while conn.recv(4096):  # the PINGs arrive and are never answered
            pass
    except OSError:
        pass


def test_silent_websocket_peer_is_found_by_pings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nanopy")
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    server = threading.Thread(target=_silent_ws_server, args=(listener, accepted), daemon=True)
    server.start()
    try:
        with nanopy.Socket("pair", dead_peer_timeout=1, reconnect_interval=30) as sock:
            sock.connect(f"ws://127.0.0.1:{listener.getsockname()[1]}/")
            wait_pipes(sock)
            started = time.monotonic()
            wait_no_pipes(sock, timeout=10)
            took = time.monotonic() - started
            assert 0.8 < took < 3.0
            assert sock.stats().dead_pipes == 1
        dead = [r for r in caplog.records if "stopped answering" in r.getMessage()]
        assert len(dead) == 1 and dead[0].levelno == logging.INFO
        assert f"127.0.0.1:{listener.getsockname()[1]}" in dead[0].getMessage()
    finally:
        listener.close()
        for conn in accepted:
            conn.close()


def test_live_idle_websocket_pipe_stays() -> None:
    with nanopy.Socket("pair", dead_peer_timeout=1) as a, nanopy.Socket("pair", dead_peer_timeout=1) as b:
        a.bind("ws://127.0.0.1:0")
        b.connect(a.endpoints[0].url)
        wait_pipes(b)
        removed = threading.Event()
        b.on_pipe_removed(lambda pipe: removed.set())
        assert not removed.wait(3.0)  # three timeouts of silence: PINGs and PONGs keep it
        b.send(b"still here")
        assert a.recv(timeout=5) == b"still here"
        assert a.stats().dead_pipes == b.stats().dead_pipes == 0


def test_nng_answers_our_pings() -> None:
    """An idle ws pipe to NNG (pynng) outlives several timeouts: NNG answers the PINGs."""
    from peers import free_tcp_port, pynng_peer

    url = f"ws://127.0.0.1:{free_tcp_port()}/"
    with pynng_peer("Pair0", listen=url) as peer, nanopy.Socket("pair", dead_peer_timeout=1) as sock:
        sock.connect(url)
        wait_pipes(sock)
        removed = threading.Event()
        sock.on_pipe_removed(lambda pipe: removed.set())
        assert not removed.wait(3.0)
        assert all(d.conn._pings_sent >= 2 for d in sock._driver.pipe_drivers())  # type: ignore[attr-defined]
        sock.send(b"after the silence")
        assert peer.recv() == b"after the silence"
        assert sock.stats().dead_pipes == 0


@pytest.mark.parametrize("scheme", ["tcp", "ws"])
def test_slow_reader_keeps_its_pipe(scheme: str) -> None:
    """Back-pressure is not death: a PULL that reads nothing for four timeouts (its
    queue full, its window closed, our writes waiting) keeps its pipe and gets every
    message -- though Linux's user timeout would end a connection whose data waits."""
    with nanopy.Socket("push", dead_peer_timeout=1, send_timeout=0.3) as push, \
            nanopy.Socket("pull", dead_peer_timeout=1, recv_buffer=8) as pull:
        push.connect(pull.bind(f"{scheme}://127.0.0.1:0").url)
        wait_pipes(push)
        sent = send_until_full(push.send, nanopy.Timeout, b"y" * 60000)
        removed = threading.Event()
        push.on_pipe_removed(lambda pipe: removed.set())
        pull.on_pipe_removed(lambda pipe: removed.set())
        assert not removed.wait(4.0)
        got = [int(pull.recv(timeout=5)[:6]) for _ in range(sent)]
        assert got == list(range(sent))
        assert push.stats().dead_pipes == pull.stats().dead_pipes == 0


def _sp_handshake(conn: socket.socket, protocol: int) -> None:
    conn.sendall(b"\x00SP\x00" + struct.pack("!H", protocol) + b"\x00\x00")
    got = b""
    while len(got) < 8:
        got += conn.recv(8 - len(got))


def _stuck_then_pull(push: nanopy.Socket, pull: nanopy.Socket, server: socket.socket, url: str,
                     body: bytes) -> tuple[socket.socket, int]:
    """PUSH dials ``url`` (``server``: a peer that reads nothing) with priority 1 and
    sends numbered messages (1, 2, ...) until that pipe takes no more -- its kernel's
    buffers, then its queue, until no credit is left -- then dials PULL (priority 2).
    Returns the stuck peer's connection and how many messages it took."""
    push.connect(url, priority=1)
    conn, _ = server.accept()
    _sp_handshake(conn, 0x51)
    wait_pipes(push)
    count = 0
    while True:
        try:
            push.send(b"%06d" % (count + 1) + body)
        except nanopy.Timeout:
            break
        count += 1
    push.connect(pull.endpoints[0].url, priority=2)
    wait_pipes(push, 2)
    return conn, count


def test_push_requeues_what_a_dying_pipe_never_wrote() -> None:
    """A PULL that reads nothing (priority 1) holds PUSH's messages in the kernel and
    then in its pipe's queue; when it resets, the queued ones go to the other PULL,
    in order, and only the kernel's part is lost (and counted)."""
    stuck = socket.create_server(("127.0.0.1", 0))
    with nanopy.Socket("push", send_buffer=200, send_timeout=0.5) as push, nanopy.Socket("pull") as pull:
        pull.bind("tcp://127.0.0.1:0")
        body = b"x" * 64000
        conn, count = _stuck_then_pull(push, pull, stuck, f"tcp://127.0.0.1:{stuck.getsockname()[1]}", body)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # RST: the pipe dies with its queue full
        wait_pipes(push, 1)
        got = []
        while True:
            try:
                got.append(int(pull.recv(timeout=2)[:6]))
            except nanopy.Timeout:
                break
        stats = push.stats()
        assert stats.messages_requeued > 0
        assert got == list(range(got[0], count + 1)), "the requeued messages arrived out of order or with gaps"
        assert len(got) == stats.messages_requeued
        lost = got[0] - 1  # the first messages: in the kernels when the peer reset
        assert lost > 0 and lost * len(body) < 16 << 20
    stuck.close()


def _stuck_listener(scheme: str) -> tuple[socket.socket, str]:
    """A raw listener whose accepted connection will read nothing (a small receive
    buffer, so PUSH's kernel fills quickly); returns it and the URL to dial."""
    if scheme == "tcp":
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        server.bind(("127.0.0.1", 0))
        url = f"tcp://127.0.0.1:{server.getsockname()[1]}"
    else:
        url = ipc_url("stuck")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(url.removeprefix("ipc://"))
    server.listen(1)
    return server, url


@pytest.mark.parametrize("scheme", ["tcp", "ipc"])
def test_push_requeued_messages_go_before_any_later_send(scheme: str) -> None:
    """Pipe A's peer reads nothing, then dies; the engine is held just after A was
    found dead and before its removal (A's connection is asked for its kernel
    counters there). Whatever is sent then, and after, reaches PULL B behind every
    message A had not written: send order holds across the death."""
    server, stuck_url = _stuck_listener(scheme)
    pipes: list[Any] = []
    with nanopy.Socket("push", send_buffer=8, send_timeout=0.3) as push, nanopy.Socket("pull") as pull:
        pull.bind(ipc_url("b") if scheme == "ipc" else "tcp://127.0.0.1:0")
        push.on_pipe_added(pipes.append)
        body = b"x" * 65536
        conn, count = _stuck_then_pull(push, pull, server, stuck_url, body)

        reached, release = threading.Event(), threading.Event()
        a_conn = pipes[0]._driver.conn
        kernel_socket = a_conn.kernel_socket

        def held_kernel_socket() -> socket.socket:  # (the engine thread, in A's end)
            reached.set()
            release.wait(20)
            return kernel_socket()  # type: ignore[no-any-return]

        a_conn.kernel_socket = held_kernel_socket
        later = [b"%06d" % n + body for n in range(count + 1, count + 6)]
        try:
            if scheme == "tcp":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # A's peer dies (RST, or an ipc peer gone with unread data)
            assert reached.wait(20), "pipe A never ended"
            unsent = list(later)
            while unsent:  # found dead, not removed: a send now must not pass A's queue
                try:
                    push.send(unsent[0], timeout=0)
                except nanopy.Timeout:
                    break  # (the core holds sends until A's unwritten rest is known)
                unsent.pop(0)
        finally:
            release.set()
        for payload in unsent:
            push.send(payload, timeout=10)
        got = [int(pull.recv(timeout=10)[:6])]
        while got[-1] < count + 5:
            got.append(int(pull.recv(timeout=10)[:6]))
        first = got[0]
        assert got == list(range(first, count + 6)), f"out of order: {got[:40]}"
        assert 1 < first <= count  # the first ones were lost in the kernels, the rest requeued
        assert push.stats().messages_requeued == count + 1 - first
    server.close()


def test_req_resend_goes_to_another_pipe() -> None:
    with nanopy.Socket("rep") as mute, nanopy.Socket("rep") as good, \
            nanopy.Socket("req", resend_interval=0.3) as req:
        mute.bind("tcp://127.0.0.1:0")
        good.bind("tcp://127.0.0.1:0")
        req.connect(mute.endpoints[0].url, priority=1)
        req.connect(good.endpoints[0].url, priority=2)
        wait_pipes(req, 2)

        def answer() -> None:
            msg = good.recv_msg(timeout=10)
            msg.reply(b"from good")

        helper = threading.Thread(target=answer)
        helper.start()
        assert req.request(b"hello", timeout=5) == b"from good"
        helper.join()
        assert mute.recv(timeout=1) == b"hello"  # the first attempt went to the preferred pipe


# -- the cores' side of it (Sans-I/O) -------------------------------------------------------
def _core(cls: type) -> object:
    from nanopy.core.options import new_options

    return cls(new_options(cls.name))


def _transmits(core: object) -> list[tuple[int, bytes]]:
    from nanopy.core.base import TRANSMIT

    actions = core.actions  # type: ignore[attr-defined]
    out = [(a[1], a[2]) for a in actions if a[0] == TRANSMIT]
    actions.clear()
    return out


def _preferring(kind: str, credit: int) -> Any:
    """A requeueing core (PUSH or raw REQ) with pipe 1 (preferred) and pipe 2."""
    from nanopy.core.base import PipeInfo
    from nanopy.protocols.pipeline import Push0
    from nanopy.protocols.reqrep import XReq0

    core: Any = _core(Push0 if kind == "push" else XReq0)
    core.add_pipe(PipeInfo(1, "a", 1, 8), credit)
    core.add_pipe(PipeInfo(2, "b", 2, 8), credit)
    return core


@pytest.mark.parametrize("kind", ["push", "xreq"])
def test_core_requeue_holds_what_no_pipe_can_take_and_sends_it_first(kind: str) -> None:
    from nanopy.core.errors import WouldBlock

    core = _preferring(kind, 2)
    core.send(b"m1")
    core.send(b"m2")
    _transmits(core)
    core.remove_pipe(1)
    assert core.requeue([b"o1", b"o2", b"o3"]) == 3
    assert _transmits(core) == [(2, b"o1"), (2, b"o2")]  # pipe 2's credit
    assert core.holding and not core.can_send()
    with pytest.raises(WouldBlock):
        core.send(b"new")  # a new message waits behind the held one
    core.pipe_credit(2, 2)
    assert _transmits(core) == [(2, b"o3")]
    assert not core.holding and "send" not in vars(core)  # the usual methods are back
    core.send(b"new")
    assert _transmits(core) == [(2, b"new")]


@pytest.mark.parametrize("kind", ["push", "xreq"])
def test_core_withdrawn_pipe_with_a_write_under_way_holds_sends_until_its_rest_comes(kind: str) -> None:
    from nanopy.core.errors import WouldBlock

    core = _preferring(kind, 4)
    core.send(b"m1")
    assert _transmits(core) == [(1, b"m1")]
    core.withdraw_pipe(1, pending=True)  # found dead while writing: its rest is not known yet
    assert core.holding and not core.can_send()
    with pytest.raises(WouldBlock):
        core.send(b"later")  # pipe 2 has credit, but must not pass what pipe 1 held
    assert core.requeue([b"refused"]) == 1  # a TRANSMIT to pipe 1 that came too late
    assert _transmits(core) == []
    core.remove_pipe(1)
    assert core.requeue([b"o1", b"o2"], 1) == 2  # its rest: ahead of the refused one
    assert _transmits(core) == [(2, b"o1"), (2, b"o2"), (2, b"refused")]
    assert not core.holding and core.can_send()
    core.send(b"later")
    assert _transmits(core) == [(2, b"later")]


def test_core_withdrawn_pipe_takes_no_new_send() -> None:
    from nanopy.core.base import PipeInfo
    from nanopy.core.errors import WouldBlock
    from nanopy.protocols.pair import Pair0
    from nanopy.protocols.pubsub import Pub0

    push = _preferring("push", 4)
    push.withdraw_pipe(1)
    push.send(b"m")
    assert _transmits(push) == [(2, b"m")] and not push.holding
    pair: Any = _core(Pair0)
    pair.add_pipe(PipeInfo(1, "a", 8, 8), 4)
    pair.withdraw_pipe(1)
    with pytest.raises(WouldBlock):
        pair.send(b"m")  # waits for the next peer instead of going into a dead pipe
    pub: Any = _core(Pub0)
    pub.options.overflow = "block"
    pub.add_pipe(PipeInfo(1, "a", 8, 8), 0)  # a full subscriber: "block" waits for it...
    pub.add_pipe(PipeInfo(2, "b", 8, 8), 4)
    assert not pub.can_send()
    pub.withdraw_pipe(1)  # ...until it is found dead
    assert pub.can_send()
    pub.send(b"m")
    assert _transmits(pub) == [(2, b"m")]
    pub.remove_pipe(1)
    assert pub.can_send()


def test_cores_that_must_not_requeue_take_nothing() -> None:
    from nanopy.core.base import PipeInfo
    from nanopy.protocols.pair import Pair0
    from nanopy.protocols.reqrep import Rep0, Req0

    for cls in (Req0, Rep0, Pair0):
        core: Any = _core(cls)
        core.add_pipe(PipeInfo(1, "a", 8, 8), 4)
        assert core.requeue([b"x"]) == 0 and not core.holding


def test_req_resend_after_resend_interval_avoids_the_last_pipe() -> None:
    from nanopy.core.base import PipeInfo
    from nanopy.protocols.reqrep import RESEND_TICKS, Req0

    core: Any = _core(Req0)
    core.options.resend_interval = 1.0
    core.add_pipe(PipeInfo(1, "best", 1, 8), 8)
    core.add_pipe(PipeInfo(2, "other", 2, 8), 8)
    core.start_request(b"q")
    assert [pid for pid, _ in _transmits(core)] == [1]
    for _ in range(RESEND_TICKS + 1):
        core.timer_fired("resend-tick")
    assert [pid for pid, _ in _transmits(core)] == [2]  # not the preferred pipe that said nothing
    for _ in range(RESEND_TICKS + 1):
        core.timer_fired("resend-tick")
    assert [pid for pid, _ in _transmits(core)] == [1]  # and back: never twice on the same pipe


def test_req_resends_the_moment_its_pipe_is_found_dead() -> None:
    from nanopy.core.base import PipeInfo
    from nanopy.protocols.reqrep import Req0

    core: Any = _core(Req0)
    core.add_pipe(PipeInfo(1, "best", 1, 8), 8)
    core.add_pipe(PipeInfo(2, "other", 2, 8), 8)
    core.start_request(b"q")
    assert [pid for pid, _ in _transmits(core)] == [1]
    core.withdraw_pipe(1)  # found dead: no waiting for its removal
    assert [pid for pid, _ in _transmits(core)] == [2]
    core.remove_pipe(1)
    assert _transmits(core) == []  # (once)
