"""Run the whole service-discovery demo and verify it.

    python examples/service_discovery/run_demo.py [--beacon]

With ``--beacon`` nothing is told the discovery service's address: it beacons and
the services find it. The demo keeps those beacons on loopback (sent to and heard
at 127.255.255.255, on a free UDP port); real deployments leave that out and the
beacons go out by broadcast on the host's interfaces.

1. start the discovery service, three services (echo, upper, answer) and a client;
2. kill ``upper`` with SIGKILL while the client keeps calling;
3. watch discovery drop it, restart it (on a new port) and watch it come back;
4. stop the client and check its summary: every call answered and verified, the
   outage ridden through with retries only for ``upper``.

Exits 0 and prints ``DEMO OK`` when every check passed.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
T0 = time.monotonic()
LOOPBACK_BROADCAST = "127.255.255.255"  # beacons in this demo never leave the machine


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:5.2f}s] {text}", flush=True)


class Proc:
    """A child process whose stdout lines are read into a queue."""

    def __init__(self, label: str, script: str, *args: str) -> None:
        self.label = label
        self.lines: queue.Queue[str] = queue.Queue()
        self.popen = subprocess.Popen(
            [sys.executable, "-u", os.path.join(HERE, script), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, match: Callable[[str], bool], what: str, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"FAILED: {self.label} did not print {what} within {timeout}s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if match(line):
                return line

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> int:
    beacon = "--beacon" in sys.argv[1:]
    port = str(free_udp_port())
    procs: list[Proc] = []
    try:
        beacon_args = ["--beacon", "--beacon-port", port, "--beacon-to", LOOPBACK_BROADCAST] if beacon else []
        disco = Proc("discovery", "discovery.py", "--interval", "0.25", "--misses", "2", *beacon_args)
        procs.append(disco)
        _, survey_url, resolver_url = disco.expect(lambda text: text.startswith("ready "), "ready").split()
        say(f"discovery surveys at {survey_url}, resolver at {resolver_url}"
            + (f"; beacons on UDP port {port} (loopback)" if beacon else ""))
        # How a service finds the discovery service: its address, or nothing but the beacons.
        find = ["--beacon", "--beacon-port", port, "--beacon-bind", LOOPBACK_BROADCAST] if beacon \
            else ["--discovery", survey_url]

        services: dict[str, Proc] = {}
        addresses: dict[str, str] = {}
        for name in ("echo", "upper", "answer"):
            services[name] = Proc(name, "service.py", name, *find)
            procs.append(services[name])
        for name, proc in services.items():
            addresses[name] = proc.expect(lambda text: text.startswith("ready "), "ready").split()[2]
        for _ in services:
            line = disco.expect(lambda text: text.startswith("+ "), "a discovered service")
            say(f"discovered {line[2:]}")

        client = Proc("client", "client.py", "--resolver", resolver_url)
        procs.append(client)
        for name in services:
            client.expect(lambda text, n=name: text.startswith(f"using {n} "), f"a call to {name}")
        say("client is calling all three services")
        time.sleep(0.5)  # let it make a few rounds of calls

        old = addresses["upper"]
        services["upper"].kill()
        killed = time.monotonic()
        say(f"killed upper (pid {services['upper'].popen.pid}) at {old}")
        disco.expect(lambda text: text == f"- upper {old}", "upper being dropped")
        lost = time.monotonic()
        say(f"discovery dropped upper after {lost - killed:.2f}s")

        services["upper"] = Proc("upper", "service.py", "upper", *find)
        procs.append(services["upper"])
        new = services["upper"].expect(lambda text: text.startswith("ready "), "ready").split()[2]
        say(f"restarted upper at {new}")
        disco.expect(lambda text: text == f"+ upper {new}", "upper being found again")
        found = time.monotonic()
        say(f"discovery found upper again after {found - lost:.2f}s")
        client.expect(lambda text: text == f"using upper at {new}", "a call to the new upper")
        say("client switched to the new upper")
        time.sleep(0.5)

        assert client.popen.stdin is not None
        client.popen.stdin.close()
        summary = json.loads(client.expect(lambda text: text.startswith("SUMMARY "), "its summary")[8:])
        client.popen.wait(timeout=15)
    finally:
        for proc in procs:
            proc.kill()

    stats = summary["services"]
    checks = {
        "every service answered": all(stats[n]["ok"] > 0 for n in ("echo", "upper", "answer")),
        "every reply verified": all(s["bad"] == 0 for s in stats.values()),
        "upper was served by two instances": stats["upper"]["instances"] == 2,
        "only upper needed retries": stats["echo"]["retries"] == stats["answer"]["retries"] == 0,
        "the old address was dropped": old != new,
    }
    print()
    print("== service discovery demo: summary ==")
    for name in ("echo", "upper", "answer"):
        s = stats[name]
        print(f"  {name:<7} {s['ok']:4d} calls answered and verified, {s['retries']} retries, "
              f"{s['instances']} instance(s)")
    print(f"  upper outage: dropped {lost - killed:.2f}s after the kill, back {found - lost:.2f}s "
          f"after the restart ({old} -> {new})")
    for check, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAILED'}] {check}")
    if beacon:
        print("  (zero configuration: the services found the discovery service by its beacons)")
    if all(checks.values()):
        print("DEMO OK")
        return 0
    print("DEMO FAILED")
    return 1


if __name__ == "__main__":
    sys.exit(main())
