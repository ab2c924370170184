"""ws:// specifics: subprotocols, path routing, framing, limits, control frames, bad peers.

A hand-driven WebSocket client (websockets' Sans-I/O ClientProtocol over a blocking
socket) plays the peer, so every frame on the wire is under the test's control.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

import pytest
from conftest import wait_until
from peers import ipv6_available
from tls_certs import tls_files
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

import nanopy
from nanopy.testing import wait_no_pipes, wait_pipes
from nanopy.transports.ws import FRAGMENT_SIZE, normalize_path, parse_ws_url


class RawClient:
    """A blocking WebSocket client that shows every frame it gets."""

    def __init__(
        self, url: str, subprotocol: str | None, max_size: int | None = None, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        uri = parse_uri(url)
        self.sock = socket.create_connection((uri.host, uri.port), timeout=5)
        if ssl_context is not None:
            self.sock = ssl_context.wrap_socket(self.sock, server_hostname="localhost")
        self.proto = ClientProtocol(uri, subprotocols=[subprotocol] if subprotocol else None, max_size=max_size)
        self.proto.send_request(self.proto.connect())
        self.flush()
        self.frames: list[Frame] = []
        self.response: Response | None = None
        while self.response is None:
            for ev in self.pump():
                if isinstance(ev, Response):
                    self.response = ev
                else:
                    self.frames.append(ev)

    def flush(self) -> None:
        for chunk in self.proto.data_to_send():
            if chunk:
                self.sock.sendall(chunk)

    def pump(self) -> list[Any]:
        data = self.sock.recv(1 << 20)
        if data:
            self.proto.receive_data(data)
        else:
            self.proto.receive_eof()
        self.flush()
        events = self.proto.events_received()
        if not data and not events:
            raise EOFError
        return events

    def next_frame(self) -> Frame:
        while not self.frames:
            self.frames += self.pump()
        return self.frames.pop(0)

    def message(self) -> bytes:
        parts = []
        while True:
            frame = self.next_frame()
            if frame.opcode in (Opcode.BINARY, Opcode.CONT):
                parts.append(frame.data)
                if frame.fin:
                    return b"".join(parts)
            elif frame.opcode is Opcode.CLOSE:
                raise EOFError(self.proto.close_rcvd)

    def close_code(self) -> int:
        while True:
            frame = self.next_frame()
            if frame.opcode is Opcode.CLOSE:
                assert self.proto.close_rcvd is not None
                return self.proto.close_rcvd.code

    def close(self) -> None:
        self.sock.close()


def raw_request(port: int, target: str, protocol: str = "pair.sp.nanomsg.org") -> bytes:
    """Send a hand-written upgrade request; return the status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(
            f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n".encode()
        )
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return data.split(b"\r\n", 1)[0]


def port_of(url: str) -> int:
    return int(url.split("://")[1].split("/")[0].rsplit(":", 1)[1])


# -- URLs ----------------------------------------------------------------------------
def test_url_parsing() -> None:
    assert parse_ws_url("ws://h:1/a/b", "ws", bind=False) == ("h", 1, "/a/b")
    assert parse_ws_url("ws://h", "ws", bind=False) == ("h", 80, "/")
    assert parse_ws_url("wss://h/x/", "wss", bind=False) == ("h", 443, "/x")
    assert parse_ws_url("ws://[::1]:5/p", "ws", bind=False) == ("::1", 5, "/p")
    assert parse_ws_url("ws://*:0/p", "ws", bind=True) == ("", 0, "/p")
    assert normalize_path("") == "/"
    assert normalize_path("/a/?q=1") == "/a"
    with pytest.raises(nanopy.AddressError):
        parse_ws_url("ws://:5/p", "ws", bind=False)


# -- subprotocols, paths ----------------------------------------------------------------
def test_subprotocols_name_the_listener(make_socket: Any) -> None:
    rep = make_socket("pair")
    ep = rep.bind("ws://127.0.0.1:0/sp")
    ok = RawClient(ep.url, "pair.sp.nanomsg.org")
    assert ok.response is not None and ok.response.status_code == 101
    assert ok.proto.subprotocol == "pair.sp.nanomsg.org"
    ok.close()
    upper = RawClient(ep.url, "PAIR.SP.NANOMSG.ORG")  # NNG matches case-insensitively
    assert upper.response is not None and upper.response.status_code == 101
    upper.close()
    assert raw_request(port_of(ep.url), "/sp", "pair1.sp.nanomsg.org").startswith(b"HTTP/1.1 400")


def test_pipeline_subprotocols_both_ways(make_socket: Any) -> None:
    """A PUSH dialer offers pull.sp.nanomsg.org; a PULL listener requires its own name."""
    pull = make_socket("pull")
    ep = pull.bind("ws://127.0.0.1:0/pipe")
    raw = RawClient(ep.url, "pull.sp.nanomsg.org")
    assert raw.response is not None and raw.response.status_code == 101
    raw.close()
    push = make_socket("push")
    push.connect(ep.url)
    wait_pipes(push)
    push.send(b"job")
    assert pull.recv(timeout=5) == b"job"


