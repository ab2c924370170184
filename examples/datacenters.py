"""Stay in the local data centre, fail over to the remote one, come back.

Two REP services stand for the same service in two data centres. The client's
REQ socket connects to both: the local one at ``priority=1``, the remote one at
``priority=2``. Every request goes to the local service while it is up; when it
dies, requests move to the remote one (a request caught on the dying connection
is resent at once); when the local service is back, traffic returns to it.

    python examples/datacenters.py [--requests-per-phase N]

Prints where each request went, e.g.::

    [ 0.001s] phase 1: both up     request  1 -> local
    ...
    [ 0.160s] -- the local data centre goes down --
    [ 0.161s] phase 2: local down  request  1 -> remote
    ...
    [ 0.312s] -- the local data centre is back --
    [ 0.313s] phase 3: local back  request  1 -> remote
    [ 0.364s] phase 3: local back  request  2 -> local
"""

from __future__ import annotations

import argparse
import threading
import time

import nanopy
from nanopy.testing import wait_pipes


class Service:
    """A REP server in its own thread that answers with its data centre's name."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.sock = nanopy.Socket("rep", bind=url)
        self.url = self.sock.endpoints[0].url  # the real port after :0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while True:
                request = self.sock.recv()
                self.sock.send(self.name.encode() + b" answers " + request)
        except nanopy.Closed:
            pass

    def stop(self) -> None:
        self.sock.close(linger=0)
        self.thread.join()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests-per-phase", type=int, default=4)
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between requests")
    args = ap.parse_args(argv)

    local = Service("local", "tcp://127.0.0.1:0")
    remote = Service("remote", "tcp://127.0.0.1:0")
    client = nanopy.Socket("req", recv_timeout=5.0, reconnect_interval=0.1, reconnect_interval_max=0.5)
    client.connect(local.url, priority=1)
    client.connect(remote.url, priority=2)
    wait_pipes(client, 2)
    start = time.monotonic()
    where: dict[str, int] = {}

    def phase(title: str, until: str | None = None) -> None:
        """Send requests; with ``until``, keep going until one reaches that centre."""
        i = 0
        while True:
            i += 1
            reply = client.request(b"request %d" % i)
            dc = reply.split(b" ", 1)[0].decode()
            where[dc] = where.get(dc, 0) + 1
            print(f"[{time.monotonic() - start:6.3f}s] {title:<20} request {i:2d} -> {dc}")
            if dc == until:
                until = None
            if i >= args.requests_per_phase and until is None:
                return
            time.sleep(args.interval)  # pacing for the demo, not synchronisation

    try:
        phase("phase 1: both up")
        local.stop()
        print(f"[{time.monotonic() - start:6.3f}s] -- the local data centre goes down --")
        phase("phase 2: local down")
        local = Service("local", local.url)  # back at the same address
        print(f"[{time.monotonic() - start:6.3f}s] -- the local data centre is back --")
        # Until the client's dialer reconnects (within its back-off), requests
        # still go to the remote centre; then they return to the local one.
        phase("phase 3: local back", until="local")
    finally:
        client.close()
        local.stop()
        remote.stop()
    print(f"requests served: {where}")


if __name__ == "__main__":
    main()
