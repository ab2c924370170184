"""ZAP (RFC 27): a bind with ``zap_domain=`` asks the handler on inproc://zeromq.zap.01.

pyzmq clients (NULL, PLAIN, CURVE) against a nanopy bind with ``ZapAuthenticator``;
a hand-written handler (a nanopy REP) answering 300/400/500 and a user id with
metadata; an SP transport gated by ZAP; no handler; a handler that never answers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import wait_until

import nanopy
from nanopy.auth import CURVE_ALLOW_ANY, ZAP_ENDPOINT, ZapReply, ZapRequest

zmq = pytest.importorskip("zmq")
from zmq.utils.monitor import recv_monitor_message  # noqa: E402

MakeSocket = Callable[..., nanopy.Socket]
FAILED_AUTH = zmq.EVENT_HANDSHAKE_FAILED_AUTH
FAILED_PROTOCOL = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL


@pytest.fixture
def zctx() -> Iterator[Any]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def auth() -> Iterator[nanopy.ZapAuthenticator]:
    with nanopy.ZapAuthenticator() as a:
        yield a


def client(zctx: Any, url: str, kind: int = zmq.PUSH, **opts: Any) -> Any:
    sock = zctx.socket(kind)
    sock.linger, sock.rcvtimeo, sock.sndtimeo = 0, 5000, 5000
    for name, value in opts.items():
        setattr(sock, name, value)
    sock.connect(url.removeprefix("zmtp+"))
    return sock


def failure_of(zctx: Any, url: str, kind: int = zmq.PUSH, **opts: Any) -> tuple[int, int]:
    """(event, value) of the first handshake failure a fresh pyzmq client reports."""
    sock = zctx.socket(kind)
    sock.linger = 0
    for name, value in opts.items():
        setattr(sock, name, value)
    monitor = sock.get_monitor_socket()
    monitor.rcvtimeo = 5000
    sock.connect(url.removeprefix("zmtp+"))
    try:
        while True:
            event = recv_monitor_message(monitor)
            if event["event"] in (FAILED_AUTH, FAILED_PROTOCOL):
                return event["event"], event["value"]
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)


def test_request_and_reply_frames_round_trip() -> None:
    request = ZapRequest("global", "10.0.0.1", b"bob", "PLAIN", (b"admin", b"secret"), b"7")
    assert request.frames() == [b"1.0", b"7", b"global", b"10.0.0.1", b"bob", b"PLAIN", b"admin", b"secret"]
    assert ZapRequest.from_frames(request.frames()) == request
    assert (request.user, request.password, request.curve_key) == ("admin", "secret", None)
    reply = ZapReply.to(request, "200", "OK", "joe", {"Role": b"ops"})
    again = ZapReply.from_frames(reply.frames())
    assert (again.request_id, again.user_id, dict(again.metadata), again.ok) == (b"7", "joe", {"Role": b"ops"}, True)
    with pytest.raises(ValueError, match="status code"):
        ZapReply.from_frames([b"1.0", b"7", b"201", b"", b"", b""])
    with pytest.raises(ValueError, match="version"):
        ZapRequest.from_frames([b"2.0", b"7", b"d", b"a", b"", b"NULL"])


def test_bind_checks_the_zap_keywords(make_socket: MakeSocket) -> None:
    rep = make_socket("rep")
    with pytest.raises(TypeError, match="zap_domain"):
        rep.bind("zmtp+tcp://127.0.0.1:0", plain_server=True)
    with pytest.raises(ValueError, match="1 to 255 ASCII"):
        rep.bind("tcp://127.0.0.1:0", zap_domain="")
    with pytest.raises(TypeError, match="a connect has no gate"):
        rep.connect("zmtp+tcp://127.0.0.1:1", plain_server=True)
    with pytest.raises(TypeError, match="PLAIN client"):
        rep.bind("zmtp+tcp://127.0.0.1:0", plain=("a", "b"), plain_server=True, zap_domain="d")


def test_pyzmq_null_clients_by_address(make_socket: MakeSocket, zctx: Any, auth: nanopy.ZapAuthenticator) -> None:
    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind("zmtp+tcp://127.0.0.1:0", zap_domain="global")
    auth.allow("127.0.0.1")
    push = client(zctx, ep.url)
    push.send(b"hello")
    msg = pull.recv_msg()
    assert msg.body == b"hello" and msg.pipe is not None
    assert msg.pipe.peer.zap_user == "" and msg.pipe.peer.mechanism == "null"
    auth.deny("127.0.0.0/8")  # (deny wins over allow)
    assert failure_of(zctx, ep.url) == (FAILED_AUTH, 400)
    wait_until(lambda: pull.stats().auth_failures >= 1, what="the refusal counted")
    assert len(pull.pipes) == 1


def test_pyzmq_plain_clients(make_socket: MakeSocket, zctx: Any, auth: nanopy.ZapAuthenticator) -> None:
    auth.configure_plain(passwords={"admin": "secret"})
    rep = make_socket("rep", recv_timeout=5)
    ep = rep.bind("zmtp+tcp://127.0.0.1:0", plain_server=True, zap_domain="global")
    # libzmq 4.3's PLAIN client reports any ERROR as a protocol failure (docs/zmtp.md)
    refused = failure_of(zctx, ep.url, zmq.REQ, plain_username=b"admin", plain_password=b"wrong")
    assert refused[0] == FAILED_PROTOCOL
    wait_until(lambda: rep.stats().auth_failures >= 1, what="the refusal counted")
    req = client(zctx, ep.url, zmq.REQ, plain_username=b"admin", plain_password=b"secret")
    req.send(b"hi")
    msg = rep.recv_msg()
    assert msg.pipe is not None
    peer = msg.pipe.peer
    assert (peer.mechanism, peer.user, peer.zap_user) == ("plain", "admin", "admin")
    msg.reply(b"welcome")
    assert req.recv() == b"welcome"


@pytest.mark.parametrize("any_key", [False, True])
def test_pyzmq_curve_clients(make_socket: MakeSocket, zctx: Any, auth: nanopy.ZapAuthenticator, any_key: bool) -> None:
    pytest.importorskip("nacl")
    server_public, server_secret = zmq.curve_keypair()
    known_public, known_secret = zmq.curve_keypair()
    stranger_public, stranger_secret = zmq.curve_keypair()
    auth.configure_curve(location=CURVE_ALLOW_ANY if any_key else {known_public})
    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind("zmtp+tcp://127.0.0.1:0", curve_secret_key=server_secret, zap_domain="global")
    stranger = {"curve_serverkey": server_public, "curve_publickey": stranger_public,
                "curve_secretkey": stranger_secret}
    if not any_key:
        assert failure_of(zctx, ep.url, **stranger) == (FAILED_AUTH, 400)
    who = stranger if any_key else {"curve_serverkey": server_public, "curve_publickey": known_public,
                                    "curve_secretkey": known_secret}
    push = client(zctx, ep.url, **who)
    push.send(b"sealed")
    msg = pull.recv_msg()
    assert msg.body == b"sealed" and msg.pipe is not None
    key = who["curve_publickey"].decode()
    assert msg.pipe.peer.curve_key == key and msg.pipe.peer.zap_user == key


class Handler:
    """A hand-written ZAP handler: a nanopy REP on inproc, in a thread."""

    def __init__(self, decide: Callable[[list[bytes]], list[bytes] | None]) -> None:
        self.decide = decide
        self.requests: list[list[bytes]] = []
        self.rep = nanopy.Socket("rep", bind=ZAP_ENDPOINT)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                frames = self.rep.recv_multipart(timeout=None)
            except nanopy.Closed:
                return
            self.requests.append(frames)
            answer = self.decide(frames)
            if answer is not None:
                self.rep.send_multipart(answer)

    def close(self) -> None:
        self.rep.close()
        self.thread.join(5)


@pytest.fixture
def handler_of() -> Iterator[Callable[..., Handler]]:
    made: list[Handler] = []

    def make(decide: Callable[[list[bytes]], list[bytes] | None]) -> Handler:
        made.append(Handler(decide))
        return made[-1]

    yield make
    for h in made:
        h.close()


def by_identity(frames: list[bytes]) -> list[bytes]:
    """200 with a user id and metadata for "ok", else the status the identity names."""
    version, rid, domain, address, identity, mechanism = frames[:6]
    if identity == b"ok":
        meta = b"\x04Role" + (3).to_bytes(4, "big") + b"ops"
        return [b"1.0", rid, b"200", b"OK", b"joe", meta]
    return [b"1.0", rid, identity[-3:], b"no " + identity, b"", b""]


def test_hand_written_handler_codes_user_and_metadata(make_socket: MakeSocket, zctx: Any,
                                                      handler_of: Callable[..., Handler]) -> None:
    handler = handler_of(by_identity)
    rep = make_socket("rep", recv_timeout=5)
    ep = rep.bind("zmtp+tcp://127.0.0.1:0", zap_domain="test")
    for code in (300, 400, 500):
        assert failure_of(zctx, ep.url, zmq.REQ, routing_id=f"t{code}".encode()) == (FAILED_AUTH, code)
    req = client(zctx, ep.url, zmq.REQ, routing_id=b"ok")
    req.send(b"who am I?")
    msg = rep.recv_msg()
    assert msg.pipe is not None
    peer = msg.pipe.peer
    assert peer.zap_user == "joe" and dict(peer.zap_metadata or {}) == {"Role": b"ops"}
    msg.reply(b"joe")
    assert req.recv() == b"joe"
    version, _, domain, address, identity, mechanism = handler.requests[-1]
    assert (version, domain, address, identity, mechanism) == (b"1.0", b"test", b"127.0.0.1", b"ok", b"NULL")
    wait_until(lambda: rep.stats().auth_failures >= 3, what="the refusals counted")


def test_sp_transport_gated_by_zap(make_socket: MakeSocket, handler_of: Callable[..., Handler]) -> None:
    admit = threading.Event()

    def decide(frames: list[bytes]) -> list[bytes]:
        code = b"200" if admit.is_set() else b"400"
        return [b"1.0", frames[1], code, b"", b"sp-user" if admit.is_set() else b"", b""]

    handler = handler_of(decide)
    seen: list[nanopy.Peer] = []
    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind("tcp://127.0.0.1:0", zap_domain="sp", authorize=lambda peer: seen.append(peer) or True)
    push = make_socket("push", reconnect_interval=0.02, reconnect_interval_max=0.1)
    push.connect(ep.url)
    wait_until(lambda: pull.stats().auth_failures >= 2, what="two ZAP refusals")
    assert pull.pipes == [] and not seen  # (authorize is asked only after ZAP admits)
    admit.set()
    push.send(b"in", timeout=5)
    msg = pull.recv_msg()
    assert msg.body == b"in" and msg.pipe is not None and msg.pipe.peer.zap_user == "sp-user"
    assert seen and seen[-1].zap_user == "sp-user"  # authorize sees what the handler said
    assert handler.requests[-1][2:6] == [b"sp", b"127.0.0.1", b"", b"NULL"]


def test_no_handler_refuses_with_the_reason_logged(make_socket: MakeSocket, zctx: Any,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="nanopy")
    pull = make_socket("pull")
    ep = pull.bind("zmtp+tcp://127.0.0.1:0", zap_domain="global")
    assert failure_of(zctx, ep.url) == (FAILED_AUTH, 500)
    wait_until(lambda: any("no ZAP handler is bound" in r.getMessage() for r in caplog.records),
               what="the logged reason")
    wait_until(lambda: pull.stats().auth_failures >= 1, what="the refusal counted")
    assert pull.pipes == []


def test_a_silent_handler_stalls_no_admitted_pipe(make_socket: MakeSocket, zctx: Any,
                                                  handler_of: Callable[..., Handler],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="nanopy")
    handler_of(lambda frames: None)  # never answers
    pull = make_socket("pull", recv_timeout=5, handshake_timeout=1.0)
    gated = pull.bind("zmtp+tcp://127.0.0.1:0", zap_domain="global")
    open_ep = pull.bind("zmtp+tcp://127.0.0.1:0")
    waiting = client(zctx, gated.url)
    waiting.send(b"held")
    admitted = client(zctx, open_ep.url)
    for i in range(20):  # while the gated handshake waits for its handler
        admitted.send(b"%d" % i)
        assert pull.recv() == b"%d" % i
    wait_until(lambda: any("did not answer" in r.getMessage() for r in caplog.records),
               what="the refusal for the silent handler")
    wait_until(lambda: pull.stats().auth_failures >= 1, what="the refusal counted")
    assert len(pull.pipes) == 1


def test_inproc_carries_multipart_between_req_and_rep_only(make_socket: MakeSocket) -> None:
    rep = make_socket("rep", recv_timeout=5, bind="inproc://zap-mp")
    req = make_socket("req", recv_timeout=5, connect="inproc://zap-mp")
    replies: list[bytes] = []
    thread = threading.Thread(target=lambda: replies.append(req.request(nanopy.zmtp.Multipart([b"a", b"", b"c"]))))
    thread.start()
    with pytest.raises(nanopy.ProtocolError, match="3 frames"):
        rep.recv()  # (a plain recv never joins frames silently)
    assert rep.recv_multipart() == [b"a", b"", b"c"]
    rep.send_multipart([b"x", b"y"])
    thread.join(5)
    assert isinstance(replies[0], nanopy.zmtp.Multipart) and replies[0].parts == (b"x", b"y")
    pair = make_socket("pair", bind="inproc://zap-mp-pair")
    with pytest.raises(nanopy.ProtocolError, match="SP pipes carry one frame"):
        pair.send_multipart([b"a", b"b"])


def test_authenticator_decisions(tmp_path: Any) -> None:
    """The decision alone (no sockets): domains, address lists, key directories."""
    import zmq.auth

    public_file, _ = zmq.auth.create_certificates(str(tmp_path), "client")
    public, _ = zmq.auth.load_certificate(public_file)
    a = nanopy.ZapAuthenticator()
    a.configure_plain("shop", {"ann": "pw"})
    a.configure_curve("*", str(tmp_path))
    raw = zmq.utils.z85.decode(public)

    def code(domain: str, address: str, mechanism: str, *credentials: bytes) -> tuple[str, str]:
        reply = a.authenticate(ZapRequest(domain, address, b"", mechanism, credentials, b"1"))
        assert reply.request_id == b"1"
        return reply.status_code, reply.user_id

    assert code("shop", "10.1.2.3", "PLAIN", b"ann", b"pw") == ("200", "ann")
    assert code("shop", "10.1.2.3", "PLAIN", b"ann", b"no")[0] == "400"
    assert code("other", "10.1.2.3", "PLAIN", b"ann", b"pw")[0] == "400"  # no table for that domain, none for "*"
    assert code("other", "10.1.2.3", "CURVE", raw) == ("200", public.decode())
    assert code("other", "10.1.2.3", "CURVE", bytes(32))[0] == "400"
    a.allow("10.0.0.0/8")
    a.deny("10.9.0.0/16")
    assert code("x", "10.1.2.3", "NULL")[0] == "200"
    assert code("x", "10.9.1.1", "NULL")[0] == "400"  # deny wins
    assert code("x", "192.168.1.1", "NULL")[0] == "400"  # not allowed
    with pytest.raises(ValueError, match="no directory"):
        a.configure_curve("*", str(tmp_path / "missing"))
