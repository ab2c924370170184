"""Zero-configuration discovery across namespaced hosts: beacons, fail-over, groups, a hostile flood,
unicast beacons, and a signed group against a hostile host.

One LAN for the module: a client host running ``Discovery(beacon=True)``, two service
hosts running a REP on ``tcp://0.0.0.0:7000`` and ``Announcer(..., beacon=True)`` with
that wildcard address, and a hostile host. No address is configured anywhere: the
services find the discovery service by its broadcast beacons and the client reaches
them at the addresses their answers carry. Every child prints wall-clock stamps
(``time.time()``; the namespaces share the clock) so that the test measures from the
moment it acted, not from when it read a line.

Run with ``-s`` to see the figures (resolution time, fail-over time, beacon cost).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import netns
import pytest

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(120)]

_reason = netns.skip_reason()
if _reason:
    pytestmark.append(pytest.mark.skip(reason=_reason))

INTERVAL = 1.0  # as in the Done-means
MISSES = 2

# The client: Discovery services (one per group) with nothing but beacon=True, and a caller.
CLIENT = """
import json, sys, time, nanopy
from nanopy.discovery import Discovery
interval, groups = float(sys.argv[1]), sys.argv[2].split(",")
url = sys.argv[4] if len(sys.argv) > 4 else None
discos = {g: Discovery(url, beacon=True, interval=interval, misses=int(sys.argv[3]), group=g.strip("-"))
          for g in groups}
started = time.time()
def printer(group):
    # One write per line: the groups' callbacks run on their own threads, and print()
    # with several arguments writes them one by one (lines came out interleaved).
    def changed(name, address, added):
        line = f"{'+' if added else '-'} {group} {name} {address} {time.time():.3f}\\n"
        sys.stdout.write(line)
        sys.stdout.flush()
    return changed
for group, disco in discos.items():
    disco.on_change(printer(group))
print(f"ready {started:.3f}", flush=True)

def call(disco, name):
    end = time.monotonic() + 15
    while time.monotonic() < end:
        address = disco.resolve(name, timeout=max(0.0, end - time.monotonic()))
        with nanopy.Socket("req", connect=address) as req:
            try:
                answer = req.request(b"hi", timeout=0.5).decode()
            except nanopy.Timeout:
                print("retry", address, flush=True)
                continue
        return f"answer {address} {answer} {time.time():.3f}"
    return "failed"

for line in sys.stdin:
    command, group, *rest = line.split()
    disco = discos[group]
    if command == "call":
        print(call(disco, rest[0]), flush=True)
    elif command == "services":
        print("services", json.dumps(disco.services(), sort_keys=True), flush=True)
    elif command == "stats":
        print("stats", json.dumps({"beacons_sent": disco.beacons_sent, "rounds": disco.rounds,
                                   "seconds": time.time() - started}), flush=True)
"""

# A service: a REP on a wildcard address, announced as such, found by beacons only.
SERVICE = """
import json, sys, threading, time, nanopy
from nanopy.discovery import Announcer
name, group, label = sys.argv[1:4]
wildcard, listen = (sys.argv[4], sys.argv[5:]) if len(sys.argv) > 4 else ("0.0.0.0", ["0.0.0.0", "::"])
address = f"tcp://{wildcard}:7000"
rep = nanopy.Socket("rep", bind=address)
def serve():
    while True:
        msg = rep.recv_msg()
        msg.reply(msg.body + b"@" + label.encode())
threading.Thread(target=serve, daemon=True).start()
ann = Announcer(name, address, beacon=True, group=group.strip("-"), beacon_bind=listen)
print("ready", flush=True)
for line in sys.stdin:
    with open("/proc/self/status") as status:
        rss = next(int(l.split()[1]) for l in status if l.startswith("VmRSS:"))
    print("stats", json.dumps({"discoveries": ann.discoveries, "heard": ann.beacons_heard,
                               "ignored": ann.beacons_ignored, "refused": ann.beacons_refused,
                               "answered": ann.answered, "rss_kb": rss, "cpu": time.process_time()}), flush=True)
