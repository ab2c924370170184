"""Instructions per round trip, counted by callgrind: a speed check that load cannot blur.

    .venv/bin/python benchmarks/instructions.py [--transports tcp,ipc] [--repeat 2] \\
        [--side before=../nanopy-before] [--side portable=.:NANOPY_BACKEND=portable]

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

Needs valgrind (Debian's package). Each count takes 10-30 s.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
from statistics import median

COLLECTED = re.compile(r"Collected : (\d+)")


def ping_pong(transport: str, n: int) -> None:
    """The measured workload: ``n`` round trips of 64 B between two PAIR sockets."""
    import nanopy

    url = {"tcp": "tcp://127.0.0.1:0", "ipc": f"ipc:///tmp/nanopy-instructions-{os.getpid()}.sock",
           "inproc": "inproc://instructions"}[transport]
    echo, caller = nanopy.Socket("pair"), nanopy.Socket("pair")
    caller.connect(echo.bind(url).url)
    payload = b"x" * 64

    def serve() -> None:
        for _ in range(n):
            echo.send(echo.recv())

    thread = threading.Thread(target=serve)
    thread.start()
    for _ in range(n):
        caller.send(payload)
        caller.recv()
    thread.join()
    caller.close()
    echo.close()


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--workload", nargs=2, metavar=("TRANSPORT", "N"), help=argparse.SUPPRESS)
    p.add_argument("--side", action="append", default=[], metavar="NAME=CHECKOUT[:KEY=VALUE...]",
                   help="a checkout (and environment settings) to count; default: this one")
    p.add_argument("--transports", default="tcp,ipc")
    p.add_argument("--small", type=int, default=200)
    p.add_argument("--large", type=int, default=1200)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    if args.workload:
        ping_pong(args.workload[0], int(args.workload[1]))
        return 0
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides: dict[str, tuple[str, dict[str, str]]] = {}
    for spec in args.side or [f"this={here}"]:
        name, _, rest = spec.partition("=")
        checkout, *settings = rest.split(":")
        if not name or not checkout or not all("=" in kv for kv in settings):
            p.error(f"--side {spec!r}: give NAME=CHECKOUT[:KEY=VALUE...]")
        sides[name] = (os.path.abspath(checkout), dict(kv.split("=", 1) for kv in settings))
    extra = args.large - args.small
    print(f"{'transport':9} {'side':10} {'instructions per round trip (each repeat)':44} median")
    for transport in args.transports.split(","):
        for name, (checkout, env) in sides.items():
            per_trip = []
            for _ in range(args.repeat):
                small = count(checkout, env, transport, args.small)
                large = count(checkout, env, transport, args.large)
                per_trip.append((large - small) / extra)
            shown = ", ".join(f"{value:,.0f}" for value in per_trip)
            print(f"{transport:9} {name:10} {shown:44} {median(per_trip):,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
