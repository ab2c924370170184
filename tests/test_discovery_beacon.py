"""Discovery beacons on loopback: the format, following and forgetting, groups, junk, the cap, the CLI.

Nothing here leaves loopback: discovery services send their beacons to
127.255.255.255 (``beacon_to``), announcers listen there (``beacon_bind``), and
every test uses a fresh UDP port so that parallel runs cannot hear each other.
Across real (namespaced) hosts, see tests/test_multihost_discovery.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nanopy.discovery import MAX_DISCOVERIES, MAX_OPEN_DISCOVERIES, Announcer, Discovery
from nanopy.discovery.beacon import MAGIC, Beacon, decode_beacon, encode_beacon, interface_broadcasts
from nanopy.testing import wait_no_pipes, wait_pipes

LOOPBACK_BROADCAST = "127.255.255.255"
INTERVAL = 0.2


@pytest.fixture
def port() -> int:
    """A UDP port nobody else uses right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def beaconing(port: int, **kw: Any) -> Discovery:
    kw.setdefault("interval", INTERVAL)
    return Discovery("tcp://127.0.0.1:0", beacon=True, beacon_port=port, beacon_to=LOOPBACK_BROADCAST, **kw)


def listening(name: str, address: str, port: int, **kw: Any) -> Announcer:
    return Announcer(name, address, beacon=True, beacon_port=port, beacon_bind=LOOPBACK_BROADCAST, **kw)


def until(predicate: Callable[[], Any], timeout: float = 10.0) -> None:
    """Wait for ``predicate()`` by polling a counter-like state (no event exists for it)."""
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.02)