"""

# A hostile host: floods the beacon port with garbage, foreign and other-group datagrams.
FLOOD = """
import os, socket, sys, time
from nanopy.discovery.beacon import DEFAULT_BEACON_PORT, Beacon, encode_beacon
seconds, targets = float(sys.argv[1]), sys.argv[2:]
valid = encode_beacon(Beacon(os.urandom(8), 7000, 1.0))
samples = [
    b"", os.urandom(26), b"SPDB", b"x" * 1500,              # noise, a bare magic, too long
    b"SPDB\\x02" + valid[5:],                               # a future version
    valid[:-2], valid[:8] + b"\\x00\\x00\\x00\\x00" + valid[12:],  # truncated; interval 0
    valid[:20] + b"\\x03ftp\\x00\\x00",                       # an unknown scheme
    encode_beacon(Beacon(os.urandom(8), 7000, 1.0, group="intruders")),  # another group
    encode_beacon(Beacon(os.urandom(8), 7000, 1.0, bye=True)),           # bye from a stranger
]
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
sent, end = 0, time.monotonic() + seconds
while time.monotonic() < end:
    for data in samples:
        for target in targets:
            try:
                sock.sendto(data, (target, DEFAULT_BEACON_PORT))
                sent += 1
            except OSError:
                pass
print(f"sent {sent} {seconds}", flush=True)
"""


@pytest.fixture(scope="module")
def net() -> Iterator[netns.Lan]:
    with netns.lan("client", "svc1", "svc2", "hostile") as lan:
        yield lan


@pytest.fixture
def hosts(net: netns.Lan) -> Iterator[dict[str, netns.Host]]:
    """The module's hosts; every process a test started is killed after it."""
    yield net.hosts
    for host in net.hosts.values():
        host.kill()


def start_services(hosts: dict[str, netns.Host], group1: str = "-", group2: str = "-") -> list[netns.Process]:
    procs = [hosts[h].python(SERVICE, "echo", group, h) for h, group in (("svc1", group1), ("svc2", group2))]
    for proc in procs:
        proc.expect("^ready", timeout=20)
    return procs


def start_client(hosts: dict[str, netns.Host], interval: float, groups: str = "-",
                 *url: str) -> tuple[netns.Process, float]:
    client = hosts["client"].python(CLIENT, str(interval), groups, str(MISSES), *url)
    started = float(client.expect(r"^ready (\S+)", timeout=20).group(1))
    return client, started


def stats(proc: netns.Process, *command: str) -> dict[str, object]:
    proc.send(" ".join(command) if command else "stats")
    result: dict[str, object] = json.loads(proc.expect("^stats ", timeout=10).string[6:])
    return result


def test_zero_configuration_resolution_and_failover(hosts: dict[str, netns.Host]) -> None:
    svc1, svc2 = hosts["svc1"], hosts["svc2"]
    start_services(hosts, "-", "-")
    client, started = start_client(hosts, INTERVAL)
    found = {}
    for _ in range(2):  # both services, at the addresses they can be reached at
        match = client.expect(r"^\+ - echo (\S+) (\S+)", timeout=10)
        found[match.group(1)] = float(match.group(2)) - started
    assert set(found) == {f"tcp://{svc1.addr}:7000", f"tcp://{svc2.addr}:7000"}
    first = min(found.values())
    assert first <= 5.0, f"first resolution took {first:.2f}s"

    killed = time.time()
    svc1.kill()  # SIGKILL: no goodbye
    client.send("call - echo")  # a client calling at once rides through the crash
    seen: dict[str, re.Match[str]] = {}
    while len(seen) < 2:  # the answer and the drop, in either order
        line = client.expect(rf"^answer (\S+) (\S+) (\S+)|^- - echo tcp://{svc1.addr}:7000 (\S+)", timeout=15)
        seen[line.group(0)[0]] = line
    answer = seen["a"]
    assert answer.group(1) == f"tcp://{svc2.addr}:7000" and answer.group(2) == "hi@svc2"
    failover = float(answer.group(3)) - killed
    dropped = float(seen["-"].group(4)) - killed
    assert dropped <= (MISSES + 1) * INTERVAL, f"dropped {dropped:.2f}s after the SIGKILL"
    assert failover <= 5.0, f"fail-over took {failover:.2f}s"
    client.send("call - echo")  # and every later resolution goes to the survivor
    assert client.expect(r"^answer (\S+)", timeout=15).group(1) == f"tcp://{svc2.addr}:7000"

    cost = stats(client, "stats -")
    per_interval = float(cost["beacons_sent"]) / float(cost["rounds"])  # type: ignore[arg-type]
    assert per_interval == 1.0  # one interface (eth0): one datagram per interval
    print(f"\nFIGURES interval={INTERVAL}s misses={MISSES}: first resolution {first:.2f}s "
          f"(both services {max(found.values()):.2f}s); SIGKILL -> dropped {dropped:.2f}s "
          f"(bound {(MISSES + 1) * INTERVAL:.1f}s), a client calling at once answered by the other "
          f"after {failover:.2f}s; beacon cost {per_interval:g} datagram per interval per discovery "
          f"process ({cost['beacons_sent']} in {cost['rounds']} rounds), 0 per announcer")