def test_paths_share_a_port(make_socket: Any) -> None:
    a = make_socket("pair")
    b = make_socket("pair")
    ep_a = a.bind("ws://127.0.0.1:0/a")
    port = port_of(ep_a.url)
    ep_b = b.bind(f"ws://127.0.0.1:{port}/b")
    assert ep_b.url == f"ws://127.0.0.1:{port}/b"
    ca = make_socket("pair")
    cb = make_socket("pair")
    ca.connect(ep_a.url)
    cb.connect(ep_b.url + "/")  # a trailing slash routes to the same path
    wait_pipes(a)
    wait_pipes(b)
    ca.send(b"to a")
    cb.send(b"to b")
    assert a.recv(timeout=5) == b"to a"
    assert b.recv(timeout=5) == b"to b"
    assert raw_request(port, "/nothing").startswith(b"HTTP/1.1 404")
    # closing one path keeps the other served
    ep_a.close()
    wait_no_pipes(ca)
    cb.send(b"still")
    assert b.recv(timeout=5) == b"still"
    assert raw_request(port, "/a").startswith(b"HTTP/1.1 404")
    # the same path twice is taken
    with pytest.raises(nanopy.AddressInUse):
        make_socket("pair").bind(f"ws://127.0.0.1:{port}/b")


def test_empty_request_target_means_root(make_socket: Any) -> None:
    s = make_socket("pair")
    ep = s.bind("ws://127.0.0.1:0")
    assert ep.url.endswith("/")
    assert raw_request(port_of(ep.url), "").startswith(b"HTTP/1.1 101")
    assert raw_request(port_of(ep.url), "/?x=1").startswith(b"HTTP/1.1 101")


# -- framing -------------------------------------------------------------------------------
def test_large_message_fragmented_at_64k(make_socket: Any) -> None:
    s = make_socket("pair")
    ep = s.bind("ws://127.0.0.1:0/frag")
    raw = RawClient(ep.url, "pair.sp.nanomsg.org")
    wait_pipes(s)
    body = bytes(range(256)) * 1000  # 256000 bytes -> 4 frames
    s.send(body)
    frames = [raw.next_frame() for _ in range(4)]
    assert [f.opcode for f in frames] == [Opcode.BINARY, Opcode.CONT, Opcode.CONT, Opcode.CONT]
    assert [f.fin for f in frames] == [False, False, False, True]
    assert all(len(f.data) <= FRAGMENT_SIZE for f in frames)
    assert b"".join(f.data for f in frames) == body
    # and it reassembles what a peer fragments
    raw.proto.send_binary(b"abc", fin=False)
    raw.proto.send_ping(b"in-between")  # control frames may come between fragments
    raw.proto.send_continuation(b"def", fin=True)
    raw.flush()
    assert s.recv(timeout=5) == b"abcdef"
    raw.close()


def test_ping_is_answered(make_socket: Any) -> None:
    s = make_socket("pair")
    ep = s.bind("ws://127.0.0.1:0/ping")
    raw = RawClient(ep.url, "pair.sp.nanomsg.org")
    raw.proto.send_ping(b"hello?")
    raw.flush()
    frame = raw.next_frame()
    assert frame.opcode is Opcode.PONG and frame.data == b"hello?"
    raw.close()


def test_clean_close_handshake(make_socket: Any) -> None:
    s = make_socket("pair")
    ep = s.bind("ws://127.0.0.1:0/close")
    raw = RawClient(ep.url, "pair.sp.nanomsg.org")
    wait_pipes(s)
    s.close()
    assert raw.close_code() == 1000
    raw.close()


def test_peer_close_frame_ends_pipe(make_socket: Any) -> None:
    s = make_socket("pair")
    ep = s.bind("ws://127.0.0.1:0/bye")
    raw = RawClient(ep.url, "pair.sp.nanomsg.org")
    wait_pipes(s)
    raw.proto.send_close(1000, "bye")
    raw.flush()
    assert raw.close_code() == 1000  # echoed
    wait_no_pipes(s)
    assert s.stats().protocol_errors == 0
    raw.close()


def test_text_frame_closes_that_pipe_only(make_socket: Any) -> None:
    s = make_socket("pull")
    ep = s.bind("ws://127.0.0.1:0/text")
    good = make_socket("push")
    good.connect(ep.url)
    wait_pipes(s)
    bad = RawClient(ep.url, "pull.sp.nanomsg.org")
    wait_pipes(s, 2)
    bad.proto.send_text(b"hi")
    bad.flush()
    assert bad.close_code() == 1003
    wait_until(lambda: len(s.pipes) == 1, what="bad pipe gone")
    assert s.stats().protocol_errors == 1
    good.send(b"fine")
    assert s.recv(timeout=5) == b"fine"
    bad.close()


