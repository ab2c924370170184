"""ws://, wss:// and tls+tcp:// against NNG: pynng sockets and nngcat.

REQ/REP, PUSH/PULL and PUB/SUB over ws with each side listening in turn, a 2 MiB
message in both directions (nanopy fragments at 64 KiB, NNG drops frames over 1 MiB);
wss and tls+tcp with a CA generated in the test (pynng.TLSConfig); a client that
lacks the CA is refused and no message passes. Every pynng peer runs in a child
process (tests/peers.py :func:`pynng_peer`): NNG's ws close can abort its process.
"""

from __future__ import annotations

import os
import select
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from conftest import wait_until
from peers import (
    PynngCloseCrashed,
    PynngPeerDied,
    body_of,
    free_tcp_port,
    need_tool,
    pynng_dial,
    pynng_peer,
    pynng_socket,
    read_exactly,
    run_tool,
    wait_exit,
)
from tls_certs import tls_files

import nanopy
from nanopy.testing import wait_pipes

pytestmark = pytest.mark.interop

MakeSocket = Callable[..., nanopy.Socket]
BIG = 2 << 20  # 2 MiB
SMALL = b"small message"
OPTS = {"recv_max_size": 4 << 20, "reconnect_interval": 0.02, "reconnect_interval_max": 0.2}


def free_ws_url(path: str = "/interop") -> str:
    return f"ws://127.0.0.1:{free_tcp_port()}{path}"


@pytest.fixture(params=["nanopy-listens", "nng-listens"])
def nanopy_listens(request: pytest.FixtureRequest) -> bool:
    return request.param == "nanopy-listens"


def attach_pynng(make_socket: MakeSocket, proto: str, peer: object, nanopy_listens: bool) -> nanopy.Socket:
    sock = make_socket(proto, **OPTS)
    if nanopy_listens:
        url = sock.bind("ws://127.0.0.1:0/interop").url
        pynng_dial(peer, url)
    else:
        url = free_ws_url()
        peer.listen(url)  # type: ignore[attr-defined]
        sock.connect(url)
    wait_pipes(sock)
    wait_until(lambda: len(peer.pipes) == 1, what="pynng sees the pipe")  # type: ignore[attr-defined]
    return sock


# -- pynng over ws ------------------------------------------------------------------------
def test_pynng_req_to_nanopy_rep(make_socket: MakeSocket, nanopy_listens: bool) -> None:
    with pynng_peer("Req0", recv_timeout=10_000, send_timeout=10_000) as req:
        rep = attach_pynng(make_socket, "rep", req, nanopy_listens)
        big_q, big_a = body_of(BIG, 1), body_of(BIG, 2)
        req.send(SMALL)
        assert rep.recv(timeout=10) == SMALL
        rep.send(b"answer")
        assert req.recv() == b"answer"
        req.send(big_q)
        assert rep.recv(timeout=10) == big_q
        rep.send(big_a)
        assert req.recv() == big_a


def test_nanopy_req_to_pynng_rep(make_socket: MakeSocket, nanopy_listens: bool) -> None:
    with pynng_peer("Rep0", recv_timeout=10_000, send_timeout=10_000) as rep:
        req = attach_pynng(make_socket, "req", rep, nanopy_listens)
        big_q, big_a = body_of(BIG, 3), body_of(BIG, 4)
        req.send(big_q)
        assert rep.recv() == big_q
        rep.send(big_a)
        assert req.recv(timeout=10) == big_a
        req.send(SMALL)
        assert rep.recv() == SMALL
        rep.send(b"ok")
        assert req.recv(timeout=10) == b"ok"


def test_pynng_push_to_nanopy_pull(make_socket: MakeSocket, nanopy_listens: bool) -> None:
    with pynng_peer("Push0", send_timeout=10_000) as push:
        pull = attach_pynng(make_socket, "pull", push, nanopy_listens)
        bodies = [SMALL, body_of(BIG, 5), b"", body_of(70_000, 6)]
        for body in bodies:
            push.send(body)
        assert [pull.recv(timeout=10) for _ in bodies] == bodies
        assert pull.stats().protocol_errors == 0