def test_two_groups_on_one_lan_stay_apart(hosts: dict[str, netns.Host]) -> None:
    s1, s2 = start_services(hosts, "red", "blue")
    client, _ = start_client(hosts, 0.5, "red,blue")
    found = dict(client.expect(r"^\+ (\S+) echo (\S+)", timeout=10).groups() for _ in range(2))
    red, blue = found["red"], found["blue"]
    assert (red, blue) == (f"tcp://{hosts['svc1'].addr}:7000", f"tcp://{hosts['svc2'].addr}:7000")
    for proc in (s1, s2):  # several beacon rounds later, still one discovery service each
        proc.send("stats")
        proc.expect("^stats")
    s2_stats = stats(s2)
    while int(s2_stats["ignored"]) < 3:  # type: ignore[call-overload]
        s2_stats = stats(s2)
    assert len(s2_stats["discoveries"]) == 1  # type: ignore[arg-type]
    assert len(stats(s1)["discoveries"]) == 1  # type: ignore[arg-type]
    client.send("services red")
    assert json.loads(client.expect("^services ").string[9:]) == {"echo": [red]}
    client.send("services blue")
    assert json.loads(client.expect("^services ").string[9:]) == {"echo": [blue]}


def test_hostile_flood_changes_nothing(hosts: dict[str, netns.Host]) -> None:
    s1, s2 = start_services(hosts, "-", "-")
    client, _ = start_client(hosts, 0.5)
    client.expect(r"^\+ - echo", timeout=10)
    client.expect(r"^\+ - echo", timeout=10)
    before = [stats(s) for s in (s1, s2)]
    subnet_broadcast = f"{netns.SUBNET}.255"
    flood = hosts["hostile"].python(FLOOD, "4", subnet_broadcast, hosts["svc1"].addr, hosts["svc2"].addr)
    sent = int(flood.expect(r"^sent (\d+)", timeout=30).group(1))
    client.send("call - echo")
    client.expect("^answer ", timeout=15)
    after = [stats(s) for s in (s1, s2)]
    client.send("services -")
    services = json.loads(client.expect("^services ").string[9:])
    assert sorted(services["echo"]) == [f"tcp://{hosts[h].addr}:7000" for h in ("svc1", "svc2")]
    assert not [line for line in client.seen if line.startswith("- ")], "a provider was dropped during the flood"
    for b, a in zip(before, after, strict=True):
        assert a["discoveries"] == b["discoveries"] and a["refused"] == 0
        assert int(a["ignored"]) - int(b["ignored"]) > 100  # type: ignore[call-overload]
        assert int(a["answered"]) > int(b["answered"])  # type: ignore[call-overload]
        assert int(a["rss_kb"]) - int(b["rss_kb"]) < 8 * 1024  # type: ignore[call-overload]
    cpu = max(float(a["cpu"]) - float(b["cpu"]) for b, a in zip(before, after, strict=True))  # type: ignore[arg-type]
    print(f"\nFIGURES flood: {sent} hostile datagrams in 4 s ({sent / 4:.0f}/s); each announcer ignored "
          f"{[int(a['ignored']) - int(b['ignored']) for b, a in zip(before, after, strict=True)]} "  # type: ignore[call-overload]
          f"and used at most {cpu:.2f}s of CPU meanwhile; nothing dropped or added")


