"""Closing a socket, on every transport (issue 11, step 5).

The guarantees pinned here (docs/api.md "Closing", docs/architecture.md "Closing"):
every blocked call raises ``Closed`` at once, whatever the linger; queued messages
reach a live peer within linger; listeners stop first (their address is free while
the pipes still flush), then dialers, then pipes; a stalled handshake never holds
close up; once close() returns the address can be bound again and no engine task
of the socket is left; cancelling aclose() still closes; at exit all sockets
linger side by side.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from conftest import bind_url, reap_child, wait_until
from forking import inherited_socket_is_closed
from peers import free_tcp_port
from tls_certs import tls_files

import nanopy
from nanopy.engine import engine as _engine
from nanopy.pipe.driver import PipeDriver
from nanopy.socket.endpoint import Endpoint
from nanopy.testing import wait_pipes

pytestmark = pytest.mark.usefixtures("no_nanopy_errors")

ALL_TRANSPORTS = ["tcp", "ipc", "inproc", "ws", "wss", "tls+tcp"]
WIRE_TRANSPORTS = [t for t in ALL_TRANSPORTS if t != "inproc"]


@dataclass
class Place:
    """Where to bind on one transport and how to dial it."""

    transport: str
    url: str  # to bind (a fixed port for tcp-based ones, so it can be bound again)
    bind_opts: dict[str, Any] = field(default_factory=dict)
    dial_opts: dict[str, Any] = field(default_factory=dict)

    def dial_url(self, bound: str) -> str:
        return bound.replace("127.0.0.1", "localhost") if self.dial_opts else bound

    def raw_address(self, bound: str) -> tuple[int, Any]:
        """(family, address) for a plain socket that connects without a handshake."""
        if self.transport == "ipc":
            return socket.AF_UNIX, bound.split("://", 1)[1]
        hostport = bound.split("://", 1)[1].split("/", 1)[0]
        host, port = hostport.rsplit(":", 1)
        return socket.AF_INET, (host, int(port))


def place(transport: str, tag: str = "close") -> Place:
    if transport in ("tcp", "ipc", "inproc"):
        url = bind_url(transport, tag)
        if transport == "tcp":
            url = f"tcp://127.0.0.1:{free_tcp_port()}"
        return Place(transport, url)
    if transport == "ws":
        return Place(transport, f"ws://127.0.0.1:{free_tcp_port()}/{tag}")
    t = tls_files()
    path = f"/{tag}" if transport == "wss" else ""
    return Place(
        transport,
        f"{transport}://127.0.0.1:{free_tcp_port()}{path}",
        {"ssl_context": t.server_ctx},
        {"ssl_context": t.client_ctx},
    )


@pytest.fixture(params=ALL_TRANSPORTS)
def where(request: pytest.FixtureRequest) -> Place:
    return place(request.param)


@pytest.fixture(params=WIRE_TRANSPORTS)
def wire(request: pytest.FixtureRequest) -> Place:
    return place(request.param)


@contextmanager
def closing(*socks: nanopy.Socket) -> Iterator[None]:
    try:
        yield
    finally:
        for s in socks:
            s.close(linger=0)


def socket_tasks(sock: nanopy.Socket) -> list[str]:
    """Names of the engine tasks still running on behalf of ``sock``.

    A task belongs to the socket when its coroutine is a method of the socket, of
    its task tree, of one of its endpoints or pipes, or of its timers.
    """
    def mine(obj: Any) -> bool:
        if obj is None:
            return False
        if obj is sock or obj is sock._tasks or obj is sock._driver or obj is sock._driver.timers:
            return True
        if isinstance(obj, Endpoint):
            return obj.socket is sock
        if isinstance(obj, PipeDriver):
            return obj.sock is sock._driver
        return False

    async def walk() -> list[str]:
        found: list[str] = []

        def visit(task: Any) -> None:
            frame = getattr(task.coro, "cr_frame", None)
            if frame is not None:  # a method of the socket's parts, or a closure running one
                owners = [frame.f_locals.get("self")]
                owners += [getattr(v, "__self__", None) for v in frame.f_locals.values()]
                if any(mine(o) for o in owners):
                    wrapped = frame.f_locals.get("afn")  # what a tree wrapper runs
                    found.append(f"{task.name}({getattr(wrapped, '__qualname__', '')})")
            for nursery in task.child_nurseries:
                for child in nursery.child_tasks:
                    visit(child)

        visit(trio.lowlevel.current_root_task())
        return found

    return list(_engine.get_engine().run(walk))


def stalled_pair(where: Place, sender_binds: bool = False) -> tuple[nanopy.Socket, nanopy.Socket, str]:
    """A PUSH with messages queued that its PULL (not reading, 1-message queue) holds back.

    Returns (push, pull, bound url).
    """
    pull = nanopy.Socket("pull", recv_buffer=1)
    push = nanopy.Socket("push", send_buffer=8)
    if sender_binds:
        bound = push.bind(where.url, **where.bind_opts).url
        pull.connect(where.dial_url(bound), **where.dial_opts)
    else:
        bound = pull.bind(where.url, **where.bind_opts).url
        push.connect(where.dial_url(bound), **where.dial_opts)
    wait_pipes(push)
    wait_pipes(pull)
    pad = b"q" * 65536
    with pytest.raises(nanopy.Timeout):
        for _ in range(400):  # until kernel buffers and the pipe's queue are full
            push.send(pad, timeout=0.3)
    return push, pull, bound


# -- after close() returns ---------------------------------------------------------------------------


def test_address_free_and_no_task_left_after_close(where: Place) -> None:
    pull = nanopy.Socket("pull", recv_timeout=5)
    push = nanopy.Socket("push")
    with closing(pull, push):
        bound = pull.bind(where.url, **where.bind_opts).url
        push.connect(where.dial_url(bound), **where.dial_opts)
        push.send(b"one")
        assert pull.recv() == b"one"
        assert socket_tasks(pull), "the live socket's tasks are visible"
        pull.close()
        again = nanopy.Socket("pull")
        with closing(again):
            again.bind(bound, **where.bind_opts)  # free at once, no retry
        assert socket_tasks(pull) == []
        push.close()
        assert socket_tasks(push) == []


def test_protocol_timers_run_in_the_tree_and_end_with_close() -> None:
    rep = nanopy.Socket("rep")
    req = nanopy.Socket("req", resend_interval=30, recv_timeout=5)
    surveyor = nanopy.Socket("surveyor", survey_deadline=30)
    with closing(rep, req, surveyor):
        req.connect(rep.bind(bind_url("tcp")).url)
        req.send(b"question")  # arms the resend timer
        assert rep.recv() == b"question"
        surveyor.send(b"anyone?")  # arms the survey deadline, with no pipe at all
        for sock in (req, surveyor):
            assert any("Timers._run" in name for name in socket_tasks(sock))
            sock.close()
            assert socket_tasks(sock) == []


def test_endpoint_close_stops_its_pipes_and_frees_the_address(where: Place) -> None:
    pull = nanopy.Socket("pull")
    push = nanopy.Socket("push")
    with closing(pull, push):
        ep = pull.bind(where.url, **where.bind_opts)
        push.connect(where.dial_url(ep.url), **where.dial_opts)
        wait_pipes(pull)
        ep.close()
        wait_until(lambda: not pull.pipes, what="the endpoint's pipe closed")
        wait_until(lambda: not any("run_listener" in n for n in socket_tasks(pull)), what="listener gone")
        again = nanopy.Socket("pull")
        with closing(again):
            again.bind(ep.url, **where.bind_opts)


# -- the synchronous half first ----------------------------------------------------------------------


def _blocked_callers(push: nanopy.Socket) -> dict[str, Callable[[], Any]]:
    """Calls that block on a PUSH whose pipes are all full: a thread's send, a trio
    and an asyncio task's asend, a poll for POLLOUT."""
    import asyncio

    async def trio_send() -> None:
        await push.asend(b"blocked", timeout=30)

    async def asyncio_send() -> None:
        await push.asend(b"blocked", timeout=30)

    def poll() -> None:
        poller = nanopy.Poller()
        poller.register(push, nanopy.POLLOUT)
        poller.poll(timeout=30)

    return {
        "send": lambda: push.send(b"blocked", timeout=30),
        "trio asend": lambda: trio.run(trio_send),
        "asyncio asend": lambda: asyncio.run(asyncio_send()),
        "poll": poll,
    }


