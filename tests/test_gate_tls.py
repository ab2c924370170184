"""What a peer a bind's gate refused sees, per transport: the mechanism's own error.

tls+tcp: an address ``deny=`` refuses gets the TLS alert ``access_denied`` in place
of a ServerHello; a peer ``authorize=`` refuses (after the handshake, it may need the
certificate) gets a close_notify, a clean end of the session rather than a bare TCP
close. ws: HTTP 403 before the upgrade, CLOSE 1008 after it; wss: the same inside TLS.
Each test also shows an admitted peer served by the same bind, and a nanopy dialer
that keeps retrying (its back-off) with a clear reason in its log; pynng names the refusal too.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

import pytest
from conftest import wait_until
from tls_certs import tls_files

import nanopy
from nanopy.testing import wait_pipes

websockets_sync = pytest.importorskip("websockets.sync.client")
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

MakeSocket = Callable[..., nanopy.Socket]
OPTS = {"reconnect_interval": 0.02, "reconnect_interval_max": 0.1}
#: a second loopback address: the refused raw clients come from it, nanopy's admitted
#: dialers from 127.0.0.1 (Linux routes all of 127.0.0.0/8 to lo)
REFUSED_HOST = "127.0.0.2"
PUSH_HEADER = b"\x00SP\x00\x00\x50\x00\x00"  # a PUSH's SP header (protocol 0x50)


def host_port(url: str) -> tuple[str, int]:
    host, _, port = url.split("://", 1)[1].split("/", 1)[0].rpartition(":")
    return host, int(port)


def tls_client(url: str, source: str, ragged_eof_is_error: bool = True) -> ssl.SSLSocket:
    """A raw TLS client from ``source`` (the handshake runs here: it may raise)."""
    raw = socket.create_connection(host_port(url), timeout=5, source_address=(source, 0))
    try:
        return tls_files().client_ctx.wrap_socket(raw, server_hostname="localhost",
                                                  suppress_ragged_eofs=not ragged_eof_is_error)
    except BaseException:
        raw.close()
        raise


def ws_connect(url: str, source: str, secure: bool) -> Any:
    """A websockets client offering PUSH's subprotocol to a PULL listener."""
    raw = socket.create_connection(host_port(url), timeout=5, source_address=(source, 0))
    kwargs: dict[str, Any] = {"ssl": tls_files().client_ctx, "server_hostname": "localhost"} if secure else {}
    return websockets_sync.connect(url, sock=raw, subprotocols=["pull.sp.nanomsg.org"],  # type: ignore[list-item]
                                   open_timeout=5, close_timeout=2, **kwargs)


def admitted_round_trip(pull: nanopy.Socket, ep: nanopy.Endpoint, make_socket: MakeSocket, scheme: str) -> None:
    """A nanopy PUSH from 127.0.0.1 is admitted and served by the same bind."""
    push = make_socket("push", **OPTS)
    opts = {"ssl_context": tls_files().client_ctx} if scheme in ("tls+tcp", "wss") else {}
    push.connect(ep.url.replace("127.0.0.1", "localhost") if scheme != "ws" else ep.url, **opts)
    wait_pipes(pull)
    push.send(b"admitted")
    assert pull.recv() == b"admitted"


def server_ctx() -> dict[str, Any]:
    return {"ssl_context": tls_files().server_ctx}


# -- tls+tcp --------------------------------------------------------------------------
def test_tls_denied_address_gets_access_denied_alert(make_socket: MakeSocket) -> None:
    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind("tls+tcp://127.0.0.1:0", deny=[REFUSED_HOST], **server_ctx())
    with pytest.raises(ssl.SSLError) as caught:
        tls_client(ep.url, REFUSED_HOST)
    assert caught.value.reason == "TLSV1_ALERT_ACCESS_DENIED", caught.value
    wait_until(lambda: pull.stats().auth_failures == 1, what="the refusal counted")
    admitted_round_trip(pull, ep, make_socket, "tls+tcp")
    assert pull.stats().auth_failures == 1 and pull.stats().protocol_errors == 0


def test_tls_refused_by_authorize_gets_close_notify(make_socket: MakeSocket) -> None:
    def authorize(peer: nanopy.Peer) -> bool | str:
        return peer.address.startswith("127.0.0.1:") or "not on this list"

    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind("tls+tcp://127.0.0.1:0", authorize=authorize, **server_ctx())
    # Ragged EOFs raise: a bare TCP close would be SSLEOFError, a close_notify is b"".
    with tls_client(ep.url, REFUSED_HOST, ragged_eof_is_error=True) as tls:
        tls.sendall(PUSH_HEADER)  # the gate hears our header out; the PULL's would follow only an admission
        assert tls.recv(64) == b""  # close_notify: a clean end of the TLS session
    wait_until(lambda: pull.stats().auth_failures == 1, what="the refusal counted")
    admitted_round_trip(pull, ep, make_socket, "tls+tcp")


def test_nanopy_tls_dialer_reports_access_denied_and_retries(
    make_socket: MakeSocket, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="nanopy")
    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind("tls+tcp://127.0.0.1:0", deny=["127.0.0.1"], **server_ctx())
    push = make_socket("push", **OPTS)
    push.connect(ep.url.replace("127.0.0.1", "localhost"), ssl_context=tls_files().client_ctx)
    wait_until(lambda: push.stats().handshake_failures >= 3, what="the dialer retrying")
    assert any("ACCESS_DENIED" in r.getMessage() for r in caplog.records if r.name.startswith("nanopy"))
    assert pull.stats().auth_failures >= 3 and pull.pipes == [] and push.pipes == []


