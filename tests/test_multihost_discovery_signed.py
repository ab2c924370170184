"""Signed discovery against a hostile host on one LAN of namespaced hosts.

A client host runs ``Discovery(beacon=True)``, two service hosts a REP on
``tcp://0.0.0.0:7000`` and ``Announcer(..., beacon=True)``, all with the group's key
file (or, for the open group, none). A hostile host on the same segment first listens
to the real beacons, then, for a few seconds at once:

* answers the real discovery service's surveys with a priority-1 service of its own,
  unsigned (an ``Announcer`` without a secret) and signed with a wrong key but bound to
  the right survey (its nonce copied);
* replays every real beacon it hears (to the broadcast address and to each service
  host), and sends *bye* beacons for the real discovery service: version 1 with its
  instance id, and the captured signed beacon with the bye flag set;
* runs two rogue discovery services that beacon on the LAN (one open, one with a wrong key).

With the secret, that changes nothing (every resolution goes to the real services,
nothing is delisted, the rogues learn nothing) and every attack is counted by reason.
Without it, the forged answer takes the resolutions and the rogues learn the services,
as docs/security.md says.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import netns
import pytest

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(120)]

_reason = netns.skip_reason()
if _reason:
    pytestmark.append(pytest.mark.skip(reason=_reason))

CLIENT = """
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

SERVICE = """
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


@pytest.fixture(scope="module")
def net() -> Iterator[netns.Lan]:
    with netns.lan("client", "svc1", "svc2", "hostile") as lan:
        yield lan


@pytest.fixture
def hosts(net: netns.Lan) -> Iterator[dict[str, netns.Host]]:
    yield net.hosts
    for host in net.hosts.values():
        host.kill()


@pytest.fixture
def key_files(tmp_path: Path) -> tuple[str, str]:
    paths = []
    for name in ("group.key", "wrong.key"):
        path = tmp_path / name
        path.write_bytes(os.urandom(32).hex().encode() + b"\n")
        path.chmod(0o600)
        paths.append(str(path))
    return paths[0], paths[1]


def _json_after(proc: netns.Process, command: str, prefix: str) -> Any:
    proc.send(command)
    return json.loads(proc.expect(f"^{prefix} ", timeout=20).string[len(prefix) + 1:])


def attack(hosts: dict[str, netns.Host], secret: str, wrong: str) -> dict[str, Any]:
    """Start the group, let the hostile host attack for 4 s while the client resolves; the outcome."""
    services = [hosts[h].python(SERVICE, h, secret) for h in ("svc1", "svc2")]
    for proc in services:
        proc.expect("^ready", timeout=20)
    client = hosts["client"].python(CLIENT, secret)
    client.expect("^ready", timeout=20)
    real = sorted(client.expect(r"^\+ echo (\S+)", timeout=10).group(1) for _ in range(2))
    before = [_json_after(s, "stats", "stats") for s in services]
    mark = len(client.seen)
    hostile = hosts["hostile"].python(HOSTILE, wrong, "4", f"{netns.SUBNET}.255",
                                      *(hosts[h].addr for h in ("svc1", "svc2")))
    hostile.expect("^captured", timeout=10)
    resolved = _json_after(client, "resolve 10", "resolved")  # (2 s of the 4 s attack)
    outcome = _json_after(hostile, "", "attacked")
    return {"real": real, "resolved": resolved, "hostile": outcome, "client": _json_after(client, "stats", "stats"),
            "changes": [line for line in client.drain()[mark:] if line[:2] in ("+ ", "- ")],
            "before": before, "services": [_json_after(s, "stats", "stats") for s in services]}


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
