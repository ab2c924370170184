"""nanopy sockets on zmtp+tcp:// and zmtp+ipc:// against real libzmq sockets (pyzmq).

Every pair in both bind/connect directions over tcp and ipc; subscription
forwarding and publisher-side filtering (an XSUB shows what the PUB sent);
multipart both ways; 2 MiB messages; REQ/REP with envelopes and behind a
ROUTER/DEALER broker; PLAIN; socket types refused at the handshake.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from itertools import count
from typing import Any

import pytest
from conftest import wait_until

import nanopy
from nanopy.testing import wait_no_pipes, wait_pipes

zmq = pytest.importorskip("zmq")

pytestmark = pytest.mark.interop

MakeSocket = Callable[..., nanopy.Socket]
BIG = os.urandom(2 << 20)  # 2 MiB
BIG_LIMIT = 4 << 20  # recv_max_size for them (the default is 1 MiB)
_paths = count()


@pytest.fixture
def zctx() -> Iterator[Any]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def zsocket(zctx: Any, kind: int, **opts: Any) -> Any:
    sock = zctx.socket(kind)
    sock.linger = 0
    sock.rcvtimeo = 5000
    sock.sndtimeo = 5000
    for name, value in opts.items():
        sock.setsockopt(getattr(zmq, name.upper()), value)
    return sock


def ipc_path() -> str:
    return f"{tempfile.gettempdir()}/npz-{os.getpid()}-{next(_paths)}.ipc"


def link(nsock: nanopy.Socket, zsock: Any, transport: str, nanopy_binds: bool, **ep_options: Any) -> None:
    """Join a nanopy socket and a libzmq socket; either binds; returns once nanopy has the pipe."""
    if nanopy_binds:
        url = "zmtp+tcp://127.0.0.1:0" if transport == "tcp" else f"zmtp+ipc://{ipc_path()}"
        ep = nsock.bind(url, **ep_options)
        zsock.connect(ep.url.removeprefix("zmtp+"))
    else:
        if transport == "tcp":
            port = zsock.bind_to_random_port("tcp://127.0.0.1")
            zurl = f"tcp://127.0.0.1:{port}"
        else:
            zurl = f"ipc://{ipc_path()}"
            zsock.bind(zurl)
        nsock.connect("zmtp+" + zurl, **ep_options)
    wait_pipes(nsock)


DIRECTIONS = [
    pytest.param(t, b, id=f"{t}-{'nanopy' if b else 'zmq'}-binds") for t in ("tcp", "ipc") for b in (True, False)
]


@pytest.mark.parametrize(("transport", "nanopy_binds"), DIRECTIONS)
def test_push_pull_both_ways(make_socket: MakeSocket, zctx: Any, transport: str, nanopy_binds: bool) -> None:
    pull = make_socket("pull", recv_timeout=5, recv_max_size=BIG_LIMIT)
    zpush = zsocket(zctx, zmq.PUSH)
    link(pull, zpush, transport, nanopy_binds)
    zpush.send(b"one")
    zpush.send(BIG)
    zpush.send_multipart([b"a", b"", b"c" * 300])
    assert pull.recv() == b"one"
    assert pull.recv() == BIG
    multi = pull.recv_msg().body
    assert isinstance(multi, nanopy.zmtp.Multipart) and multi.parts == (b"a", b"", b"c" * 300)

    push = make_socket("push", send_timeout=5)
    zpull = zsocket(zctx, zmq.PULL)
    link(push, zpull, transport, not nanopy_binds)
    for body in (b"", b"x" * 255, b"y" * 256, BIG):
        push.send(body)
    assert [zpull.recv() for _ in range(4)] == [b"", b"x" * 255, b"y" * 256, BIG]
    push.send(nanopy.zmtp.Multipart([b"k", b"v"]))
    assert zpull.recv_multipart() == [b"k", b"v"]


@pytest.mark.parametrize(("transport", "nanopy_binds"), DIRECTIONS)
def test_pair(make_socket: MakeSocket, zctx: Any, transport: str, nanopy_binds: bool) -> None:
    pair = make_socket("pair", recv_timeout=5, send_timeout=5, recv_max_size=BIG_LIMIT)
    zpair = zsocket(zctx, zmq.PAIR)
    link(pair, zpair, transport, nanopy_binds)
    pair.send(b"ping")
    assert zpair.recv() == b"ping"
    zpair.send(BIG)
    assert pair.recv() == BIG
    pair.send(BIG)
    assert zpair.recv() == BIG


def publish_until(send: Callable[[], None], recv: Callable[[], bytes], wanted: bytes, tries: int = 200) -> None:
    """Publish until the marker arrives: a subscription reaches the publisher a
    moment after the pipe is up, and a publisher drops what nobody asked for yet."""
    for _ in range(tries):
        send()
        try:
            if recv() == wanted:
                return
        except (nanopy.Timeout, zmq.Again):
            continue
    pytest.fail(f"{wanted!r} never arrived")


@pytest.mark.parametrize(("transport", "nanopy_binds"), DIRECTIONS)
def test_nanopy_pub_filters_per_pipe(make_socket: MakeSocket, zctx: Any, transport: str, nanopy_binds: bool) -> None:
    pub = make_socket("pub")
    xsub = zsocket(zctx, zmq.XSUB, rcvtimeo=100)  # an XSUB shows all it gets: the PUB's filtering
    link(pub, xsub, transport, nanopy_binds)
    xsub.send(b"\x01keep")
    publish_until(lambda: pub.send(b"keep-sync"), xsub.recv, b"keep-sync")
    for body in (b"drop1", b"keep1", b"kee", b"keep2"):
        pub.send(body)
    xsub.rcvtimeo = 5000
    assert [xsub.recv(), xsub.recv()] == [b"keep1", b"keep2"]
    xsub.send(b"\x00keep")  # cancelled: nothing matches any more
    xsub.send(b"\x01m")
    publish_until(lambda: pub.send(b"m-sync"), xsub.recv, b"m-sync")
    pub.send(b"keep3")
    pub.send(nanopy.zmtp.Multipart([b"m", b"part"]))
    assert xsub.recv_multipart() == [b"m", b"part"]


@pytest.mark.parametrize(("transport", "nanopy_binds"), DIRECTIONS)
def test_nanopy_sub_forwards_subscriptions(
    make_socket: MakeSocket, zctx: Any, transport: str, nanopy_binds: bool
) -> None:
    sub = make_socket("sub", recv_timeout=0.1)
    sub.subscribe(b"a")
    sub.subscribe(b"a")  # twice: told once, cancelled with the last unsubscribe (as libzmq's SUB)
    xpub = zsocket(zctx, zmq.XPUB, xpub_verbose=1, xpub_verboser=1)
    link(sub, xpub, transport, nanopy_binds)
    assert xpub.recv() == b"\x01a"  # the subscriptions, sent when the pipe came up
    publish_until(lambda: xpub.send(b"a-sync"), sub.recv, b"a-sync")
    sub.subscribe(b"b")
    assert xpub.recv() == b"\x01b"
    sub.unsubscribe(b"a")
    sub.unsubscribe(b"a")
    assert xpub.recv() == b"\x00a"
    sub.recv_timeout = 5
    for body in (b"c", b"a1", b"b1"):
        xpub.send(body)
    assert sub.recv() == b"b1"  # (an a-sync may have come twice: the first after the timeout)


@pytest.mark.parametrize(("transport", "nanopy_binds"), DIRECTIONS)
def test_zmq_pub_to_nanopy_sub(make_socket: MakeSocket, zctx: Any, transport: str, nanopy_binds: bool) -> None:
    sub = make_socket("sub", recv_timeout=0.1, recv_max_size=BIG_LIMIT)
    sub.subscribe(b"t/")
    zpub = zsocket(zctx, zmq.PUB)
    link(sub, zpub, transport, nanopy_binds)
    publish_until(lambda: zpub.send(b"t/sync"), sub.recv, b"t/sync")
    sub.recv_timeout = 5
    zpub.send(b"u/no")
    zpub.send(b"t/" + BIG)
    assert sub.recv() == b"t/" + BIG


@pytest.mark.parametrize(("transport", "nanopy_binds"), DIRECTIONS)
def test_req_rep_both_ways(make_socket: MakeSocket, zctx: Any, transport: str, nanopy_binds: bool) -> None:
    req = make_socket("req", recv_timeout=5)
    zrep = zsocket(zctx, zmq.REP)
    link(req, zrep, transport, nanopy_binds)
    req.send(b"q")
    assert zrep.recv() == b"q"
    zrep.send(b"a")
    assert req.recv() == b"a"

    rep = make_socket("rep", recv_timeout=5, recv_max_size=BIG_LIMIT)
    zreq = zsocket(zctx, zmq.REQ)
    link(rep, zreq, transport, not nanopy_binds)
    zreq.send(BIG)
    msg = rep.recv_msg()
    assert msg.body == BIG
    msg.reply(b"got it")
    assert zreq.recv() == b"got it"


def test_req_looks_like_libzmq_req_to_a_router(make_socket: MakeSocket, zctx: Any) -> None:
    """Guide-style ROUTER code unpacks [identity, b"", body]; concurrent requests on
    one pipe are serialised (the wire has no request id) and each gets its reply."""
    req = make_socket("req", recv_timeout=5)
    router = zsocket(zctx, zmq.ROUTER)
    link(req, router, "tcp", False, identity=b"client-1")
    results: dict[int, bytes] = {}

    def ask(i: int) -> None:
        results[i] = req.request(b"q%d" % i, timeout=10)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for _ in range(3):
        identity, empty, body = router.recv_multipart()
        assert (identity, empty) == (b"client-1", b"")
        with pytest.raises(zmq.Again):  # one at a time on the wire
            router.recv_multipart(zmq.NOBLOCK)
        router.send_multipart([identity, b"", body + b"!"])
    for t in threads:
        t.join(10)
    assert results == {i: b"q%d!" % i for i in range(3)}


def test_rep_behind_a_router_dealer_broker(make_socket: MakeSocket, zctx: Any) -> None:
    """A nanopy REP works a libzmq broker's DEALER side; the envelope comes back intact."""
    frontend = zsocket(zctx, zmq.ROUTER)
    backend = zsocket(zctx, zmq.DEALER)
    fport = frontend.bind_to_random_port("tcp://127.0.0.1")
    rep = make_socket("rep", recv_timeout=5)
    link(rep, backend, "tcp", True)
    clients = [zsocket(zctx, zmq.REQ) for _ in range(2)]
    for c in clients:
        c.connect(f"tcp://127.0.0.1:{fport}")
    stop = threading.Event()

    def broker() -> None:
        poller = zmq.Poller()
        poller.register(frontend, zmq.POLLIN)
        poller.register(backend, zmq.POLLIN)
        while not stop.is_set():
            for sock, _ in poller.poll(50):
                other = backend if sock is frontend else frontend
                other.send_multipart(sock.recv_multipart())

    thread = threading.Thread(target=broker)
    thread.start()
    try:
        for i, c in enumerate(clients):
            c.send(b"job%d" % i)
        for _ in clients:
            msg = rep.recv_msg()
            msg.reply(msg.body.upper())
        assert [c.recv() for c in clients] == [b"JOB0", b"JOB1"]
    finally:
        stop.set()
        thread.join(5)


