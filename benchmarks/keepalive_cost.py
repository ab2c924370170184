"""What dead-peer detection costs an idle pipe: packets per minute (docs/partitions.md).

Two hosts in network namespaces (tests/netns.py; needs root), one idle PAIR pipe
between them per run, counted from the client host's TCP segment counters
(``/proc/net/snmp`` inside its namespace, so nothing else is counted):

    sudo .venv/bin/python benchmarks/keepalive_cost.py [--seconds 60]

Prints, per transport and ``dead_peer_timeout`` (the default, 2, and None), the
TCP segments sent plus received per minute on that one idle pipe.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import netns  # noqa: E402

PEER = """
import sys, nanopy
sock = nanopy.Socket("pair")
if sys.argv[3] != "default":
    sock.dead_peer_timeout = None if sys.argv[3] == "none" else float(sys.argv[3])
(sock.bind if sys.argv[1] == "bind" else sock.connect)(sys.argv[2])
sock.on_pipe_added(lambda p: print("added", flush=True))
print("ready", flush=True)
sys.stdin.read()
"""


def segments(host: netns.Host) -> int:
    text = host.run("cat", "/proc/net/snmp").stdout.splitlines()
    rows = [line.split() for line in text if line.startswith("Tcp:")]
    names, values = rows[0], rows[1]
    return int(values[names.index("InSegs")]) + int(values[names.index("OutSegs")])


def measure(scheme: str, timeout: str, seconds: float) -> float:
    with netns.lan("client", "server") as net:
        client, server = net.hosts["client"], net.hosts["server"]
        url = f"{scheme}://{server.addr}:5700"
        server.python(PEER, "bind", url, timeout).expect("ready", 30)
        proc = client.python(PEER, "connect", url, timeout)
        proc.expect("added", 30)
        time.sleep(1.0)  # the handshake's packets are not the idle cost
        before = segments(client)
        time.sleep(seconds)
        return (segments(client) - before) * 60.0 / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    reason = netns.skip_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    for scheme in ("tcp", "ws"):
        for timeout in ("default", "2", "none"):
            rate = measure(scheme, timeout, args.seconds)
            print(f"{scheme:4} dead_peer_timeout={timeout:8} {rate:6.1f} TCP segments/min on one idle pipe", flush=True)


if __name__ == "__main__":
    main()
