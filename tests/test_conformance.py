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
from tls_certs import tls_files

import nanopy
import nanopy.transports
from nanopy.testing import check_transport, local_url

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


@pytest.fixture(params=SCHEMES)
def scheme(request: pytest.FixtureRequest) -> str:
    return request.param


# The plug-in contract itself (refused dials, cancellation, round trips, binds, port 0,
# large messages, recv_max_size, closes and reconnects...) is the kit's: rules T1-T18
# and C1-C11 of nanopy.testing.check_transport, run by test_check_transport below.
# What stays here is the engine's side: closing endpoints and sockets mid-dial.


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