def test_plain_both_ways(make_socket: MakeSocket, zctx: Any) -> None:
    seen: list[tuple[str, str]] = []

    def auth(user: str, password: str) -> bool:
        seen.append((user, password))
        return password == "secret"

    pull = make_socket("pull", recv_timeout=5)
    zpush = zsocket(zctx, zmq.PUSH, plain_username=b"ann", plain_password=b"secret")
    link(pull, zpush, "tcp", True, plain_auth=auth)
    zpush.send(b"authenticated")
    assert pull.recv() == b"authenticated"
    assert seen == [("ann", "secret")]

    bad = zsocket(zctx, zmq.PUSH, plain_username=b"eve", plain_password=b"guess")
    bad.connect(pull.endpoints[0].url.removeprefix("zmtp+"))
    wait_until(lambda: pull.stats().protocol_errors >= 1, what="the bad password refused")
    assert len(pull.pipes) == 1

    from zmq.auth.thread import ThreadAuthenticator

    authenticator = ThreadAuthenticator(zctx)  # a libzmq PLAIN server asks a ZAP handler
    authenticator.start()
    try:
        authenticator.configure_plain(domain="*", passwords={"bob": "pw"})
        zpull = zsocket(zctx, zmq.PULL, plain_server=1)
        push = make_socket("push")
        link(push, zpull, "tcp", False, plain=("bob", "pw"))
        push.send(b"to a PLAIN server")
        assert zpull.recv() == b"to a PLAIN server"
        refused = make_socket("push")
        refused.connect(push.endpoints[0].url, plain=("bob", "wrong"))
        wait_until(lambda: refused.stats().protocol_errors >= 1, what="the wrong password refused")
        assert refused.pipes == []
    finally:
        authenticator.stop()


