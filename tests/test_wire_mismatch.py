"""What the logs say when a pipe is refused (issue 32, items 3 and 4):

* an SP URL meeting a ZeroMQ peer, or a ``zmtp+`` URL meeting an SP peer: both
  ends name the other protocol and the scheme to use, dialer and listener alike,
  over tcp and ipc, nanopy on both sides and libzmq on one;
* a message over ``recv_max_size``, on every transport: the WARNING names the size
  seen, the limit and the option that lifts it (a pyzmq user's 2 MiB message included).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from itertools import count
from typing import Any

import pytest
from conftest import wait_until

import nanopy

pytestmark = pytest.mark.timeout(30)

MakeSocket = Callable[..., nanopy.Socket]
_paths = count()


def url_for(scheme: str) -> str:
    if scheme.endswith("ipc"):
        return f"{scheme}://{tempfile.gettempdir()}/npwm-{os.getpid()}-{next(_paths)}.ipc"
    return f"{scheme}://127.0.0.1:0" + ("/big" if scheme in ("ws", "wss") else "")


def warnings_of(caplog: pytest.LogCaptureFixture, name: str) -> str:
    return "\n".join(r.getMessage() for r in caplog.records
                     if r.levelno == logging.WARNING and r.getMessage().startswith(f"{name}:"))


SP_SIDE = ("speaks ZeroMQ (ZMTP), not SP", "use a zmtp+{base}:// URL for it")
ZMTP_SIDE = ("speaks SP", "not ZMTP", "use a {base}:// URL for it")


def named(caplog: pytest.LogCaptureFixture, side: str, parts: tuple[str, ...], base: str = "tcp") -> bool:
    """Whether ``side``'s WARNINGs name the other protocol and the scheme to use."""
    logged = warnings_of(caplog, side)
    return all(part.format(base=base) in logged for part in parts)


@pytest.mark.parametrize("base", ["tcp", "ipc"])
@pytest.mark.parametrize("sp_binds", [True, False], ids=["sp-listener", "zmtp-listener"])
def test_both_ends_of_an_sp_zmtp_mismatch_name_it(
    make_socket: MakeSocket, caplog: pytest.LogCaptureFixture, base: str, sp_binds: bool
) -> None:
    caplog.set_level(logging.WARNING, logger="nanopy")
    sp = make_socket("pull", name="sp-side", reconnect_interval=5)
    zmtp = make_socket("push", name="zmtp-side", reconnect_interval=5)
    if sp_binds:
        url = sp.bind(url_for(base)).url
        zmtp.connect(f"zmtp+{url}")
    else:
        url = zmtp.bind(url_for(f"zmtp+{base}")).url
        sp.connect(url.removeprefix("zmtp+"))

    wait_until(lambda: named(caplog, "sp-side", SP_SIDE, base) and named(caplog, "zmtp-side", ZMTP_SIDE, base),
               what="both ends naming the mismatch")
    assert sp.stats().protocol_errors >= 1 and zmtp.stats().protocol_errors >= 1


@pytest.fixture
def zctx() -> Iterator[Any]:
    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def test_an_sp_dialer_names_a_libzmq_listener(
    make_socket: MakeSocket, caplog: pytest.LogCaptureFixture, zctx: Any
) -> None:
    import zmq

    caplog.set_level(logging.WARNING, logger="nanopy")
    pull = make_socket("pull", name="sp-side", reconnect_interval=0.05)
    push = zctx.socket(zmq.PUSH)
    push.linger = 0
    pull.connect(f"tcp://127.0.0.1:{push.bind_to_random_port('tcp://127.0.0.1')}")
    wait_until(lambda: named(caplog, "sp-side", SP_SIDE), what="the SP side naming ZeroMQ")


def test_an_sp_listener_names_a_libzmq_dialer(
    make_socket: MakeSocket, caplog: pytest.LogCaptureFixture, zctx: Any
) -> None:
    """libzmq may read our SP header before it sends its signature, and then close
    without a byte (a protocol error: it does not redial): nothing names it then, as
    for any peer that leaves before the handshake. Fresh libzmq dialers come until
    one sends its signature first, which the SP side names."""
    import zmq

    caplog.set_level(logging.WARNING, logger="nanopy")
    url = make_socket("pull", name="sp-side").bind("tcp://127.0.0.1:0").url
    for _ in range(50):
        push = zctx.socket(zmq.PUSH)
        push.linger = 0
        push.connect(url)
        with contextlib.suppress(pytest.fail.Exception):
            wait_until(lambda: named(caplog, "sp-side", SP_SIDE), timeout=0.5)
            return
    pytest.fail("no libzmq dialer was named in 50 tries")


SIZE_SCHEMES = ("tcp", "ipc", "ws", "wss", "tls+tcp", "zmtp+tcp", "zmtp+ipc")


def tls_options(scheme: str, server: bool) -> dict[str, Any]:
    if scheme not in ("wss", "tls+tcp"):
        return {}
    from tls_certs import tls_files

    files = tls_files()
    return {"ssl_context": files.server_ctx if server else files.client_ctx}


@pytest.mark.parametrize("scheme", SIZE_SCHEMES)
def test_the_size_log_names_the_option(make_socket: MakeSocket, caplog: pytest.LogCaptureFixture, scheme: str) -> None:
    if scheme in ("ws", "wss"):
        pytest.importorskip("websockets")
    caplog.set_level(logging.WARNING, logger="nanopy")
    pull = make_socket("pull", name="small", recv_max_size=1000)
    push = make_socket("push")
    push.connect(pull.bind(url_for(scheme), **tls_options(scheme, True)).url, **tls_options(scheme, False))
    push.send(b"x" * 2000)
    wait_until(lambda: "peer sent a 2000-byte" in warnings_of(caplog, "small"), what="the message refused, logged")
    assert "recv_max_size is 1000 (set the socket's recv_max_size higher, or to 0 for no limit" \
        in warnings_of(caplog, "small")
    assert pull.stats().messages_too_large == 1


def test_a_pyzmq_users_2_mib_message(make_socket: MakeSocket, caplog: pytest.LogCaptureFixture, zctx: Any) -> None:
    """The default limit refuses it, the log says how to lift it, and lifted, it arrives."""
    import zmq

    caplog.set_level(logging.WARNING, logger="nanopy")
    pull = make_socket("pull", name="zpull", recv_timeout=5)
    push = zctx.socket(zmq.PUSH)
    push.linger = 0
    push.connect(pull.bind("zmtp+tcp://127.0.0.1:0").url.removeprefix("zmtp+"))
    big = b"z" * (2 << 20)
    wait_until(lambda: len(pull.pipes) == 1, what="libzmq's connection")
    first = pull.pipes[0].id
    push.send(big)
    wait_until(lambda: "peer sent a 2097152-byte frame; recv_max_size is 1048576 (set the socket's "
               "recv_max_size" in warnings_of(caplog, "zpull"), what="the 2 MiB message refused, logged")
    assert pull.stats().messages_too_large == 1
    pull.recv_max_size = 4 << 20
    # libzmq reconnects and the new pipe takes the new limit; a message libzmq wrote into the
    # closed connection before it saw the close would be lost, so send once the new one is up
    wait_until(lambda: [p.id for p in pull.pipes if p.id != first] != [], what="libzmq back")
    push.send(big)
    assert pull.recv() == big
