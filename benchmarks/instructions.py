"""Instructions per round trip, counted by callgrind: a speed check that load cannot blur.

    .venv/bin/python benchmarks/instructions.py [--transports tcp,ipc] [--repeat 2] \\
        [--side before=../nanopy-before] [--side portable=.:NANOPY_BACKEND=portable]
    .venv/bin/python benchmarks/instructions.py --scenario batch [--transports tcp] ...

Wall-clock ratios on a shared 2-core machine swing by 10-50 % between runs (see
``before_after.py``'s noise column), which hides a change of a few per cent.
``valgrind --tool=callgrind`` counts the instructions a process executes instead,
whatever else the machine does. Each side runs a PAIR ping-pong of 64 B messages
(an echo thread and the caller in one process, both blocking ``recv``/``send``, so
the direct read and its wake are on the path) twice, with ``--small`` and ``--large``
round trips; the difference divided by the extra round trips is the cost of one round
trip with start-up and shutdown cancelled out. Threads under valgrind run one at a
time, so how often a receiver finds its message already there (and skips the wait)
varies: repeat a side to see that spread (a few per cent) before reading a change.

``--scenario pub`` counts per message too, in the seed-004 shape (benchmarks/burst.py):
a PUB sending 1 KiB messages one ``send`` at a time to one subscriber (lossless:
``overflow="block"``), a receiving thread taking them with ``recv``; the send column
is the publisher's cost per message. ``--small``/``--large`` are units of 256 messages.

``--scenario batch`` counts instructions per *message* instead: PUSH -> PULL, the
caller sending ``send_batch`` of 256 messages of 64 B, a receiving thread taking them
with ``recv_batch(256)``; ``--small``/``--large`` are batches. Each thread is counted
apart (``--separate-threads``): the caller's thread is the send side, the thread
started last the receive side, the ones between the engine. ``--pyzmq`` adds a row of
pyzmq's plain API on the same shape (one ``send``/``recv`` per message; libzmq's
I/O threads in the engine column): the batch goal of issue 36 is a rate twice pyzmq's.

Needs valgrind (Debian's package). Each count takes 10-30 s.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from statistics import median
from typing import Any

COLLECTED = re.compile(r"Collected : (\d+)")


def _url(transport: str) -> str:
    """A loopback address of ``transport`` for the workloads."""
    return {"tcp": "tcp://127.0.0.1:0", "ipc": f"ipc:///tmp/nanopy-instructions-{os.getpid()}.sock",
            "inproc": "inproc://instructions"}[transport]


def _alongside(other: Callable[[], None], mine: Callable[[], None], *sockets: Any) -> None:
    """Run ``other`` in a thread while this thread runs ``mine``; then close ``sockets``."""
    thread = threading.Thread(target=other)
    thread.start()
    mine()
    thread.join()
    for sock in sockets:
        sock.close()


def ping_pong(transport: str, n: int) -> None:
    """The measured workload: ``n`` round trips of 64 B between two PAIR sockets."""
    import nanopy

    url = _url(transport)
    echo, caller = nanopy.Socket("pair"), nanopy.Socket("pair")
    caller.connect(echo.bind(url).url)
    payload = b"x" * 64

    def serve() -> None:
        for _ in range(n):
            echo.send(echo.recv())

    def call() -> None:
        for _ in range(n):
            caller.send(payload)
            caller.recv()

    _alongside(serve, call, caller, echo)


BATCH = 256  # messages per send_batch / most per recv_batch (as benchmarks/throughput.py)


def batches(transport: str, n: int) -> None:
    """The ``batch`` workload: ``n`` send_batch calls of ``BATCH`` 64 B messages,
    PUSH -> PULL, received by a thread with ``recv_batch(BATCH)``."""
    import nanopy

    url = _url(transport)
    pull, push = nanopy.Socket("pull"), nanopy.Socket("push")
    push.connect(pull.bind(url).url)
    batch = [b"x" * 64] * BATCH

    def receive() -> None:
        got = 0
        while got < n * BATCH:
            got += len(pull.recv_batch(BATCH))

    def send() -> None:
        for _ in range(n):
            push.send_batch(batch)

    _alongside(receive, send, push, pull)


PUB_SIZE = 1024  # the seed-004 shape's message (benchmarks/burst.py)
PUB_BURST = 256  # messages per unit of the ``pub`` scenario's --small/--large


def pub_sub(transport: str, n: int) -> None:
    """The ``pub`` workload: ``n`` * ``PUB_BURST`` plain ``send`` calls of 1 KiB on a PUB
    with one subscriber, lossless (``overflow="block"`` at both ends, as
    benchmarks/burst.py), taken by a receiving thread with ``recv``."""
    import nanopy

    url = _url(transport)
    sub = nanopy.Socket("sub", overflow="block")
    pub = nanopy.Socket("pub", overflow="block")
    sub.subscribe(b"")
    pub.connect(sub.bind(url).url)
    while len(pub.pipes) < 1:  # (a PUB drops what it sends before its subscriber joins)
        threading.Event().wait(0.001)
    pub.send(b"-")  # the subscription is there once the subscriber has this one
    sub.recv()
    _one_by_one(sub, pub, b"p" * PUB_SIZE, n * PUB_BURST)


def _one_by_one(receiver: Any, sender: Any, msg: bytes, total: int) -> None:
    """``sender`` sends ``msg`` ``total`` times with plain ``send`` while a thread
    takes them from ``receiver`` with plain ``recv``; then both are closed."""

    def receive() -> None:
        for _ in range(total):
            receiver.recv()

    def send() -> None:
        for _ in range(total):
            sender.send(msg)

    _alongside(receive, send, sender, receiver)


def zmq_plain(transport: str, n: int) -> None:
    """The batch workload's shape on pyzmq's plain API (its ``--pyzmq`` row): the
    same messages, one ``send``/``recv`` each, PUSH -> PULL over tcp or ipc."""
    import zmq

    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    if transport == "ipc":
        url = f"ipc:///tmp/nanopy-instructions-zmq-{os.getpid()}.sock"
        pull.bind(url)
    else:
        url = f"tcp://127.0.0.1:{pull.bind_to_random_port('tcp://127.0.0.1')}"
    push.connect(url)
    _one_by_one(pull, push, b"x" * 64, n * BATCH)
    ctx.term()
    if transport == "ipc":
        os.unlink(url[len("ipc://"):])  # (libzmq leaves its socket file)


def callgrind_threads(args: list[str], cwd: str, env: dict[str, str]) -> list[int]:
    """The instructions of each thread (in the order they started) while ``args`` runs."""
    with tempfile.TemporaryDirectory() as out:
        cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes",
               f"--callgrind-out-file={out}/cg", *args]
        subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=True)
        totals = []
        for name in sorted((f for f in os.listdir(out) if "-" in f), key=lambda f: int(f.rsplit("-", 1)[-1])):
            with open(os.path.join(out, name)) as f:
                found = re.search(r"^totals: (\d+)", f.read(), re.M)
            totals.append(int(found.group(1)) if found else 0)
        return totals


def callgrind_total(args: list[str], cwd: str | None = None, env: dict[str, str] | None = None) -> int:
    """The instructions callgrind counts while ``args`` (a command) runs."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *args]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=True)
    match = COLLECTED.search(done.stderr)
    if match is None:
        raise RuntimeError(f"no callgrind total in: {done.stderr[-500:]}")
    return int(match.group(1))