# -- ws and wss -------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_ws_denied_address_gets_403(make_socket: MakeSocket, scheme: str) -> None:
    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind(f"{scheme}://127.0.0.1:0/g", deny=[REFUSED_HOST], **(server_ctx() if scheme == "wss" else {}))
    with pytest.raises(InvalidStatus) as caught:
        ws_connect(ep.url, REFUSED_HOST, scheme == "wss")
    assert caught.value.response.status_code == 403
    wait_until(lambda: pull.stats().auth_failures == 1, what="the refusal counted")
    admitted_round_trip(pull, ep, make_socket, scheme)
    assert pull.stats().auth_failures == 1


@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_ws_refused_by_authorize_gets_close_1008(make_socket: MakeSocket, scheme: str) -> None:
    def authorize(peer: nanopy.Peer) -> bool | str:
        return peer.address.startswith("127.0.0.1:") or "not on this list"

    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind(f"{scheme}://127.0.0.1:0/g", authorize=authorize, **(server_ctx() if scheme == "wss" else {}))
    with ws_connect(ep.url, REFUSED_HOST, scheme == "wss") as ws:  # the upgrade succeeds
        with pytest.raises(ConnectionClosed) as caught:
            ws.recv(timeout=5)
    assert caught.value.rcvd is not None
    assert (caught.value.rcvd.code, caught.value.rcvd.reason) == (1008, "not on this list")
    wait_until(lambda: pull.stats().auth_failures == 1, what="the refusal counted")
    admitted_round_trip(pull, ep, make_socket, scheme)


def test_nanopy_ws_dialer_sees_403_and_retries(make_socket: MakeSocket, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="nanopy")
    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind("ws://127.0.0.1:0/g", deny=["127.0.0.1"])
    push = make_socket("push", **OPTS)
    push.connect(ep.url)
    wait_until(lambda: push.stats().handshake_failures >= 3, what="the dialer retrying")
    assert any("403" in r.getMessage() for r in caplog.records if r.name.startswith("nanopy"))
    assert pull.stats().auth_failures >= 3 and pull.pipes == []


def test_nanopy_ws_dialer_sees_1008_and_retries(make_socket: MakeSocket, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="nanopy")
    pull = make_socket("pull", recv_timeout=5)
    ep = pull.bind("ws://127.0.0.1:0/g", authorize=lambda peer: "closed for maintenance")
    push = make_socket("push", **OPTS)
    push.connect(ep.url)
    wait_until(lambda: pull.stats().auth_failures >= 3, what="the dialer retrying")
    assert pull.pipes == [] and pull.stats().messages_received == 0
    assert any("1008" in r.getMessage() for r in caplog.records if r.name.startswith("nanopy"))


@pytest.mark.parametrize(("scheme", "error"), [("tls+tcp", "CryptoError"), ("ws", "PermissionDenied")])
def test_pynng_dialer_reports_the_refusal(make_socket: MakeSocket, scheme: str, error: str) -> None:
    """NNG reads the access_denied alert as a crypto error and the 403 as EPERM."""
    pynng = pytest.importorskip("pynng")
    from peers import pynng_peer

    pull = make_socket("pull", recv_timeout=5)
    opts = server_ctx() if scheme == "tls+tcp" else {}
    ep = pull.bind(f"{scheme}://127.0.0.1:0" + ("/g" if scheme == "ws" else ""), deny=["127.0.0.1"], **opts)
    t = tls_files()
    tls = {"tls_config": {"mode": "MODE_CLIENT", "server_name": "localhost", "ca_string": t.ca_pem}}
    with pynng_peer("Push0", **(tls if scheme == "tls+tcp" else {})) as push:
        with pytest.raises(getattr(pynng, error)):
            push.dial(ep.url.replace("127.0.0.1", "localhost") if scheme == "tls+tcp" else ep.url, block=True)
    assert pull.stats().auth_failures >= 1 and pull.pipes == []


@pytest.mark.parametrize("scheme", ["tcp", "ipc"])
def test_pynng_dialer_refused_by_authorize_never_has_a_pipe(make_socket: MakeSocket, scheme: str,
                                                           tmp_path: Any) -> None:
    """The listener sends its SP header only once ``authorize`` admits: NNG's blocking
    dial fails rather than succeeding into a pipe that closes at once; admitted, a
    message sent right after the dial arrives (nothing is lost to a doomed pipe)."""
    pynng = pytest.importorskip("pynng")
    from peers import pynng_peer

    admit = {"now": False}
    pull = make_socket("pull", recv_timeout=5)
    url = "tcp://127.0.0.1:0" if scheme == "tcp" else f"ipc://{tmp_path}/gated.ipc"
    ep = pull.bind(url, authorize=lambda peer: admit["now"] or "not yet")
    with pynng_peer("Push0") as push:
        with pytest.raises(pynng.NNGException):
            push.dial(ep.url, block=True)
        assert pull.stats().auth_failures == 1 and pull.pipes == []
        admit["now"] = True
        push.dial(ep.url, block=True)
        push.send(b"right after the dial")
        assert pull.recv() == b"right after the dial"
