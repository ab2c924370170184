"""tls+tcp:// and wss://: certificates, mutual TLS, rejection, defaults, stalls."""

from __future__ import annotations

import socket
import ssl
from typing import Any

import pytest
from conftest import wait_until
from tls_certs import tls_files

import nanopy
from nanopy.testing import wait_pipes

URLS = {"tls+tcp": "tls+tcp://127.0.0.1:0", "wss": "wss://127.0.0.1:0/secure"}


@pytest.fixture(params=sorted(URLS))
def scheme(request: pytest.FixtureRequest) -> str:
    return request.param


def test_round_trip_with_test_ca(scheme: str, make_socket: Any) -> None:
    t = tls_files()
    pull = make_socket("pull")
    ep = pull.bind(URLS[scheme], ssl_context=t.server_ctx)
    push = make_socket("push")
    push.connect(ep.url.replace("127.0.0.1", "localhost"), ssl_context=t.client_ctx)  # name in the cert
    wait_pipes(pull)
    push.send(b"secret")
    assert pull.recv(timeout=5) == b"secret"


def test_client_without_the_ca_is_rejected(scheme: str, make_socket: Any) -> None:
    t = tls_files()
    pull = make_socket("pull")
    ep = pull.bind(URLS[scheme], ssl_context=t.server_ctx)
    push = make_socket("push", reconnect_interval=0.05)
    push.connect(ep.url)  # default context: system CAs only
    wait_until(lambda: push.stats().protocol_errors >= 2, what="verification failures")
    assert push.pipes == [] and pull.pipes == []
    with pytest.raises(nanopy.Timeout):
        push.send(b"must not pass", timeout=0)  # no pipe ever came up
    with pytest.raises(nanopy.Timeout):
        pull.recv(timeout=0)  # and without a pipe nothing can be on its way
    assert pull.stats().messages_received == 0


def test_mutual_tls(scheme: str, make_socket: Any) -> None:
    t = tls_files()
    pull = make_socket("pull")
    ep = pull.bind(URLS[scheme], ssl_context=t.mtls_server_ctx)
    anonymous = make_socket("push", reconnect_interval=0.05)
    anonymous.connect(ep.url, ssl_context=t.client_ctx)  # trusts the server, has no certificate
    # With TLS 1.3 the client may finish its half first and only then hear the alert.
    wait_until(lambda: anonymous.stats().reconnect_attempts >= 2, what="anonymous client refused")
    assert pull.pipes == [] and pull.stats().connects == 0
    anonymous.close()
    known = make_socket("push")
    known.connect(ep.url, ssl_context=t.client_cert_ctx)
    wait_pipes(pull)
    known.send(b"hello from a known client")
    assert pull.recv(timeout=5) == b"hello from a known client"
    assert pull.stats().messages_received == 1


def test_listener_needs_a_context(scheme: str, make_socket: Any) -> None:
    with pytest.raises(nanopy.AddressError, match="ssl_context"):
        make_socket("pair").bind(URLS[scheme])
    with pytest.raises(TypeError, match="ssl_context"):
        make_socket("pair").bind(URLS[scheme], ssl_context="cert.pem")


def test_plain_schemes_refuse_ssl_context(make_socket: Any) -> None:
    with pytest.raises(TypeError, match="ssl_context"):
        make_socket("pair").bind("tcp://127.0.0.1:0", ssl_context=tls_files().server_ctx)
    with pytest.raises(TypeError, match="ssl_context"):
        make_socket("pair").bind("ws://127.0.0.1:0/x", ssl_context=tls_files().server_ctx)


def test_default_client_context_verifies() -> None:
    from nanopy.transports.tls import client_context

    ctx = client_context({})
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2


def test_stalled_server_hits_handshake_timeout(scheme: str, make_socket: Any) -> None:
    """A server that accepts TCP and never speaks TLS: the dialer gives up on its own."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(5)
        port = server.getsockname()[1]
        push = make_socket("push", handshake_timeout=0.3, reconnect_interval=5)
        path = "/x" if scheme == "wss" else ""
        push.connect(f"{scheme}://127.0.0.1:{port}{path}", ssl_context=tls_files().client_ctx)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(5)
            while conn.recv(65536):  # ClientHello, then EOF once the timeout fires
                pass
        wait_until(lambda: push.stats().protocol_errors >= 1, what="timeout counted")


def test_stalled_client_does_not_block_others(scheme: str, make_socket: Any) -> None:
    t = tls_files()
    pull = make_socket("pull", handshake_timeout=0.5)
    ep = pull.bind(URLS[scheme], ssl_context=t.server_ctx)
    port = int(ep.url.split(":")[2].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as staller:
        push = make_socket("push")
        push.connect(ep.url, ssl_context=t.client_ctx)
        wait_pipes(pull)
        push.send(b"through")
        assert pull.recv(timeout=5) == b"through"
        # the socket's handshake_timeout drops the silent connection (wss too)
        staller.settimeout(5)
        assert staller.recv(1024) == b""


def test_wss_paths_share_one_tls_server(make_socket: Any) -> None:
    t = tls_files()
    a = make_socket("pull")
    ep = a.bind("wss://127.0.0.1:0/one", ssl_context=t.server_ctx)
    port = ep.url.split(":")[2].split("/")[0]
    b = make_socket("pull")
    b.bind(f"wss://127.0.0.1:{port}/two", ssl_context=t.server_ctx)
    with pytest.raises(nanopy.AddressInUse, match="ssl_context"):
        make_socket("pull").bind(f"wss://127.0.0.1:{port}/three", ssl_context=t.mtls_server_ctx)
    with pytest.raises(nanopy.AddressInUse, match="wss"):
        make_socket("pull").bind(f"ws://127.0.0.1:{port}/plain")
    pa, pb = make_socket("push"), make_socket("push")
    pa.connect(f"wss://127.0.0.1:{port}/one", ssl_context=t.client_ctx)
    pb.connect(f"wss://127.0.0.1:{port}/two", ssl_context=t.client_ctx)
    pa.send(b"1")
    pb.send(b"2")
    assert a.recv(timeout=5) == b"1"
    assert b.recv(timeout=5) == b"2"
