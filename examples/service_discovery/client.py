"""A client: resolves services by name through the discovery service and calls them.

    python client.py --resolver tcp://127.0.0.1:5601 [--services echo,upper,answer]

Calls every service in turn until stdin closes, checking each reply. When a call
times out (the provider died) or the name is not registered (yet), it asks the
resolver again and retries, so it rides through a service being killed and
restarted elsewhere. Prints a line whenever a service's address changes or a call
is retried, and at the end ``SUMMARY {json}`` with per-service counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import nanopy

EXPECTED = {
    "echo": lambda body: body,
    "upper": lambda body: body.upper(),
    "answer": lambda body: b"The answer is 42",
}


class Client:
    def __init__(self, resolver: str, timeout: float) -> None:
        self.resolver = nanopy.Socket("req", connect=resolver)
        self.timeout = timeout
        self.sockets: dict[str, nanopy.Socket] = {}  # address -> REQ socket
        self.current: dict[str, str] = {}  # service -> address last used
        self.stats: dict[str, dict[str, int]] = {}

    def resolve(self, name: str) -> str | None:
        return self.resolver.request(f"resolve {name}".encode(), timeout=5.0).decode() or None

    def call(self, name: str, body: bytes, attempts: int = 200) -> bytes:
        stats = self.stats.setdefault(name, {"ok": 0, "retries": 0, "bad": 0, "instances": 0})
        for _ in range(attempts):
            address = self.resolve(name)
            if address is None:
                stats["retries"] += 1
                print(f"retry {name}: no live provider", flush=True)
                time.sleep(0.1)  # nothing registered yet: give discovery a moment
                continue
            if self.current.get(name) != address:
                self.current[name] = address
                stats["instances"] += 1
                print(f"using {name} at {address}", flush=True)
            sock = self.sockets.get(address)
            if sock is None:
                sock = self.sockets[address] = nanopy.Socket("req", connect=address)
            try:
                reply = sock.request(body, timeout=self.timeout)
            except nanopy.Timeout:
                stats["retries"] += 1
                print(f"retry {name}: no answer from {address}", flush=True)
                self.sockets.pop(address).close(linger=0)
                continue
            result = reply.partition(b":")[2]
            if result == EXPECTED[name](body):
                stats["ok"] += 1
            else:
                stats["bad"] += 1
            return result
        raise RuntimeError(f"{name}: no answer after {attempts} attempts")

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)
        self.resolver.close(linger=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--resolver", required=True)
    ap.add_argument("--services", default="echo,upper,answer")
    ap.add_argument("--timeout", type=float, default=0.3, help="seconds to wait for one reply")
    args = ap.parse_args()
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    client = Client(args.resolver, args.timeout)
    names = args.services.split(",")
    n = 0
    try:
        while not stop.is_set():
            name = names[n % len(names)]
            client.call(name, f"hello #{n} from the client".encode())
            n += 1
    finally:
        client.close()
    print("SUMMARY " + json.dumps({"calls": n, "services": client.stats}), flush=True)


if __name__ == "__main__":
    main()