def test_nanopy_push_to_pynng_pull(make_socket: MakeSocket, nanopy_listens: bool) -> None:
    with pynng_peer("Pull0", recv_timeout=10_000) as pull:
        push = attach_pynng(make_socket, "push", pull, nanopy_listens)
        bodies = [SMALL, body_of(BIG, 7), b"", body_of(70_000, 8)]
        for body in bodies:
            push.send(body)
        assert [pull.recv_msg().bytes for _ in bodies] == bodies


def publish_until_seen(send: Callable[[bytes], None], recv: Callable[[], bytes]) -> None:
    """PUB drops for pipes it does not know yet: publish a marker until it arrives."""
    for _ in range(100):
        send(b"sync")
        try:
            if recv() == b"sync":
                return
        except (nanopy.Timeout, Exception):
            continue
    pytest.fail("subscriber never received the sync marker")


def test_nanopy_pub_to_pynng_sub(make_socket: MakeSocket, nanopy_listens: bool) -> None:
    with pynng_peer("Sub0", recv_timeout=200) as sub:
        sub.subscribe(b"")
        pub = attach_pynng(make_socket, "pub", sub, nanopy_listens)
        publish_until_seen(pub.send, sub.recv)
        sub.recv_timeout = 10_000
        big = body_of(BIG, 9)
        pub.send(big)
        pub.send(SMALL)
        got = [sub.recv() for _ in range(2)]
        while got[0] == b"sync":
            got = got[1:] + [sub.recv()]
        assert got == [big, SMALL]


def test_pynng_pub_to_nanopy_sub(make_socket: MakeSocket, nanopy_listens: bool) -> None:
    with pynng_peer("Pub0") as pub:
        sub = attach_pynng(make_socket, "sub", pub, nanopy_listens)
        sub.subscribe(b"")
        publish_until_seen(pub.send, lambda: sub.recv(timeout=0.2))
        big = body_of(BIG, 10)
        pub.send(big)
        pub.send(SMALL)
        got = [sub.recv(timeout=10) for _ in range(2)]
        while got[0] == b"sync":
            got = got[1:] + [sub.recv(timeout=10)]
        assert got == [big, SMALL]


# -- nngcat over ws -------------------------------------------------------------------------
def read_msgpack(proc: subprocess.Popen[bytes], timeout: float = 15) -> bytes:
    """One ``--msgpack`` bin object from the tool's stdout."""
    tag = read_exactly(proc, 1, timeout)[0]
    width = {0xC4: 1, 0xC5: 2, 0xC6: 4}[tag]
    size = int.from_bytes(read_exactly(proc, width, timeout), "big")
    return read_exactly(proc, size, timeout) if size else b""


def body_file(tmp_path: os.PathLike[str], body: bytes, name: str) -> str:
    path = os.path.join(tmp_path, name)
    with open(path, "wb") as f:
        f.write(body)
    return path


def cat_endpoint(sock: nanopy.Socket, nanopy_listens: bool) -> list[str]:
    """Attach ``sock``; the tool's endpoint flag and URL."""
    if nanopy_listens:
        return ["--dial", sock.bind("ws://127.0.0.1:0/cat").url]
    url = free_ws_url("/cat")
    sock.connect(url)
    return ["--listen", url]


def test_nngcat_rep_answers_nanopy_req(make_socket: MakeSocket, nanopy_listens: bool, tmp_path) -> None:
    exe = need_tool("nngcat")
    req = make_socket("req", **OPTS)
    answer = body_of(BIG, 11)
    question = body_of(BIG, 12)
    args = [exe, "--rep", *cat_endpoint(req, nanopy_listens), "-Z", str(8 << 20),
            "--file", body_file(tmp_path, answer, "answer"), "--msgpack"]
    with run_tool(args) as proc:
        req.send(question)
        assert read_msgpack(proc) == question  # read first: the tool blocks on a full stdout pipe
        assert req.recv(timeout=15) == answer


def test_nngcat_req_asks_nanopy_rep(make_socket: MakeSocket, nanopy_listens: bool, tmp_path) -> None:
    exe = need_tool("nngcat")
    rep = make_socket("rep", **OPTS)
    question = body_of(BIG, 13)
    answer = body_of(BIG, 14)
    args = [exe, "--req", *cat_endpoint(rep, nanopy_listens), "-Z", str(8 << 20),
            "--file", body_file(tmp_path, question, "question"), "--msgpack"]
    with run_tool(args) as proc:
        assert rep.recv(timeout=15) == question
        rep.send(answer)
        assert read_msgpack(proc) == answer


