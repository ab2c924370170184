"""ws:// throughput and latency: nanopy against pynng (NNG), in one run (< 1 minute).

    .venv/bin/python benchmarks/ws.py [--rounds 2] [--duration 1.5]

* throughput: PUSH (dialer) -> PULL (listener) in two processes, 64 B and 1 KiB;
  the receiver counts messages over ``--duration`` seconds after a 0.3 s warm-up.
* latency: PAIR ping-pong of 64 B between two processes; round trip median and p99.

Libraries take turns within each round (the order alternates) so outside load hits
both alike; the table shows the median over rounds. Each side is a fresh process.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import time
from typing import Any

WARMUP = 0.3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- workers (each in its own process) ------------------------------------------------
def _open(lib: str, proto: str) -> Any:
    if lib == "nanopy":
        import nanopy

        return nanopy.Socket(proto, recv_max_size=0)
    import pynng

    return {"push": pynng.Push0, "pull": pynng.Pull0, "pair": pynng.Pair0}[proto]()


def _attach(lib: str, sock: Any, url: str, listen: bool) -> None:
    if lib == "nanopy":
        (sock.bind if listen else sock.connect)(url)
    elif listen:
        sock.listen(url)
    else:
        sock.dial(url, block=False)


def receiver(lib: str, url: str, duration: float, ready: Any, stop: Any, out: Any) -> None:
    sock = _open(lib, "pull")
    _attach(lib, sock, url, listen=True)
    ready.set()
    recv = sock.recv
    recv()
    start = time.perf_counter()
    n = 0
    while time.perf_counter() - start < WARMUP:
        recv()
    t0, n = time.perf_counter(), 0
    end = t0 + duration
    while True:
        for _ in range(256):
            recv()
        n += 256
        if time.perf_counter() >= end:
            break
    out.put(n / (time.perf_counter() - t0))
    stop.set()
    sock.close()


def sender(lib: str, url: str, size: int, stop: Any) -> None:
    sock = _open(lib, "push")
    _attach(lib, sock, url, listen=False)
    payload = b"x" * size
    send = sock.send
    while not stop.is_set():
        for _ in range(512):
            send(payload)
    sock.close()


def echo(lib: str, url: str, ready: Any, stop: Any) -> None:
    sock = _open(lib, "pair")
    if lib == "pynng":
        sock.recv_timeout = 200
    _attach(lib, sock, url, listen=True)
    ready.set()
    while not stop.is_set():
        try:
            data = sock.recv(timeout=0.2) if lib == "nanopy" else sock.recv()
        except Exception:  # noqa: BLE001 - a timeout (each library its own): look at the stop flag again
            continue
        sock.send(data)
    sock.close()


def pinger(lib: str, url: str, duration: float, out: Any) -> None:
    sock = _open(lib, "pair")
    _attach(lib, sock, url, listen=False)
    payload = b"p" * 64
    sock.send(payload)
    sock.recv()
    rtts = []
    end = time.perf_counter() + WARMUP + duration
    warm = time.perf_counter() + WARMUP
    while True:
        t = time.perf_counter_ns()
        sock.send(payload)
        sock.recv()
        now = time.perf_counter()
        if now >= warm:
            rtts.append(time.perf_counter_ns() - t)
        if now >= end:
            break
    rtts.sort()
    out.put((rtts[len(rtts) // 2] / 1000, rtts[int(len(rtts) * 0.99)] / 1000))
    sock.close()


# -- driver ------------------------------------------------------------------------------------
def run_throughput(ctx: Any, lib: str, size: int, duration: float) -> float:
    url = f"ws://127.0.0.1:{free_port()}/bench"
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    rx = ctx.Process(target=receiver, args=(lib, url, duration, ready, stop, out))
    rx.start()
    ready.wait(10)
    tx = ctx.Process(target=sender, args=(lib, url, size, stop))
    tx.start()
    try:
        return out.get(timeout=duration + 20)
    finally:
        for p in (rx, tx):
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


def run_latency(ctx: Any, lib: str, duration: float) -> tuple[float, float]:
    url = f"ws://127.0.0.1:{free_port()}/bench"
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    srv = ctx.Process(target=echo, args=(lib, url, ready, stop))
    srv.start()
    ready.wait(10)
    cli = ctx.Process(target=pinger, args=(lib, url, duration, out))
    cli.start()
    try:
        return out.get(timeout=duration + 20)
    finally:
        stop.set()
        for p in (cli, srv):
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=1.5)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    libs = ["nanopy", "pynng"]
    thr: dict[tuple[str, int], list[float]] = {}
    lat: dict[str, list[tuple[float, float]]] = {}
    for rnd in range(args.rounds):
        order = libs if rnd % 2 == 0 else libs[::-1]
        for size in (64, 1024):
            for lib in order:
                thr.setdefault((lib, size), []).append(run_throughput(ctx, lib, size, args.duration))
        for lib in order:
            lat.setdefault(lib, []).append(run_latency(ctx, lib, args.duration))
    print(f"ws:// loopback, {args.rounds} rounds of {args.duration:g} s, median over rounds")
    print(f"{'':8} {'64 B msg/s':>12} {'1 KiB msg/s':>12} {'RTT p50 us':>11} {'RTT p99 us':>11}")
    for lib in libs:
        p50 = statistics.median(x[0] for x in lat[lib])
        p99 = statistics.median(x[1] for x in lat[lib])
        print(
            f"{lib:8} {statistics.median(thr[(lib, 64)]):12,.0f} {statistics.median(thr[(lib, 1024)]):12,.0f}"
            f" {p50:11.0f} {p99:11.0f}"
        )
    n64 = statistics.median(thr[("nanopy", 64)]) / statistics.median(thr[("pynng", 64)])
    n1k = statistics.median(thr[("nanopy", 1024)]) / statistics.median(thr[("pynng", 1024)])
    rtt = statistics.median(x[0] for x in lat["nanopy"]) / statistics.median(x[0] for x in lat["pynng"])
    print(f"nanopy/pynng: throughput x{n64:.2f} (64 B), x{n1k:.2f} (1 KiB); round trip x{rtt:.2f}")


if __name__ == "__main__":
    main()
