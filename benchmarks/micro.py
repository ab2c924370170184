"""Per-call costs of nanopy's send/recv fast paths, one thread, no profiler.

    .venv/bin/python benchmarks/micro.py [-n 50000]

Complements ``profiling.py``: sampling profilers inflate small functions and count
blocked time, so this times the pieces directly with ``thread_time`` (the CPU of
the calling thread only) while the engine thread is idle or busy elsewhere. pyzmq
is timed the same way as a reference. Figures are microseconds per call; read them
as relative costs (the machine is shared).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def timed(label: str, n: int, fn: Callable[[], None], rows: list[tuple[str, float, float]]) -> None:
    c0, w0 = time.thread_time(), time.perf_counter()
    fn()
    c1, w1 = time.thread_time(), time.perf_counter()
    rows.append((label, (c1 - c0) / n * 1e6, (w1 - w0) / n * 1e6))


def _calls(fn: Callable[[], object], n: int) -> Callable[[], None]:
    """A loop that calls ``fn`` ``n`` times, for :func:`timed`."""

    def run() -> None:
        call = fn
        for _ in range(n):
            call()

    return run


def wait_until(pred: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # a measuring tool, not a test: polling is fine here
        if time.monotonic() > deadline:
            raise TimeoutError("queue did not fill")
        time.sleep(0.005)


def nanopy_costs(n: int, rows: list[tuple[str, float, float]]) -> None:
    for transport in ("inproc", "tcp"):
        _nanopy_transport(transport, n, rows)


def _nanopy_transport(transport: str, n: int, rows: list[tuple[str, float, float]]) -> None:
    import nanopy
    from nanopy.testing import connect_pair, inproc_url

    msg = b"m" * 64
    url = inproc_url("micro") if transport == "inproc" else "tcp://127.0.0.1:0"
    push = nanopy.Socket("push", send_buffer=n + 10)
    pull = nanopy.Socket("pull", recv_buffer=2 * n + 10)
    connect_pair(pull, push, url)
    core = pull._core

    def fill() -> None:
        for _ in range(n):
            push.send(msg)
        wait_until(lambda: core._fq.queued() >= n)

    def sends() -> None:
        send = push.send
        for _ in range(n):
            send(msg)

    timed(f"nanopy {transport}: Socket.send (credit available)", n, sends, rows)
    wait_until(lambda: core._fq.queued() >= n)

    def recvs() -> None:
        recv = pull.recv
        for _ in range(n):
            recv()

    timed(f"nanopy {transport}: Socket.recv (message queued)", n, recvs, rows)
    if transport == "inproc":
        fill()

        def core_pops() -> None:
            pop = core.recv_body
            with pull._driver.lock:
                for _ in range(n):
                    pop()
                core.actions.clear()

        timed("  part: core.recv_body() (FairQueue.pop + PrioList)", n, core_pops, rows)

        def locks() -> None:
            lock = pull._driver.lock
            for _ in range(n):
                with lock:
                    pass

        timed("  part: with the socket lock: pass", n, locks, rows)

        for label, fn in (
            ("  part: SocketDriver._drain() (no actions, no waiters)", pull._driver._drain),
            ("  part: time.monotonic() (PipeDriver.transmit calls it per message)", time.monotonic),
        ):
            timed(label, n, _calls(fn, n), rows)

        from nanopy.core.wire import FrameDecoder, encode_frames

        frames = encode_frames([msg] * n)
        dec = FrameDecoder(False, 1 << 20)

        def decode() -> None:
            for i in range(0, len(frames), 256 * 1024):
                dec.feed(frames[i : i + 256 * 1024])

        timed("  part: FrameDecoder.feed per frame (256 KiB chunks)", n, decode, rows)

        def encode() -> None:
            batch = [msg] * 1024
            for _ in range(n // 1024):
                encode_frames(batch)

        timed("  part: encode_frames per frame (1024-frame batches)", n // 1024 * 1024, encode, rows)
    if transport == "tcp":
        # Send-side pieces, on a fresh pair (they consume credits behind the socket's back).
        push.close(linger=0)
        pull.close(linger=0)
        push = nanopy.Socket("push", send_buffer=n + 10)
        pull = nanopy.Socket("pull", recv_buffer=2 * n + 10)
        connect_pair(pull, push, "tcp://127.0.0.1:0")
        pcore = push._core

        def core_sends() -> None:
            send = pcore.send
            with push._driver.lock:
                for _ in range(n):
                    send(msg)
                pcore.actions.clear()

        timed("  part: Push0.send (LoadBalancer.take + action tuple)", n, core_sends, rows)
        driver = next(iter(push._pipes.values()))

        def transmits() -> None:
            transmit = driver.transmit
            for _ in range(n):
                transmit(msg)

        timed("  part: PipeDriver.transmit (busy pipe: outbox + writer kick)", n, transmits, rows)
        wait_until(lambda: pull._core._fq.queued() >= n)
    push.close(linger=0)
    pull.close(linger=0)


_SOCKETPAIR_CODE = """
import socket, sys, time
a, b = socket.socketpair()
msg = b"x" * 72
n = 5000
for size in map(int, sys.argv[1:]):
    c0 = time.thread_time()
    for _ in range(n):
        a.send(msg)
        b.recv(size)
    print(size, (time.thread_time() - c0) / n * 1e6)
"""


def syscall_costs(rows: list[tuple[str, float, float]]) -> None:
    """One small message through a socketpair, read with different recv sizes.

    A recv buffer of 128 KiB or more is above glibc's default mmap threshold: every
    call then pays mmap + page faults + mremap (shrink) + munmap -- until some larger
    mmapped block happens to be freed and glibc raises the threshold, so the cost
    depends on the process's history. Measured in a fresh interpreter.
    """
    import subprocess

    from nanopy.transports import _stream

    sizes = sorted({_stream.RECV_SIZE, 256 * 1024, 64 * 1024}, reverse=True)
    out = subprocess.run([sys.executable, "-c", _SOCKETPAIR_CODE, *map(str, sizes)],
                         capture_output=True, text=True, timeout=60, check=False).stdout
    for line in out.splitlines():
        size, cpu = line.split()
        note = " (nanopy's RECV_SIZE)" if int(size) == _stream.RECV_SIZE else ""
        rows.append((f"fresh process: socketpair send + recv({int(size) // 1024} KiB){note}", float(cpu), float("nan")))


def zmq_costs(n: int, rows: list[tuple[str, float, float]]) -> None:
    import zmq

    ctx = zmq.Context.instance()
    msg = b"m" * 64
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 0)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    pull.bind("inproc://micro")
    push.connect("inproc://micro")

    def sends() -> None:
        send = push.send
        for _ in range(n):
            send(msg)

    timed("pyzmq inproc: send", n, sends, rows)

    def recvs() -> None:
        recv = pull.recv
        for _ in range(n):
            recv()

    timed("pyzmq inproc: recv (message queued)", n, recvs, rows)
    push.close(0)
    pull.close(0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=50_000)
    args = p.parse_args()
    rows: list[tuple[str, float, float]] = []
    syscall_costs(rows)  # first: a large free() elsewhere raises glibc's mmap threshold
    nanopy_costs(args.n, rows)
    zmq_costs(args.n, rows)
    width = max(len(r[0]) for r in rows)
    print(f"{'call':<{width}}  {'CPU us':>7}  {'wall us':>7}")
    for label, cpu, wall in rows:
        wall_text = f"{'-':>7}" if math.isnan(wall) else f"{wall:7.3f}"
        print(f"{label:<{width}}  {cpu:7.3f}  {wall_text}")
    os._exit(0)


if __name__ == "__main__":
    main()