def test_blocked_calls_raise_closed_at_once_while_close_lingers(where: Place) -> None:
    push, pull, _ = stalled_pair(where)
    with closing(pull, push):
        outcome: dict[str, BaseException | None] = {}

        def run(name: str, call: Callable[[], Any]) -> None:
            try:
                call()
                outcome[name] = None
            except BaseException as exc:  # noqa: BLE001 - checked below
                outcome[name] = exc

        callers = [threading.Thread(target=run, args=item) for item in _blocked_callers(push).items()]
        for t in callers:
            t.start()
        wait_until(
            lambda: len(push._driver.send_q.waiters) == 3 and len(push._driver.watchers) == 1,
            what="every caller parked",
        )
        closer = threading.Thread(target=push.close, kwargs={"linger": 2})
        t0 = time.monotonic()
        closer.start()
        for t in callers:
            t.join(max(0.0, t0 + 1 - time.monotonic()))
        assert not any(t.is_alive() for t in callers), f"still blocked 1 s into close(): {outcome}"
        assert time.monotonic() - t0 < 1
        assert all(isinstance(exc, nanopy.Closed) for exc in outcome.values()), outcome
        closer.join(10)
        assert not closer.is_alive()


# -- order: listeners, dialers, pipes ----------------------------------------------------------------


