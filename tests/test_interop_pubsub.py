"""PUB/SUB against real NNG and nanomsg peers: pynng sockets, nngcat and nanocat."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import wait_until
from peers import need_tool, pynng_dial, pynng_socket, read_exactly, run_tool

import nanopy
from nanopy.testing import ipc_url, local_url, wait_pipes

pytestmark = pytest.mark.interop

MakeSocket = Callable[..., nanopy.Socket]


def bind_url(transport: str) -> str:
    return local_url(transport, "ips")


def send_until(pub_send: Callable[[bytes], None], recv: Callable[[], bytes], marker: bytes, tries: int = 100) -> None:
    """Publish ``marker`` until the subscriber sees it: the peer's side of a fresh
    pipe may come up a moment after ours, and PUB drops for pipes it does not know yet."""
    for _ in range(tries):
        pub_send(marker)
        try:
            if recv() == marker:
                return
        except Exception:  # the receive timed out: try again
            continue
    pytest.fail(f"subscriber never received {marker!r}")


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_nanopy_pub_to_pynng_sub(make_socket: MakeSocket, transport: str) -> None:
    pub = make_socket("pub")
    ep = pub.bind(bind_url(transport))
    with pynng_socket("Sub0", recv_timeout=2000) as sub:
        sub.subscribe(b"keep")
        sub.subscribe(b"\x00\xff")
        pynng_dial(sub, ep.url)
        wait_pipes(pub)
        send_until(pub.send, sub.recv, b"keep-sync")
        for body in (b"drop1", b"keep1", b"kee", b"\x00\xffbin", b"\x00\xfe", b"keep2"):
            pub.send(body)
        assert [sub.recv() for _ in range(3)] == [b"keep1", b"\x00\xffbin", b"keep2"]
        sub.unsubscribe(b"keep")
        pub.send(b"keep3")
        pub.send(b"\x00\xff!")
        assert sub.recv() == b"\x00\xff!"


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_pynng_pub_to_nanopy_sub(make_socket: MakeSocket, transport: str) -> None:
    with pynng_socket("Pub0") as pub:
        url = "tcp://127.0.0.1:0" if transport == "tcp" else ipc_url("ips")
        listener = pub.listen(url)
        if transport == "tcp":
            url = f"tcp://{listener.local_address}"  # the real port (str() is in host order)
        sub = make_socket("sub", recv_timeout=0.2)
        sub.subscribe(b"a/")
        sub.subscribe("b/€")
        sub.connect(url)
        wait_pipes(sub)
        wait_until(lambda: len(pub.pipes) == 1, what="pynng PUB sees the SUB")
        send_until(pub.send, sub.recv, b"a/sync")
        sub.recv_timeout = 5.0
        for body in (b"c/1", b"a/1", "b/€1".encode(), b"a", b"b/", b"a/2"):
            pub.send(body)
        assert [sub.recv() for _ in range(3)] == [b"a/1", "b/€1".encode(), b"a/2"]
        assert sub.stats().protocol_errors == 0


def read_small_msgpack(proc: object, timeout: float) -> bytes:
    """One ``--msgpack`` message of fewer than 256 bytes (bin8: 0xC4, size, body)."""
    head = read_exactly(proc, 2, timeout)  # type: ignore[arg-type]
    assert head[0] == 0xC4, head
    return read_exactly(proc, head[1], timeout) if head[1] else b""  # type: ignore[arg-type]


@pytest.mark.parametrize("tool", ["nngcat", "nanocat"])
@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_nanopy_pub_to_cat_sub(make_socket: MakeSocket, tool: str, transport: str) -> None:
    exe = need_tool(tool)
    pub = make_socket("pub")
    ep = pub.bind(bind_url(transport))
    args = [exe, "--sub", "--connect", ep.url, "--subscribe", "X", "--subscribe", "sync", "--msgpack"]
    with run_tool(args) as proc:
        wait_pipes(pub)
        # The tool's SUB may see its pipe a moment after we see ours: publish the
        # sync marker until it shows up, then the real test messages.
        for _ in range(50):
            pub.send(b"sync")
            if read_until_readable(proc, 0.2):
                break
        for body in (b"Y1", b"X1", b"x2", b"X", b"YX", b"Xend"):
            pub.send(body)
        got = []
        while not got or got[-1] != b"Xend":
            got.append(read_small_msgpack(proc, timeout=10))
        assert [m for m in got if m != b"sync"] == [b"X1", b"X", b"Xend"]
        assert b"sync" in got


def read_until_readable(proc: object, timeout: float) -> bool:
    """Whether the tool's stdout has data within ``timeout`` (nothing is consumed)."""
    import select

    return bool(select.select([proc.stdout], [], [], timeout)[0])  # type: ignore[attr-defined]