def send(port: int, *datagrams: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        for data in datagrams:
            sock.sendto(data, (LOOPBACK_BROADCAST, port))


# -- the format -----------------------------------------------------------------------------------


def test_beacon_bytes_are_as_documented() -> None:
    beacon = Beacon(bytes(range(8)), 5600, 1.0, "ws", "prod", "/disco")
    data = encode_beacon(beacon)
    assert data == (b"SPDB" + b"\x01" + b"\x00" + b"\x15\xe0" + b"\x00\x00\x03\xe8" + bytes(range(8))
                    + b"\x02ws" + b"\x04prod" + b"\x06/disco")
    assert decode_beacon(data) == beacon
    assert beacon.url("192.0.2.1") == "ws://192.0.2.1:5600/disco"
    assert Beacon(b"i" * 8, 1, 1.0).url("fe80::1%eth0") == "tcp://[fe80::1%eth0]:1"
    assert len(encode_beacon(Beacon(b"i" * 8, 5600, 1.0))) == 26  # the common case
    assert decode_beacon(data + b"future fields") == beacon  # additions are ignored
    assert decode_beacon(encode_beacon(Beacon(b"i" * 8, 1, 0.5, bye=True))).bye


VALID = encode_beacon(Beacon(b"i" * 8, 5600, 1.0))


@pytest.mark.parametrize("bad", [
    b"", b"SPDB", VALID[:-1], b"ZRE\x01" + VALID[4:], VALID[:4] + b"\x02" + VALID[5:],
    VALID[:6] + b"\x00\x00" + VALID[8:], VALID[:8] + b"\x00" * 4 + VALID[12:], VALID[:20] + b"\x03ftp\x00\x00",
    VALID[:20] + b"\x03tcp\x00\x02/x", VALID[:20] + b"\x03tcp\x01\xff\x00", VALID + b"x" * 1024,
])
def test_malformed_beacons_are_rejected(bad: bytes) -> None:
    with pytest.raises(ValueError):
        decode_beacon(bad)


def test_misuse_is_refused_precisely(port: int) -> None:
    with pytest.raises(TypeError, match="beacon=True"):
        Discovery()
    with pytest.raises(ValueError, match="beacon=True"):
        Announcer("x", "tcp://h:1")
    with pytest.raises(ValueError, match="port"):
        Discovery("ipc:///tmp/nanopy-beacon-test", beacon=True, beacon_to=LOOPBACK_BROADCAST)
    with pytest.raises(ValueError, match="beacon_port"):
        beaconing(0)
    with pytest.raises(ValueError, match="group"):
        beaconing(port, group="g" * 300)


def test_link_local_addresses_keep_their_interface() -> None:
    from nanopy.transports.tcp import ipv6_sockaddr, peer_text

    lo = socket.if_nametoindex("lo")
    assert ipv6_sockaddr("fe80::1%lo", 5) == ("fe80::1", 5, 0, lo)
    assert ipv6_sockaddr("fe80::1", 5) == ("fe80::1", 5, 0, 0)
    assert peer_text(("fe80::1", 5, 0, lo)) == "[fe80::1%lo]:5"
    assert peer_text(("127.0.0.1", 5)) == "127.0.0.1:5"


def test_interfaces_come_from_the_kernel_without_loopback() -> None:
    for name, address in interface_broadcasts():
        assert name != "lo" and not address.startswith("127.")
        socket.inet_aton(address)


# -- following beacons -------------------------------------------------------------------------------


def test_announcers_find_a_beaconing_discovery_and_wildcards_become_reachable(port: int) -> None:
    with beaconing(port) as disco, listening("echo", "tcp://0.0.0.0:7000", port) as a, \
            listening("echo", "tcp://127.0.0.1:7001", port, priority=1) as b:
        until(lambda: len(disco.services().get("echo", [])) == 2)
        # The wildcard host is replaced by the announcer's address on its route to the discovery.
        assert disco.services() == {"echo": ["tcp://127.0.0.1:7001", "tcp://127.0.0.1:7000"]}
        assert a.discoveries == b.discoveries == [disco.url]
        assert disco.beacons_sent >= 1
        assert a.beacons_ignored == 0


def test_groups_stay_apart_and_connect_combines(port: int) -> None:
    with beaconing(port, group="red") as red, beaconing(port, group="blue") as blue, \
            Discovery("tcp://127.0.0.1:0", interval=INTERVAL) as plain, \
            listening("svc", "tcp://127.0.0.1:7100", port, group="red", connect=plain.url) as ann:
        assert red.resolve("svc", timeout=10) == "tcp://127.0.0.1:7100"
        assert plain.resolve("svc", timeout=10) == "tcp://127.0.0.1:7100"  # explicit connect= still works
        until(lambda: ann.beacons_ignored >= 3)  # blue's beacons, heard and ignored
        assert ann.discoveries == [red.url]
        assert blue.services() == {}


def test_a_closing_discovery_is_forgotten_at_once(port: int) -> None:
    with listening("svc", "tcp://127.0.0.1:7200", port) as ann:
        disco = beaconing(port, interval=5.0)  # silence alone would take 15 s
        try:
            assert disco.resolve("svc", timeout=20) == "tcp://127.0.0.1:7200"
        finally:
            disco.close()  # says goodbye
        until(lambda: ann.discoveries == [], timeout=3.0)
        wait_no_pipes(ann.socket, 5)


def test_a_silent_discovery_is_forgotten_and_found_again(port: int) -> None:
    """A discovery that dies without a goodbye is dropped after three of its intervals."""
    with Discovery("tcp://127.0.0.1:0", interval=INTERVAL) as disco, listening("svc", "tcp://h:1", port) as ann:
        beacon = encode_beacon(Beacon(os.urandom(8), int(disco.url.rpartition(":")[2]), 0.1))
        send(port, beacon)  # as if from a discovery service that then crashed
        assert disco.resolve("svc", timeout=10) == "tcp://h:1"
        heard = time.monotonic()
        until(lambda: ann.discoveries == [])
        assert time.monotonic() - heard >= 0.3 - 0.05  # not before 3 x 0.1 s
        wait_no_pipes(disco.socket, 5)
        send(port, beacon)
        wait_pipes(disco.socket, 1, 10)


def test_junk_is_counted_and_changes_nothing(port: int) -> None:
    with beaconing(port) as disco, listening("svc", "tcp://127.0.0.1:7300", port) as ann:
        assert disco.resolve("svc", timeout=10) == "tcp://127.0.0.1:7300"
        junk = [b"", b"\x00" * 30, MAGIC, b"x" * 2000, VALID[:-2], VALID[:4] + b"\x09" + VALID[5:]]
        send(port, *junk * 20)
        until(lambda: ann.beacons_ignored >= len(junk) * 20)
        assert ann.discoveries == [disco.url] and ann.beacons_refused == 0
        rounds = disco.rounds
        until(lambda: disco.rounds >= rounds + 2)
        assert disco.services() == {"svc": ["tcp://127.0.0.1:7300"]}


def test_discoveries_followed_are_capped(port: int) -> None:
    """A flood of valid beacons from strangers costs at most max_discoveries dialers (counted)."""
    with listening("svc", "tcp://h:1", port, max_discoveries=5) as ann:
        closed_port = port  # UDP port number, so no TCP listener: the dials just fail and retry
        send(port, *[encode_beacon(Beacon(os.urandom(8), closed_port, 0.2)) for _ in range(5 + 8)])
        until(lambda: ann.beacons_heard == 5 + 8)
        assert len(ann.discoveries) == 5  # one dialer per stranger, up to the cap
        assert ann.beacons_refused == ann.stats()["beacons_refused"] == 8
        until(lambda: ann.discoveries == [])  # silent strangers are forgotten


def test_the_default_caps_are_bounded_by_memory_not_32(port: int) -> None:
    with listening("svc", "tcp://h:1", port) as open_, listening("svc", "tcp://h:1", port, secret=b"k" * 16) as signed:
        assert (open_.max_discoveries, signed.max_discoveries) == (MAX_OPEN_DISCOVERIES, MAX_DISCOVERIES)
    assert MAX_OPEN_DISCOVERIES == 256 and MAX_DISCOVERIES == 1024
    with pytest.raises(ValueError, match="max_discoveries"):
        Announcer("svc", "tcp://h:1", connect="tcp://127.0.0.1:1", max_discoveries=0)


# -- the command line ----------------------------------------------------------------------------------


def cli_beacon_round_trip(port: int, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[list[str], str]:
    """``nanopy announce --beacon`` in a child, ``nanopy discover --beacon --once`` here, both with
    ``extra`` options: the discovery lists the announced service; returns the announcer's
    stderr lines up to its status line, and what the discovery wrote on stderr."""
    from nanopy._cli.discover import discover_main

    ann = subprocess.Popen(
        [sys.executable, "-m", "nanopy", "announce", "web", "tcp://0.0.0.0:80", "--beacon", "--group", "cli",
         "--beacon-port", str(port), "--beacon-bind", LOOPBACK_BROADCAST, *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert ann.stderr is not None
        lines = [ann.stderr.readline()]
        while "beacons on UDP port" not in lines[-1]:  # listening from now on
            assert lines[-1], f"the announcer exited: {lines}"
            lines.append(ann.stderr.readline())
        status = discover_main(["--beacon", "--bind", "tcp://127.0.0.1:0", "--beacon-to", LOOPBACK_BROADCAST,
                                "--beacon-port", str(port), "--group", "cli", "--interval", "0.2",
                                "--once", "--wait", "1.5", "--json", *extra])
        assert status == 0
        written = capsys.readouterr()
        assert json.loads(written.out) == {"web": ["tcp://127.0.0.1:80"]}
        return lines, written.err
    finally:
        ann.kill()
        ann.wait(10)


def test_cli_discover_and_announce_with_beacons(port: int, capsys: pytest.CaptureFixture[str]) -> None:
    (first, status), err = cli_beacon_round_trip(port, capsys)
    assert "dropped" not in err
    assert "has no secret: its discovery group is open" in first  # (no --secret-file: warned, once)
    assert not status.rstrip().endswith("(signed)")


def test_cli_refuses_to_run_without_an_address_or_beacons() -> None:
    for argv in (["discover", "--once"], ["announce", "web", "tcp://h:80"]):
        done = subprocess.run([sys.executable, "-m", "nanopy", *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "--beacon" in done.stderr


@pytest.fixture(autouse=True)
def _no_threads_left() -> Iterator[None]:
    yield
    import threading

    until(lambda: not [t for t in threading.enumerate() if t.name.startswith("nanopy-beacons")], timeout=5)


def test_example_demo_runs_with_beacons() -> None:
    """examples/service_discovery/run_demo.py --beacon: no address given, beacons kept on loopback."""
    demo = os.path.join(os.path.dirname(__file__), "..", "examples", "service_discovery", "run_demo.py")
    done = subprocess.run([sys.executable, demo, "--beacon"], check=False, capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "beacons on UDP port" in done.stdout and done.stdout.rstrip().endswith("DEMO OK")
