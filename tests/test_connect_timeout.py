"""``connect_timeout`` (issue 32, Done means 3): one connect may take as long as the
option allows -- 10 s by default -- on every dialing transport, so a connect that
needs 5 s and more on a slow link succeeds at its first attempt.

A listener whose accept queue is full stands in for the slow link: Linux drops a
TCP SYN to such a listener (as a lossy link drops it) and the dialer's kernel sends
it again 1, 3 and 7 s after the first; a Unix-socket listener with a full backlog
refuses with EAGAIN, and nanopy tries again. After ``HOLD`` seconds the slow
listener makes room and relays every connection to a real nanopy listener of the
same scheme, so each transport's own handshake runs end to end.
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
from conftest import wait_until

import nanopy
from nanopy.testing import wait_pipes

pytestmark = pytest.mark.timeout(60)

HOLD = 5.5  # how long the slow listener drops (or refuses) connections
SCHEMES = ("tcp", "ipc", "ws", "wss", "tls+tcp", "zmtp+tcp", "zmtp+ipc")
_paths = count()


def ipc_path() -> str:
    return f"{tempfile.gettempdir()}/npct-{os.getpid()}-{next(_paths)}.ipc"


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class SlowListener:
    """A listener with a full accept queue (listen(0) and one idle connection in it)
    for ``hold`` seconds; then it accepts and relays each connection to ``target``
    (a Unix path or a (host, port))."""

    def __init__(self, target: Any, hold: float = HOLD) -> None:
        self.target = target
        self.hold = hold
        self.family = socket.AF_UNIX if isinstance(target, str) else socket.AF_INET
        self.listener = socket.socket(self.family, socket.SOCK_STREAM)
        self.path = ""
        if self.family == socket.AF_UNIX:
            self.path = ipc_path()
            self.listener.bind(self.path)
            self.address: Any = self.path
        else:
            self.listener.bind(("127.0.0.1", 0))
            self.address = self.listener.getsockname()
        self.listener.listen(0)
        self.filler = socket.socket(self.family, socket.SOCK_STREAM)
        self.filler.connect(self.address)  # the accept queue is full from now on
        self.sockets: list[socket.socket] = [self.listener, self.filler]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        if self._stop.wait(self.hold):  # (the slow link: nothing gets in meanwhile)
            return
        try:
            self.listener.accept()[0].close()  # the filler: room for the dialer
            self.listener.settimeout(0.2)
            while not self._stop.is_set():
                try:
                    conn, _ = self.listener.accept()
                except TimeoutError:
                    continue
                conn.settimeout(None)
                upstream = socket.socket(self.family, socket.SOCK_STREAM)
                upstream.connect(self.target)
                self.sockets += [conn, upstream]
                for src, dst in ((conn, upstream), (upstream, conn)):
                    threading.Thread(target=_pump, args=(src, dst), daemon=True).start()
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in self.sockets:
            sock.close()
        if self.path:
            os.unlink(self.path)


@pytest.fixture
def slow_listener() -> Iterator[Callable[..., SlowListener]]:
    made: list[SlowListener] = []

    def make(target: Any, hold: float = HOLD) -> SlowListener:
        made.append(SlowListener(target, hold))
        return made[-1]

    yield make
    for listener in made:
        listener.close()


def bind_options(scheme: str) -> dict[str, Any]:
    if scheme in ("wss", "tls+tcp"):
        from tls_certs import tls_files

        return {"ssl_context": tls_files().server_ctx}
    return {}


def connect_options(scheme: str) -> dict[str, Any]:
    if scheme in ("wss", "tls+tcp"):
        from tls_certs import tls_files

        return {"ssl_context": tls_files().client_ctx}
    return {}


def through(listener: Callable[..., SlowListener], scheme: str, bound: str, hold: float = HOLD) -> str:
    """The URL of a slow listener in front of the nanopy listener at ``bound``."""
    rest = bound.split("://", 1)[1]
    if scheme.endswith("ipc"):
        return f"{scheme}://{listener(rest, hold).address}"
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    slow = listener((host, int(port)), hold)
    return f"{scheme}://127.0.0.1:{slow.address[1]}" + (f"/{path}" if path else "")


def bound_url(scheme: str) -> str:
    if scheme.endswith("ipc"):
        return f"{scheme}://{ipc_path()}"
    return f"{scheme}://127.0.0.1:0" + ("/slow" if scheme in ("ws", "wss") else "")


def test_a_slow_connect_succeeds_on_every_transport(
    make_socket: Callable[..., nanopy.Socket], slow_listener: Callable[..., SlowListener]
) -> None:
    pytest.importorskip("websockets")
    pairs = []
    started = time.monotonic()
    for scheme in SCHEMES:
        pull = make_socket("pull", recv_timeout=5)
        url = pull.bind(bound_url(scheme), **bind_options(scheme)).url
        push = make_socket("push", name=f"push-{scheme}")
        push.connect(through(slow_listener, scheme, url), **connect_options(scheme))
        pairs.append((scheme, push, pull))
    for scheme, push, pull in pairs:
        wait_pipes(push, timeout=HOLD + 10)
        took = time.monotonic() - started
        assert took >= HOLD - 0.5, f"{scheme}: connected after {took:.1f} s, before the listener had room"
        # One attempt did it: no connect timed out or failed on the way.
        assert push.stats().reconnect_attempts == 0, f"{scheme}: {push.stats().reconnect_attempts} failed dials"
        push.send(scheme.encode())
        assert pull.recv() == scheme.encode()


@pytest.mark.parametrize("scheme", ["tcp", "ipc"])
def test_a_connect_gives_up_after_connect_timeout(
    make_socket: Callable[..., nanopy.Socket],
    slow_listener: Callable[..., SlowListener],
    caplog: pytest.LogCaptureFixture,
    scheme: str,
) -> None:
    """The endpoint's own connect_timeout (0.5 s) overrides the socket's: the attempt
    fails, is counted and logged at DEBUG naming the option; the dialer goes on and
    connects once the listener has room."""
    caplog.set_level(logging.DEBUG, logger="nanopy")
    pull = make_socket("pull", recv_timeout=5)
    url = pull.bind(bound_url(scheme)).url
    push = make_socket("push", connect_timeout=30, reconnect_interval=0.2, reconnect_interval_max=0.5)
    push.connect(through(slow_listener, scheme, url, hold=2.0), connect_timeout=0.5)
    wait_until(lambda: push.stats().reconnect_attempts >= 1, timeout=2, what="a timed-out connect")
    assert "no answer in 0.5 s (connect_timeout)" in caplog.text
    wait_pipes(push, timeout=10)
    push.send(b"in the end")
    assert pull.recv() == b"in the end"


def test_connect_timeout_option() -> None:
    with nanopy.Socket("push") as push:
        assert push.connect_timeout == 10.0
        push.connect_timeout = None
        assert push.connect_timeout is None
        with pytest.raises(ValueError, match="connect_timeout must be greater than 0 seconds"):
            push.connect_timeout = 0
        with pytest.raises(TypeError, match="connect_timeout"):
            push.connect("tcp://127.0.0.1:1", connect_timeout="soon")
        with pytest.raises(TypeError, match=r"unknown endpoint option\(s\) connect_timeout for tcp:// bind"):
            push.bind("tcp://127.0.0.1:0", connect_timeout=1)