def test_ipv6_link_local_beacons(hosts: dict[str, netns.Host]) -> None:
    """Bound to [::], the discovery also beacons to ff02::1; an announcer hearing only IPv6 dials
    it at its link-local address, and its [::] wildcard is listed as its own link-local address."""
    service = hosts["svc2"].python(SERVICE, "echo", "-", "svc2", "[::]", "::")
    service.expect("^ready", timeout=20)
    client, _ = start_client(hosts, 0.5, "-", "tcp://[::]:0")
    address = client.expect(r"^\+ - echo (\S+)", timeout=15).group(1)
    assert address.startswith("tcp://[fe80::") and address.endswith("%eth0]:7000")
    client.send("call - echo")
    assert client.expect(r"^answer (\S+) (\S+)", timeout=15).groups() == (address, "hi@svc2")
    (followed,) = stats(service)["discoveries"]  # type: ignore[misc]
    assert str(followed).startswith("tcp://[fe80::")


# Announcers only (no service behind them): several on one host, each with its own port.
ANNOUNCER = """
import json, sys
from nanopy.discovery import Announcer
ann = Announcer(sys.argv[1], f"tcp://0.0.0.0:{sys.argv[2]}", beacon=True)
print("ready", flush=True)
for line in sys.stdin:
    print("stats", json.dumps({"discoveries": ann.discoveries, "relayed": ann.stats()["beacons_relayed"]}), flush=True)
"""

UNICAST_CLIENT = """
import sys
from nanopy.discovery import Discovery
disco = Discovery(beacon=True, interval=0.5, beacon_to=sys.argv[1:])
disco.on_change(lambda name, address, added: print("+" if added else "-", name, address, flush=True))
print("ready", flush=True)
sys.stdin.read()
"""


def test_unicast_beacons_reach_every_listener_on_the_host(hosts: dict[str, netns.Host]) -> None:
    """beacon_to= a host's unicast address: the kernel gives each datagram to one socket; the
    listener that gets it relays it over loopback, so all three announcers on svc1 follow."""
    svc1 = hosts["svc1"]
    announcers = [svc1.python(ANNOUNCER, f"svc{i}", str(7000 + i)) for i in range(3)]
    other = hosts["svc2"].python(ANNOUNCER, "elsewhere", "7000")
    for proc in (*announcers, other):
        proc.expect("^ready", timeout=20)
    client = hosts["client"].python(UNICAST_CLIENT, svc1.addr)
    client.expect("^ready", timeout=20)
    found = sorted(client.expect(r"^\+ (\S+) (\S+)", timeout=10).groups() for _ in range(3))
    assert found == [(f"svc{i}", f"tcp://{svc1.addr}:{7000 + i}") for i in range(3)]
    relayed = [int(stats(proc)["relayed"]) for proc in announcers]  # type: ignore[call-overload]
    assert sum(relayed) >= 1  # one of them got each unicast datagram and handed it on
    assert stats(other)["discoveries"] == []  # unicast to svc1 only: svc2 heard nothing


# -- signed discovery against a hostile host --------------------------------------------------------
# A client host runs ``Discovery(beacon=True)``, two service hosts a REP on
# ``tcp://0.0.0.0:7000`` and ``Announcer(..., beacon=True)``, all with the group's key
# file (or, for the open group, none). A hostile host on the same segment first listens
# to the real beacons, then, for a few seconds at once:
#
# * answers the real discovery service's surveys with a priority-1 service of its own,
#   unsigned (an ``Announcer`` without a secret) and signed with a wrong key but bound to
#   the right survey (its nonce copied);
# * replays every real beacon it hears (to the broadcast address and to each service
#   host), and sends *bye* beacons for the real discovery service: version 1 with its
#   instance id, and the captured signed beacon with the bye flag set;
# * runs two rogue discovery services that beacon on the LAN (one open, one with a wrong key).
#
# With the secret, that changes nothing (every resolution goes to the real services,
# nothing is delisted, the rogues learn nothing) and every attack is counted by reason.
# Without it, the forged answer takes the resolutions and the rogues learn the services,
# as docs/security.md says.