def test_close_stops_listeners_then_dialers_then_pipes(monkeypatch: pytest.MonkeyPatch) -> None:
    order: list[str] = []
    real_cancel, real_close_soon = Endpoint.cancel, PipeDriver.close_soon

    def cancel(ep: Endpoint) -> None:
        order.append("dialer" if ep.dialer else "listener")
        real_cancel(ep)

    def close_soon(pipe: PipeDriver) -> None:
        order.append("pipe")
        real_close_soon(pipe)

    monkeypatch.setattr(Endpoint, "cancel", cancel)
    monkeypatch.setattr(PipeDriver, "close_soon", close_soon)
    peer = nanopy.Socket("bus")
    bus = nanopy.Socket("bus")
    with closing(peer, bus):
        # Dialers first, listeners last: the order comes from close, not from creation.
        bus.connect(peer.bind(bind_url("tcp")).url)
        own = bus.bind(bind_url("ipc")).url
        peer.connect(own)
        wait_pipes(bus, 2)
        bus.close(linger=0)
        assert order == ["listener", "dialer", "pipe", "pipe"]


def test_listener_stops_before_the_pipes_linger(wire: Place) -> None:
    """While close lingers on queued messages, the address is free already and no
    new pipe comes in; close returns as soon as the queue is written."""
    push, pull, bound = stalled_pair(wire, sender_binds=True)
    with closing(pull, push):
        closer = threading.Thread(target=push.close, kwargs={"linger": 30})
        closer.start()
        newcomer = nanopy.Socket("pull")
        with closing(newcomer):
            def rebind() -> bool:
                try:
                    newcomer.bind(bound, **wire.bind_opts)
                except nanopy.AddressInUse:
                    return False
                return True

            wait_until(rebind, what="the address free while close() lingers")
            assert closer.is_alive(), "close() did not linger"
        t0 = time.monotonic()
        while True:  # the stalled reader wakes up: the queue drains, close returns
            try:
                pull.recv(timeout=0.5)
            except nanopy.Timeout:
                break
        closer.join(10)
        assert not closer.is_alive()
        assert time.monotonic() - t0 < 10


# -- linger ------------------------------------------------------------------------------------------


def test_linger_flushes_queued_messages_to_a_live_peer(where: Place) -> None:
    pull = nanopy.Socket("pull", recv_buffer=2)
    push = nanopy.Socket("push")
    with closing(pull, push):
        bound = pull.bind(where.url, **where.bind_opts).url
        push.connect(where.dial_url(bound), **where.dial_opts)
        wait_pipes(push)
        body = b"m" * 32768
        for i in range(100):
            push.send(b"%03d" % i + body, timeout=5)
        if where.transport != "inproc":  # inproc hands every message to the peer's inbox at once
            assert not all(d.flushed() for d in push._pipes.values()), "nothing was left queued"
        closer = threading.Thread(target=push.close, kwargs={"linger": 20})
        closer.start()
        got = [pull.recv(timeout=10)[:3] for _ in range(100)]
        assert got == [b"%03d" % i for i in range(100)]
        closer.join(10)
        assert not closer.is_alive()
        assert socket_tasks(push) == []


