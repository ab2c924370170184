"""What a bind's gate costs under a flood of refused connections (issue 34).

    .venv/bin/python benchmarks/gate_flood.py [--flood 10000] [--n 2000]

Part 1, the flood: per mode (``deny=`` by address, refused by ``authorize=``) ``--flood``
connections from 127.0.0.2 to a REP on tcp, opened one after another by a child
process as fast as the server closes them, while an admitted REQ (127.0.0.1) of this
process keeps round-tripping. Reported: the refusal rate and elapsed time, the
admitted round trip's p50/p99 during the flood, and the server process's RSS and open
descriptors before and after.

Part 2, CPU per connection: ``--n`` connections per cell, no admitted client; the
server process's ``time.process_time()`` from the first connection until the last is
counted (refused: ``auth_failures``; admitted: the pipe came and went), divided by n.
Cells: tcp and tls+tcp, each with no gate / denied by address / refused by authorize /
admitted by authorize. The flooder's own CPU (for TLS, its side of the handshake) is
in the child, not counted.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from statistics import quantiles
from typing import Any

import nanopy

REFUSED_HOST = "127.0.0.2"
REQ_HEADER = b"\x00SP\x00\x00\x30\x00\x00"  # a REQ's SP header: the REP server's peer


# -- the flooder (a child process) ---------------------------------------------------------
def flooder(port: int, n: int, scheme: str, until: str) -> None:
    """Open ``n`` connections one after another; read the server's SP header
    (``until == "header"``: an admitted peer, then leave) or up to its close."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    for _ in range(n):
        raw = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(REFUSED_HOST, 0))
        s: socket.socket = raw
        try:
            if scheme == "tls+tcp":
                s = ctx.wrap_socket(raw)  # a refused address: the access_denied alert raises here
            s.sendall(REQ_HEADER)
            got = b""
            while True:
                chunk = s.recv(4096)
                got += chunk
                if not chunk or (until == "header" and len(got) >= 8):
                    break
        except (ssl.SSLError, OSError):
            pass
        finally:
            s.close()


def spawn_flooder(port: int, n: int, scheme: str, until: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--flooder", str(port), str(n), scheme, until])


# -- the server side -------------------------------------------------------------------------
def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def tls_server_context() -> ssl.SSLContext:
    import trustme  # (the test suite's dependency; a throw-away certificate)

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("127.0.0.1", "localhost").configure_cert(ctx)
    return ctx


def admitted(peer: nanopy.Peer) -> bool:
    return peer.address.startswith("127.0.0.1:")


def gate_options(mode: str) -> dict[str, Any]:
    if mode == "deny":
        return {"deny": [REFUSED_HOST]}
    if mode == "authorize":
        return {"authorize": admitted}
    if mode == "admit":
        return {"authorize": lambda peer: True}
    return {}


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.001)


def flood(mode: str, n: int) -> dict[str, float]:
    """Part 1: ``n`` refused connections while an admitted REQ round-trips."""
    with nanopy.Socket("rep", recv_timeout=30) as rep, nanopy.Socket("req", recv_timeout=30) as req:
        ep = rep.bind("tcp://127.0.0.1:0", **gate_options(mode))
        req.connect(ep.url)

        def serve() -> None:
            try:
                while True:
                    msg = rep.recv_msg()
                    msg.reply(msg.body)
            except nanopy.Closed:
                pass

        threading.Thread(target=serve, daemon=True).start()
        for _ in range(200):  # warm up: the pipe, the allocator, the thread pool
            req.send(b"warm")
            req.recv()
        rss0, fds0 = rss_kib(), open_fds()
        port = int(ep.url.rpartition(":")[2])
        started = time.monotonic()
        child = spawn_flooder(port, n, "tcp", "eof")
        rtts: list[float] = []
        while child.poll() is None:
            t = time.perf_counter()
            req.send(b"ping")
            req.recv()
            rtts.append(time.perf_counter() - t)
        wait_for(lambda: rep.stats().auth_failures >= n, 60, "every refusal counted")
        elapsed = time.monotonic() - started
        rss1, fds1 = rss_kib(), open_fds()
        cuts = quantiles(rtts, n=100) if len(rtts) > 1 else [rtts[0]] * 99
        return {"elapsed_s": elapsed, "rate_per_s": n / elapsed, "round_trips": len(rtts),
                "rtt_p50_us": cuts[49] * 1e6, "rtt_p99_us": cuts[98] * 1e6,
                "rss_before_kib": rss0, "rss_after_kib": rss1, "fds_before": fds0, "fds_after": fds1,
                "auth_failures": rep.stats().auth_failures}


def cpu_per_connection(scheme: str, mode: str, n: int, server_ctx: ssl.SSLContext | None) -> float:
    """Part 2: the server's CPU microseconds per connection of one cell."""
    opts: dict[str, Any] = gate_options(mode)
    if server_ctx is not None:
        opts["ssl_context"] = server_ctx
    with nanopy.Socket("rep") as rep:
        ep = rep.bind(f"{scheme}://127.0.0.1:0", **opts)
        port = int(ep.url.rpartition(":")[2])
        refused = mode in ("deny", "authorize")
        cpu = time.process_time()
        child = spawn_flooder(port, n, scheme, "eof" if refused else "header")
        if refused:
            wait_for(lambda: rep.stats().auth_failures >= n, 300, "every refusal counted")
        else:
            wait_for(lambda: rep.stats().disconnects >= n, 300, "every pipe come and gone")
        used = time.process_time() - cpu
        child.wait(60)
        return used / n * 1e6


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--flooder":
        flooder(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--flood", type=int, default=10000, help="refused connections per mode in part 1")
    ap.add_argument("--n", type=int, default=2000, help="connections per cell in part 2")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} CPUs")
    print(f"\nPart 1: {args.flood} refused connections per mode (tcp, REP), an admitted REQ round-tripping")
    for mode in ("deny", "authorize"):
        r = flood(mode, args.flood)
        print(f"  {mode:9}: {r['elapsed_s']:.1f} s, {r['rate_per_s']:.0f} refusals/s, "
              f"{r['round_trips']} admitted round trips, p50 {r['rtt_p50_us']:.0f} us, p99 {r['rtt_p99_us']:.0f} us, "
              f"RSS {r['rss_before_kib']} -> {r['rss_after_kib']} KiB, fds {r['fds_before']} -> {r['fds_after']}, "
              f"auth_failures {r['auth_failures']}")
    print(f"\nPart 2: server CPU per connection (us, {args.n} connections per cell)")
    ctx = tls_server_context()
    modes = [("none", "no gate"), ("deny", "denied by address"), ("authorize", "refused by authorize"),
             ("admit", "admitted by authorize")]
    print(f"  {'':24}{'tcp':>10}{'tls+tcp':>10}")
    for mode, label in modes:
        tcp = cpu_per_connection("tcp", mode, args.n, None)
        tls = cpu_per_connection("tls+tcp", mode, args.n, ctx)
        print(f"  {label:24}{tcp:10.0f}{tls:10.0f}")
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