def test_nngcat_push_to_nanopy_pull(make_socket: MakeSocket, nanopy_listens: bool, tmp_path) -> None:
    exe = need_tool("nngcat")
    pull = make_socket("pull", **OPTS)
    body = body_of(BIG, 15)
    args = [exe, "--push", *cat_endpoint(pull, nanopy_listens), "--file", body_file(tmp_path, body, "b")]
    with run_tool(args) as proc:
        assert pull.recv(timeout=15) == body
        assert wait_exit(proc) == 0


def test_nanopy_push_to_nngcat_pull(make_socket: MakeSocket, nanopy_listens: bool) -> None:
    exe = need_tool("nngcat")
    push = make_socket("push", **OPTS)
    body = body_of(BIG, 16)
    args = [exe, "--pull", *cat_endpoint(push, nanopy_listens), "-Z", str(8 << 20), "--msgpack"]
    with run_tool(args) as proc:
        push.send(SMALL)
        push.send(body)
        assert read_msgpack(proc) == SMALL
        assert read_msgpack(proc) == body


def test_nanopy_pub_to_nngcat_sub(make_socket: MakeSocket, nanopy_listens: bool) -> None:
    exe = need_tool("nngcat")
    pub = make_socket("pub", **OPTS)
    big = body_of(BIG, 17)
    args = [exe, "--sub", *cat_endpoint(pub, nanopy_listens), "--subscribe", "", "-Z", str(8 << 20), "--msgpack"]
    with run_tool(args) as proc:
        wait_pipes(pub)
        for _ in range(100):  # the tool's side of the pipe may lag ours
            pub.send(b"sync")
            if select.select([proc.stdout], [], [], 0.1)[0]:
                break
        pub.send(big)
        got = read_msgpack(proc)
        while got == b"sync":
            got = read_msgpack(proc)
        assert got == big


def test_nngcat_pub_to_nanopy_sub(make_socket: MakeSocket, nanopy_listens: bool, tmp_path) -> None:
    exe = need_tool("nngcat")
    sub = make_socket("sub", **OPTS)
    sub.subscribe(b"")
    big = body_of(BIG, 18)
    # The tool publishes the same body every second until killed.
    args = [exe, "--pub", *cat_endpoint(sub, nanopy_listens), "--file", body_file(tmp_path, big, "big"),
            "--interval", "1"]
    with run_tool(args):
        assert sub.recv(timeout=15) == big


# -- TLS with pynng.TLSConfig -----------------------------------------------------------------
TLS_SCHEMES = {"wss": "wss://127.0.0.1:0/secure", "tls+tcp": "tls+tcp://127.0.0.1:0"}


@pytest.fixture(params=sorted(TLS_SCHEMES))
def tls_scheme(request: pytest.FixtureRequest) -> str:
    return request.param


def pynng_tls(server: bool, with_ca: bool = True) -> dict[str, str]:
    """Keywords for ``pynng.TLSConfig`` in the peer's process (tests/peers.py :func:`pynng_peer`)."""
    t = tls_files()
    if server:
        cut = t.server_pem.index("-----BEGIN CERTIFICATE-----")
        return {"mode": "MODE_SERVER", "own_key_string": t.server_pem[:cut], "own_cert_string": t.server_pem[cut:]}
    if with_ca:
        return {"mode": "MODE_CLIENT", "server_name": "localhost", "ca_string": t.ca_pem}
    return {"mode": "MODE_CLIENT", "server_name": "localhost", "auth_mode": "AUTH_MODE_REQUIRED"}


def test_tls_pynng_dials_nanopy(make_socket: MakeSocket, tls_scheme: str) -> None:
    pull = make_socket("pull", **OPTS)
    url = pull.bind(TLS_SCHEMES[tls_scheme], ssl_context=tls_files().server_ctx).url
    with pynng_peer("Push0", send_timeout=10_000, tls_config=pynng_tls(server=False)) as push:
        pynng_dial(push, url.replace("127.0.0.1", "localhost"))
        big = body_of(BIG, 19)
        push.send(SMALL)
        push.send(big)
        assert pull.recv(timeout=10) == SMALL
        assert pull.recv(timeout=10) == big