def count(checkout: str, env: dict[str, str], transport: str, n: int) -> int:
    """Instructions of one run of :func:`ping_pong` in ``checkout`` (its own venv)."""
    python = os.path.join(checkout, ".venv", "bin", "python")
    args = [python, os.path.abspath(__file__), "--workload", transport, str(n)]
    return callgrind_total(args, cwd=checkout, env={**os.environ, **env})


def count_batch(checkout: str, env: dict[str, str], transport: str, n: int, scenario: str = "batch") -> list[int]:
    """Instructions of each thread in one run of :func:`batches` (or ``scenario``) in ``checkout``."""
    python = os.path.join(checkout, ".venv", "bin", "python")
    args = [python, os.path.abspath(__file__), "--workload", transport, str(n), "--scenario", scenario]
    return callgrind_threads(args, checkout, {**os.environ, **env})


def report_batch(sides: dict[str, tuple[str, dict[str, str]]], transports: str, small: int, large: int,
                 repeat: int, pyzmq: bool, scenario: str = "batch") -> None:
    """Print instructions per message of the batch scenario: in all, send, engine, receive
    (``pyzmq``: and a row of pyzmq's plain API, its I/O threads as the engine)."""
    extra = (large - small) * (BATCH if scenario == "batch" else PUB_BURST)
    rows_of = [(name, checkout, env, scenario) for name, (checkout, env) in sides.items()]
    if pyzmq and scenario == "batch":
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        rows_of.append(("pyzmq", here, {}, "zmq"))
    print(f"{'transport':9} {'side':10} {'per message: all (each repeat)':32} {'send':>6} {'engine':>6} {'recv':>6}")
    for transport in transports.split(","):
        for name, checkout, env, scenario in rows_of:
            rows = []
            for _ in range(repeat):
                before = count_batch(checkout, env, transport, small, scenario)
                after = count_batch(checkout, env, transport, large, scenario)
                per = [(b - a) / extra for a, b in zip(before, after, strict=True)]
                rows.append((sum(per), per[0], sum(per[1:-1]), per[-1]))
            shown = ", ".join(f"{row[0]:,.0f}" for row in rows)
            mid = sorted(rows)[len(rows) // 2]
            print(f"{transport:9} {name:10} {shown:32} {mid[1]:6,.0f} {mid[2]:6,.0f} {mid[3]:6,.0f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--workload", nargs=2, metavar=("TRANSPORT", "N"), help=argparse.SUPPRESS)
    p.add_argument("--side", action="append", default=[], metavar="NAME=CHECKOUT[:KEY=VALUE...]",
                   help="a checkout (and environment settings) to count; default: this one")
    p.add_argument("--scenario", choices=("pingpong", "batch", "zmq", "pub"), default="pingpong",
                   help="pingpong: per round trip (default); batch: per message of send_batch/recv_batch; "
                   "pub: per 1 KiB message a PUB sends to one subscriber")
    p.add_argument("--pyzmq", action="store_true", help="batch: add a row of pyzmq's plain send/recv, same shape")
    p.add_argument("--transports", default="tcp,ipc")
    p.add_argument("--small", type=int, default=None, help="round trips (batches): 200 (20)")
    p.add_argument("--large", type=int, default=None, help="round trips (batches): 1200 (220)")
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    if args.workload:
        workload = {"batch": batches, "zmq": zmq_plain, "pub": pub_sub}.get(args.scenario, ping_pong)
        workload(args.workload[0], int(args.workload[1]))
        return 0
    batch = args.scenario in ("batch", "pub")
    small = args.small if args.small is not None else (20 if batch else 200)
    large = args.large if args.large is not None else (220 if batch else 1200)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides: dict[str, tuple[str, dict[str, str]]] = {}
    for spec in args.side or [f"this={here}"]:
        name, _, rest = spec.partition("=")
        checkout, *settings = rest.split(":")
        if not name or not checkout or not all("=" in kv for kv in settings):
            p.error(f"--side {spec!r}: give NAME=CHECKOUT[:KEY=VALUE...]")
        sides[name] = (os.path.abspath(checkout), dict(kv.split("=", 1) for kv in settings))
    if batch:
        report_batch(sides, args.transports, small, large, args.repeat, args.pyzmq, args.scenario)
        return 0
    extra = large - small
    print(f"{'transport':9} {'side':10} {'instructions per round trip (each repeat)':44} median")
    for transport in args.transports.split(","):
        for name, (checkout, env) in sides.items():
            per_trip = []
            for _ in range(args.repeat):
                per_trip.append((count(checkout, env, transport, large) - count(checkout, env, transport, small)) / extra)
            shown = ", ".join(f"{value:,.0f}" for value in per_trip)
            print(f"{transport:9} {name:10} {shown:44} {median(per_trip):,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
