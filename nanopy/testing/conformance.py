"""The transport conformance kit: :func:`check_transport` (re-exported by nanopy.testing).

What every transport must do for a socket, checked through real sockets the way
a user drives them: bind (port 0 gives a real address), connect, messages both
ways in order, small and large, a refused second bind of the same address, the
receive size limit (the offending pipe closes, the socket goes on), a peer's
close seen as the pipe's end, and a connect that finds its listener again after
a rebind. Our built-in transports and the example plug-in (examples/plugins)
run it in tests/test_conformance.py; a plug-in author runs it in their own tests.

May call: the public Socket API and the transport registry only.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import transports
from ..core.errors import AddressInUse, Timeout
from ..socket.socket import Socket

_FILE_SCHEMES = {"ipc", "zmtp+ipc"}  # an address is a file path
_PATH_SCHEMES = {"ws", "wss"}  # host:port plus a resource path
_counter = iter(range(1 << 62))


def local_url(scheme: str, tag: str = "t") -> str:
    """A fresh address to bind for ``scheme`` on this host only.

    ``ipc``-like schemes get a new file in the temporary directory, ``inproc`` a
    process-unique name, ``ws``/``wss`` port 0 with a path, every other scheme
    ``scheme://127.0.0.1:0`` (port 0: the bound endpoint's ``url`` has the real port).

    Args:
        scheme: a registered transport scheme.
        tag: a word put into file and inproc names (to tell tests apart).

    Returns:
        The URL.
    """
    n = next(_counter)
    if scheme in _FILE_SCHEMES:
        return f"{scheme}://{tempfile.gettempdir()}/np-{os.getpid()}-{tag}-{n}.ipc"
    if scheme == "inproc":
        return f"inproc://{tag}-{os.getpid()}-{n}"
    if scheme in _PATH_SCHEMES:
        return f"{scheme}://127.0.0.1:0/{tag}"
    return f"{scheme}://127.0.0.1:0"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a process that needs a
    fixed port before it starts; prefer binding port 0 where the code allows)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "the condition") -> None:
    """Poll ``predicate`` until it is true; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:g} s")
        time.sleep(0.005)


def check_transport(
    scheme: str,
    *,
    url: str | None = None,
    bind_options: Mapping[str, Any] | None = None,
    connect_options: Mapping[str, Any] | None = None,
    timeout: float = 10.0,
) -> None:
    """Check that transport ``scheme`` does what nanopy's own transports do.

    Runs through real sockets (PAIR): bind and connect; 200 messages each way in
    order; empty, 64 KiB and 512 KiB messages; a second bind of the bound address
    refused with :class:`~nanopy.AddressInUse`; a message
    over ``recv_max_size`` closes that pipe only, counted as a protocol error;
    the peer's close ends the pipe; a dialer reconnects once a listener binds its
    address again. Every wait is bounded by ``timeout``.

    Args:
        scheme: the registered scheme to check (``nanopy.transports.schemes()``).
        url: the address to bind; default :func:`local_url` (``scheme://127.0.0.1:0``
            for host:port schemes).
        bind_options, connect_options: endpoint options, e.g. an ``ssl_context``.
        timeout: seconds each step may take.

    Raises:
        AssertionError: a check failed; the message names it.
        ValueError: ``scheme`` is not registered.
    """
    if scheme not in transports.schemes():
        raise ValueError(f"no transport registered for {scheme!r}; registered: {', '.join(transports.schemes())}")
    bind_opts = dict(bind_options or {})
    connect_opts = dict(connect_options or {})
    address = url or local_url(scheme, "check")
    with (
        Socket("pair", recv_timeout=timeout, send_timeout=timeout) as a,
        Socket("pair", recv_timeout=timeout, send_timeout=timeout, reconnect_interval=0.05) as b,
    ):
        ep = a.bind(address, **bind_opts)
        bound = ep.url
        assert bound.startswith(scheme + "://"), f"{scheme}: the bound endpoint's url is {bound!r}"
        assert ":0/" not in bound + "/" or scheme == "inproc", f"{scheme}: port 0 was not resolved in {bound!r}"
        b.connect(bound, **connect_opts)
        _wait_pipes(a, b, 1, timeout, f"{scheme}: a pipe after connect")

        for sender, receiver, way in ((a, b, "bind->connect"), (b, a, "connect->bind")):
            for i in range(200):
                sender.send(b"%d" % i)
            got = [receiver.recv() for _ in range(200)]
            assert got == [b"%d" % i for i in range(200)], f"{scheme}: 200 messages {way} out of order or changed"
        for size in (0, 64 * 1024, 512 * 1024):
            body = bytes(range(256)) * (size // 256)
            a.send(body)
            assert b.recv() == body, f"{scheme}: a {size}-byte message did not arrive intact"

        with Socket("pair") as other:
            try:
                other.bind(bound, **bind_opts)
            except AddressInUse:
                pass
            else:
                raise AssertionError(f"{scheme}: a second bind of {bound} was not refused with AddressInUse")

        ep.close()
        wait_for(lambda: not a.pipes and not b.pipes, timeout, f"{scheme}: pipes ended by the listener's close")
        ep = a.bind(bound, **bind_opts)  # (the same address: the dialer finds it again)
        _wait_pipes(a, b, 1, timeout, f"{scheme}: the dialer reconnecting after a rebind")
        b.send(b"again")
        assert a.recv() == b"again", f"{scheme}: no message after reconnecting"

        b.close()
        wait_for(lambda: not a.pipes, timeout, f"{scheme}: the peer's close seen as the pipe's end")
    if scheme != "inproc":  # (inproc hands message objects over: no wire limit, as in NNG)
        _check_recv_max_size(scheme, local_url(scheme, "check"), bind_opts, connect_opts, timeout)


def _check_recv_max_size(
    scheme: str, address: str, bind_opts: dict[str, Any], connect_opts: dict[str, Any], timeout: float
) -> None:
    """A message over ``recv_max_size`` closes its pipe, counted; the socket goes on."""
    with (
        Socket("pair", recv_max_size=1000, recv_timeout=timeout) as a,
        Socket("pair", send_timeout=timeout, reconnect_interval=0.05) as b,
    ):
        b.connect(a.bind(address, **bind_opts).url, **connect_opts)
        _wait_pipes(a, b, 1, timeout, f"{scheme}: a pipe after connect")
        b.send(b"x" * 1000)
        assert a.recv() == b"x" * 1000, f"{scheme}: a message of exactly recv_max_size was not delivered"
        first = {p.id for p in a.pipes} | {p.id for p in b.pipes}
        b.send(b"y" * 1001)
        wait_for(lambda: a.stats().protocol_errors >= 1, timeout, f"{scheme}: an oversized message refused")
        try:
            a.recv(timeout=0)
        except Timeout:
            pass
        else:
            raise AssertionError(f"{scheme}: a message over recv_max_size was delivered")
        # (the bad pipe counts its error before it leaves: wait for both ends' new pipe)
        wait_for(
            lambda: [p.id for p in a.pipes if p.id not in first] and [p.id for p in b.pipes if p.id not in first]
            and len(a.pipes) == len(b.pipes) == 1,
            timeout, f"{scheme}: the dialer's new pipe after the oversized message",
        )
        b.send(b"after")
        assert a.recv() == b"after", f"{scheme}: the socket did not go on after closing a bad pipe"


def _wait_pipes(a: Socket, b: Socket, n: int, timeout: float, what: str) -> None:
    wait_for(lambda: len(a.pipes) == n and len(b.pipes) == n, timeout, what)