def test_tls_nanopy_dials_pynng(make_socket: MakeSocket, tls_scheme: str) -> None:
    port = free_tcp_port()
    url = f"{tls_scheme}://127.0.0.1:{port}" + ("/secure" if tls_scheme == "wss" else "")
    with pynng_peer("Rep0", recv_timeout=10_000, send_timeout=10_000, tls_config=pynng_tls(server=True)) as rep:
        rep.listen(url)
        req = make_socket("req", **OPTS)
        req.connect(url, ssl_context=tls_files().client_ctx)
        big = body_of(BIG, 20)
        req.send(big)
        assert rep.recv() == big
        rep.send(big[::-1])
        assert req.recv(timeout=10) == big[::-1]


def test_tls_pynng_without_ca_is_refused(make_socket: MakeSocket, tls_scheme: str) -> None:
    pynng = pytest.importorskip("pynng")
    pull = make_socket("pull", **OPTS)
    url = pull.bind(TLS_SCHEMES[tls_scheme], ssl_context=tls_files().server_ctx).url
    with pynng_peer("Push0", send_timeout=300, tls_config=pynng_tls(server=False, with_ca=False)) as push:
        pynng_dial(push, url.replace("127.0.0.1", "localhost"))
        with pytest.raises(pynng.Timeout):
            push.send(b"must not pass")  # no pipe ever comes up
        with pytest.raises(nanopy.Timeout):
            pull.recv(timeout=0)  # and without a pipe nothing can be on its way
        assert len(push.pipes) == 0
    assert pull.stats().messages_received == 0 and pull.stats().connects == 0


def test_tls_nanopy_without_ca_is_refused(make_socket: MakeSocket, tls_scheme: str) -> None:
    port = free_tcp_port()
    url = f"{tls_scheme}://127.0.0.1:{port}" + ("/secure" if tls_scheme == "wss" else "")
    with pynng_peer("Pull0", recv_timeout=300, tls_config=pynng_tls(server=True)) as pull:
        pull.listen(url)
        push = make_socket("push", **OPTS)
        push.connect(url)  # default context: the test CA is unknown
        wait_until(lambda: push.stats().protocol_errors >= 2, what="verification failures")
        assert push.pipes == [] and len(pull.pipes) == 0
        with pytest.raises(nanopy.Timeout):
            push.send(b"must not pass", timeout=0)




# -- path-less URLs and nanomsg -----------------------------------------------------------------
def test_nngcat_pathless_url_reaches_root(make_socket: MakeSocket) -> None:
    """NNG dials ``ws://host:port`` with an empty request target; we serve it as ``/``."""
    exe = need_tool("nngcat")
    pull = make_socket("pull", **OPTS)
    url = pull.bind("ws://127.0.0.1:0").url
    assert url.endswith("/")
    with run_tool([exe, "--push", "--dial", url.rstrip("/"), "--data", "no path"]) as proc:
        assert pull.recv(timeout=15) == b"no path"
        assert wait_exit(proc) == 0


@pytest.mark.parametrize("nanopy_listens_", [True, False], ids=["nanopy-listens", "nanocat-listens"])
def test_nanocat_push_to_nanopy_pull(make_socket: MakeSocket, nanopy_listens_: bool) -> None:
    exe = need_tool("nanocat")
    pull = make_socket("pull", **OPTS)
    if nanopy_listens_:
        flag, url = "--connect", pull.bind("ws://127.0.0.1:0/nn").url
    else:
        flag, url = "--bind", free_ws_url("")  # nanomsg refuses a path when binding
        pull.connect(url)
    body = "nanomsg says hi " * 1000
    with run_tool([exe, "--push", flag, url, "--data", body]) as proc:
        assert pull.recv(timeout=15) == body.encode()
        assert wait_exit(proc) == 0


