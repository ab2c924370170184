"""Silent partitions across real (namespaced) hosts: notice the vanished peer, fail
over by priority, come back, lose only what was already on the dead wire (issue 23,
docs/partitions.md).

Three hosts as in examples/datacenters.py: ``client`` prefers ``ny`` (priority 1)
over ``ldn`` (priority 2). ``Lan.cut(ny)`` drops ny's packets both ways with no RST
or FIN. One LAN runs every scenario at once (REQ/REP, PUSH/PULL, PUB/SUB, SURVEY and
an idle PAIR, each over tcp and ws) so the tier stays short; a second test checks the
library's default bound. Each test prints its figures (``pytest -s``).
"""

from __future__ import annotations

import json
import pathlib
import time
from typing import Any

import netns
import pytest
from conftest import needs_platform

# A busy pipe to a silently cut peer is found by the TCP user timeout: the portable
# platform backend has none (docs/architecture.md, "The platform layer").
pytestmark = [pytest.mark.multihost, needs_platform("user_timeout")]

_reason = netns.skip_reason()
if _reason:
    pytestmark.append(pytest.mark.skip(reason=_reason))

PEERS = (pathlib.Path(__file__).parent / "partition_peers.py").read_text()
SCHEMES = ("tcp", "ws")
TLS_SCHEMES = ("tls+tcp", "wss")  # REQ/REP only: the same kernel detection under TLS
RECONNECT_MAX = 5.0  # the library's reconnect_interval_max
RETURN_BOUND = RECONNECT_MAX + 2.0  # Done means: back to ny within reconnect_interval_max + 2 s


def stamp(line: str) -> float:
    return float(line.rsplit(" ", 1)[1])


def first(proc: netns.Process, prefix: str, after: float, timeout: float) -> float:
    """The time of the first line starting with ``prefix`` stamped at or after ``after``."""
    deadline = time.monotonic() + timeout
    while True:
        for line in proc.drain():
            if line.startswith(prefix) and stamp(line) >= after:
                return stamp(line)
        if time.monotonic() > deadline:
            raise AssertionError(f"{proc.name}: no {prefix!r} after {after:.3f} in {timeout} s; "
                                 f"last lines {proc.seen[-8:]}")
        time.sleep(0.05)


def stats(proc: netns.Process) -> dict[str, Any]:
    proc.send("stats")
    result: dict[str, Any] = json.loads(proc.expect(r"^stats ", timeout=10).string[6:])
    return next(iter(result.values()))


def urls(net: netns.Lan, port: int, scheme: str) -> str:
    ny, ldn = net.hosts["ny"], net.hosts["ldn"]
    return f"{scheme}://{ny.addr}:{port}@1,{scheme}://{ldn.addr}:{port}@2"


def tls_dir(net: netns.Lan, folder: pathlib.Path) -> dict[str, str]:
    """A test CA and one certificate for every host's address, as NP_TLS_DIR."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert(*(host.addr for host in net.hosts.values()))
    (folder / "ca.pem").write_bytes(ca.cert_pem.bytes())
    (folder / "server.pem").write_bytes(b"".join(b.bytes() for b in [cert.private_key_pem, *cert.cert_chain_pems]))
    return {"NP_TLS_DIR": str(folder)}


def start_servers(net: netns.Lan, timeout: str, env: dict[str, str] | None = None) -> dict[str, netns.Process]:
    client = net.hosts["client"]
    servers = {name: net.hosts[name].python(PEERS, "server", name, net.hosts[name].addr, timeout, client.addr,
                                            env=env)
               for name in ("ny", "ldn")}
    for proc in servers.values():
        proc.expect("^bound", timeout=30)
    return servers


def received(proc: netns.Process, kind: str, scheme: str) -> dict[int, float]:
    """Sequence numbers a server's PULL or SUB got over ``scheme``, with their times."""
    got = {}
    for line in proc.drain():
        words = line.split()
        if words[0] == kind and words[1] == scheme:
            got[int(words[2])] = float(words[3])
    return got


