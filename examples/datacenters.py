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

Here the local service dies as a process does: its kernel closes the connection,
and the client sees it at once. A data centre more often vanishes without a word
(a cut link, a host without power). ``--cut-links`` (Linux, root, iproute2, a
checkout of nanopy) shows that case with three hosts in network namespaces
(tests/netns.py): the link of the local host is cut silently, and the client's
``dead_peer_timeout`` (docs/partitions.md) finds the dead pipe and fails over;
after the heal, requests come back::

    sudo .venv/bin/python examples/datacenters.py --cut-links [--dead-peer-timeout 2]
"""

from __future__ import annotations

import argparse
import pathlib
import queue
import sys
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
    ap.add_argument("--cut-links", action="store_true",
                    help="hosts in network namespaces; the local one's link is cut silently (root)")
    ap.add_argument("--dead-peer-timeout", type=float, default=None,
                    help="the client's dead_peer_timeout with --cut-links (default: the library's)")
    ap.add_argument("--role", nargs="+", help=argparse.SUPPRESS)  # a process inside a namespace
    args = ap.parse_args(argv)
    if args.role:
        run_role(args.role, args.dead_peer_timeout)
        return
    if args.cut_links:
        cut_links(args.dead_peer_timeout)
        return

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


# -- --cut-links: the same data centres on hosts of their own ----------------------------
def run_role(role: list[str], timeout: float | None) -> None:
    """One process inside a namespace: ``service NAME URL`` or ``client LOCAL REMOTE``."""
    if role[0] == "service":
        Service(role[1], role[2])
        print("serving", flush=True)
        threading.Event().wait()
    client = nanopy.Socket("req")
    if timeout is not None:
        client.dead_peer_timeout = timeout
    client.connect(role[1], priority=1)
    client.connect(role[2], priority=2)
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        try:
            dc = client.request(b"request %d" % i, timeout=5.0).split(b" ", 1)[0].decode()
        except nanopy.Timeout:
            dc = "(no answer in 5 s)"
        print(f"{time.monotonic():.3f} request {i:3d} -> {dc}", flush=True)
        time.sleep(0.5)


def cut_links(timeout: float | None) -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    import netns  # a checkout's test helpers: namespaces, a bridge, silent cuts

    reason = netns.skip_reason()
    if reason:
        sys.exit(f"--cut-links cannot run here: {reason}")
    me = ["import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')", __file__]
    opts = [] if timeout is None else ["--dead-peer-timeout", str(timeout)]
    with netns.lan("client", "local", "remote") as net:
        urls = {}
        for name in ("local", "remote"):
            host = net.hosts[name]
            urls[name] = f"tcp://{host.addr}:5555"
            host.python(*me, "--role", "service", name, urls[name]).expect("serving", 30)
        proc = net.hosts["client"].python(*me, *opts, "--role", "client", urls["local"], urls["remote"])
        proc.expect("ready", 30)
        start = time.monotonic()

        def show(seconds: float) -> None:
            """Print the client's lines for ``seconds``, timed from the start."""
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0:
                try:
                    line = proc.lines.get(timeout=left)
                except queue.Empty:
                    return
                if line is None:
                    sys.exit("the client process ended")
                at, rest = line.split(" ", 1)
                print(f"[{float(at) - start:7.3f}s] {rest}", flush=True)

        def event(text: str) -> None:
            print(f"[{time.monotonic() - start:7.3f}s] -- {text} --", flush=True)

        show(3)
        net.cut(net.hosts["local"])
        event("the local data centre's link is cut (no RST, no FIN)")
        show(15)
        net.heal(net.hosts["local"])
        event("the link is back")
        show(8)


if __name__ == "__main__":
    main()