def test_linger_is_a_bound_when_the_peer_reads_nothing(where: Place) -> None:
    push, pull, _ = stalled_pair(where)
    with closing(pull, push):
        t0 = time.monotonic()
        push.close(linger=0.3)
        took = time.monotonic() - t0
        assert took < 0.3 + 2.0
        # inproc queued nothing on the sender's side: the peer's inbox holds it all.
        assert where.transport == "inproc" or took >= 0.25
        assert socket_tasks(push) == []


# -- stalled handshakes ------------------------------------------------------------------------------


def test_close_during_a_stalled_incoming_handshake_is_prompt(wire: Place) -> None:
    pull = nanopy.Socket("pull", handshake_timeout=30)
    with closing(pull):
        bound = pull.bind(wire.url, **wire.bind_opts).url
        family, address = wire.raw_address(bound)
        with socket.socket(family, socket.SOCK_STREAM) as silent:  # connects, then says nothing
            silent.connect(address)
            if wire.transport not in ("ws", "wss"):  # ws upgrades run in the shared port server
                wait_until(lambda: any("_handshake_and_run" in n for n in socket_tasks(pull)), what="handshake")
            t0 = time.monotonic()
            pull.close(linger=1)
            assert time.monotonic() - t0 < 1
        assert socket_tasks(pull) == []
        again = nanopy.Socket("pull")
        with closing(again):
            again.bind(bound, **wire.bind_opts)


def test_close_during_a_stalled_outgoing_handshake_is_prompt(wire: Place) -> None:
    family = socket.AF_UNIX if wire.transport == "ipc" else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as server:  # accepts, then says nothing
        if family == socket.AF_UNIX:
            server.bind(wire.url.split("://", 1)[1])
        else:
            server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(10)
        host_port = f"127.0.0.1:{server.getsockname()[1]}" if family == socket.AF_INET else ""
        url = {
            "tcp": f"tcp://{host_port}",
            "ipc": wire.url,
            "ws": f"ws://{host_port}/stall",
            "wss": f"wss://{host_port}/stall",
            "tls+tcp": f"tls+tcp://{host_port}",
        }[wire.transport]
        push = nanopy.Socket("push", handshake_timeout=30)
        with closing(push):
            push.connect(wire.dial_url(url), **wire.dial_opts)
            conn, _ = server.accept()
            with conn:  # the dialer is connected and waits for the peer's TLS, upgrade or SP header
                t0 = time.monotonic()
                push.close(linger=1)
                assert time.monotonic() - t0 < 1
            assert socket_tasks(push) == []


# -- aclose ------------------------------------------------------------------------------------------


def test_cancelled_aclose_still_closes_and_the_tasks_end(where: Place) -> None:
    push, pull, _ = stalled_pair(where)
    with closing(pull, push):

        async def main() -> None:
            with trio.move_on_after(0.05) as waiting:
                await push.aclose(linger=0.5)
            # (inproc has nothing queued on the sender's side: no linger there)
            assert waiting.cancelled_caught or where.transport == "inproc", "aclose did not linger"
            assert push.closed
            with pytest.raises(nanopy.Closed):
                await push.asend(b"x")
            await push.aclose()  # waits for the rest of the linger, then the tree's end

        t0 = time.monotonic()
        trio.run(main)
        took = time.monotonic() - t0
        assert took < 0.5 + 2.0
        assert where.transport == "inproc" or took > 0.4
        assert socket_tasks(push) == []


def test_aclose_from_asyncio_waits_for_the_tree(where: Place) -> None:
    import asyncio

    pull = nanopy.Socket("pull")
    with closing(pull):
        bound = pull.bind(where.url, **where.bind_opts).url

        async def main() -> None:
            await pull.aclose()

        asyncio.run(main())
        assert socket_tasks(pull) == []
        again = nanopy.Socket("pull")
        with closing(again):
            again.bind(bound, **where.bind_opts)


