"""``nanopy bench``: quick throughput and latency figures for this machine.

    nanopy bench [--transport tcp|ipc|inproc] [--size BYTES] [--seconds S]

Throughput is PUSH -> PULL, latency is PAIR ping-pong (mean round trip / 2). tcp
and ipc run the peer in a second process, inproc in a second thread. For
side-by-side figures against pynng and pyzmq, install the ``bench`` extra
(``pip install 'nanopy[bench]'``: pynng, pyzmq, matplotlib) and run
``benchmarks/run.py`` from a source checkout (``--plot FILE.png`` draws a chart).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

import nanopy

COMPARE_HINT = (
    "nanopy alone. To compare with pyzmq and pynng in the same run: pip install 'nanopy[bench]' "
    "(pynng, pyzmq, matplotlib), then from a source checkout: python benchmarks/run.py --plot chart.png"
)


def _url(transport: str) -> str:
    if transport == "tcp":
        return "tcp://127.0.0.1:0"
    if transport == "ipc":
        return f"ipc://{tempfile.gettempdir()}/nanopy-bench-{time.monotonic_ns()}.ipc"
    return f"inproc://nanopy-bench-{time.monotonic_ns()}"


def _peer(role: str, url: str, size: int, seconds: float) -> None:
    """The other side: a sender for throughput, an echo for latency."""
    if role == "push":
        # (a long linger: on a loaded machine the receiver may drain the queue, end
        # marker last, well after close; the default 1 s would drop the marker)
        with nanopy.Socket("push", connect=url, linger=seconds + 10) as sock:
            payload = b"x" * size
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for _ in range(1000):
                    sock.send(payload)
            sock.send(b"")  # end marker
    else:
        with nanopy.Socket("pair", connect=url, recv_timeout=seconds + 10) as sock:
            try:
                while True:
                    data = sock.recv()
                    if not data:
                        break
                    sock.send(data)
            except nanopy.Timeout:
                pass


def _start_peer(transport: str, role: str, url: str, size: int, seconds: float) -> object:
    if transport == "inproc":
        t = threading.Thread(target=_peer, args=(role, url, size, seconds), daemon=True)
        t.start()
        return t
    code = (
        "from nanopy._cli.bench import _peer; import sys; "
        "_peer(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))"
    )
    return subprocess.Popen([sys.executable, "-c", code, role, url, str(size), str(seconds)])


def _finish(peer: object) -> None:
    if isinstance(peer, subprocess.Popen):
        try:
            peer.wait(timeout=15)
        except subprocess.TimeoutExpired:
            peer.kill()
            peer.wait()
    else:
        peer.join(timeout=15)  # type: ignore[attr-defined]


def throughput(transport: str, size: int, seconds: float) -> float:
    with nanopy.Socket("pull", recv_timeout=seconds + 10) as pull:
        url = pull.bind(_url(transport)).url
        peer = _start_peer(transport, "push", url, size, seconds)
        try:
            pull.recv()
            count, start = 0, time.perf_counter()
            while pull.recv():
                count += 1
            elapsed = time.perf_counter() - start
        finally:
            _finish(peer)
    return count / elapsed


def latency(transport: str, size: int, seconds: float) -> float:
    with nanopy.Socket("pair", recv_timeout=10) as sock:
        url = sock.bind(_url(transport)).url
        peer = _start_peer(transport, "echo", url, size, seconds)
        try:
            payload = b"x" * max(size, 1)
            for _ in range(200):  # warm up
                sock.send(payload)
                sock.recv()
            trips, start = 0, time.perf_counter()
            end = start + seconds
            while time.perf_counter() < end:
                sock.send(payload)
                sock.recv()
                trips += 1
            elapsed = time.perf_counter() - start
            sock.send(b"")
        finally:
            _finish(peer)
    return elapsed / trips / 2 * 1e6


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="nanopy bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transport", choices=("tcp", "ipc", "inproc"), action="append")
    parser.add_argument("--size", type=int, default=64, help="message size in bytes (default 64)")
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per figure")
    args = parser.parse_args(list(argv))
    if args.size < 1:
        parser.error("--size must be at least 1")
    print(f"{'transport':<10} {'PUSH->PULL msgs/s':>18} {'PAIR one-way us':>16}   ({args.size} B)")
    for transport in args.transport or ["tcp", "ipc", "inproc"]:
        rate = throughput(transport, args.size, args.seconds)
        lat = latency(transport, args.size, args.seconds)
        print(f"{transport:<10} {rate:>18,.0f} {lat:>16.1f}", flush=True)
    # The table stays alone on stdout (scripts parse it); the hint goes to stderr.
    print(COMPARE_HINT, file=sys.stderr)
    return 0
