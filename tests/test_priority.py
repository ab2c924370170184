"""Endpoint priorities end to end (issue 4, "Done means" 2).

Send priority (``priority=``) steers load-balanced senders (PUSH, REQ): all traffic
goes to the most preferred live pipe, fails over to the next priority when it goes
away, and comes back when it returns; equal priorities share round robin. Receive
priority (``recv_priority=``) makes PULL drain its preferred pipes first.

Each scenario runs for PUSH (PULL servers) and for REQ (REP servers, when
``nanopy.protocols.reqrep`` exists).
"""

from __future__ import annotations

import importlib.util
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from conftest import wait_until

import nanopy
from nanopy.testing import ipc_url, wait_pipes

MakeSocket = Callable[..., nanopy.Socket]

RECONNECT = 0.1  # the client's reconnect_interval
RECONNECT_MAX = 0.4  # and its cap, so a returning server is found quickly

HAVE_REQREP = importlib.util.find_spec("nanopy.protocols.reqrep") is not None


class Rig:
    """A client socket and named servers, each server at its own address."""

    client_protocol = ""
    server_protocol = ""

    def __init__(self, make_socket: MakeSocket, transport: str) -> None:
        self.make_socket = make_socket
        self.transport = transport
        self.urls: dict[str, str] = {}
        self.servers: dict[str, nanopy.Socket] = {}
        self.threads: list[threading.Thread] = []
        self.client = make_socket(
            self.client_protocol, reconnect_interval=RECONNECT, reconnect_interval_max=RECONNECT_MAX
        )

    def start(self, name: str) -> None:
        """Start server ``name`` (again at its old address if it ran before)."""
        url = self.urls.get(name)
        if url is None:
            url = "tcp://127.0.0.1:0" if self.transport == "tcp" else ipc_url("prio")
        server = self.make_socket(self.server_protocol)
        self.urls[name] = server.bind(url).url
        self.servers[name] = server
        t = threading.Thread(target=self._serve, args=(name, server), daemon=True)
        t.start()
        self.threads.append(t)

    def stop(self, name: str) -> None:
        self.servers.pop(name).close(linger=0)

    def connect(self, name: str, priority: int) -> None:
        self.client.connect(self.urls[name], priority=priority)

    def _serve(self, name: str, server: nanopy.Socket) -> None:
        raise NotImplementedError

    def route(self, timeout: float = 0.25) -> str | None:
        """Send one message; the name of the server that got it (None if it was lost)."""
        raise NotImplementedError

    def close(self) -> None:
        self.client.close(linger=0)
        for server in list(self.servers.values()):
            server.close(linger=0)
        for t in self.threads:
            t.join(5)


class PushRig(Rig):
    client_protocol = "push"
    server_protocol = "pull"

    def __init__(self, make_socket: MakeSocket, transport: str) -> None:
        super().__init__(make_socket, transport)
        self.seen: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.counter = 0

    def _serve(self, name: str, server: nanopy.Socket) -> None:
        try:
            while True:
                self.seen.put((name, server.recv()))
        except nanopy.Closed:
            pass

    def route(self, timeout: float = 0.25) -> str | None:
        self.counter += 1
        tag = str(self.counter).encode()
        self.client.send(tag, timeout=5)
        deadline = time.monotonic() + timeout
        while True:
            try:
                name, body = self.seen.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None  # sent on a pipe that was dying
            if body == tag:
                return name
            # a message that was given up on earlier and arrived late: skip it


class ReqRig(Rig):
    client_protocol = "req"
    server_protocol = "rep"

    def _serve(self, name: str, server: nanopy.Socket) -> None:
        try:
            while True:
                server.recv()
                server.send(name.encode())
        except nanopy.Closed:
            pass

    def route(self, timeout: float = 0.25) -> str | None:
        try:
            return self.client.request(b"where?", timeout=timeout).decode()  # type: ignore[attr-defined]
        except nanopy.Timeout:
            return None


RIGS = [
    pytest.param(PushRig, id="push"),
    pytest.param(
        ReqRig,
        id="req",
        marks=pytest.mark.skipif(not HAVE_REQREP, reason="REQ/REP not implemented yet"),
    ),
]


@pytest.fixture(params=RIGS)
def rig_class(request: pytest.FixtureRequest) -> type[Rig]:
    return request.param


@pytest.fixture
def make_rig(make_socket: MakeSocket) -> Any:
    made: list[Rig] = []

    def make(cls: type[Rig], transport: str = "tcp") -> Rig:
        rig = cls(make_socket, transport)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.close()


def routes(rig: Rig, n: int) -> list[str | None]:
    return [rig.route(timeout=5.0) for _ in range(n)]


