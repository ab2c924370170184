"""``pipe.peer``: who is on the other end, on every transport and mechanism.

nanopy to nanopy on tcp, ipc, inproc, ws, wss (with and without a client
certificate), tls+tcp and zmtp+tcp/zmtp+ipc with NULL, PLAIN and CURVE; against
pyzmq (PLAIN, CURVE with ``zmq.curve_keypair()`` keys, an Identity) and pynng
over tls+tcp with a client certificate. Both ends of a pipe get a peer value.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from itertools import count
from typing import Any

import pytest
from tls_certs import tls_files

import nanopy
from nanopy.testing import wait_pipes

MakeSocket = Callable[..., nanopy.Socket]
_paths = count()


def ipc_path() -> str:
    return f"{tempfile.gettempdir()}/nppeer-{os.getpid()}-{next(_paths)}.ipc"


def exchange(make_socket: MakeSocket, url: str, bind: dict[str, Any], connect: dict[str, Any],
             dial_host: str = "127.0.0.1") -> tuple[nanopy.Peer, nanopy.Peer, str]:
    """A REQ asks a REP bound at ``url``: the peers each side's message came with."""
    rep = make_socket("rep", recv_timeout=5)
    ep = rep.bind(url, **bind)
    req = make_socket("req", recv_timeout=5)
    req.connect(ep.url.replace("127.0.0.1", dial_host), **connect)
    req.send(b"who are you?")
    asked = rep.recv_msg()
    rep.send(b"the server")
    answered = req.recv_msg()
    assert asked.pipe is not None and answered.pipe is not None
    assert asked.pipe.peer is not None and answered.pipe.peer is not None
    # the pipe objects of sock.pipes() carry the same value
    assert [p.peer for p in rep.pipes] == [asked.pipe.peer]
    assert [p.peer for p in req.pipes] == [answered.pipe.peer]
    return asked.pipe.peer, answered.pipe.peer, ep.url


def host_port(peer: nanopy.Peer) -> tuple[str, int]:
    host, _, port = peer.address.rpartition(":")
    return host, int(port)


def test_peer_is_frozen_and_exported() -> None:
    peer = nanopy.Peer("127.0.0.1:5", "tcp")
    with pytest.raises(dataclasses.FrozenInstanceError):
        peer.user = "eve"  # type: ignore[misc]
    assert (peer.mechanism, peer.user, peer.curve_key, peer.certificate, peer.routing_id) == (
        "null", None, None, None, None)
    assert peer.host == "127.0.0.1" and nanopy.Peer("[::1]:7", "ws").host == "::1"
    assert nanopy.Peer("/tmp/x.ipc", "ipc").host is None


@pytest.mark.parametrize("scheme", ["tcp", "zmtp+tcp", "ws"])
def test_tcp_based_peers(make_socket: MakeSocket, scheme: str) -> None:
    url = f"{scheme}://127.0.0.1:0" + ("/p" if scheme == "ws" else "")
    on_server, on_client, bound = exchange(make_socket, url, {}, {})
    port = int(bound.split(":")[2].split("/")[0])
    assert on_client.transport == on_server.transport == scheme
    assert on_client.mechanism == on_server.mechanism == "null"
    assert host_port(on_client) == ("127.0.0.1", port)  # the REQ's reply pipe names the server
    host, client_port = host_port(on_server)
    assert host == "127.0.0.1" and client_port not in (0, port)
    assert on_server.user is on_server.curve_key is on_server.certificate is None


@pytest.mark.parametrize("scheme", ["ipc", "zmtp+ipc"])
def test_ipc_peers(make_socket: MakeSocket, scheme: str) -> None:
    path = ipc_path()
    on_server, on_client, _ = exchange(make_socket, f"{scheme}://{path}", {}, {})
    assert on_server.address == on_client.address == path
    assert on_server.transport == scheme and on_server.mechanism == "null"


def test_inproc_peers(make_socket: MakeSocket) -> None:
    on_server, on_client, _ = exchange(make_socket, "inproc://peer-test", {}, {})
    assert on_server == on_client == nanopy.Peer("peer-test", "inproc")


@pytest.mark.parametrize("scheme", ["tls+tcp", "wss"])
def test_tls_without_client_certificate(make_socket: MakeSocket, scheme: str) -> None:
    t = tls_files()
    url = f"{scheme}://127.0.0.1:0" + ("/s" if scheme == "wss" else "")
    on_server, on_client, _ = exchange(make_socket, url, {"ssl_context": t.server_ctx},
                                       {"ssl_context": t.client_ctx}, dial_host="localhost")
    assert on_server.mechanism == on_client.mechanism == "tls"
    assert on_server.transport == scheme
    assert on_server.certificate is None  # the client showed none
    assert on_client.certificate is not None  # the server's, verified by the client
    assert ("DNS", "localhost") in on_client.certificate["subjectAltName"]


