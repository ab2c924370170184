"""nanopy.discovery: Discovery + Announcer, the answer format, and the CLI commands.

Timing claims are checked in survey rounds (``Discovery.rounds``) as well as wall
time, with short intervals (0.2 s) to keep the file fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nanopy import Closed
from nanopy.discovery import SURVEY, Announcer, Discovery, decode_answer, encode_answer
from nanopy.testing import wait_no_pipes, wait_pipes

INTERVAL = 0.2
DEADLINE = 0.1
MISSES = 2


class Recorder:
    """Collects on_change events with the survey round they happened in."""

    def __init__(self, disco: Discovery) -> None:
        self.disco = disco
        self.events: list[tuple[str, str, bool, int, float]] = []
        self.cond = threading.Condition()
        disco.on_change(self._on_change)

    def _on_change(self, name: str, address: str, added: bool) -> None:
        with self.cond:
            self.events.append((name, address, added, self.disco.rounds, time.monotonic()))
            self.cond.notify_all()

    def wait(self, predicate: Callable[[list[tuple[str, str, bool, int, float]]], Any], timeout: float = 10.0) -> Any:
        with self.cond:
            ok = self.cond.wait_for(lambda: predicate(self.events), timeout)
            assert ok, f"condition not met in {timeout}s; events: {self.events}"
            return ok

    def event(self, name: str, address: str, added: bool) -> tuple[str, str, bool, int, float]:
        self.wait(lambda evs: any(e[:3] == (name, address, added) for e in evs))
        return [e for e in self.events if e[:3] == (name, address, added)][-1]


@pytest.fixture
def disco() -> Iterator[Discovery]:
    with Discovery("tcp://127.0.0.1:0", interval=INTERVAL, deadline=DEADLINE, misses=MISSES) as d:
        yield d


def announce_process(name: str, address: str, connect: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "nanopy", "announce", name, address, "--connect", connect, *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, 9)
    proc.wait(timeout=10)


# -- the answer format -------------------------------------------------------------------------------


def test_answer_round_trip_and_shape() -> None:
    data = encode_answer("echo", "tcp://10.0.0.2:7000", priority=3, metadata={"zone": "ny", "w": [1, 2]})
    assert json.loads(data) == {"v": 1, "name": "echo", "address": "tcp://10.0.0.2:7000", "priority": 3,
                                "metadata": {"zone": "ny", "w": [1, 2]}}
    p = decode_answer(data)
    assert (p.name, p.address, p.priority, dict(p.metadata)) == ("echo", "tcp://10.0.0.2:7000", 3,
                                                                 {"zone": "ny", "w": [1, 2]})
    # Minimal answer from another language: defaults apply, unknown fields are ignored.
    p = decode_answer(b'{"v":1,"name":"x","address":"ipc:///a","future":true}')
    assert (p.priority, dict(p.metadata)) == (8, {})
    assert json.loads(SURVEY)["v"] == 1


@pytest.mark.parametrize("bad", [
    b"", b"\xff", b"[]", b"null", b'{"name":"x","address":"y"}', b'{"v":2,"name":"x","address":"y"}',
    b'{"v":true,"name":"x","address":"y"}', b'{"v":1,"address":"y"}', b'{"v":1,"name":"","address":"y"}',
    b'{"v":1,"name":"x","address":5}', b'{"v":1,"name":"x","address":"y","priority":0}',
    b'{"v":1,"name":"x","address":"y","priority":"1"}', b'{"v":1,"name":"x","address":"y","metadata":[]}',
])
def test_decode_rejects(bad: bytes) -> None:
    with pytest.raises(ValueError):
        decode_answer(bad)


def test_encode_validates() -> None:
    with pytest.raises(ValueError):
        encode_answer("", "tcp://a:1")
    with pytest.raises(ValueError):
        encode_answer("x", "tcp://a:1", priority=17)
    with pytest.raises(TypeError):
        encode_answer("x", "tcp://a:1", metadata={"f": object()})
    with pytest.raises(ValueError):
        encode_answer("x", "tcp://a:1", metadata={"big": "z" * 70000})
    with pytest.raises(ValueError):
        Discovery("tcp://127.0.0.1:0", interval=0.1, deadline=0.5)


# -- discovery behaviour ----------------------------------------------------------------------------------


def test_three_services_appear_within_two_intervals(disco: Discovery) -> None:
    rec = Recorder(disco)
    services = [("alpha", "tcp://127.0.0.1:7001"), ("beta", "tcp://127.0.0.1:7002"), ("gamma", "tcp://127.0.0.1:7003")]
    anns = [Announcer(n, a, disco.url, metadata={"i": i}) for i, (n, a) in enumerate(services)]
    try:
        wait_pipes(disco.socket, 3, 10)
        start_round, start = disco.rounds, time.monotonic()
        for name, address in services:
            _, _, _, rnd, when = rec.event(name, address, True)
            # Seen by the first survey sent after the pipes were up, or the one after it.
            assert rnd <= start_round + 1
            assert when - start <= 2 * INTERVAL + 1.0  # slack for a loaded machine; rounds are exact
        assert disco.services() == {n: [a] for n, a in services}
        assert [dict(p.metadata) for p in disco.providers()] == [{"i": 0}, {"i": 1}, {"i": 2}]
    finally:
        for a in anns:
            a.close()


def test_killed_service_disappears_and_comes_back(disco: Discovery) -> None:
    rec = Recorder(disco)
    keep = Announcer("svc", "tcp://127.0.0.1:7100", disco.url)
    proc = announce_process("svc", "tcp://127.0.0.1:7101", disco.url)
    try:
        rec.event("svc", "tcp://127.0.0.1:7101", True)
        kill_round, killed_at = disco.rounds, time.monotonic()
        kill(proc)
        _, _, _, rnd, when = rec.event("svc", "tcp://127.0.0.1:7101", False)
        assert rnd <= kill_round + MISSES + 1
        assert when - killed_at <= (MISSES + 1) * INTERVAL + 1.0
        assert disco.services() == {"svc": ["tcp://127.0.0.1:7100"]}
        # resolve() only returns live providers.
        assert {disco.resolve("svc") for _ in range(50)} == {"tcp://127.0.0.1:7100"}
        # Restarted: it is discovered again.
        proc = announce_process("svc", "tcp://127.0.0.1:7101", disco.url)
        rec.wait(lambda evs: evs[-1][:3] == ("svc", "tcp://127.0.0.1:7101", True), timeout=20)
        assert {disco.resolve("svc") for _ in range(200)} == {"tcp://127.0.0.1:7100", "tcp://127.0.0.1:7101"}
    finally:
        kill(proc)
        keep.close()


def test_resolve_priority_and_lookup_error(disco: Discovery) -> None:
    rec = Recorder(disco)
    with pytest.raises(LookupError, match="no live provider of 'db'"):
        disco.resolve("db")
    with Announcer("db", "tcp://h:1", disco.url, priority=8), Announcer("db", "tcp://h:2", disco.url, priority=2):
        assert disco.resolve("db", timeout=10) in ("tcp://h:1", "tcp://h:2")
        rec.wait(lambda evs: len(evs) == 2)
        assert {disco.resolve("db") for _ in range(50)} == {"tcp://h:2"}  # best priority first
        assert disco.services() == {"db": ["tcp://h:2", "tcp://h:1"]}
    rec.wait(lambda evs: len(evs) == 4)
    with pytest.raises(LookupError):
        disco.resolve("db")


def test_resolve_waits_and_close_wakes(disco: Discovery) -> None:
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(disco.resolve("late", timeout=20)))
    t.start()
    with Announcer("late", "inproc://late", disco.url):
        t.join(20)
    assert got == ["inproc://late"]

    def blocked() -> None:
        try:
            disco.resolve("never", timeout=None)
        except Closed as exc:
            got.append(exc)

    t = threading.Thread(target=blocked)
    t.start()
    disco.close()
    t.join(10)
    assert isinstance(got[-1], Closed)


def test_discovery_restart_is_survived(tmp_path: Any) -> None:
    first = Discovery("tcp://127.0.0.1:0", interval=INTERVAL, deadline=DEADLINE)
    url = first.url
    anns = [Announcer(f"s{i}", f"tcp://127.0.0.1:{7200 + i}", url, reconnect_interval_max=0.2) for i in range(3)]
    try:
        assert first.resolve("s2", timeout=10) == "tcp://127.0.0.1:7202"
        first.close()
        for a in anns:
            wait_no_pipes(a.socket, 10)
        with Discovery(url, interval=INTERVAL, deadline=DEADLINE) as second:
            for i in range(3):
                assert second.resolve(f"s{i}", timeout=10) == f"tcp://127.0.0.1:{7200 + i}"
    finally:
        for a in anns:
            a.close()


@pytest.mark.interop
def test_pynng_respondent_is_discovered(disco: Discovery) -> None:
    pynng = pytest.importorskip("pynng")
    answer = json.dumps({"v": 1, "name": "from-nng", "address": "tcp://127.0.0.1:7300", "priority": 4,
                         "metadata": {"lang": "c"}}).encode()
    surveys: list[bytes] = []
    with pynng.Respondent0() as resp:
        resp.dial(disco.url, block=False)

        def serve() -> None:
            while True:
                try:
                    surveys.append(resp.recv())
                    resp.send(answer)
                except pynng.exceptions.Closed:
                    return

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        assert disco.resolve("from-nng", timeout=10) == "tcp://127.0.0.1:7300"
        (p,) = disco.providers("from-nng")
        assert p.priority == 4 and dict(p.metadata) == {"lang": "c"}
    t.join(10)
    assert json.loads(surveys[0]) == json.loads(SURVEY)


def test_bad_answers_are_ignored(disco: Discovery) -> None:
    pynng = pytest.importorskip("pynng")
    with pynng.Respondent0() as resp, Announcer("good", "tcp://g:1", disco.url):
        resp.dial(disco.url, block=False)
        resp.recv_timeout = 5000
        # An answer that misses its survey's deadline (a loaded machine) is dropped as
        # late, never read: answer each survey until one bad answer was read in time.
        give_up = time.monotonic() + 10
        while disco.rejected == 0 and time.monotonic() < give_up:
            resp.recv()
            resp.send(b"pickle\x80\x04")
        assert disco.resolve("good", timeout=10) == "tcp://g:1"
    assert disco.rejected >= 1
    assert set(disco.services()) <= {"good"}


@pytest.mark.trio
async def test_async_resolve_trio(disco: Discovery) -> None:
    with Announcer("t", "tcp://t:1", disco.url):
        assert await disco.aresolve("t", timeout=10) == "tcp://t:1"
        assert await disco.aservices() == {"t": ["tcp://t:1"]}
    async with Discovery("tcp://127.0.0.1:0", interval=INTERVAL) as other:
        with pytest.raises(LookupError):
            await other.aresolve("t", timeout=0.05)


def test_async_resolve_asyncio(disco: Discovery) -> None:
    import asyncio

    async def main() -> str:
        async with Announcer("a", "tcp://a:1", disco.url):
            return await disco.aresolve("a", timeout=10)

    assert asyncio.run(main()) == "tcp://a:1"


# -- the command line ----------------------------------------------------------------------------------------


def test_discover_once_json(capsys: pytest.CaptureFixture[str]) -> None:
    from nanopy._cli.discover import discover_main
    from nanopy.testing import ipc_url

    url = ipc_url("disco")
    with Announcer("cli", "tcp://c:1", url, reconnect_interval_max=0.1):
        assert discover_main(["--bind", url, "--interval", "0.2", "--once", "--wait", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"cli": ["tcp://c:1"]}


def test_discover_events_and_announce_cli() -> None:
    from nanopy.testing import ipc_url

    url = ipc_url("disco-cli")
    disco_proc = subprocess.Popen(
        [sys.executable, "-m", "nanopy", "discover", "--bind", url, "--interval", "0.2", "--events"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    ann = announce_process("web", "tcp://w:80", url, "--priority", "2", "--meta", "zone=ny")
    try:
        assert disco_proc.stdout is not None
        line = disco_proc.stdout.readline()  # blocks until the first change is printed
        assert line.split()[1:] == [b"+", b"web", b"tcp://w:80"]
        kill(ann)
        line = disco_proc.stdout.readline()
        assert line.split()[1:] == [b"-", b"web", b"tcp://w:80"]
    finally:
        kill(ann)
        kill(disco_proc)


def test_example_demo_runs() -> None:
    """examples/service_discovery/run_demo.py passes its own checks."""
    demo = os.path.join(os.path.dirname(__file__), "..", "examples", "service_discovery", "run_demo.py")
    done = subprocess.run([sys.executable, demo], check=False, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("DEMO OK")


def test_render_table() -> None:
    from nanopy._cli.discover import render_table
    from nanopy.discovery import Provider

    rows = render_table([Provider("echo", "tcp://h:1", 2, {"zone": "ny"}, 0.0, 98.0),
                         Provider("db", "ipc:///x", 8, {}, 0.0, 99.5)], now=100.0)
    assert rows == [
        "NAME  ADDRESS    PRIO  SEEN      METADATA",
        'echo  tcp://h:1  2     2.0s ago  {"zone":"ny"}',
        "db    ipc:///x   8     0.5s ago",
    ]
    assert render_table([])[1] == "(no live providers)"
