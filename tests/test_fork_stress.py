"""Fork under load (issue 32, item 5): the parent forks again and again while other threads
send, receive, open and close sockets over tcp, ipc and inproc with several protocols,
trio and asyncio loops await nanopy calls (and ``aclose``), a hostile peer sends junk and
a sender oversized messages. Each child makes new sockets, talks to the parent both ways
and exits; the parent hears from it within a bounded time, and the load goes on.

Before nanopy/_fork.py a child could hang inside ``os.fork()`` itself: the at-fork hook
woke a parent's trio task waiting in ``aclose()``, which takes that trio run's lock, held
at that instant by the parent's engine thread (a wake is a ``run_sync_soon``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import partial
from typing import Any

import pytest
import trio
from forking import FORK_WARNING, fork_child, reap

import nanopy
from nanopy.testing import local_url, wait_pipes

FORKS = 8
#: the longest the parent waits for a child's messages, and for the load to move on
BOUND = 10.0
#: short timeouts of the load's calls: a worker looks at ``stop`` at least this often
TICK = 0.2
PAIRS = [  # (sender, receiver, transport): every transport, several protocols
    ("push", "pull", "tcp"), ("push", "pull", "ipc"), ("push", "pull", "inproc"),
    ("pub", "sub", "tcp"), ("req", "rep", "ipc"), ("bus", "bus", "inproc"), ("pair", "pair", "tcp"),
]


class Load:
    """Background work, each worker counting its progress; errors collected."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.errors: list[str] = []
        self._progress: dict[str, int] = {}
        self._moved = threading.Condition()
        self.threads: list[threading.Thread] = []

    def start(self, name: str, fn: Callable[[], None], ticks: tuple[str, ...] | None = None) -> None:
        """Run ``fn`` in a thread; it calls :meth:`tick` with each name in ``ticks``
        (default: ``name``) as it makes progress."""
        for counter in (name,) if ticks is None else ticks:
            self._progress[counter] = 0

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(f"{name}: {exc!r}")

        thread = threading.Thread(target=run, name=f"load {name}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def tick(self, name: str) -> None:
        with self._moved:
            self._progress[name] += 1
            self._moved.notify_all()

    def wait_all_moved(self) -> None:
        """Block until every worker has made progress since this call began."""
        with self._moved:
            before = dict(self._progress)
            moved = self._moved.wait_for(
                lambda: self.errors or all(self._progress[k] > v for k, v in before.items()), BOUND
            )
        assert not self.errors, self.errors
        assert moved, f"the load stalled: {self._progress} (was {before})"

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(BOUND)
        assert not [t.name for t in self.threads if t.is_alive()]
        assert not self.errors, self.errors


def _quietly(call: Callable[[], Any]) -> bool:
    """Run one call of the load; False when it timed out (the load is busy: try again)."""
    try:
        call()
    except nanopy.Timeout:
        return False
    return True


def pump(load: Load, sender: str, receiver: str, transport: str) -> None:
    """Messages from a sender thread to a receiver thread (a REP echoes to its REQ)."""
    name = f"{sender}/{receiver} {transport}"
    rx = nanopy.Socket(receiver, recv_timeout=TICK, send_timeout=TICK)
    tx = nanopy.Socket(sender, recv_timeout=TICK, send_timeout=TICK, connect=rx.bind(local_url(transport, "load")).url)
    if receiver == "sub":
        rx.subscribe(b"")
    wait_pipes(rx)

    def receive() -> None:
        with rx:
            while not load.stop.is_set():
                if _quietly(rx.recv) and receiver == "rep":
                    _quietly(lambda: rx.send(b"re"))

    def send() -> None:
        with tx:
            while not load.stop.is_set():
                if _quietly(lambda: tx.send(b"m" * 200)) and (sender != "req" or _quietly(tx.recv)):
                    load.tick(name)

    load.start(name + " rx", receive, ticks=())
    load.start(name, send)


def churn(load: Load, transport: str) -> None:
    """Sockets opened, used and closed again and again (every other one closed with a
    message still in flight)."""
    name = f"churn {transport}"
    for n in itertools.count():
        if load.stop.is_set():
            return
        with nanopy.Socket("pair", recv_timeout=TICK * 10, send_timeout=TICK * 10) as a:
            url = a.bind(local_url(transport, "churn")).url
            with nanopy.Socket("pair", connect=url, send_timeout=TICK * 10) as b:
                b.send(b"c")
                if n % 2:
                    a.recv()
                    b.send(b"in flight")
                    b.close(linger=0)
        load.tick(name)


def trio_loop(load: Load) -> None:
    """A trio run whose tasks await ``aclose()`` (the waiter a fork used to wake) while
    another one's receives keep other threads waking the run (each wake takes its lock)."""

    async def cycles(transport: str) -> None:
        while not load.stop.is_set():
            pull = nanopy.Socket("pull", recv_timeout=TICK * 10)
            push = nanopy.Socket("push", send_timeout=TICK * 10, connect=pull.bind(local_url(transport, "trio")).url)
            await push.asend(b"t")
            await pull.arecv()
            await push.aclose()
            await pull.aclose()
            load.tick(f"trio cycle {transport}")

    async def ping(transport: str) -> None:
        with nanopy.Socket("pair", recv_timeout=TICK) as near, nanopy.Socket("pair", recv_timeout=TICK) as far:
            far.connect(near.bind(local_url(transport, "ping")).url)
            echo = threading.Thread(target=_echo, args=(load, far), daemon=True)
            echo.start()
            while not load.stop.is_set():
                await near.asend(b"ping")
                if await _aquietly(near.arecv):
                    load.tick(f"trio ping {transport}")
            await trio.to_thread.run_sync(echo.join)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for transport in ("tcp", "ipc", "inproc"):
                nursery.start_soon(cycles, transport)
                nursery.start_soon(ping, transport)

    trio.run(main)


def _echo(load: Load, sock: nanopy.Socket) -> None:
    while not load.stop.is_set():
        try:
            sock.send(sock.recv())
        except nanopy.Timeout:
            pass


async def _aquietly(call: Callable[[], Any]) -> bool:
    try:
        await call()
    except nanopy.Timeout:
        return False
    return True


def asyncio_loop(load: Load) -> None:
    async def main() -> None:
        while not load.stop.is_set():
            rep = nanopy.Socket("rep", recv_timeout=TICK * 10, send_timeout=TICK * 10)
            req = nanopy.Socket("req", recv_timeout=TICK * 10, connect=rep.bind(local_url("tcp", "aio")).url)
            await req.asend(b"q")
            await rep.asend(await rep.arecv())
            await req.arecv()
            await req.aclose()
            await rep.aclose()
            load.tick("asyncio")

    asyncio.run(main())


def hostile(load: Load) -> None:
    """A peer that sends junk instead of an SP header, and a sender of oversized messages."""
    with ExitStack() as stack:
        victim = stack.enter_context(nanopy.Socket("pull", handshake_timeout=0.2, recv_max_size=1024))
        url = victim.bind("tcp://127.0.0.1:0").url
        big = stack.enter_context(nanopy.Socket("push", connect=url, reconnect_interval=0.01, send_timeout=TICK))
        host, port = url[len("tcp://"):].rsplit(":", 1)
        while not load.stop.is_set():
            with socket.create_connection((host, int(port)), timeout=BOUND) as raw:
                raw.sendall(b"GET / HTTP/1.1\r\n\r\n")
                try:
                    while raw.recv(4096):  # (until the listener drops it)
                        pass
                except ConnectionResetError:
                    pass  # (dropped with our junk unread)
            _quietly(lambda: big.send(b"x" * 4096))  # closes its pipe at the receiver
            load.tick("hostile")


@pytest.fixture
def load() -> Iterator[Load]:
    work = Load()
    for sender, receiver, transport in PAIRS:
        pump(work, sender, receiver, transport)
    for transport in ("tcp", "ipc", "inproc"):
        work.start(f"churn {transport}", partial(churn, work, transport))
    work.start("trio", partial(trio_loop, work), ticks=tuple(
        f"trio {kind} {transport}" for kind in ("cycle", "ping") for transport in ("tcp", "ipc", "inproc")))
    work.start("asyncio", partial(asyncio_loop, work))
    work.start("hostile", partial(hostile, work))
    try:
        yield work
    finally:
        work.finish()


def _child_talks_to_parent(inherited: nanopy.Socket, urls: dict[str, str]) -> int:
    """In the child: the parent's socket is closed here; new sockets reach the parent."""
    try:
        inherited.recv(timeout=0)
        return 2
    except nanopy.Closed as exc:
        if "fork" not in str(exc):
            return 3
    me = os.getpid()
    for transport in ("tcp", "ipc"):
        with nanopy.Socket("push", connect=urls[transport], send_timeout=BOUND) as push:
            push.send(b"child %d %s" % (me, transport.encode()))
    with nanopy.Socket("req", connect=urls["rep"], send_timeout=BOUND, recv_timeout=BOUND) as req:
        req.send(b"child %d asks" % me)
        if req.recv() != b"parent answers %d" % me:
            return 4
    return 0


@pytest.mark.timeout(90)
@pytest.mark.filterwarnings(FORK_WARNING)
def test_children_forked_under_load_talk_to_the_parent(load: Load) -> None:
    with ExitStack() as stack:
        home = stack.enter_context(nanopy.Socket("pull", recv_timeout=BOUND))
        rep = stack.enter_context(nanopy.Socket("rep", recv_timeout=BOUND, send_timeout=BOUND))
        urls = {
            "tcp": home.bind("tcp://127.0.0.1:0").url,
            "ipc": home.bind(local_url("ipc", "home")).url,
            "rep": rep.bind("tcp://127.0.0.1:0").url,
        }
        rounds = []
        for _ in range(FORKS):
            load.wait_all_moved()  # every worker is busy (between two of its calls, or in one)
            t0 = time.monotonic()
            pid = fork_child(lambda: _child_talks_to_parent(home, urls), watchdog=BOUND * 2)
            try:
                got = {home.recv(), home.recv()}
                assert got == {b"child %d tcp" % pid, b"child %d ipc" % pid}
                assert rep.recv() == b"child %d asks" % pid
                rep.send(b"parent answers %d" % pid)
            finally:
                code = reap(pid, BOUND)
            assert code == 0, f"child {pid} exit code {code} (None: hung, killed)"
            rounds.append(time.monotonic() - t0)
        load.wait_all_moved()  # the parent's work goes on after the forks
    assert max(rounds) < BOUND