@pytest.mark.parametrize("first", ["nanopy-closes", "nng-closes"])
def test_wss_close_with_pynng_is_prompt_and_clean(
    make_socket: MakeSocket, ws_close_times: object, nanopy_listens: bool, first: str
) -> None:
    """The close handshake with NNG completes at once over TLS: nanopy's end gets
    NNG's CLOSE 1000 and closes well within the 0.5 s it would give a silent peer."""
    t = tls_files()
    role = "nanopy-listens" if nanopy_listens else "nng-listens"
    with pynng_peer("Pull0", recv_timeout=10_000, tls_config=pynng_tls(server=not nanopy_listens)) as pull:
        push = make_socket("push", reconnect_interval=5)
        if nanopy_listens:
            url = push.bind("wss://127.0.0.1:0/close", ssl_context=t.server_ctx).url
            pynng_dial(pull, url.replace("127.0.0.1", "localhost"))
        else:
            url = f"wss://127.0.0.1:{free_tcp_port()}/close"
            pull.listen(url)
            push.connect(url, ssl_context=t.client_ctx)
        wait_pipes(push)
        push.send(SMALL, timeout=10)
        assert pull.recv() == SMALL
        if first == "nanopy-closes":
            push.close(linger=0)
        else:
            pull.close()
        ((side, seconds, code),) = ws_close_times.wait(1)  # type: ignore[attr-defined]
    print(f"{role}, {first}: nanopy's {side} closed in {seconds * 1000:.1f} ms, peer's code {code}")
    if code is None and ws_close_times.cut_short[0]:  # type: ignore[attr-defined]
        # Seen under load, NNG's bug rather than ours: NNG wrote its CLOSE frame's head
        # and closed the connection before the two code bytes that follow it.
        print("NNG cut its CLOSE frame short; nanopy still closed at once")
    else:
        assert code == 1000, f"NNG's CLOSE not received ({role}, {first}): {code}"
    assert seconds < 0.2, f"closing took {seconds:.3f} s ({role}, {first})"


# -- issue 22 (3): NNG's close of a ws pipe can race its peer's and abort -------------------
@pytest.mark.parametrize("nanopy_listens", [True, False], ids=["nanopy-listens", "nng-listens"])
def test_pynng_socket_is_closed_after_ours_and_its_pipes(make_socket: MakeSocket, nanopy_listens: bool) -> None:
    """tests/peers.py closes our side first; the pynng socket closes with no pipe left."""
    seen: list[tuple[bool, int]] = []
    with pynng_peer("Pair0") as peer:
        sock = attach_pynng(make_socket, "pair", peer, nanopy_listens)
        close = peer.close

        def record_and_close() -> None:
            seen.append((sock.closed, len(peer.pipes)))
            close()

        peer.close = record_and_close  # type: ignore[method-assign]
    assert seen == [(True, 0)]


@pytest.mark.parametrize("when", ["in-close", "mid-test"])
def test_a_pynng_peer_that_aborts_cannot_take_pytest_down(make_socket: MakeSocket, when: str) -> None:
    """The pynng peer's process aborts (as NNG's close race does); this process goes on.

    In close, after the test's work: a PynngCloseCrashed warning naming SIGABRT, our
    socket closed first as usual. Mid-test: PynngPeerDied, an AssertionError that fails
    the test with the child's end in it; our socket loses only that pipe. Either way
    the next peer gets a fresh process.
    """
    if when == "in-close":
        expect: Any = pytest.warns(PynngCloseCrashed, match="ended with SIGABRT during Pair0.close")
    else:
        expect = pytest.raises(PynngPeerDied, match="ended with SIGABRT during Pair0: abort")
    with expect, pynng_peer("Pair0", recv_timeout=10_000) as doomed:
        sock = attach_pynng(make_socket, "pair", doomed, nanopy_listens=True)
        sock.send(b"before")
        assert doomed.recv() == b"before"
        dead_pid = doomed.pid
        if when == "in-close":
            doomed._abort_on_close()
        else:
            doomed._abort_now()
    if when == "in-close":
        assert sock.closed
    else:
        wait_until(lambda: sock.pipes == [], what="our end of the dead peer's pipe closed")
        assert not sock.closed
    with pytest.raises(ProcessLookupError):
        os.kill(dead_pid, 0)  # gone and reaped
    with pynng_peer("Pair0", recv_timeout=10_000) as fresh:
        assert fresh.pid != dead_pid
        sock = attach_pynng(make_socket, "pair", fresh, nanopy_listens=True)
        sock.send(b"after")
        assert fresh.recv() == b"after"


def test_in_process_pynng_refuses_crash_prone_transports() -> None:
    """tests/peers.py sends every ws/wss/tls+tcp pynng peer to a child process."""
    with pynng_socket("Pair0") as peer, pytest.raises(ValueError, match="use peers.pynng_peer"):
        peer.listen(free_ws_url())
    with pytest.raises(ValueError, match="use peers.pynng_peer"), pynng_socket("Pair0", dial="wss://localhost:1/"):
        pass
