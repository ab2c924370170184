"""PAIR ping-pong latency between two processes (one-way = round trip / 2).

Parent side: :func:`measure` runs one (system, api, transport) cell once.
Worker side (``python latency.py '<json>'``): roles ``echo`` (binds, sends every
message straight back) and ``ping`` (connects, times round trips).

Method: the pinger warms up for ``warmup`` seconds (its first round trip also
waits for the connection), then times round trips with ``perf_counter_ns`` for
``duration`` seconds or ``max_rtts`` round trips, whichever ends first. It reports
mean, p50 and p99; the echo side samples its CPU every 20 ms so the parent can
add it to the pinger's CPU over the same window. Both ends use the same api
(sync or trio).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (
    END,
    Commands,
    Sampler,
    emit,
    interpolate,
    loadavg,
    make_url,
    open_socket,
    percentile,
    remove_ipc,
    run_workers,
    start_watchdog,
    worker_args,
)


def _open_window(duration: float) -> tuple[float, float, int]:
    """Start of the timed window: (monotonic, CPU time, perf_counter_ns deadline)."""
    t0, c0 = time.monotonic(), time.process_time()
    return t0, c0, time.perf_counter_ns() + int(duration * 1e9)


def _ping_result(rtts: list[int], t0: float, t1: float, cpu: float, end_ok: bool) -> dict[str, Any]:
    return {"rtts": rtts, "t0": t0, "t1": t1, "cpu": cpu, "end_ok": end_ok}


def ping_sync(send: Callable[[bytes], Any], recv: Callable[[], bytes], msg: bytes, warmup: float, duration: float, max_rtts: int) -> dict[str, Any]:
    send(msg)
    recv()
    end_warm = time.monotonic() + warmup
    while time.monotonic() < end_warm:
        send(msg)
        recv()
    pc = time.perf_counter_ns
    rtts: list[int] = []
    append = rtts.append
    t0, c0, stop = _open_window(duration)
    for _ in range(max_rtts):
        a = pc()
        send(msg)
        recv()
        b = pc()
        append(b - a)
        if b >= stop:
            break
    t1, c1 = time.monotonic(), time.process_time()
    send(END)
    return _ping_result(rtts, t0, t1, c1 - c0, recv() == END)


async def ping_trio(asend: Any, arecv: Any, msg: bytes, warmup: float, duration: float, max_rtts: int) -> dict[str, Any]:
    await asend(msg)
    await arecv()
    end_warm = time.monotonic() + warmup
    while time.monotonic() < end_warm:
        await asend(msg)
        await arecv()
    pc = time.perf_counter_ns
    rtts: list[int] = []
    append = rtts.append
    t0, c0, stop = _open_window(duration)
    for _ in range(max_rtts):
        a = pc()
        await asend(msg)
        await arecv()
        b = pc()
        append(b - a)
        if b >= stop:
            break
    t1, c1 = time.monotonic(), time.process_time()
    await asend(END)
    return _ping_result(rtts, t0, t1, c1 - c0, await arecv() == END)


def echo_sync(send: Callable[[bytes], Any], recv: Callable[[], bytes], sampler: Sampler) -> int:
    monotonic = time.monotonic
    n = 0
    while True:
        m = recv()
        send(m)
        if m == END:
            break
        n += 1
        sampler.maybe(monotonic(), n)
    sampler.force(n)
    return n


async def echo_trio(asend: Any, arecv: Any, sampler: Sampler) -> int:
    monotonic = time.monotonic
    n = 0
    while True:
        m = await arecv()
        await asend(m)
        if m == END:
            break
        n += 1
        sampler.maybe(monotonic(), n)
    sampler.force(n)
    return n


def worker_main() -> None:
    args = worker_args()
    start_watchdog(args["timeout"])
    role, system, api = args["role"], args["system"], args["api"]
    try:
        if role == "echo":
            cmds = Commands()
            sock = open_socket(system, "pair", args["url"], bind=True)
            emit("ready", url=sock.url)
            sampler = Sampler()
            if api == "sync":
                n = echo_sync(sock.send, sock.recv, sampler)
            else:
                import trio

                n = trio.run(echo_trio, sock.asend, sock.arecv, sampler)
            emit("echoed", n=n, samples=sampler.samples)
            cmds.exit.wait(args["timeout"])  # keep the END reply alive until it is read
            sock.close()
        elif role == "ping":
            sock = open_socket(system, "pair", args["url"], bind=False)
            msg = b"p" * args["size"]
            params = (msg, args["warmup"], args["duration"], args["max_rtts"])
            if api == "sync":
                res = ping_sync(sock.send, sock.recv, *params)
            else:
                import trio

                res = trio.run(ping_trio, sock.asend, sock.arecv, *params)
            emit("done", **res)
            sock.close()
        else:
            raise ValueError(role)
    except BaseException as exc:  # noqa: BLE001 -- reported to the parent, which fails the run
        emit("error", message=f"{type(exc).__name__}: {exc}")
        sys.stdout.flush()
        os._exit(2)
    sys.stdout.flush()
    os._exit(0)


def measure(system: str, api: str, transport: str, size: int, warmup: float, duration: float, max_rtts: int = 200_000) -> dict[str, Any]:
    """Run one ping-pong measurement; returns a result record (raises WorkerError)."""
    url = make_url(transport, "lat")
    args = {"system": system, "api": api, "size": size, "warmup": warmup, "duration": duration,
            "max_rtts": max_rtts, "timeout": warmup + duration + 20.0}
    load = loadavg()
    try:
        workers = run_workers(
            ("latency.py", "echo", {**args, "url": url}),
            ("latency.py", "ping", args),
            {("ping", "done"): ("echo", "exit")},
            args["timeout"],
        )
    finally:
        remove_ipc(url)
    done = workers["ping"].event("done")
    echoed = workers["echo"].event("echoed")
    if done is None or echoed is None:
        raise RuntimeError("missing events from the ping-pong workers")
    rtts = sorted(done["rtts"])
    n = len(rtts)
    mean_rtt = sum(rtts) / n / 1000  # µs
    samples = echoed["samples"]
    cpu = done["cpu"] + interpolate(samples, done["t1"], 1) - interpolate(samples, done["t0"], 1)
    return {
        "test": "latency",
        "system": system,
        "api": api,
        "transport": transport,
        "mode": "proc",
        "size": size,
        "one_way_us": mean_rtt / 2,
        "rtt_mean_us": mean_rtt,
        "one_way_p50_us": percentile(rtts, 50) / 2000,
        "one_way_p99_us": percentile(rtts, 99) / 2000,
        "rtt_p50_us": percentile(rtts, 50) / 1000,
        "rtt_p99_us": percentile(rtts, 99) / 1000,
        "cpu_us_per_rtt": cpu / n * 1e6,
        "rtts": n,
        "complete": bool(done["end_ok"]),
        "loadavg": load,
    }


if __name__ == "__main__":
    worker_main()
