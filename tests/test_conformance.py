"""One conformance suite for every registered transport scheme.

Runs over ``nanopy.transports.schemes()`` -- the built-ins and any installed plug-in
-- plus the example plug-in in ``examples/plugins`` (registered in-process here when
it is not installed). A scheme this file knows nothing about is tried as
``scheme://127.0.0.1:0``.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import wait_until
from tls_certs import tls_files

import nanopy
import nanopy.transports
from nanopy.testing import check_transport, local_url, wait_no_pipes, wait_pipes
from nanopy.transports import PipeContext

EXAMPLE_SRC = Path(__file__).resolve().parent.parent / "examples" / "plugins" / "src"
if "tcp+zlib" not in nanopy.transports.schemes():
    sys.path.insert(0, str(EXAMPLE_SRC))
    import nanopy_zlib

    if "tcp+zlib" not in nanopy.transports.schemes():  # (a build's egg-info there declares it too)
        nanopy.transports.register("tcp+zlib", nanopy_zlib.transport)

SCHEMES = nanopy.transports.schemes()
# Schemes whose address is a host:port (port 0 = any free port; a raw TCP peer can stall them).
LOCAL_ONLY = {"inproc", "ipc", "zmtp+ipc"}


def bind_url(scheme: str) -> str:
    return local_url(scheme, "conf")


def accepts_tls(scheme: str) -> bool:
    return "ssl_context" in getattr(nanopy.transports.get(scheme), "endpoint_options", ())


def bind_opts(scheme: str) -> dict[str, Any]:
    return {"ssl_context": tls_files().server_ctx} if accepts_tls(scheme) else {}


def connect_opts(scheme: str) -> dict[str, Any]:
    return {"ssl_context": tls_files().client_ctx} if accepts_tls(scheme) else {}


def context(scheme: str, recv_max_size: int = 1 << 20, dialer: bool = False) -> PipeContext:
    opts = connect_opts(scheme) if dialer else bind_opts(scheme)
    return PipeContext(0x10, 0x10, "pair", "pair", recv_max_size, {"tcp_nodelay": True, **opts})


@pytest.fixture(params=SCHEMES)
def scheme(request: pytest.FixtureRequest) -> str:
    return request.param


def connected(make_socket: Any, scheme: str, **options: Any) -> tuple[nanopy.Socket, nanopy.Socket]:
    a = make_socket("pair", **options)
    b = make_socket("pair", **options)
    ep = a.bind(bind_url(scheme), **bind_opts(scheme))
    b.connect(ep.url, **connect_opts(scheme))
    wait_pipes(a)
    wait_pipes(b)
    return a, b


# -- transport level -----------------------------------------------------------------
@pytest.mark.trio
async def test_refused_connect(scheme: str) -> None:
    transport = nanopy.transports.get(scheme)
    listener = await transport.listen(bind_url(scheme), context(scheme))
    url = listener.url
    await listener.aclose()
    with trio.fail_after(5):
        with pytest.raises(OSError):
            conn = await transport.dial(url, context(scheme, dialer=True))
            await conn.aclose()


@pytest.mark.trio
async def test_accept_is_cancellable_and_address_reusable(scheme: str) -> None:
    transport = nanopy.transports.get(scheme)
    listener = await transport.listen(bind_url(scheme), context(scheme))
    with trio.move_on_after(0.05) as scope:
        await listener.accept()
    assert scope.cancelled_caught
    await listener.aclose()
    again = await transport.listen(listener.url, context(scheme))  # the address is free again
    assert again.url == listener.url
    await again.aclose()


@pytest.mark.trio
async def test_transport_round_trip(scheme: str) -> None:
    """The raw Connection contract: handshake, batch send, batch receive, EOF."""
    transport = nanopy.transports.get(scheme)
    listener = await transport.listen(bind_url(scheme), context(scheme))
    try:
        with trio.fail_after(10):
            client = await transport.dial(listener.url, context(scheme, dialer=True))
            async with trio.open_nursery() as nursery:
                # ws routes a connection by its upgrade request: accept needs the client going
                nursery.start_soon(client.handshake)
                server = await listener.accept()
                await server.handshake()
            batch = [b"one", b"", b"x" * 100_000, b"last"]
            await client.send(batch)
            got: list[bytes] = []
            while len(got) < len(batch):
                got += await server.receive()
            assert got == batch
            await server.send([b"back"])
            assert await client.receive() == [b"back"]
            await client.aclose()
            with pytest.raises((EOFError, OSError)):
                while True:
                    await server.receive()
            await server.aclose()
    finally:
        await listener.aclose()


# -- socket level ----------------------------------------------------------------------
def test_duplicate_bind(scheme: str, make_socket: Any) -> None:
    a = make_socket("pair")
    b = make_socket("pair")
    ep = a.bind(bind_url(scheme), **bind_opts(scheme))
    with pytest.raises(nanopy.AddressInUse):
        b.bind(ep.url, **bind_opts(scheme))


def test_port_zero(scheme: str, make_socket: Any) -> None:
    if scheme in LOCAL_ONLY:
        pytest.skip("no ports")
    a = make_socket("pair")
    ep = a.bind(bind_url(scheme), **bind_opts(scheme))
    port = int(ep.url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    assert port > 0
    b = make_socket("pair")
    b.connect(ep.url, **connect_opts(scheme))
    wait_pipes(b)


def test_large_messages(scheme: str, make_socket: Any) -> None:
    a, b = connected(make_socket, scheme, recv_max_size=8 << 20)
    big = bytes(range(256)) * (4 << 12)  # 4 MiB
    b.send(big)
    assert a.recv(timeout=10) == big
    a.send(big[::-1])
    assert b.recv(timeout=10) == big[::-1]


def test_recv_max_size(scheme: str, make_socket: Any) -> None:
    if scheme == "inproc":
        pytest.skip("inproc hands message objects over; it has no wire limit (as in NNG)")
    a = make_socket("pair", recv_max_size=1000)
    b = make_socket("pair")
    ep = a.bind(bind_url(scheme), **bind_opts(scheme))
    b.connect(ep.url, **connect_opts(scheme))
    wait_pipes(a)
    b.send(b"x" * 1000)
    assert a.recv(timeout=5) == b"x" * 1000  # exactly the limit passes
    b.send(b"y" * 1001)
    # The pipe fails on the oversized message (counted) instead of delivering it.
    wait_until(lambda: a.stats().protocol_errors >= 1, what="the oversized message refused")
    with pytest.raises(nanopy.Timeout):
        a.recv(timeout=0)


def test_peer_close(scheme: str, make_socket: Any) -> None:
    a, b = connected(make_socket, scheme)
    b.send(b"before")
    assert a.recv(timeout=5) == b"before"
    b.close()
    wait_no_pipes(a)
    c = make_socket("pair")  # the listener keeps serving
    c.connect(a.endpoints[0].url, **connect_opts(scheme))
    wait_pipes(a)
    c.send(b"after")
    assert a.recv(timeout=5) == b"after"


def test_listener_close_ends_pipes(scheme: str, make_socket: Any) -> None:
    a, b = connected(make_socket, scheme)
    a.endpoints[0].close()
    wait_no_pipes(b)
    wait_no_pipes(a)


def test_close_endpoint_while_dialing(scheme: str, make_socket: Any) -> None:
    """A dialer stuck in its handshake lets go of the connection when its endpoint closes."""
    if scheme in LOCAL_ONLY:
        pytest.skip("needs a TCP peer that stalls")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        server.settimeout(5)
        b = make_socket("pair", handshake_timeout=30)
        path = "/stall" if scheme in ("ws", "wss") else ""
        ep = b.connect(f"{scheme}://127.0.0.1:{port}{path}", **connect_opts(scheme))
        conn, _ = server.accept()
        with conn:
            ep.close()
            conn.settimeout(5)
            while conn.recv(65536):  # the client's hello, then EOF when it lets go
                pass
        assert b.endpoints == []


def test_close_socket_while_accepting_and_dialing(scheme: str, make_socket: Any) -> None:
    a = make_socket("pair")
    ep = a.bind(bind_url(scheme), **bind_opts(scheme))
    b = make_socket("pair", reconnect_interval=0.01)
    b.connect(
        bind_url(scheme).replace(":0", ":1") if scheme not in LOCAL_ONLY else bind_url(scheme), **connect_opts(scheme)
    )
    a.close()
    b.close()
    c = make_socket("pair")
    c.bind(ep.url, **bind_opts(scheme))  # the address was released


def test_check_transport(scheme: str) -> None:
    """The public kit (nanopy.testing.check_transport) passes for every registered scheme."""
    check_transport(scheme, bind_options=bind_opts(scheme), connect_options=connect_opts(scheme))


def test_check_transport_refuses_an_unknown_scheme() -> None:
    with pytest.raises(ValueError, match="no transport registered for 'nope'"):
        check_transport("nope")
