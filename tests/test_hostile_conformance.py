"""The same hostile cases over tcp, ipc, tls+tcp, ws and wss, judged by one set of
rules (docs/transports.md, "Errors, reconnects and logs"):

* a peer that breaks the wire rules -- garbage, a TLS rejection, a stalled handshake,
  a connection cut in the middle of a frame by FIN or by RST alike -- is one protocol
  error, logged at WARNING at most once per endpoint and interval;
* a port probe (connect, say nothing, leave) is not counted;
* a dialer that is refused -- a closed port, HTTP 404 or 200 from a web server --
  counts reconnect attempts and logs nothing above DEBUG;
* a TLS dialer refused by a mutual-TLS server counts a protocol error, and so does
  the server, on tls+tcp and wss alike.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import wait_until
from tls_certs import tls_files
from websockets.client import ClientProtocol
from websockets.uri import parse_uri

import nanopy
from nanopy.core.wire import encode_header
from nanopy.testing import local_url, wait_pipes

SCHEMES = ("tcp", "ipc", "tls+tcp", "ws", "wss")
TLS = ("tls+tcp", "wss")
HANDSHAKE_TIMEOUT = 0.5
PUSH_HEADER = encode_header(0x50)


def bind_url(scheme: str) -> str:
    return local_url(scheme, "hostile")


def tls_opts(scheme: str, ctx: ssl.SSLContext) -> dict[str, Any]:
    return {"ssl_context": ctx} if scheme in TLS else {}


@pytest.fixture(params=SCHEMES)
def scheme(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def listener(scheme: str, make_socket: Callable[..., nanopy.Socket]) -> Iterator[tuple[nanopy.Socket, str]]:
    pull = make_socket("pull", handshake_timeout=HANDSHAKE_TIMEOUT)
    ep = pull.bind(bind_url(scheme), **tls_opts(scheme, tls_files().server_ctx))
    yield pull, ep.url


def good_exchange(pull: nanopy.Socket, url: str, scheme: str, make_socket: Callable[..., nanopy.Socket]) -> None:
    push = make_socket("push")
    push.connect(url, **tls_opts(scheme, tls_files().client_ctx))
    push.send(b"fine", timeout=5)
    assert pull.recv(timeout=5) == b"fine"
    push.close()


# -- a raw client per transport ---------------------------------------------------------------
def host_port(url: str) -> tuple[str, int]:
    rest = url.split("://", 1)[1].split("/", 1)[0]
    host, port = rest.rsplit(":", 1)
    return host, int(port)


def raw_connect(scheme: str, url: str) -> socket.socket:
    """A plain socket to the listener (no TLS, no handshake)."""
    if scheme == "ipc":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(url[len("ipc://") :])
    else:
        s = socket.create_connection(host_port(url))
    s.settimeout(5)
    return s


def connect_and_handshake(scheme: str, url: str) -> socket.socket:
    """A socket (TLS-wrapped where the scheme has TLS) after a correct handshake."""
    s = raw_connect(scheme, url)
    if scheme in TLS:
        s = tls_files().client_ctx.wrap_socket(s, server_hostname="127.0.0.1")
    if scheme in ("ws", "wss"):
        proto = ClientProtocol(parse_uri(url.replace("wss://", "ws://")), subprotocols=["pull.sp.nanomsg.org"])
        proto.send_request(proto.connect())
        s.sendall(b"".join(proto.data_to_send()))
        while not proto.events_received():
            data = s.recv(65536)
            assert data
            proto.receive_data(data)
        assert proto.state.name == "OPEN"
    else:
        s.sendall(PUSH_HEADER)
        got = b""
        while len(got) < 8:
            chunk = s.recv(8 - len(got))
            assert chunk
            got += chunk
    return s


def message_then_partial_frame(scheme: str) -> bytes:
    """A complete message ``first``, then the start of a 100-byte one cut after 7
    bytes (in one write: once ``first`` arrives, the server has read the rest)."""
    if scheme in ("ws", "wss"):
        return bytes((0x82, 0x85)) + b"\0\0\0\0first" + bytes((0x82, 0x80 | 100)) + b"\0\0\0\0" + b"partial"
    prefix = b"\x01" if scheme == "ipc" else b""
    return prefix + struct.pack(">Q", 5) + b"first" + prefix + struct.pack(">Q", 100) + b"partial"


def reset(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def wait_closed(s: socket.socket, limit: float) -> float:
    """Read until the server closes; how long that took."""
    t0 = time.monotonic()
    s.settimeout(limit)
    try:
        while s.recv(65536):
            pass
    except (ConnectionResetError, ssl.SSLError, OSError) as exc:
        if isinstance(exc, TimeoutError):
            pytest.fail(f"not disconnected within {limit} s")
    return time.monotonic() - t0


def nanopy_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("nanopy") and r.levelno >= logging.WARNING]


# -- the cases ---------------------------------------------------------------------------------------
@pytest.mark.fault
@pytest.mark.parametrize("cut", ["fin", "rst"])
def test_cut_in_the_middle_of_a_frame_counts_alike(
    scheme: str, listener: tuple[nanopy.Socket, str], cut: str, make_socket: Any
) -> None:
    pull, url = listener
    s = connect_and_handshake(scheme, url)
    wait_pipes(pull)
    s.sendall(message_then_partial_frame(scheme))
    assert pull.recv(timeout=5) == b"first"
    if cut == "fin":
        s.shutdown(socket.SHUT_WR)  # under TLS: no close_notify, a bare FIN
        wait_closed(s, 5)
        s.close()
    else:
        reset(s)
    wait_until(lambda: pull.stats().protocol_errors == 1, what=f"{cut} mid-frame counted")
    wait_until(lambda: pull.stats().pipes == 0, what="pipe closed")
    good_exchange(pull, url, scheme, make_socket)
    assert pull.stats().protocol_errors == 1


@pytest.mark.fault
@pytest.mark.parametrize("cut", ["fin", "rst"])
def test_leaving_between_messages_is_not_counted(
    scheme: str, listener: tuple[nanopy.Socket, str], cut: str, make_socket: Any
) -> None:
    pull, url = listener
    s = connect_and_handshake(scheme, url)
    s.sendall(message_then_partial_frame(scheme).split(b"first")[0] + b"first")
    assert pull.recv(timeout=5) == b"first"
    if cut == "fin":
        s.shutdown(socket.SHUT_WR)
        wait_closed(s, 5)
        s.close()
    else:
        reset(s)
    wait_until(lambda: pull.stats().disconnects == 1, what="pipe closed")
    good_exchange(pull, url, scheme, make_socket)
    assert pull.stats().protocol_errors == 0


@pytest.mark.fault
def test_port_probe_is_not_counted(scheme: str, listener: tuple[nanopy.Socket, str], make_socket: Any) -> None:
    pull, url = listener
    for _ in range(3):
        raw_connect(scheme, url).close()
    reset(raw_connect(scheme, url))
    good_exchange(pull, url, scheme, make_socket)
    assert pull.stats().protocol_errors == 0


@pytest.mark.fault
def test_garbage_is_one_protocol_error_and_warnings_are_rate_limited(
    scheme: str, listener: tuple[nanopy.Socket, str], make_socket: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pull, url = listener
    caplog.set_level(logging.DEBUG, logger="nanopy")
    n = 8
    for _ in range(n):  # plain text to TLS, HTTP to SP, binary to HTTP...
        s = raw_connect(scheme, url)
        try:
            s.sendall(bytes(range(1, 256)) * 2 + b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        wait_closed(s, HANDSHAKE_TIMEOUT + 2)
        s.close()
    wait_until(lambda: pull.stats().protocol_errors == n, what=f"{n} protocol errors")
    good_exchange(pull, url, scheme, make_socket)
    assert len(nanopy_warnings(caplog)) == 1, nanopy_warnings(caplog)


@pytest.mark.fault
def test_stalled_handshake_is_dropped_at_the_handshake_timeout(
    scheme: str, listener: tuple[nanopy.Socket, str], make_socket: Any
) -> None:
    pull, url = listener
    s = raw_connect(scheme, url)
    s.sendall(b"\x16" if scheme in TLS else b"\x00")  # a first byte, then silence
    took = wait_closed(s, HANDSHAKE_TIMEOUT + 5)
    s.close()
    assert HANDSHAKE_TIMEOUT * 0.8 <= took <= HANDSHAKE_TIMEOUT + 1, took
    wait_until(lambda: pull.stats().protocol_errors == 1, what="stall counted")
    good_exchange(pull, url, scheme, make_socket)


# -- dialers ----------------------------------------------------------------------------------------
class HttpServer:
    """Answers every connection with one fixed HTTP response."""

    def __init__(self, status: str) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.answer = f"HTTP/1.1 {status}\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello".encode()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    conn.sendall(self.answer)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.mark.fault
@pytest.mark.parametrize("refusal", ["closed-port", "ws-404", "ws-200"])
def test_refused_dialer_counts_reconnects_quietly(
    refusal: str, make_socket: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="nanopy")
    server = None
    if refusal == "closed-port":
        with socket.create_server(("127.0.0.1", 0)) as probe:
            url = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    elif refusal == "ws-404":
        other = make_socket("pull")
        url = other.bind("ws://127.0.0.1:0/served").url.replace("/served", "/elsewhere")
    else:
        server = HttpServer("200 OK")
        url = f"ws://127.0.0.1:{server.port}/"
    try:
        push = make_socket("push", reconnect_interval=0.02, reconnect_interval_max=0.05)
        push.connect(url)
        wait_until(lambda: push.stats().reconnect_attempts >= 3, what="reconnect attempts")
    finally:
        if server is not None:
            server.close()
    assert push.stats().protocol_errors == 0
    assert nanopy_warnings(caplog) == []


@pytest.mark.fault
@pytest.mark.parametrize("tls_scheme", TLS)
@pytest.mark.parametrize("client", ["no-certificate", "unknown-ca", "plaintext"])
def test_mutual_tls_rejections_are_counted_on_both_sides(tls_scheme: str, client: str, make_socket: Any) -> None:
    t = tls_files()
    pull = make_socket("pull", handshake_timeout=2)
    ep = pull.bind(bind_url(tls_scheme), ssl_context=t.mtls_server_ctx)
    if client == "plaintext":
        s = raw_connect(tls_scheme, ep.url)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" if tls_scheme == "wss" else PUSH_HEADER)
        wait_closed(s, 5)
        s.close()
        wait_until(lambda: pull.stats().protocol_errors == 1, what="plaintext counted")
        return
    ctx = ssl.create_default_context()
    t.ca.configure_trust(ctx)  # type: ignore[attr-defined]
    if client == "unknown-ca":
        import trustme

        trustme.CA().issue_cert("intruder@example.org").configure_cert(ctx)
    push = make_socket("push", reconnect_interval=0.05, reconnect_interval_max=0.1)
    push.connect(ep.url, ssl_context=ctx)
    wait_until(lambda: pull.stats().protocol_errors >= 2, what="listener counts the rejections")
    wait_until(lambda: push.stats().protocol_errors >= 2, what="dialer counts the rejections")
    assert pull.stats().connects == 0 and push.stats().connects == 0


# -- a listener out of file descriptors ----------------------------------------------------------
FD_LISTENER = r"""
import logging, resource, sys, nanopy
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
pull = nanopy.Socket("pull")
urls = [pull.bind("tcp://127.0.0.1:0").url, pull.bind("ws://127.0.0.1:0/fd").url]
import os
used = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (used + 8, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
print(" ".join(urls), flush=True)
for _ in range(2):
    print(pull.recv(timeout=20).decode(), flush=True)
pull.close(linger=0)
"""


@pytest.mark.fault
def test_listener_out_of_descriptors_backs_off_quietly(make_socket: Any) -> None:
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", FD_LISTENER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        urls = proc.stdout.readline().split()
        assert len(urls) == 2, proc.stderr.read() if proc.stderr else ""
        hogs = []
        for url in urls:  # use up the listener's descriptors on both transports
            hogs += [socket.create_connection(host_port(url), timeout=5) for _ in range(12)]
        starved_since = time.monotonic()
        for hog in hogs:
            hog.close()
        for url in urls:
            push = make_socket("push")
            push.connect(url)
            push.send(url.encode(), timeout=10)
        got = {proc.stdout.readline().strip() for _ in urls}
        assert got == set(urls)
        assert time.monotonic() - starved_since < 15
        proc.wait(10)
        assert proc.stderr is not None
        log = proc.stderr.read()
        assert "WARNING" not in log and "ERROR" not in log, log
        assert "accept paused" in log  # one INFO per episode, not one per retry
        assert log.count("accept paused") <= 4, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