@pytest.mark.timeout(240)
def test_fail_over_and_back_with_dead_peer_timeout_2(tmp_path: pathlib.Path) -> None:
    figures: list[str] = []
    with netns.lan("client", "ny", "ldn") as net:
        client, ny = net.hosts["client"], net.hosts["ny"]
        env = tls_dir(net, tmp_path)
        servers = start_servers(net, "2", env)
        clients: dict[str, netns.Process] = {}
        for scheme, port in (("tls+tcp", 5603), ("wss", 5604)):  # REQ over TLS too
            clients[f"req-{scheme}"] = client.python(PEERS, "req", urls(net, port, scheme), "2", "5", env=env)
        for scheme in SCHEMES:
            port = 0 if scheme == "tcp" else 1
            clients[f"req-{scheme}"] = client.python(PEERS, "req", urls(net, 5601 + port, scheme), "2", "5")
            clients[f"push-{scheme}"] = client.python(PEERS, "push", urls(net, 5611 + port, scheme), "2")
            clients[f"surveyor-{scheme}"] = client.python(PEERS, "surveyor", urls(net, 5631 + port, scheme), "2")
            clients[f"idle-{scheme}"] = client.python(PEERS, "idle", f"{scheme}://{ny.addr}:{5641 + port}@1", "2")
        clients["pub"] = client.python(PEERS, "pub", f"tcp://{client.addr}:5621,ws://{client.addr}:5622", "2")
        for proc in clients.values():
            proc.expect("^ready", timeout=60)
        # Everything flows to ny (and both SUBs hear the PUB) before the cut.
        warm = time.monotonic()
        for scheme in SCHEMES:
            first(clients[f"req-{scheme}"], "answer ny", warm, 30)
            first(clients[f"surveyor-{scheme}"], "survey ldn+ny", warm, 30)
            first(clients[f"idle-{scheme}"], "added", 0, 30)
            first(servers["ny"], f"pull {scheme}", warm, 30)
            for name in ("ny", "ldn"):
                first(servers[name], f"sub {scheme}", warm, 30)

        for scheme in TLS_SCHEMES:
            first(clients[f"req-{scheme}"], "answer ny", warm, 30)

        cut = time.monotonic()
        net.cut(ny)
        for scheme in SCHEMES + TLS_SCHEMES:
            req = clients[f"req-{scheme}"]
            over = first(req, "answer ldn", cut, 15) - cut
            figures.append(f"REQ/{scheme} fail-over (dead_peer_timeout=2): {over:.2f} s")
            assert over < 4.0, f"REQ over {scheme} took {over:.2f} s to fail over"
        for scheme in SCHEMES:
            idle = first(clients[f"idle-{scheme}"], "removed", cut, 15) - cut
            figures.append(f"idle PAIR/{scheme} dead pipe noticed: {idle:.2f} s")
            assert idle < 2.0 + 0.5, f"idle pipe over {scheme} noticed after {idle:.2f} s"  # (+ timer slack)
            surveyor = clients[f"surveyor-{scheme}"]
            gone = first(surveyor, "removed", cut, 15) - cut
            figures.append(f"SURVEYOR/{scheme} dead pipe closed: {gone:.2f} s")
            assert gone < 4.0
        gone = first(clients["pub"], "removed", cut, 15) - cut
        figures.append(f"PUB dead pipe closed (first of tcp/ws): {gone:.2f} s")
        # Hold the cut for 30 s of PUSH traffic (the figure of Done means 2).
        time.sleep(max(0.0, cut + 30 - time.monotonic()))
        push_stats = {scheme: stats(clients[f"push-{scheme}"]) for scheme in SCHEMES}
        heal = time.monotonic()
        net.heal(ny)
        for scheme in TLS_SCHEMES:
            back = first(clients[f"req-{scheme}"], "answer ny", heal, 20) - heal
            figures.append(f"REQ/{scheme} back to ny after the heal: {back:.2f} s")
            assert back < RETURN_BOUND
        for scheme in SCHEMES:
            back = first(clients[f"req-{scheme}"], "answer ny", heal, 20) - heal
            figures.append(f"REQ/{scheme} back to ny after the heal: {back:.2f} s")
            assert back < RETURN_BOUND
            back = first(servers["ny"], f"pull {scheme}", heal, 20) - heal
            figures.append(f"PUSH/{scheme} back to ny after the heal: {back:.2f} s")
            assert back < RETURN_BOUND
            back = first(servers["ny"], f"sub {scheme}", heal, 20) - heal
            figures.append(f"SUB/{scheme} on ny hears the PUB again after the heal: {back:.2f} s")
            assert back < RETURN_BOUND
            back = first(clients[f"surveyor-{scheme}"], "survey ldn+ny", heal, 20) - heal
            figures.append(f"SURVEYOR/{scheme} hears ny again after the heal: {back:.2f} s")
            assert back < RETURN_BOUND + 1.0  # (+ one survey period)
        # Surveys kept getting ldn's answer through the cut; ldn's SUBs missed nothing.
        for scheme in SCHEMES:
            during = [line for line in clients[f"surveyor-{scheme}"].drain()
                      if line.startswith("survey") and cut + 4 < stamp(line) < heal]
            assert during and all("ldn" in line for line in during)
            got = received(servers["ldn"], "sub", scheme)
            cut_span = [seq for seq, at in got.items() if cut < at < heal]
            assert cut_span and max(cut_span) - min(cut_span) + 1 == len(cut_span), "ldn's SUB lost messages"

        # PUSH: stop, let everything land, count what was lost over the cut.
        settle = time.monotonic() + 3
        for scheme in SCHEMES:
            clients[f"push-{scheme}"].send("stop")
        sent = {scheme: int(clients[f"push-{scheme}"].expect("^stopped").string.split()[1]) for scheme in SCHEMES}
        time.sleep(max(0.0, settle - time.monotonic()))
        for scheme in SCHEMES:
            got = set(received(servers["ny"], "pull", scheme)) | set(received(servers["ldn"], "pull", scheme))
            lost = sorted(set(range(1, sent[scheme] + 1)) - got)
            st = push_stats[scheme]
            figures.append(f"PUSH/{scheme} 10 msg/s, 30 s cut: {len(lost)} of {sent[scheme]} lost "
                           f"(stats: dead_pipes={st['dead_pipes']}, lost_pipes_unacked={st['lost_pipes_unacked']}, "
                           f"lost_unacked_bytes={st['lost_unacked_bytes']})")
            assert len(lost) <= 30, f"PUSH over {scheme} lost {len(lost)}: {lost}"
            assert not lost or lost[-1] - lost[0] < 40, "the losses are not all from the moment of the cut"
            assert st["dead_pipes"] >= 1 and st["lost_pipes_unacked"] >= 1 and st["lost_unacked_bytes"] > 0

        # A crashed process (its kernel answers with RST/FIN): fail over at once, and back on restart.
        crash = time.monotonic()
        servers["ny"].kill()
        for scheme in SCHEMES:
            over = first(clients[f"req-{scheme}"], "answer ldn", crash, 15) - crash
            figures.append(f"REQ/{scheme} fail-over when ny's process dies: {over:.2f} s")
            assert over < 2.0
        restart = time.monotonic()
        ny_again = ny.python(PEERS, "server", "ny", ny.addr, "2", client.addr, env=env)
        ny_again.expect("^bound", timeout=30)
        for scheme in SCHEMES:
            back = first(clients[f"req-{scheme}"], "answer ny", restart, 20) - restart
            figures.append(f"REQ/{scheme} back to the restarted ny: {back:.2f} s (from the restart)")
            assert back < RETURN_BOUND + 3.0  # (+ the new process's start-up)
    print("\n" + "\n".join(figures))


