"""PAIR v0 and PUSH/PULL against real peers: pynng (NNG), nngcat (NNG) and nanocat (nanomsg).

Every combination runs over tcp and ipc with each side binding in turn, and carries
bodies of 0 B, 1 B, 64 KiB and 1 MiB - 1 (the largest that fits nanomsg's and nanopy's
default 1 MiB receive limit), checking that they arrive intact and in order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from peers import (
    INTEROP_SIZES,
    NANOCAT_STAY,
    body_of,
    free_tcp_url,
    need_tool,
    pynng_dial,
    pynng_socket,
    read_msgpack_messages,
    run_tool,
    wait_exit,
)

import nanopy
from nanopy.testing import ipc_url, wait_pipes

pytestmark = pytest.mark.interop

BODIES = [body_of(size, seed) for seed, size in enumerate(INTEROP_SIZES)]
SIZES = [len(b) for b in BODIES]
# Short reconnect delays: tools that bind come and go between messages.
FAST_RECONNECT = {"reconnect_interval": 0.01, "reconnect_interval_max": 0.05}


def peer_url(kind: str) -> str:
    """An address a foreign peer can bind (it cannot report a port 0 back to us)."""
    return free_tcp_url() if kind == "tcp" else ipc_url("interop")


@pytest.fixture(params=["tcp", "ipc"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=["nanopy-binds", "peer-binds"])
def nanopy_binds(request: pytest.FixtureRequest) -> bool:
    return request.param == "nanopy-binds"


@pytest.fixture
def sock_factory() -> Iterator[Callable[..., nanopy.Socket]]:
    made: list[nanopy.Socket] = []

    def make(protocol: str) -> nanopy.Socket:
        s = nanopy.Socket(protocol, **FAST_RECONNECT)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close(linger=0)


def attach(sock: nanopy.Socket, kind: str, binds: bool) -> str:
    """Bind or connect ``sock``; the URL the peer must use."""
    if binds:
        return sock.bind("tcp://127.0.0.1:0" if kind == "tcp" else ipc_url("interop")).url
    url = peer_url(kind)
    sock.connect(url)
    return url


def recv_all(sock: nanopy.Socket, n: int) -> list[bytes]:
    return [sock.recv(timeout=10) for _ in range(n)]


def send_all(sock: nanopy.Socket, bodies: list[bytes]) -> None:
    for body in bodies:
        sock.send(body, timeout=10)


# -- pynng ------------------------------------------------------------------------------------


def _pynng_attach(peer: object, url: str, nanopy_binds: bool) -> None:
    if nanopy_binds:
        pynng_dial(peer, url)
    else:
        peer.listen(url)  # type: ignore[attr-defined]


def _link_pynng(sock: nanopy.Socket, peer: object, kind: str, nanopy_binds: bool) -> None:
    """Connect ``sock`` and the pynng ``peer`` over ``kind``, with the given side binding."""
    if nanopy_binds:
        _pynng_attach(peer, attach(sock, kind, True), True)
    else:
        url = peer_url(kind)
        _pynng_attach(peer, url, False)
        sock.connect(url)


def test_pynng_pull_from_nanopy_push(sock_factory: Callable[..., nanopy.Socket], kind: str, nanopy_binds: bool) -> None:
    push = sock_factory("push")
    with pynng_socket("Pull0", recv_timeout=10_000) as peer:
        _link_pynng(push, peer, kind, nanopy_binds)
        send_all(push, BODIES)
        got = [peer.recv_msg().bytes for _ in BODIES]
    assert got == BODIES


def test_pynng_push_to_nanopy_pull(sock_factory: Callable[..., nanopy.Socket], kind: str, nanopy_binds: bool) -> None:
    pull = sock_factory("pull")
    with pynng_socket("Push0", send_timeout=10_000) as peer:
        _link_pynng(pull, peer, kind, nanopy_binds)
        for body in BODIES:
            peer.send(body)
        got = recv_all(pull, len(BODIES))
    assert got == BODIES
    assert pull.stats().protocol_errors == 0


def test_pynng_pair(sock_factory: Callable[..., nanopy.Socket], kind: str, nanopy_binds: bool) -> None:
    pair = sock_factory("pair")
    url = peer_url(kind)
    with pynng_socket("Pair0", recv_timeout=10_000, send_timeout=10_000) as peer:
        if nanopy_binds:
            url = attach(pair, kind, True)
            _pynng_attach(peer, url, True)
        else:
            _pynng_attach(peer, url, False)
            pair.connect(url)
        send_all(pair, BODIES)
        assert [peer.recv_msg().bytes for _ in BODIES] == BODIES  # pynng recv() fails on b""
        for body in reversed(BODIES):
            peer.send(body)
        assert recv_all(pair, len(BODIES)) == list(reversed(BODIES))


def test_pynng_many_small_messages_both_ways(sock_factory: Callable[..., nanopy.Socket]) -> None:
    pull = sock_factory("pull")
    url = pull.bind("tcp://127.0.0.1:0").url
    with pynng_socket("Push0", send_timeout=10_000) as peer:
        pynng_dial(peer, url)
        for i in range(2000):
            peer.send(b"%d" % i)
        assert recv_all(pull, 2000) == [b"%d" % i for i in range(2000)]


# The pynng peer runs in its own process: pynng 0.9 (NNG 1.11) can crash with SIGSEGV
# when a socket sends again after its pipe was dropped in the middle of a large message,
# and a crash must not take the test run down with it. Each step waits for a line on
# stdin so the test decides when the peer moves on.
_OVERSIZE_PEER = """
import sys, pynng
url = sys.argv[1]
with pynng.Push0(send_timeout=10_000) as peer:
    peer.dial(url, block=False)
    peer.send(b"ok")
    peer.send(b"x" * ((1 << 20) + 1))  # nanopy's default recv_max_size is 1 MiB
    sys.stdin.readline()