SIGNED_CLIENT = """
import json, sys, time
from nanopy.discovery import Discovery
secret = None if sys.argv[1] == "-" else sys.argv[1]
disco = Discovery(beacon=True, interval=0.5, misses=2, secret=secret)
def changed(name, address, added):
    sys.stdout.write(f"{'+' if added else '-'} {name} {address}\\n")
    sys.stdout.flush()
disco.on_change(changed)
print("ready", flush=True)
for line in sys.stdin:
    command, *rest = line.split()
    if command == "resolve":
        found = []
        for _ in range(int(rest[0])):
            found.append(disco.resolve("echo", timeout=10))
            time.sleep(0.2)
        print("resolved", json.dumps(found), flush=True)
    elif command == "stats":
        print("stats", json.dumps({**disco.stats(), "services": disco.services()}), flush=True)
"""

SIGNED_SERVICE = """
import json, sys, threading, nanopy
from nanopy.discovery import Announcer
label, secret = sys.argv[1], None if sys.argv[2] == "-" else sys.argv[2]
rep = nanopy.Socket("rep", bind="tcp://0.0.0.0:7000")
ann = Announcer("echo", "tcp://0.0.0.0:7000", beacon=True, secret=secret)
print("ready", flush=True)
for line in sys.stdin:
    print("stats", json.dumps({**ann.stats(), "followed": ann.discoveries}), flush=True)
"""

