"""A PUSH/PULL fan-out over tcp, ipc and inproc, printing throughput.

One PUSH socket feeds three PULL workers (threads) through each transport in turn;
the demo checks that every message arrived exactly once.

    python examples/pipeline_demo.py [--messages N] [--size BYTES]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

import nanopy
from nanopy.testing import wait_pipes

WORKERS = 3


def run(url: str, messages: int, size: int) -> tuple[float, list[int]]:
    counts = [0] * WORKERS
    payload = b"x" * size
    with nanopy.Socket("push", send_buffer=4096) as push:
        ep = push.bind(url)
        pulls = [nanopy.Socket("pull", connect=ep.url, recv_timeout=10.0) for _ in range(WORKERS)]
        wait_pipes(push, WORKERS)
        def worker(i: int) -> None:
            sock = pulls[i]
            try:
                while True:
                    sock.recv()
                    counts[i] += 1
            except nanopy.Closed:
                pass  # closed by main once every message is in

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(WORKERS)]
        for t in threads:
            t.start()
        start = time.perf_counter()
        for _ in range(messages):
            push.send(payload)
        deadline = time.monotonic() + 30
        while sum(counts) < messages and time.monotonic() < deadline:
            time.sleep(0.001)
        elapsed = time.perf_counter() - start
        for p in pulls:
            p.close()
        for t in threads:
            t.join()
    return elapsed, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=64)
    args = parser.parse_args()
    urls = [
        "tcp://127.0.0.1:0",
        f"ipc://{tempfile.gettempdir()}/nanopy-demo.ipc",
        "inproc://nanopy-demo",
    ]
    print(f"PUSH -> {WORKERS} PULL workers, {args.messages:,} messages of {args.size} B\n")
    print(f"{'transport':<10} {'msgs/s':>12} {'MB/s':>8}   per worker")
    for url in urls:
        elapsed, counts = run(url, args.messages, args.size)
        assert sum(counts) == args.messages, f"lost messages: {counts}"
        rate = args.messages / elapsed
        print(f"{url.split(':')[0]:<10} {rate:>12,.0f} {rate * args.size / 1e6:>8.1f}   {counts}")
    print("\nevery message arrived exactly once")


if __name__ == "__main__":
    main()
