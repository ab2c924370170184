"""The platform layer's operations, each backend side by side (issue 35): what a call costs.

    .venv/bin/python benchmarks/platform_ops.py [--n 200000]

On Linux both backends run in one process (nanopy.platform.load), so the table compares
the linux backend (eventfd, epoll, ioctls) with the portable one (a socket pair,
``selectors``, ``ifaddr``) on the same machine at the same moment. Each figure is the
median over 5 timed loops, in microseconds per call. The direct read's wait is the
hot one (every blocked receive that reads its pipe directly pays it): a wake, the
wait that it ends, and the clear.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from collections.abc import Callable
from statistics import median
from typing import Any

from nanopy import platform


def _per_call(fn: Callable[[], object], n: int) -> float:
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - start) / n * 1e6)
    return median(runs)


def measure(backend: Any, n: int) -> dict[str, float]:
    a, b = socket.socketpair()
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
    client.setblocking(False)
    waker = backend.new_waker()
    wait = backend.ready_wait(b.fileno(), waker)
    try:
        def wake_wait_clear() -> None:
            waker.wake()
            wait.wait(None)
            waker.clear()

        peer.sendall(b"x" * 100)
        time.sleep(0.05)  # (the bytes arrive: unread_bytes counts them)
        return {
            "wake + wait + clear": _per_call(wake_wait_clear, n),
            "wait (nothing ready, timeout 0)": _per_call(lambda: wait.wait(0), n),
            "unread_bytes (100 waiting)": _per_call(lambda: backend.unread_bytes(client), n),
            "unacked_bytes": _per_call(lambda: backend.unacked_bytes(client), n),
            "ready_wait + close (per pipe)": _per_call(lambda: backend.ready_wait(b.fileno(), waker).close(),
                                                         max(1, n // 10)),
            "ipv4_interfaces (per beacon round)": _per_call(backend.ipv4_interfaces, max(1, n // 1000)),
        }
    finally:
        wait.close()
        waker.close()
        for sock in (a, b, client, peer):
            sock.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200_000, help="calls per timed loop of the cheap operations")
    args = p.parse_args(argv)
    names = list(platform.BACKENDS) if sys.platform.startswith("linux") else ["portable"]
    results = {name: measure(platform.load(name), args.n) for name in names}
    rows = list(next(iter(results.values())))
    print(f"{'us per call':36}" + "".join(f"{name:>12}" for name in names)
          + ("   portable / linux" if len(names) == 2 else ""))
    for row in rows:
        line = f"{row:36}" + "".join(f"{results[name][row]:12.3f}" for name in names)
        if len(names) == 2:
            line += f"   {results['portable'][row] / results['linux'][row]:8.2f}x"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