def route_until(rig: Rig, name: str, limit: float) -> float:
    """Route messages until one reaches ``name``; the seconds that took."""
    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        if elapsed > limit + 2:
            pytest.fail(f"traffic did not reach {name!r} within {limit + 2:.1f}s")
        if rig.route(timeout=0.2) == name:
            return time.monotonic() - started


def test_all_traffic_goes_to_the_most_preferred(make_rig: Any, rig_class: type[Rig]) -> None:
    rig = make_rig(rig_class)
    rig.start("dc1")
    rig.start("dc2")
    rig.connect("dc2", priority=2)  # the less preferred one comes up first
    wait_pipes(rig.client, 1)
    rig.connect("dc1", priority=1)
    wait_pipes(rig.client, 2)
    assert routes(rig, 200) == ["dc1"] * 200


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_fail_over_and_back(make_rig: Any, rig_class: type[Rig], transport: str) -> None:
    rig = make_rig(rig_class, transport)
    rig.start("dc1")
    rig.start("dc2")
    rig.connect("dc1", priority=1)
    rig.connect("dc2", priority=2)
    wait_pipes(rig.client, 2)
    assert routes(rig, 20) == ["dc1"] * 20

    rig.stop("dc1")
    took = route_until(rig, "dc2", RECONNECT + 1)
    assert took <= RECONNECT + 1.0, f"fail-over took {took:.2f}s"
    assert routes(rig, 20) == ["dc2"] * 20

    rig.start("dc1")  # the same address again: the client's dialer finds it
    took = route_until(rig, "dc1", RECONNECT_MAX + 1)
    assert took <= RECONNECT_MAX + 1.0, f"moving back took {took:.2f}s"
    assert routes(rig, 20) == ["dc1"] * 20


def test_equal_priorities_share_round_robin(make_rig: Any, rig_class: type[Rig]) -> None:
    rig = make_rig(rig_class)
    for name in ("a", "b", "c", "backup"):
        rig.start(name)
    for name in ("a", "b", "c"):
        rig.connect(name, priority=3)
    rig.connect("backup", priority=4)
    wait_pipes(rig.client, 4)
    got = routes(rig, 90)
    assert Counter(got) == {"a": 30, "b": 30, "c": 30}
    # Strict rotation: every window of three sees each server once.
    for i in range(0, 90, 3):
        assert sorted(got[i : i + 3]) == ["a", "b", "c"]  # type: ignore[type-var]


def test_back_pressure_spills_to_the_next_priority(make_socket: MakeSocket) -> None:
    """A preferred PULL that stops reading fills up; PUSH then uses the next priority."""
    push = make_socket("push", send_buffer=4)
    preferred = make_socket("pull", recv_buffer=4)
    spare = make_socket("pull", recv_timeout=5.0)
    push.connect(preferred.bind(f"inproc://prio-spill-1-{id(push)}").url, priority=1)
    push.connect(spare.bind(f"inproc://prio-spill-2-{id(push)}").url, priority=2)
    wait_pipes(push, 2)
    for i in range(200):
        push.send(b"%d" % i, timeout=5)
    # The preferred pipe took what its buffers hold; the spare got the rest, in order.
    first = int(spare.recv())
    assert 0 < first < 200
    held = [int(preferred.recv(timeout=5)) for _ in range(first)]
    assert held == list(range(first))


def test_pull_recv_priority_drains_preferred_pipes_first(make_socket: MakeSocket) -> None:
    pull = make_socket("pull", recv_timeout=5.0)
    low_ep = pull.bind("tcp://127.0.0.1:0", recv_priority=9)
    high_ep = pull.bind(ipc_url("rprio"), recv_priority=2)
    low = make_socket("push")
    high = make_socket("push")
    low.connect(low_ep.url)
    high.connect(high_ep.url)
    wait_pipes(pull, 2)
    for i in range(10):
        low.send(b"low%d" % i)
    for i in range(10):
        high.send(b"high%d" % i)
    # Wait until PULL holds all twenty (nobody reads meanwhile).
    wait_until(lambda: pull._core._fq.queued() == 20, what="20 queued messages")
    got = [pull.recv() for _ in range(20)]
    assert got == [b"high%d" % i for i in range(10)] + [b"low%d" % i for i in range(10)]


def test_pull_equal_recv_priorities_are_fair(make_socket: MakeSocket) -> None:
    pull = make_socket("pull", recv_timeout=5.0)
    ep = pull.bind("tcp://127.0.0.1:0", recv_priority=5)
    a = make_socket("push")
    b = make_socket("push")
    a.connect(ep.url)
    b.connect(ep.url)
    wait_pipes(pull, 2)
    for i in range(5):
        a.send(b"a%d" % i)
        b.send(b"b%d" % i)
    wait_until(lambda: pull._core._fq.queued() == 10, what="10 queued messages")
    got = [pull.recv()[:1] for _ in range(10)]
    # One message from each pipe in turn.
    assert all(got[i] != got[i + 1] for i in range(9)), got