with pynng.Push0(send_timeout=10_000) as peer:
    peer.dial(url, block=False)
    peer.send(b"after")
    sys.stdin.readline()
"""


def test_pynng_oversized_message_closes_the_pipe(sock_factory: Callable[..., nanopy.Socket]) -> None:
    import subprocess
    import sys

    from conftest import wait_until

    pull = sock_factory("pull")
    url = pull.bind("tcp://127.0.0.1:0").url
    peer = subprocess.Popen([sys.executable, "-c", _OVERSIZE_PEER, url], stdin=subprocess.PIPE)
    try:
        assert pull.recv(timeout=10) == b"ok"
        wait_until(lambda: pull.stats().protocol_errors == 1, timeout=10, what="oversized pipe dropped")
        peer.stdin.write(b"next\n")  # type: ignore[union-attr]
        peer.stdin.flush()  # type: ignore[union-attr]
        # The listener goes on serving: a new pynng peer gets through, and its
        # message is the next one received: the oversized one was never delivered.
        assert pull.recv(timeout=10) == b"after"
        assert pull.stats().protocol_errors == 1
        assert pull.stats().messages_received == 2
    finally:
        peer.kill()
        peer.wait()


# -- nngcat / nanocat -------------------------------------------------------------------------

TOOLS = {
    # tool: (pull flag, push flag, pair flag, listen flag, dial flag)
    "nngcat": ("--pull0", "--push0", "--pair0", "--listen", "--dial"),
    "nanocat": ("--pull", "--push", "--pair", "--bind", "--connect"),
}


@pytest.fixture(params=sorted(TOOLS))
def tool(request: pytest.FixtureRequest) -> str:
    need_tool(request.param)
    return request.param


def endpoint_flag(tool: str, tool_binds: bool) -> str:
    return TOOLS[tool][3] if tool_binds else TOOLS[tool][4]


def data_args(tool: str, body: bytes, tmp_path: os.PathLike[str], i: int) -> list[str]:
    """Arguments that make ``tool`` send ``body`` (a file, except nanocat's empty body:
    nanocat asserts on an empty --file)."""
    if not body:
        return ["--data", ""]
    path = os.path.join(tmp_path, f"body{i}.bin")
    with open(path, "wb") as f:
        f.write(body)
    return ["--file", path]


def test_tool_pull_from_nanopy_push(
    sock_factory: Callable[..., nanopy.Socket], tool: str, kind: str, nanopy_binds: bool
) -> None:
    push = sock_factory("push")
    if nanopy_binds:
        url = attach(push, kind, True)
    else:
        url = peer_url(kind)
    args = [tool, TOOLS[tool][0], endpoint_flag(tool, not nanopy_binds), url, "--msgpack"]
    with run_tool(args) as proc:
        if not nanopy_binds:
            push.connect(url)
        send_all(push, BODIES)
        got = read_msgpack_messages(proc, SIZES, timeout=15)
    assert got == BODIES


def test_tool_push_to_nanopy_pull(
    sock_factory: Callable[..., nanopy.Socket],
    tool: str,
    kind: str,
    nanopy_binds: bool,
    tmp_path: os.PathLike[str],
) -> None:
    pull = sock_factory("pull")
    url = attach(pull, kind, nanopy_binds)
    got = []
    # nanocat exits right after its send, before a large body has left (nanomsg has
    # no linger): keep it alive with a long resend interval and kill it once the
    # first copy arrived. nngcat waits 200 ms before exiting, which suffices.
    linger = list(NANOCAT_STAY) if tool == "nanocat" else []
    for i, body in enumerate(BODIES):
        # One process per message (the tools send one body and exit): the next
        # starts only after this one arrived, so the order is checked too.
        args = [
            tool, TOOLS[tool][1], endpoint_flag(tool, not nanopy_binds), url,
            *data_args(tool, body, tmp_path, i), *linger,
        ]
        with run_tool(args) as proc:
            got.append(pull.recv(timeout=15))
            if not linger:
                wait_exit(proc)
                assert proc.returncode == 0, proc.stderr.read() if proc.stderr else b""
    assert got == BODIES
    assert pull.stats().protocol_errors == 0


def test_tool_pair(
    sock_factory: Callable[..., nanopy.Socket],
    tool: str,
    kind: str,
    nanopy_binds: bool,
    tmp_path: os.PathLike[str],
) -> None:
    pair = sock_factory("pair")
    url = attach(pair, kind, nanopy_binds)
    hello = body_of(64 * 1024, seed=9)
    # With data, a PAIR tool sends it once, then prints everything it receives.
    args = [
        tool, TOOLS[tool][2], endpoint_flag(tool, not nanopy_binds), url,
        *data_args(tool, hello, tmp_path, 0), "--msgpack",
    ]
    with run_tool(args) as proc:
        assert pair.recv(timeout=15) == hello
        send_all(pair, BODIES)
        got = read_msgpack_messages(proc, SIZES, timeout=15)
    assert got == BODIES


def test_tool_pair_refused_while_nanopy_has_a_peer(
    sock_factory: Callable[..., nanopy.Socket], tool: str
) -> None:
    pair = sock_factory("pair")
    url = pair.bind("tcp://127.0.0.1:0").url
    other = sock_factory("pair")
    other.connect(url)
    wait_pipes(pair)
    args = [tool, TOOLS[tool][2], endpoint_flag(tool, False), url, "--data", "intruder", "--msgpack"]
    with run_tool(args):
        from conftest import wait_until

        other.send(b"first", timeout=5)
        # The original peer still reaches us; the intruder's message never does:
        # once its pipe has been refused, the next message is the sentinel.
        assert pair.recv(timeout=5) == b"first"
        wait_until(lambda: pair.stats().disconnects >= 1, timeout=10, what="the intruder refused")
        other.send(b"sentinel", timeout=5)
        assert pair.recv(timeout=5) == b"sentinel"
    assert len(pair.pipes) == 1
