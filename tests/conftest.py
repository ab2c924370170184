"""Shared pytest configuration and fixtures for nanopy's tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import nanopy
from nanopy import platform
from nanopy.testing import local_url

#: Python has Unix domain sockets here (not on Windows): ipc and zmtp+ipc
UNIX_SOCKETS = hasattr(socket, "AF_UNIX")
# Transports every socket-level test can run over.
TRANSPORTS = ("tcp", "ipc", "inproc") if UNIX_SOCKETS else ("tcp", "inproc")
STREAM_TRANSPORTS = ("tcp", "ipc") if UNIX_SOCKETS else ("tcp",)


def needs_platform(capability: str) -> pytest.MarkDecorator:
    """Skip where the platform backend cannot do ``capability`` (a field of
    ``nanopy.platform.CAPABILITIES``: unacked_bytes, user_timeout, fork, unix_sockets);
    NANOPY_BACKEND=portable turns them off on Linux too."""
    return pytest.mark.skipif(
        not getattr(platform.CAPABILITIES, capability),
        reason=f"the {platform.NAME} platform backend on {sys.platform} has no {capability.replace('_', ' ')} "
               "(docs/architecture.md, 'The platform layer')",
    )


#: tests of what only Linux has (/proc, network namespaces, Debian's tools)
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason=f"needs Linux, not {sys.platform}")


def pytest_configure(config: pytest.Config) -> None:
    # Also declared in pyproject.toml; repeated here so the markers exist however
    # pytest is invoked (e.g. with -c /dev/null or another rootdir).
    config.addinivalue_line("markers", "interop: talks to real peers (pynng, pyzmq, nanocat, nngcat, prometheus)")
    config.addinivalue_line("markers", "slow: long-running stress tests")
    config.addinivalue_line("markers", "spark: needs a local SparkSession")
    config.addinivalue_line("markers", "cluster: starts a Spark standalone cluster on loopback")
    config.addinivalue_line("markers", "fault: fault-injection tier; skip with -m 'not fault'")
    config.addinivalue_line("markers", "multihost: hosts in network namespaces (root); skip with -m 'not multihost'")


_NO_UNIX = "ipc needs Unix domain sockets (no socket.AF_UNIX here)"
#: what a test's code uses that only some systems have, and why it skips elsewhere
_NEEDS_IN_SOURCE = (
    (("ipc://", "ipc_url(", '"ipc"', "zmtp+ipc"), UNIX_SOCKETS, _NO_UNIX),
    (("/proc/",), sys.platform.startswith("linux"), "reads /proc (Linux)"),
    (("os.fork(",), hasattr(os, "fork"), "forks"),
    (("fork_child(", "living_child("), hasattr(os, "pidfd_open"), "reaps a forked child by a pidfd (Linux)"),
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Off Linux, skip with the reason each test that needs what this system lacks: an ipc
    parameter or address without AF_UNIX, /proc, fork with a pidfd (the CI workflow for
    macOS and Windows, .github/workflows/ci.yml, relies on it). On Linux nothing changes."""
    if sys.platform.startswith("linux"):
        return
    import inspect

    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if not UNIX_SOCKETS and any(str(v).endswith("ipc") for v in params.values()):
            item.add_marker(pytest.mark.skip(reason=f"{_NO_UNIX}, not on {sys.platform}"))
            continue
        try:
            source = inspect.getsource(item.obj)  # type: ignore[attr-defined]
        except (AttributeError, OSError, TypeError):
            continue
        for needles, available, reason in _NEEDS_IN_SOURCE:
            if not available and any(needle in source for needle in needles):
                item.add_marker(pytest.mark.skip(reason=f"{reason}, not on {sys.platform}"))
                break


def bind_url(transport: str, tag: str = "t") -> str:
    """A fresh address to bind for ``transport`` (tcp port 0 = any free port)."""
    return local_url(transport, tag)


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Each of tcp, ipc and inproc in turn."""
    return request.param


@pytest.fixture(params=STREAM_TRANSPORTS)
def stream_transport(request: pytest.FixtureRequest) -> str:
    """tcp and ipc (the transports with a wire format) in turn."""
    return request.param


@pytest.fixture
def make_socket() -> Iterator[Callable[..., nanopy.Socket]]:
    """A factory of sockets that are all closed (without linger) after the test."""
    made: list[nanopy.Socket] = []

    def make(protocol: str, **kwargs: Any) -> nanopy.Socket:
        sock = nanopy.Socket(protocol, **kwargs)
        made.append(sock)
        return sock

    yield make
    for sock in made:
        sock.close(linger=0)


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll ``predicate`` (cheaply, every few ms) until true; fail after ``timeout``.

    For state nanopy exposes no event for (counters, queue depths). Prefer
    ``nanopy.testing.wait_pipes`` and blocking calls with timeouts where they exist.
    """
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {timeout}s")
        time.sleep(0.002)