def test_protocol_violation_closes_pipe(make_socket: Any) -> None:
    s = make_socket("pair")
    ep = s.bind("ws://127.0.0.1:0/viol")
    raw = RawClient(ep.url, "pair.sp.nanomsg.org")
    wait_pipes(s)
    raw.sock.sendall(b"\x82\x03abc")  # unmasked frame from a client: forbidden
    assert raw.close_code() == 1002
    wait_no_pipes(s)
    assert s.stats().protocol_errors == 1
    raw.close()


def test_recv_max_size_closes_with_1009(make_socket: Any) -> None:
    s = make_socket("pair", recv_max_size=100_000)
    ep = s.bind("ws://127.0.0.1:0/max")
    raw = RawClient(ep.url, "pair.sp.nanomsg.org")
    wait_pipes(s)
    raw.proto.send_binary(b"x" * 100_000)
    raw.flush()
    assert s.recv(timeout=5) == b"x" * 100_000
    # over the limit across fragments
    raw.proto.send_binary(b"y" * 60_000, fin=False)
    raw.proto.send_continuation(b"y" * 60_000, fin=True)
    raw.flush()
    assert raw.close_code() == 1009
    wait_no_pipes(s)
    assert s.stats().protocol_errors == 1
    raw.close()


def test_dialer_refuses_wrong_subprotocol(make_socket: Any) -> None:
    """A REQ listener does not accept a REQ dialer (it offers rep.sp.nanomsg.org)."""
    a = make_socket("push")
    ep = a.bind("ws://127.0.0.1:0/mismatch")
    b = make_socket("push", reconnect_interval=0.05)
    b.connect(ep.url)
    wait_until(lambda: a.stats().protocol_errors >= 1 and b.stats().protocol_errors >= 1, what="refusals")
    assert a.pipes == [] and b.pipes == []


def test_ipv6(make_socket: Any) -> None:
    if not ipv6_available():
        pytest.skip("no IPv6 loopback")
    a = make_socket("pair")
    b = make_socket("pair")
    ep = a.bind("ws://[::1]:0/six")
    assert ep.url.startswith("ws://[::1]:") and ep.url.endswith("/six")
    b.connect(ep.url)
    b.send(b"over v6")
    assert a.recv(timeout=5) == b"over v6"


def test_dialer_close_while_upgrading_is_prompt(make_socket: Any) -> None:
    """Closing a dialer whose upgrade is unanswered lets go of the TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(5)
        b = make_socket("pair")
        b.connect(f"ws://127.0.0.1:{server.getsockname()[1]}/silent")
        conn, _ = server.accept()
        with conn:
            conn.settimeout(5)
            assert conn.recv(4096).startswith(b"GET /silent HTTP/1.1")
            b.close()
            assert conn.recv(4096) == b""


# -- closing promptly, ws and wss ----------------------------------------------------------
#: well under the 0.5 s close timeout an end waiting for the other's EOF would sit out
PROMPT_CLOSE = 0.2


def tls_options(scheme: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(bind options, connect options)`` for ``scheme``."""
    if scheme == "ws":
        return {}, {}
    t = tls_files()
    return {"ssl_context": t.server_ctx}, {"ssl_context": t.client_ctx}


@pytest.mark.parametrize("first", ["dialer", "listener"])
@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_close_handshake_is_prompt_at_both_ends(make_socket: Any, ws_close_times: Any, scheme: str, first: str) -> None:
    bind_opts, connect_opts = tls_options(scheme)
    pull = make_socket("pull")
    url = pull.bind(f"{scheme}://127.0.0.1:0/prompt", **bind_opts).url
    push = make_socket("push", reconnect_interval=5)
    push.connect(url.replace("127.0.0.1", "localhost"), **connect_opts)
    push.send(b"before close", timeout=5)
    assert pull.recv(timeout=5) == b"before close"
    (push if first == "dialer" else pull).close(linger=0)
    closes = ws_close_times.wait(2)
    assert sorted(side for side, _, _ in closes) == ["dialer", "listener"]
    for side, seconds, code in closes:
        assert code == 1000, f"the {side} got no CLOSE 1000 from its peer: {closes}"
        assert seconds < PROMPT_CLOSE, f"the {side} took {seconds:.3f} s to close ({scheme}, {first} first)"


def test_failure_close_code_reaches_a_wss_peer(make_socket: Any) -> None:
    """The lingering close keeps the 1009 intact over TLS too (no reset destroys it)."""
    bind_opts, _ = tls_options("wss")
    s = make_socket("pair", recv_max_size=1000)
    ep = s.bind("wss://127.0.0.1:0/max", **bind_opts)
    raw = RawClient(ep.url, "pair.sp.nanomsg.org", ssl_context=tls_files().client_ctx)
    wait_pipes(s)
    raw.proto.send_binary(b"y" * 2000)
    raw.flush()
    assert raw.close_code() == 1009
    wait_no_pipes(s)
    assert s.stats().protocol_errors == 1
    raw.close()