HOSTILE = """
import json, socket, sys, threading, time, nanopy
from dataclasses import replace
from nanopy.discovery import Announcer, Discovery, encode_answer
from nanopy.discovery.beacon import DEFAULT_BEACON_PORT, decode_beacon, encode_beacon
from nanopy.discovery.signing import KIND_ANSWER, Signer, split_signed
wrong_key, seconds, targets = sys.argv[1], float(sys.argv[2]), sys.argv[3:]

sniffer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sniffer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a copy of every broadcast, like announcers
sniffer.bind(("0.0.0.0", DEFAULT_BEACON_PORT))
captured, source = sniffer.recvfrom(2048)
beacon = decode_beacon(captured)
real_url = beacon.url(source[0])
print("captured", real_url, captured[4], flush=True)

# forged answers, priority 1: unsigned, and signed with a wrong key but bound to the survey
Announcer("echo", "tcp://192.0.2.66:7000", connect=real_url, priority=1)
forger = nanopy.Socket("respondent", connect=real_url)
def forge():
    signer = Signer(open(wrong_key, "rb").read().strip(), b"f" * 8)
    answer = encode_answer("echo", "tcp://192.0.2.67:7000", priority=1)
    while True:
        msg = forger.recv_msg()
        msg.reply(signer.sign(KIND_ANSWER, answer, split_signed(msg.body).nonce))
threading.Thread(target=forge, daemon=True).start()

# rogue surveyors, beaconing on the LAN
rogues = [Discovery(beacon=True, interval=0.5), Discovery(beacon=True, interval=0.5, secret=wrong_key)]

# replays of the real beacons (each relayed as soon as heard) and byes for the real discovery service
sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sender.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
sent = 0
def send(data):
    global sent
    for target in targets:
        sender.sendto(data, (target, DEFAULT_BEACON_PORT))
        sent += 1
old = captured
def relay():
    while True:
        data, where = sniffer.recvfrom(2048)
        if where[0] == source[0] and len(data) > 4 and data[5] & 1 == 0:
            send(data)  # a replay, moments after the original
relayer = threading.Thread(target=relay, daemon=True)
relayer.start()
flipped = bytearray(captured)
flipped[5] |= 1  # the captured beacon turned into a bye
byes = [encode_beacon(replace(beacon, bye=True)), bytes(flipped)]
end = time.monotonic() + seconds
while time.monotonic() < end:
    for data in (*byes, old):
        send(data)
    time.sleep(0.01)
print("attacked", json.dumps({"sent": sent, "rogue_services": [r.services() for r in rogues],
                              "rogue_answers": [r.stats()["answers"] for r in rogues]}), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def key_files(tmp_path: Path) -> tuple[str, str]:
    paths = []
    for name in ("group.key", "wrong.key"):
        path = tmp_path / name
        path.write_bytes(os.urandom(32).hex().encode() + b"\n")
        path.chmod(0o600)
        paths.append(str(path))
    return paths[0], paths[1]


def json_after(proc: netns.Process, command: str, prefix: str) -> Any:
    proc.send(command)
    return json.loads(proc.expect(f"^{prefix} ", timeout=20).string[len(prefix) + 1:])


def attack(hosts: dict[str, netns.Host], secret: str, wrong: str) -> dict[str, Any]:
    """Start the group, let the hostile host attack for 4 s while the client resolves; the outcome."""
    services = [hosts[h].python(SIGNED_SERVICE, h, secret) for h in ("svc1", "svc2")]
    for proc in services:
        proc.expect("^ready", timeout=20)
    client = hosts["client"].python(SIGNED_CLIENT, secret)
    client.expect("^ready", timeout=20)
    real = sorted(client.expect(r"^\+ echo (\S+)", timeout=10).group(1) for _ in range(2))
    before = [json_after(s, "stats", "stats") for s in services]
    mark = len(client.seen)
    hostile = hosts["hostile"].python(HOSTILE, wrong, "4", f"{netns.SUBNET}.255",
                                      *(hosts[h].addr for h in ("svc1", "svc2")))
    hostile.expect("^captured", timeout=10)
    resolved = json_after(client, "resolve 10", "resolved")  # (2 s of the 4 s attack)
    outcome = json_after(hostile, "", "attacked")
    return {"real": real, "resolved": resolved, "hostile": outcome, "client": json_after(client, "stats", "stats"),
            "changes": [line for line in client.drain()[mark:] if line[:2] in ("+ ", "- ")],
            "before": before, "services": [json_after(s, "stats", "stats") for s in services]}


def test_a_signed_group_is_not_steered_by_a_hostile_host(hosts: dict[str, netns.Host],
                                                         key_files: tuple[str, str]) -> None:
    result = attack(hosts, *key_files)
    real = result["real"]
    assert real == [f"tcp://{hosts[h].addr}:7000" for h in ("svc1", "svc2")]
    assert set(result["resolved"]) <= set(real)  # every resolution: a real service
    client = result["client"]
    assert sorted(client["services"]["echo"]) == real  # nothing forged listed, nothing delisted
    assert result["changes"] == [], result["changes"]  # (no change at all during the attack)
    assert client["dropped"]["unsigned"] > 0 and client["dropped"]["bad_signature"] > 0  # the forged answers
    hostile = result["hostile"]
    assert hostile["rogue_services"] == [{}, {}] and hostile["rogue_answers"] == [0, 0]  # nothing disclosed
    for before, after in zip(result["before"], result["services"], strict=True):
        assert after["followed"] == before["followed"] and after["discoveries"] == 1
        assert after["answered"] > before["answered"]
        dropped = {k: after["beacons_dropped"][k] - before["beacons_dropped"][k] for k in after["beacons_dropped"]}
        assert dropped["replayed"] > 0  # the relayed real beacons
        assert dropped["bad_signature"] > 0  # the flipped bye, the wrong-key rogue's beacons
        assert dropped["unsigned"] > 0  # the version-1 bye, the open rogue's beacons
        assert after["surveys_dropped"] == before["surveys_dropped"]  # no rogue ever got to survey
    print(f"\nFIGURES signed group under attack: {hostile['sent']} hostile datagrams in 4 s; client dropped "
          f"{client['dropped']}; service 1 dropped beacons {result['services'][0]['beacons_dropped']}")


def test_an_open_group_is_steered_as_documented(hosts: dict[str, netns.Host], key_files: tuple[str, str]) -> None:
    result = attack(hosts, "-", key_files[1])
    forged = {"tcp://192.0.2.66:7000", "tcp://192.0.2.67:7000"}
    assert set(result["resolved"]) & forged  # a forged priority-1 answer takes resolutions
    assert any(result["hostile"]["rogue_services"])  # a rogue surveyor learns the services
    assert result["client"]["dropped"] == dict.fromkeys(result["client"]["dropped"], 0)
