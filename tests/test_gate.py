"""A bind's gate: ``authorize=``, ``allow=`` and ``deny=``.

Refuse and admit on every transport (nanopy to nanopy); allow/deny CIDR blocks on
tcp; refusals are closed, counted in ``auth_failures``, logged once per host and
interval, deliver nothing and hold up nobody (a slow ``authorize``; a flood of
refused connections: test_gate_flood.py); a refused pyzmq CURVE client gets the ERROR.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import tempfile
import threading
from collections.abc import Callable
from itertools import count
from typing import Any

import pytest
from conftest import wait_until
from tls_certs import tls_files

import nanopy
from nanopy.socket.gate import Gate
from nanopy.testing import wait_pipes

MakeSocket = Callable[..., nanopy.Socket]
_paths = count()
OPTS = {"reconnect_interval": 0.02, "reconnect_interval_max": 0.1}


def ipc_path() -> str:
    return f"{tempfile.gettempdir()}/npgate-{os.getpid()}-{next(_paths)}.ipc"


def url_of(scheme: str) -> str:
    if scheme in ("ipc", "zmtp+ipc"):
        return f"{scheme}://{ipc_path()}"
    if scheme == "inproc":
        return f"inproc://gate-{next(_paths)}"
    return f"{scheme}://127.0.0.1:0" + ("/g" if scheme in ("ws", "wss") else "")


def tls_options(scheme: str, bind: bool) -> dict[str, Any]:
    if scheme not in ("wss", "tls+tcp"):
        return {}
    t = tls_files()
    return {"ssl_context": t.server_ctx if bind else t.client_ctx}


SCHEMES = ["tcp", "ipc", "inproc", "ws", "wss", "tls+tcp", "zmtp+tcp", "zmtp+ipc"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_refuse_then_admit(make_socket: MakeSocket, scheme: str) -> None:
    admit = threading.Event()
    asked: list[nanopy.Peer] = []

    def authorize(peer: nanopy.Peer) -> bool | str:
        asked.append(peer)
        return True if admit.is_set() else "not yet"

    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind(url_of(scheme), authorize=authorize, **tls_options(scheme, True))
    push = make_socket("push", **OPTS)
    push.connect(ep.url.replace("127.0.0.1", "localhost"), **tls_options(scheme, False))
    wait_until(lambda: pull.stats().auth_failures >= 3, what="three refusals")
    assert pull.pipes == [] and pull.stats().connects == 0
    assert pull.stats().handshake_failures >= 3
    assert all(p.transport == scheme for p in asked)
    if scheme in ("ws", "wss"):  # (its upgrade is answered before authorize: a doomed pipe)
        try:
            push.send(b"from a refused peer", timeout=0)
        except nanopy.Timeout:
            pass
    else:  # the listener answers only once admitted: the dialer never had a pipe
        assert push.pipes == [] and push.stats().connects == 0
        with pytest.raises(nanopy.Timeout):
            push.send(b"from a refused peer", timeout=0)
    with pytest.raises(nanopy.Timeout):
        pull.recv(timeout=0.2)
    admit.set()
    wait_pipes(pull)
    push.send(b"admitted")
    assert pull.recv() == b"admitted"  # nothing of the refused connections came through
    assert pull.pipes[0].peer == asked[-1]


@pytest.mark.parametrize("scheme", ["tcp", "ws", "tls+tcp", "zmtp+tcp"])
@pytest.mark.parametrize(
    ("allow", "deny", "admitted"),
    [
        (["127.0.0.0/8"], None, True),
        (["10.0.0.0/8", "::1"], None, False),
        (None, ["127.0.0.1"], False),
        (None, ["192.168.0.0/16"], True),
        (["127.0.0.0/8"], ["127.0.0.1/32"], False),  # deny wins
    ],
)
def test_allow_deny(make_socket: MakeSocket, scheme: str, allow: Any, deny: Any, admitted: bool) -> None:
    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind(url_of(scheme), allow=allow, deny=deny, **tls_options(scheme, True))
    push = make_socket("push", **OPTS)
    push.connect(ep.url.replace("127.0.0.1", "localhost") if "tls" in scheme else ep.url,
                 **tls_options(scheme, False))
    if admitted:
        wait_pipes(pull)
        push.send(b"in")
        assert pull.recv() == b"in"
        assert pull.stats().auth_failures == 0
    else:
        wait_until(lambda: pull.stats().auth_failures >= 2, what="refusals")
        assert pull.pipes == [] and pull.stats().messages_received == 0


def test_address_rules() -> None:
    gate = Gate("s", "tcp://127.0.0.1:1", allow=["10.0.0.0/8", "2001:db8::/32"], deny=["10.1.0.0/16"])
    assert gate.address_refusal("10.2.3.4:5") is None
    assert gate.address_refusal("[2001:db8::7]:5") is None
    assert gate.address_refusal("[::ffff:10.2.3.4]:5") is None  # an IPv4-mapped peer of a dual-stack bind
    assert gate.address_refusal("10.1.2.3:5") == "address 10.1.2.3 is denied"
    assert gate.address_refusal("192.168.1.1:5") == "address 192.168.1.1 is not allowed"
    assert Gate("s", "tcp://x:1", authorize=lambda p: True).address_refusal("1.2.3.4:5") is None


def test_bind_refuses_misuse(make_socket: MakeSocket) -> None:
    sock = make_socket("pull")
    for scheme in ("ipc", "inproc", "zmtp+ipc"):
        with pytest.raises(nanopy.AddressError, match="authorize="):
            sock.bind(url_of(scheme), allow=["127.0.0.1"])
    with pytest.raises(nanopy.AddressError, match="not an IP address"):
        sock.bind("tcp://127.0.0.1:0", deny=["localhost"])
    with pytest.raises(TypeError, match="list of addresses"):
        sock.bind("tcp://127.0.0.1:0", allow="127.0.0.1")
    with pytest.raises(TypeError, match="callable"):
        sock.bind("tcp://127.0.0.1:0", authorize="yes")
    with pytest.raises(TypeError, match="unknown endpoint option"):
        sock.connect("tcp://127.0.0.1:5", authorize=lambda p: True)
    assert sock.endpoints == []


def test_raising_authorize_refuses_and_is_logged(make_socket: MakeSocket, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="nanopy")

    def authorize(peer: nanopy.Peer) -> bool:
        raise ValueError("the user database is down")

    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind("tcp://127.0.0.1:0", authorize=authorize)
    push = make_socket("push", **OPTS)
    push.connect(ep.url)
    wait_until(lambda: pull.stats().auth_failures >= 5, what="refusals")
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1  # once per peer host and interval, not once per connection
    assert refusals[0].exc_info is not None and "the user database is down" in refusals[0].getMessage()
    assert pull.pipes == []


def test_slow_authorize_does_not_stall_admitted_pipes(make_socket: MakeSocket) -> None:
    release, second_asked = threading.Event(), threading.Event()
    calls = count()

    def authorize(peer: nanopy.Peer) -> bool:
        if next(calls) == 0:
            return True
        second_asked.set()
        release.wait(8)  # the second peer's verdict takes its time
        return True

    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind("tcp://127.0.0.1:0", authorize=authorize)
    first = make_socket("push")
    first.connect(ep.url)
    wait_pipes(pull)
    second = make_socket("push")
    second.connect(ep.url)
    assert second_asked.wait(5)
    for i in range(200):
        first.send(b"%d" % i)
    assert [pull.recv() for _ in range(200)] == [b"%d" % i for i in range(200)]
    assert len(pull.pipes) == 1  # the second still waits for its verdict
    release.set()
    wait_pipes(pull, 2)


def test_pyzmq_curve_client_gets_the_error(make_socket: MakeSocket) -> None:
    zmq = pytest.importorskip("zmq")
    from zmq.utils.monitor import recv_monitor_message

    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    known = {client_public.decode()}

    def authorize(peer: nanopy.Peer) -> bool | str:
        return True if peer.curve_key in known else "400"  # a ZAP status code: libzmq reports it

    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind("zmtp+tcp://127.0.0.1:0", curve_secret_key=server_secret, authorize=authorize)
    ctx = zmq.Context()
    try:
        stranger_public, stranger_secret = zmq.curve_keypair()
        stranger = ctx.socket(zmq.PUSH)
        stranger.linger = 0
        stranger.curve_serverkey = server_public
        stranger.curve_publickey, stranger.curve_secretkey = stranger_public, stranger_secret
        monitor = stranger.get_monitor_socket()
        monitor.rcvtimeo = 5000
        stranger.connect(ep.url.removeprefix("zmtp+"))
        stranger.send(b"from a stranger")
        while True:
            event = recv_monitor_message(monitor)
            if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                break
        assert event["value"] == 400
        friend = ctx.socket(zmq.PUSH)
        friend.linger = 0
        friend.curve_serverkey, friend.curve_publickey, friend.curve_secretkey = (
            server_public, client_public, client_secret)
        friend.connect(ep.url.removeprefix("zmtp+"))
        friend.send(b"from a friend")
        msg = pull.recv_msg()
        assert msg.body == b"from a friend" and msg.pipe is not None and msg.pipe.peer is not None
        assert msg.pipe.peer.curve_key == client_public.decode()
        assert pull.stats().auth_failures >= 1 and len(pull.pipes) == 1
    finally:
        ctx.destroy(linger=0)


def test_nanopy_zmtp_client_reads_the_reason(make_socket: MakeSocket, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="nanopy")
    pull = make_socket("pull")
    ep = pull.bind("zmtp+tcp://127.0.0.1:0", authorize=lambda peer: "closed for maintenance")
    push = make_socket("push", **OPTS)
    push.connect(ep.url)
    wait_until(lambda: push.stats().protocol_errors >= 1, what="the client's failed handshake")
    assert any("closed for maintenance" in r.getMessage() and r.name == "nanopy"
               and "refused the handshake" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mechanism", ["null", "plain"])
def test_pyzmq_clients_through_the_gate(make_socket: MakeSocket, mechanism: str) -> None:
    zmq = pytest.importorskip("zmq")
    seen: list[nanopy.Peer] = []

    def authorize(peer: nanopy.Peer) -> bool | str:
        seen.append(peer)
        return peer.routing_id == b"friend" or "500"

    bind_options: dict[str, Any] = {"plain_auth": lambda user, password: True} if mechanism == "plain" else {}
    rep = make_socket("rep", recv_timeout=5)
    ep = rep.bind("zmtp+tcp://127.0.0.1:0", allow=["127.0.0.0/8"], authorize=authorize, **bind_options)
    ctx = zmq.Context()
    try:
        def client(routing_id: bytes) -> Any:
            req = ctx.socket(zmq.REQ)
            req.linger, req.rcvtimeo = 0, 5000
            req.setsockopt(zmq.ROUTING_ID, routing_id)
            if mechanism == "plain":
                req.plain_username = b"ann" if routing_id == b"friend" else b"eve"
                req.plain_password = b"pw"
            req.connect(ep.url.removeprefix("zmtp+"))
            return req

        stranger = client(b"stranger")
        monitor = stranger.get_monitor_socket()
        monitor.rcvtimeo = 5000
        from zmq.utils.monitor import recv_monitor_message

        # libzmq 4.3's PLAIN client reports any ERROR as a protocol failure (as it does
        # for plain_auth's refusals); NULL and CURVE clients read the ZAP status code
        failed = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL if mechanism == "plain" else zmq.EVENT_HANDSHAKE_FAILED_AUTH
        while recv_monitor_message(monitor)["event"] != failed:
            pass
        friend = client(b"friend")
        friend.send(b"hello")
        assert rep.recv() == b"hello"
        rep.send(b"welcome")
        assert friend.recv() == b"welcome"
        assert {p.routing_id for p in seen} >= {b"stranger", b"friend"}
        if mechanism == "plain":
            assert {p.user for p in seen} >= {"eve", "ann"}
        assert {p.mechanism for p in seen} == {mechanism}
        assert len(rep.pipes) == 1 and rep.stats().auth_failures >= 1
    finally:
        ctx.destroy(linger=0)


@pytest.mark.parametrize("scheme", ["tls+tcp", "wss"])
def test_authorize_by_client_certificate(make_socket: MakeSocket, scheme: str) -> None:
    t = tls_files()

    def authorize(peer: nanopy.Peer) -> bool | str:
        names = peer.certificate.get("subjectAltName", ()) if peer.certificate else ()
        return ("email", "client@example.org") in names or "no known certificate"

    optional = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # asks for a certificate, needs none
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as pem:
        pem.write(t.server_pem)
        pem.flush()
        optional.load_cert_chain(pem.name)
    optional.load_verify_locations(cadata=t.ca_pem)
    optional.verify_mode = ssl.CERT_OPTIONAL
    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind(url_of(scheme), ssl_context=optional, authorize=authorize)
    anonymous = make_socket("push", **OPTS)
    anonymous.connect(ep.url.replace("127.0.0.1", "localhost"), ssl_context=t.client_ctx)
    wait_until(lambda: pull.stats().auth_failures >= 2, what="the anonymous client refused")
    anonymous.close()
    known = make_socket("push")
    known.connect(ep.url.replace("127.0.0.1", "localhost"), ssl_context=t.client_cert_ctx)
    wait_pipes(pull)
    known.send(b"signed in")
    assert pull.recv() == b"signed in"


def test_allow_deny_ipv6(make_socket: MakeSocket) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    denied = make_socket("pull")
    ep = denied.bind("tcp://[::1]:0", deny=["::1/128"])
    push = make_socket("push", **OPTS)
    push.connect(ep.url)
    wait_until(lambda: denied.stats().auth_failures >= 2, what="::1 denied")
    allowed = make_socket("pull", recv_timeout=5)
    ep = allowed.bind("tcp://[::1]:0", allow=["::/0"], deny=["127.0.0.0/8"])
    push2 = make_socket("push")
    push2.connect(ep.url)
    wait_pipes(allowed)
    push2.send(b"v6")
    assert allowed.recv() == b"v6"
    assert allowed.pipes[0].peer.host == "::1"