# -- closing twice, from several threads --------------------------------------------------------------


def test_every_concurrent_close_returns_after_the_tasks_end() -> None:
    pull = nanopy.Socket("pull")
    url = pull.bind(f"tcp://127.0.0.1:{free_tcp_port()}").url
    go = threading.Barrier(4)
    results: list[list[str]] = []

    def close() -> None:
        go.wait()
        pull.close(linger=0)
        results.append(socket_tasks(pull))

    threads = [threading.Thread(target=close) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [[]] * 4
    again = nanopy.Socket("pull", bind=url)
    again.close(linger=0)


# -- interpreter exit --------------------------------------------------------------------------------


def test_exit_lingers_all_sockets_side_by_side() -> None:
    """Three sockets with queued messages a live peer reads slowly: at exit they
    flush together, so everything arrives and the exit does not take 3 x linger."""
    pulls = [nanopy.Socket("pull", recv_buffer=2) for _ in range(3)]
    with closing(*pulls):
        urls = [p.bind(bind_url("tcp")).url for p in pulls]
        code = (
            "import sys, time, nanopy\n"
            "socks = [nanopy.Socket('push', connect=u, linger=1.5) for u in sys.argv[1:]]\n"
            "for s in socks:\n"
            "    for i in range(40):\n"
            "        s.send(b'%02d' % i + b'.' * 65536, timeout=10)\n"
            "print(time.monotonic(), flush=True)\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *urls], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            assert proc.stdout is not None
            sent_at = float(proc.stdout.readline())  # every message is queued
            for pull in pulls:
                got = [pull.recv(timeout=10)[:2] for _ in range(40)]
                assert got == [b"%02d" % i for i in range(40)]
            assert proc.wait(15) == 0, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() - sent_at < 3 * 1.5
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_exit_with_an_unreachable_peer_takes_linger_not_more() -> None:
    pull = nanopy.Socket("pull", recv_buffer=1)
    with closing(pull):
        url = pull.bind(bind_url("tcp")).url
        code = (
            "import sys, time, nanopy\n"
            "socks = [nanopy.Socket('push', connect=sys.argv[1], linger=0.5, send_buffer=4) for _ in range(4)]\n"
            "for s in socks:\n"
            "    try:\n"
            "        for _ in range(400):\n"
            "            s.send(b'.' * 65536, timeout=0.3)\n"
            "    except nanopy.Timeout:\n"
            "        pass\n"
            "print(time.monotonic(), flush=True)\n"
        )
        proc = subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None
            sent_at = float(proc.stdout.readline())
            assert proc.wait(15) == 0
            took = time.monotonic() - sent_at
            assert took < 4 * 0.5 + 1.5, f"exit took {took:.2f} s: the lingers did not overlap"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# -- fork ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # 3.12+: docs/api.md
def test_after_fork_inherited_sockets_close_at_once_and_new_ones_work() -> None:
    pull = nanopy.Socket("pull", recv_timeout=10)
    with closing(pull):
        url = pull.bind(bind_url("tcp")).url
        old = nanopy.Socket("push", connect=url)
        old_ep = old.endpoints[0]
        wait_pipes(old)
        pid = os.fork()
        if pid == 0:  # child: report through the exit code only
            os._exit(_forked_child(old, old_ep, url))
        try:
            assert pull.recv() == b"child"
        finally:
            status = reap_child(pid, 15)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child failed at step {status >> 8}"
        old.send(b"parent")  # the parent's socket is untouched
        assert pull.recv() == b"parent"
        old.close()


def _forked_child(old: nanopy.Socket, old_ep: Endpoint, url: str) -> int:
    try:
        t0 = time.monotonic()
        old_ep.close()  # the parent's tasks are not in this process: nothing to wait for
        if time.monotonic() - t0 > 0.5:
            return 20
        failed = inherited_socket_is_closed(old, url)  # (tests/forking.py)
        if failed:
            return failed
        with nanopy.Socket("push", connect=url) as new:  # a fresh engine serves it
            new.send(b"child", timeout=5)
        return 0
    except BaseException:  # noqa: BLE001 - reported as an exit code
        return 30