@pytest.mark.parametrize("scheme", ["tls+tcp", "wss"])
def test_tls_with_client_certificate(make_socket: MakeSocket, scheme: str) -> None:
    t = tls_files()
    url = f"{scheme}://127.0.0.1:0" + ("/s" if scheme == "wss" else "")
    on_server, _, _ = exchange(make_socket, url, {"ssl_context": t.mtls_server_ctx},
                               {"ssl_context": t.client_cert_ctx}, dial_host="localhost")
    assert on_server.mechanism == "tls" and on_server.certificate is not None
    assert ("email", "client@example.org") in on_server.certificate["subjectAltName"]


@pytest.mark.parametrize("scheme", ["zmtp+tcp", "zmtp+ipc"])
def test_zmtp_plain_and_identity(make_socket: MakeSocket, scheme: str) -> None:
    url = "zmtp+tcp://127.0.0.1:0" if scheme == "zmtp+tcp" else f"zmtp+ipc://{ipc_path()}"
    on_server, on_client, _ = exchange(
        make_socket, url, {"plain_auth": lambda user, password: password == "pw", "identity": b"srv"},
        {"plain": ("ann", "pw"), "identity": b"ann-1"})
    assert (on_server.mechanism, on_server.user, on_server.routing_id) == ("plain", "ann", b"ann-1")
    assert (on_client.mechanism, on_client.user, on_client.routing_id) == ("plain", None, b"srv")


def test_zmtp_curve(make_socket: MakeSocket) -> None:
    server_public, server_secret = nanopy.zmtp.curve_keypair()
    client_public, client_secret = nanopy.zmtp.curve_keypair()
    on_server, on_client, _ = exchange(
        make_socket, "zmtp+tcp://127.0.0.1:0", {"curve_secret_key": server_secret},
        {"curve_server_key": server_public, "curve_secret_key": client_secret})
    assert (on_server.mechanism, on_server.curve_key) == ("curve", client_public)
    assert (on_client.mechanism, on_client.curve_key) == ("curve", server_public)


# -- real peers -------------------------------------------------------------------------
def test_pyzmq_curve_client(make_socket: MakeSocket) -> None:
    zmq = pytest.importorskip("zmq")
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    rep = make_socket("rep", recv_timeout=5)
    ep = rep.bind("zmtp+tcp://127.0.0.1:0", curve_secret_key=server_secret)
    ctx = zmq.Context()
    try:
        req = ctx.socket(zmq.REQ)  # (libzmq announces an Identity from REQ, DEALER, ROUTER)
        req.linger, req.rcvtimeo = 0, 5000
        req.curve_serverkey, req.curve_publickey, req.curve_secretkey = server_public, client_public, client_secret
        req.setsockopt(zmq.ROUTING_ID, b"zmq-client")
        req.connect(ep.url.removeprefix("zmtp+"))
        req.send(b"sealed")
        msg = rep.recv_msg()
        peer = msg.pipe.peer if msg.pipe is not None else None
        assert peer is not None
        assert (peer.transport, peer.mechanism) == ("zmtp+tcp", "curve")
        assert peer.curve_key == client_public.decode()
        assert peer.routing_id == b"zmq-client"
        assert peer.host == "127.0.0.1"
        rep.send(b"for " + peer.curve_key.encode())  # a server may answer by key
        assert req.recv() == b"for " + client_public
    finally:
        ctx.destroy(linger=0)


def test_pyzmq_plain_client(make_socket: MakeSocket) -> None:
    zmq = pytest.importorskip("zmq")
    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind("zmtp+tcp://127.0.0.1:0", plain_auth=lambda user, password: password == "secret")
    ctx = zmq.Context()
    try:
        push = ctx.socket(zmq.PUSH)
        push.linger = 0
        push.plain_username, push.plain_password = b"ann", b"secret"
        push.connect(ep.url.removeprefix("zmtp+"))
        push.send(b"hello")
        msg = pull.recv_msg()
        assert msg.pipe is not None and msg.pipe.peer is not None
        assert (msg.pipe.peer.mechanism, msg.pipe.peer.user, msg.pipe.peer.routing_id) == ("plain", "ann", None)
    finally:
        ctx.destroy(linger=0)


def test_pynng_tls_client_certificate(make_socket: MakeSocket) -> None:
    from peers import pynng_dial, pynng_peer

    t = tls_files()
    pull = make_socket("pull", recv_timeout=10)
    url = pull.bind("tls+tcp://127.0.0.1:0", ssl_context=t.mtls_server_ctx).url
    cut = t.client_pem.index("-----BEGIN CERTIFICATE-----")
    tls = {"mode": "MODE_CLIENT", "server_name": "localhost", "ca_string": t.ca_pem,
           "own_key_string": t.client_pem[:cut], "own_cert_string": t.client_pem[cut:]}
    with pynng_peer("Push0", send_timeout=10_000, tls_config=tls) as push:
        pynng_dial(push, url.replace("127.0.0.1", "localhost"))
        push.send(b"from NNG")
        msg = pull.recv_msg()
        assert msg.body == b"from NNG"
        peer = msg.pipe.peer if msg.pipe is not None else None
        assert peer is not None and (peer.transport, peer.mechanism) == ("tls+tcp", "tls")
        assert peer.certificate is not None
        assert ("email", "client@example.org") in peer.certificate["subjectAltName"]
        wait_pipes(pull)