def send_until_full(send: Callable[[bytes], object], full: type[BaseException], body: bytes) -> int:
    """Send numbered messages (``b"%06d" % n + body``) until ``send`` raises ``full``
    (every buffer on the way is full); how many went out."""
    sent = 0
    while True:
        try:
            send(b"%06d" % sent + body)
        except full:
            return sent
        sent += 1


@pytest.fixture
def no_nanopy_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail the test if anything inside nanopy logged at ERROR or above.

    Faults are the peer's problem: nanopy may warn about them, never fail on them.
    """
    import logging

    caplog.set_level(logging.WARNING, logger="nanopy")
    yield
    errors = [r for r in caplog.records if r.name.startswith("nanopy") and r.levelno >= logging.ERROR]
    assert not errors, "nanopy logged errors:\n" + "\n".join(
        f"{r.name}: {r.getMessage()}\n{r.exc_text or ''}" for r in errors
    )


class WsCloseTimes:
    """Times every ``WsConnection.aclose`` (the real one runs): how long each end of a
    ws/wss connection takes to close, and the close code it got from its peer."""

    def __init__(self) -> None:
        import threading

        self.closes: list[tuple[str, float, int | None]] = []  # (side, seconds, peer's code)
        # per close: the peer's stream ended inside a frame (a CLOSE it cut short)
        self.cut_short: list[bool] = []
        self._cond = threading.Condition()

    def record(self, side: str, seconds: float, code: int | None, cut_short: bool = False) -> None:
        with self._cond:
            self.cut_short.append(cut_short)
            self.closes.append((side, seconds, code))
            self._cond.notify_all()

    def wait(self, count: int, timeout: float = 5.0) -> list[tuple[str, float, int | None]]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.closes) >= count, timeout), f"closes: {self.closes}"
            return list(self.closes)


@pytest.fixture
def ws_close_times(monkeypatch: pytest.MonkeyPatch) -> WsCloseTimes:
    import trio

    from nanopy.transports._ws_conn import WsConnection

    times = WsCloseTimes()
    real_aclose = WsConnection.aclose

    async def timed_aclose(self: WsConnection) -> None:
        if self._closed:
            return
        start = trio.current_time()
        await real_aclose(self)
        proto = self._proto
        rcvd = proto.close_rcvd if proto is not None else None
        # websockets words an EOF inside a frame "stream ends after N bytes, expected M"
        exc = proto.parser_exc if proto is not None else None
        cut_short = isinstance(exc, EOFError) and "stream ends after" in str(exc)
        times.record(
            "dialer" if self._client else "listener",
            trio.current_time() - start,
            rcvd.code if rcvd is not None else None,
            cut_short,
        )

    monkeypatch.setattr(WsConnection, "aclose", timed_aclose)
    return times


def reap_child(pid: int, timeout: float) -> int:
    """waitpid with a deadline: a hung child is killed (by its PID) and reaped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


@contextlib.contextmanager
def tcp_plugin(scheme: str, wrap: Callable[[Any], Any]) -> Iterator[list[Any]]:
    """Register ``scheme`` as a plug-in transport: tcp underneath, each dialled
    connection passed through ``wrap``. Yields the wrapped connections (in dial
    order); the scheme is unregistered afterwards."""
    tcp = nanopy.transports.get("tcp")
    made: list[Any] = []
    prefix = f"{scheme}://"

    class Wrapped(type(tcp)):  # type: ignore[misc]
        schemes = (scheme,)

        def check_url(self, url: str) -> None:
            super().check_url(url.replace(prefix, "tcp://"))

        def check_dial_url(self, url: str) -> None:
            super().check_dial_url(url.replace(prefix, "tcp://"))

        async def listen(self, url, ctx):  # type: ignore[no-untyped-def]
            listener = await super().listen(url.replace(prefix, "tcp://"), ctx)
            listener.url = listener.url.replace("tcp://", prefix)
            return listener

        async def dial(self, url, ctx):  # type: ignore[no-untyped-def]
            conn = wrap(await super().dial(url.replace(prefix, "tcp://"), ctx))
            made.append(conn)
            return conn

    nanopy.transports.register(scheme, Wrapped())
    try:
        yield made
    finally:
        nanopy.transports.unregister(scheme)