def test_wrong_socket_type_refused_at_handshake(
    make_socket: MakeSocket, zctx: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rep = make_socket("rep")
    ep = rep.bind("zmtp+tcp://127.0.0.1:0")
    zpush = zsocket(zctx, zmq.PUSH)
    zpush.connect(ep.url.removeprefix("zmtp+"))
    # (the count comes before the log line: wait for the line)
    wait_until(lambda: "a ZeroMQ PUSH socket is not a valid peer of a nanopy rep socket (it talks to DEALER or REQ)"
               in caplog.text, what="the PUSH refused, logged")
    assert rep.stats().protocol_errors >= 1
    assert rep.pipes == []


@pytest.mark.parametrize("protocol", ["bus", "surveyor", "respondent", "pair1"])
def test_other_protocols_refused_at_bind_and_connect(make_socket: MakeSocket, protocol: str) -> None:
    sock = make_socket(protocol)
    for call, url in ((sock.bind, "zmtp+tcp://127.0.0.1:0"), (sock.connect, "zmtp+ipc:///tmp/x.ipc")):
        with pytest.raises(nanopy.AddressError, match="it works with cooked pair, push, pull, pub, sub, req, rep"):
            call(url)
    raw = make_socket("req", raw=True)
    with pytest.raises(nanopy.AddressError, match="raw req"):
        raw.bind("zmtp+tcp://127.0.0.1:0")


def test_heartbeats_are_answered(make_socket: MakeSocket, zctx: Any) -> None:
    """libzmq with heartbeats on closes a peer that does not answer its PINGs."""
    pull = make_socket("pull", recv_timeout=5)
    zpush = zsocket(zctx, zmq.PUSH, heartbeat_ivl=50, heartbeat_timeout=200, heartbeat_ttl=500)
    link(pull, zpush, "tcp", True)
    pipe = pull.pipes[0]
    with pytest.raises(nanopy.Timeout):
        pull.recv(timeout=1.0)  # a dozen PINGs go by
    assert pull.pipes == [pipe]
    zpush.send(b"still here")
    assert pull.recv() == b"still here"
    zpush.close()
    wait_no_pipes(pull)


def test_multipart_api(make_socket: MakeSocket, zctx: Any) -> None:
    """Multipart both ways; a plain recv() of one raises and loses nothing; SP pipes refuse them."""
    pull = make_socket("pull", recv_timeout=5)
    zpush = zsocket(zctx, zmq.PUSH)
    link(pull, zpush, "tcp", True)
    zpush.send_multipart([b"head", b"tail"])
    zpush.send(b"plain")
    with pytest.raises(nanopy.ProtocolError, match="2 frames"):
        pull.recv()
    with pytest.raises(nanopy.ProtocolError, match="still queued"):
        pull.recv()
    assert pull.recv_multipart() == [b"head", b"tail"]
    assert pull.recv_multipart() == [b"plain"]

    push = make_socket("push")
    zpull = zsocket(zctx, zmq.PULL)
    link(push, zpull, "ipc", False)
    push.send_multipart([b"a", bytearray(b"b"), memoryview(b"c")])
    assert zpull.recv_multipart() == [b"a", b"b", b"c"]

    sp = make_socket("push")
    sp.bind("tcp://127.0.0.1:0")
    with pytest.raises(nanopy.ProtocolError, match="SP pipes carry one frame per message"):
        sp.send_multipart([b"a", b"b"])
    with pytest.raises(nanopy.ProtocolError, match="SP pipes carry one frame per message"):
        sp.send(nanopy.zmtp.Multipart([b"a", b"b"]))
    surveyor = make_socket("surveyor")
    with pytest.raises(nanopy.ProtocolError, match="surveyor sockets send one frame per message"):
        surveyor.send_multipart([b"a", b"b"])
    with pytest.raises(TypeError, match="list of frames"):
        push.send_multipart(b"ab")


def test_async_multipart(make_socket: MakeSocket, zctx: Any) -> None:
    import trio

    pair = make_socket("pair", recv_timeout=5)
    zpair = zsocket(zctx, zmq.PAIR)
    link(pair, zpair, "tcp", True)

    async def main() -> list[bytes]:
        await pair.asend_multipart([b"x", b"y"])
        assert zpair.recv_multipart() == [b"x", b"y"]
        zpair.send_multipart([b"1", b"2", b"3"])
        with pytest.raises(nanopy.ProtocolError, match="3 frames"):
            await pair.arecv()
        return await pair.arecv_multipart()

    assert trio.run(main) == [b"1", b"2", b"3"]


def test_curve_both_ways_with_pyzmq_keys(make_socket: MakeSocket, zctx: Any) -> None:
    from zmq.auth.thread import ThreadAuthenticator

    server_public, server_secret = zmq.curve_keypair()  # Z85 bytes, as pyzmq makes them
    client_public, client_secret = zmq.curve_keypair()
    # nanopy serves, a pyzmq client connects: its key must be in curve_clients
    pull = make_socket("pull", recv_timeout=5, recv_max_size=BIG_LIMIT)
    zpush = zsocket(zctx, zmq.PUSH, curve_serverkey=server_public, curve_publickey=client_public,
                    curve_secretkey=client_secret, heartbeat_ivl=50, heartbeat_timeout=300)
    link(pull, zpush, "tcp", True, curve_secret_key=server_secret, curve_clients={client_public.decode()})
    zpush.send_multipart([b"sealed", b"frames"])
    zpush.send(BIG)
    assert pull.recv_multipart() == [b"sealed", b"frames"]
    assert pull.recv() == BIG
    pipe = pull.pipes[0]
    with pytest.raises(nanopy.Timeout):
        pull.recv(timeout=0.8)  # sealed PINGs go by, sealed PONGs answer them
    assert pull.pipes == [pipe]
    zpush.send(b"after the heartbeats")
    assert pull.recv() == b"after the heartbeats"
    stranger_public, stranger_secret = zmq.curve_keypair()
    stranger = zsocket(zctx, zmq.PUSH, curve_serverkey=server_public, curve_publickey=stranger_public,
                       curve_secretkey=stranger_secret)
    stranger.connect(pull.endpoints[0].url.removeprefix("zmtp+"))
    wait_until(lambda: pull.stats().protocol_errors >= 1, what="the unknown client key refused")
    assert len(pull.pipes) == 1

    # pyzmq serves (with a ZAP handler, as libzmq needs), nanopy connects with an ephemeral key
    authenticator = ThreadAuthenticator(zctx)
    authenticator.start()
    try:
        authenticator.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
        zpull = zsocket(zctx, zmq.PULL, curve_server=1, curve_secretkey=server_secret)
        push = make_socket("push")
        link(push, zpull, "ipc", False, curve_server_key=server_public.decode())
        push.send(b"to a CURVE server")
        push.send_multipart([b"x", BIG])
        assert zpull.recv() == b"to a CURVE server"
        assert zpull.recv_multipart() == [b"x", BIG]
        wrong = make_socket("push")
        wrong.connect(push.endpoints[0].url, curve_server_key=client_public)  # not the server's key
        wait_until(lambda: wrong.stats().protocol_errors >= 1, what="the wrong server key refused")
        assert wrong.pipes == []
    finally:
        authenticator.stop()


def test_curve_nanopy_to_nanopy_with_heartbeat(make_socket: MakeSocket) -> None:
    public, secret = nanopy.zmtp.curve_keypair()
    client_public, client_secret = nanopy.zmtp.curve_keypair()
    rep = make_socket("rep", recv_timeout=5)
    ep = rep.bind("zmtp+tcp://127.0.0.1:0", curve_secret_key=secret, curve_clients=[client_public])
    req = make_socket("req", recv_timeout=5)
    req.connect(ep.url, curve_server_key=public.encode(), curve_secret_key=client_secret)
    wait_pipes(req)
    req.send(b"hi")
    msg = rep.recv_msg()
    msg.reply(b"hello " + msg.body)
    assert req.recv() == b"hello hi"
    # a PING from either side is answered inside the box
    conn = req._pipes[req.pipes[0].id].conn
    before = conn.last_heard
    conn.send_ping()
    wait_until(lambda: conn.last_heard > before, what="the PONG")
    assert req.stats().protocol_errors == rep.stats().protocol_errors == 0


def test_curve_option_errors(make_socket: MakeSocket, monkeypatch: pytest.MonkeyPatch) -> None:
    sock = make_socket("push")
    with pytest.raises(ValueError, match="32 raw bytes or 40 characters of Z85"):
        sock.connect("zmtp+tcp://127.0.0.1:1", curve_server_key="short")
    with pytest.raises(TypeError, match="PLAIN or CURVE"):
        sock.connect("zmtp+tcp://127.0.0.1:1", curve_server_key=bytes(32), plain=("a", "b"))
    import sys

    monkeypatch.setitem(sys.modules, "nacl", None)
    monkeypatch.setitem(sys.modules, "nacl.bindings", None)
    with pytest.raises(ImportError, match=r"nanopy\[curve\]"):
        sock.connect("zmtp+tcp://127.0.0.1:1", curve_server_key=bytes(32))


def test_nanopy_cat_speaks_zmtp(zctx: Any, tmp_path: Any) -> None:
    import subprocess
    import sys

    zpush = zsocket(zctx, zmq.PUSH)
    port = zpush.bind_to_random_port("tcp://127.0.0.1")
    out = tmp_path / "out"
    cat = [sys.executable, "-m", "nanopy", "cat"]
    proc = subprocess.Popen(
        [*cat, "--pull", "--connect", f"zmtp+tcp://127.0.0.1:{port}", "--recv-timeout", "2", "--raw"],
        stdout=out.open("wb"),
    )
    try:
        zpush.send(b"plain\n")
        zpush.send_multipart([b"frame1\n", b"frame2\n"])
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out.read_bytes() == b"plain\nframe1\nframe2\n"

    zpull = zsocket(zctx, zmq.PULL)
    zpull.rcvtimeo = 30000
    port = zpull.bind_to_random_port("tcp://127.0.0.1")
    sent = subprocess.run(
        [*cat, "--push", "--connect", f"zmtp+tcp://127.0.0.1:{port}", "--data", "via cat"],
        check=False, capture_output=True, timeout=60,
    )
    assert sent.returncode == 0, sent.stderr
    assert zpull.recv() == b"via cat"


def test_multipart_requests_and_replies(make_socket: MakeSocket, zctx: Any) -> None:
    """REQ and REP carry bodies of several frames both ways, envelopes around them."""
    req = make_socket("req", recv_timeout=5)
    router = zsocket(zctx, zmq.ROUTER)
    link(req, router, "tcp", False, identity="me")
    req.send_multipart([b"q1", b"q2"])
    assert router.recv_multipart() == [b"me", b"", b"q1", b"q2"]
    router.send_multipart([b"me", b"", b"r1", b"r2", b"r3"])
    assert req.recv_multipart() == [b"r1", b"r2", b"r3"]
    answers: list[bytes] = []
    asker = threading.Thread(target=lambda: answers.append(req.request(nanopy.zmtp.Multipart([b"x", b"y"]))))
    asker.start()
    identity, empty, *body = router.recv_multipart()
    assert body == [b"x", b"y"]
    router.send_multipart([identity, empty, b"u", b"v"])
    asker.join(10)
    assert [a.parts for a in answers] == [(b"u", b"v")]  # type: ignore[attr-defined]

    rep = make_socket("rep", recv_timeout=5)
    zreq = zsocket(zctx, zmq.REQ)
    link(rep, zreq, "ipc", True)
    zreq.send_multipart([b"a", b"", b"c"])
    msg = rep.recv_msg()
    assert msg.parts == [b"a", b"", b"c"]
    msg.reply(nanopy.zmtp.Multipart([b"A", b"C"]))
    assert zreq.recv_multipart() == [b"A", b"C"]
    zreq.send_multipart([b"m", b"n"])
    assert rep.recv_multipart() == [b"m", b"n"]
    rep.send_multipart([b"M", b"N"])
    assert zreq.recv_multipart() == [b"M", b"N"]


def test_plain_nanopy_to_nanopy_and_option_errors(make_socket: MakeSocket, caplog: pytest.LogCaptureFixture) -> None:
    pull = make_socket("pull", recv_timeout=5)
    url = pull.bind("zmtp+ipc://" + ipc_path(), plain_auth=lambda user, password: (user, password) == ("u", "p")).url
    push = make_socket("push")
    push.connect(url, plain=("u", "p"))
    push.send(b"plain")
    assert pull.recv() == b"plain"
    wrong = make_socket("push")
    wrong.connect(url, plain=("u", "x"))
    wait_until(lambda: wrong.stats().protocol_errors >= 1, what="the client told of its refusal")
    assert wrong.pipes == []
    assert "the ZMTP peer refused the handshake: Invalid username or password" in caplog.text
    for bad, error in (
        ({"plain": "u:p"}, TypeError),
        ({"plain": ("u", "p"), "plain_auth": lambda u, p: True}, TypeError),
        ({"identity": b"\x00x"}, ValueError),
        ({"identity": 5}, TypeError),
    ):
        with pytest.raises(error):
            push.connect("zmtp+tcp://127.0.0.1:1", **bad)