@pytest.mark.timeout(120)
def test_library_default_fails_over_within_15_s() -> None:
    figures: list[str] = []
    with netns.lan("client", "ny", "ldn") as net:
        client, ny = net.hosts["client"], net.hosts["ny"]
        start_servers(net, "default")
        reqs = {scheme: client.python(PEERS, "req", urls(net, 5601 + (scheme == "ws"), scheme), "default", "5")
                for scheme in SCHEMES}
        idle = client.python(PEERS, "idle", f"tcp://{ny.addr}:5641@1", "default")
        for proc in [*reqs.values(), idle]:
            proc.expect("^ready", timeout=60)
        warm = time.monotonic()
        for proc in reqs.values():
            first(proc, "answer ny", warm, 30)
        first(idle, "added", 0, 30)
        cut = time.monotonic()
        net.cut(ny)
        for scheme, proc in reqs.items():
            over = first(proc, "answer ldn", cut, 25) - cut
            timeouts = [line for line in proc.drain() if line.startswith("timeout") and cut < stamp(line)]
            figures.append(f"REQ/{scheme} fail-over with the defaults: {over:.2f} s, "
                           f"{len(timeouts)} timed-out requests")
            assert over < 15.0 and len(timeouts) <= 3
        noticed = first(idle, "removed", cut, 25) - cut
        figures.append(f"idle PAIR/tcp dead pipe noticed with the defaults: {noticed:.2f} s")
        assert noticed < 10.0 + 0.5  # (+ timer slack)
        heal = time.monotonic()
        net.heal(ny)
        for scheme, proc in reqs.items():
            back = first(proc, "answer ny", heal, 20) - heal
            figures.append(f"REQ/{scheme} back to ny after the heal (defaults): {back:.2f} s")
            assert back < RETURN_BOUND
    print("\n" + "\n".join(figures))
