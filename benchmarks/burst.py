"""The seed-004 shape (issue 36): one PUB -> one SUB process over tcp, 1 KiB, bursts.

Run it through ``benchmarks/pubsub.py --scenario burst`` (or this file directly,
with the same options)::

    .venv/bin/python benchmarks/pubsub.py --scenario burst --rounds 3 \\
        --bursts 1000,10000,100000,1000000

Each round runs every system in turn (nanopy, pyzmq, pynng: alternating, one
subscriber process per system and round), and each system sends every burst in
turn. Between bursts the publisher waits for the subscriber's report, so every
burst starts with empty queues.

* Every message carries its send time from ``time.monotonic_ns()``
  (CLOCK_MONOTONIC: one clock for every process on a Linux host); the
  subscriber takes the latency of each message when ``recv()`` returns it.
* The publisher also writes how many messages of the burst it has sent into a
  small shared file (every 64 sends); every 64 receives the subscriber reads it
  and keeps the largest ``sent - seq`` it saw: the *peak in flight* (messages the
  publisher had sent past the one just received; up to 63 too low).
* Lossless: nanopy ``overflow="block"`` on PUB and SUB; ZeroMQ ``XPUB_NODROP``
  with its default high-water marks (1000 each side). NNG's PUB has no lossless
  mode (it drops for a subscriber that lags): pynng runs with its defaults and
  the report gives its delivered count; its rates count delivered messages.
* Reported per system and burst (medians over the rounds): the publisher's send
  rate (from its first send to its last), the subscriber's receive rate (first to
  last message), mean and p99 latency, peak in flight, delivered; then nanopy's
  ratios to pyzmq and pynng per round, so "in each run" can be read off.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time
from array import array
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

HEAD = struct.Struct(">BIQq")  # kind, burst number, sequence number (from 1), send time (ns)
SHARED = struct.Struct("=Q")  # burst number << 40 | messages of it sent so far
PROBE, DATA, END, QUIT = 0, 1, 2, 3
SHARE_EVERY = 64  # publisher: share its count every this many sends; subscriber: sample as often
SEQ_MASK = (1 << 40) - 1
SYSTEMS = ("nanopy", "pyzmq", "pynng")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _Lib:
    """One system's PUB and SUB with ``send(bytes)`` / ``recv() -> bytes`` and ``close``."""

    def __init__(self, system: str, options: dict[str, Any]) -> None:
        self.system = system
        self.options = options  # extra nanopy socket options (--nanopy-opt NAME=VALUE)
        self.ctx: Any = None

    def pub(self) -> tuple[Any, str]:
        if self.system == "nanopy":
            import nanopy

            sock = nanopy.Socket("pub", overflow="block", **self.options)
            return sock, sock.bind("tcp://127.0.0.1:0").url
        if self.system == "pyzmq":
            import zmq

            self.ctx = zmq.Context()
            sock = self.ctx.socket(zmq.PUB)
            sock.setsockopt(zmq.XPUB_NODROP, 1)  # wait at the default high-water mark, never drop
            return sock, f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
        import pynng

        url = f"tcp://127.0.0.1:{_free_port()}"
        return pynng.Pub0(listen=url), url

    def sub(self, url: str) -> Any:
        if self.system == "nanopy":
            import nanopy

            sock = nanopy.Socket("sub", connect=url, overflow="block", **self.options)
            sock.subscribe(b"")
            return sock
        if self.system == "pyzmq":
            import zmq

            self.ctx = zmq.Context()
            sock = self.ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(url)
            return sock
        import pynng

        sock = pynng.Sub0(dial=url)
        sock.subscribe(b"")
        return sock

    def close(self, sock: Any) -> None:
        if self.system == "pyzmq":
            sock.close(linger=0)
            self.ctx.term()
        else:
            sock.close()


def _report(burst: int, sent: int, lats: array, first: int, last: int, lost: int, peak: int) -> dict[str, Any]:
    n = len(lats)
    ordered = sorted(lats)
    return {"burst": burst, "sent": sent, "received": n, "lost": lost,
            "recv_rate": (n - 1) / ((last - first) / 1e9) if n > 1 and last > first else 0.0,
            "mean_us": sum(lats) / n / 1e3 if n else 0.0,
            "p99_us": ordered[min(n - 1, n * 99 // 100)] / 1e3 if n else 0.0,
            "peak_in_flight": peak}


def subscriber(system: str, url: str, share_path: str, bursts: int, options: dict[str, Any]) -> None:
    """The SUB process: measures every burst and prints one JSON line per burst on stdout."""
    lib = _Lib(system, options)
    sub = lib.sub(url)
    with open(share_path, "r+b") as f:
        shared = mmap.mmap(f.fileno(), SHARED.size)
    recv, unpack, mono, read_shared = sub.recv, HEAD.unpack_from, time.monotonic_ns, SHARED.unpack_from
    ready = False
    cur = 0
    reported: set[int] = set()
    lats = array("q")
    first = last = lost = peak = 0
    expected = 1
    while len(reported) < bursts:
        m = recv()
        now = mono()
        kind, k, seq, sent_at = unpack(m)
        if kind == DATA and k == cur:  # the hot path: one message of the running burst
            lats.append(now - sent_at)
            last = now
            if seq != expected:
                lost += seq - expected  # only NNG, whose PUB drops
            expected = seq + 1
            if not seq % SHARE_EVERY:
                s = read_shared(shared)[0]
                if s >> 40 == k and (s & SEQ_MASK) - seq > peak:
                    peak = (s & SEQ_MASK) - seq
            continue
        if kind == PROBE:
            if not ready:
                ready = True
                print("ready", flush=True)
        elif kind == DATA and k > cur:  # the first message of the next burst
            cur, lats, first, last, lost, peak = k, array("q", [now - sent_at]), now, now, seq - 1, 0
            expected = seq + 1
        elif kind == END and k not in reported:  # seq is what the burst sent
            if k != cur:
                lats, first, last, peak = array("q"), 0, 0, 0
            lost = seq - len(lats)
            reported.add(k)
            print(json.dumps(_report(k, seq, lats, first, last, lost, peak)), flush=True)
    lib.close(sub)


def _lines(proc: subprocess.Popen[str], timeout: float) -> str | None:
    """The subscriber's next stdout line, or None after ``timeout`` seconds."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        return None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"subscriber exited ({proc.wait()})")
    return line


def publish(system: str, bursts: list[int], size: int, options: dict[str, Any]) -> list[dict[str, Any]]:
    """One round of one system: every burst in turn; the subscriber's reports plus the send rate."""
    lib = _Lib(system, options)
    pub, url = lib.pub()
    fd, share_path = tempfile.mkstemp(prefix="nanopy-burst-")
    os.write(fd, bytes(SHARED.size))
    os.close(fd)
    with open(share_path, "r+b") as f:
        shared = mmap.mmap(f.fileno(), SHARED.size)
    cmd = [sys.executable, os.path.abspath(__file__), "--role", "sub", "--system", system, "--url", url,
           "--share", share_path, "--count", str(len(bursts))]
    for name, value in options.items():
        cmd += ["--nanopy-opt", f"{name}={value}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    results = []
    try:
        send, pack, mono, share = pub.send, HEAD.pack, time.monotonic_ns, SHARED.pack_into
        probe = pack(PROBE, 0, 0, 0).ljust(size, b"p")
        deadline = time.monotonic() + 60
        while _lines(proc, 0.01) is None:  # probe until the subscription is in place
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system}: subscriber not ready")
            send(probe)
        pad = b"m" * (size - HEAD.size)
        for k, n in enumerate(bursts, 1):
            top = k << 40
            t0 = mono()
            for seq in range(1, n + 1):
                send(pack(DATA, k, seq, mono()) + pad)
                if not seq % SHARE_EVERY:
                    share(shared, 0, top | seq)
            t1 = mono()
            share(shared, 0, top | n)
            end = pack(END, k, n, 0).ljust(size, b"e")
            line = None
            deadline = time.monotonic() + 120
            while line is None:  # again until reported: NNG's PUB may drop the end marker too
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{system}: no report for burst {k}")
                send(end)
                line = _lines(proc, 0.02)
            report = json.loads(line)
            report.update(system=system, n=n, send_rate=n / ((t1 - t0) / 1e9))
            results.append(report)
    finally:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        lib.close(pub)
        shared.close()
        os.unlink(share_path)
    return results


def _median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def run(systems: list[str], bursts: list[int], rounds: int, size: int, options: dict[str, Any],
        json_path: str | None = None) -> list[dict[str, Any]]:
    """Alternating rounds; prints the table and the per-round ratios; returns every report."""
    print(f"seed-004 shape: PUB -> SUB over tcp, {size} B, lossless (nanopy overflow='block', "
          f"pyzmq XPUB_NODROP; pynng drops), {rounds} rounds, load {os.getloadavg()[0]:.1f}"
          + (f", nanopy options {options}" if options else ""))
    every: list[dict[str, Any]] = []
    for r in range(rounds):
        for system in systems:
            for rep in publish(system, bursts, size, options if system == "nanopy" else {}):
                rep["round"] = r
                every.append(rep)
    print(f"  load after: {os.getloadavg()[0]:.1f}")
    print(f"  {'burst':>9} {'system':7} {'send/s':>10} {'recv/s':>10} {'mean µs':>9} {'p99 µs':>9}"
          f" {'peak fl':>8} {'delivered':>10}")
    for n in bursts:
        for system in systems:
            reps = [x for x in every if x["system"] == system and x["n"] == n]
            med = {key: _median([x[key] for x in reps])
                   for key in ("send_rate", "recv_rate", "mean_us", "p99_us", "peak_in_flight", "received")}
            print(f"  {n:>9,} {system:7} {med['send_rate']:>10,.0f} {med['recv_rate']:>10,.0f}"
                  f" {med['mean_us']:>9,.0f} {med['p99_us']:>9,.0f} {med['peak_in_flight']:>8,.0f}"
                  f" {med['received'] / n:>9.1%}")
        for other in (s for s in systems if s != "nanopy" and "nanopy" in systems):
            pairs = [(a, b) for a in every for b in every
                     if a["system"] == "nanopy" and b["system"] == other and a["n"] == b["n"] == n
                     and a["round"] == b["round"]]
            rate = ", ".join(f"{a['recv_rate'] / b['recv_rate']:.2f}x" for a, b in pairs if b["recv_rate"])
            mean = ", ".join(f"{a['mean_us'] / b['mean_us']:.2f}x" for a, b in pairs if b["mean_us"])
            print(f"  {n:>9,} nanopy/{other}: receive rate {rate}; mean latency {mean}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(every, f, indent=1)
    return every


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``NAME=VALUE`` nanopy socket options (ints as ints)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        out[name] = int(value) if value.lstrip("-").isdigit() else value
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options this scenario adds to a command line."""
    p.add_argument("--bursts", default="1000,10000,100000,1000000", help="burst sizes, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (each system once per round)")
    p.add_argument("--size", type=int, default=1024, help="message size in bytes")
    p.add_argument("--nanopy-opt", action="append", default=[], metavar="NAME=VALUE",
                   help="a nanopy socket option for both ends (repeatable), e.g. recv_buffer=256")
    p.add_argument("--json", default=None, help="also write every report to this file")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", default=",".join(SYSTEMS))
    add_arguments(p)
    p.add_argument("--role", default="pub", help=argparse.SUPPRESS)
    p.add_argument("--system", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--share", help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    options = parse_options(args.nanopy_opt)
    if args.role == "sub":
        subscriber(args.system, args.url, args.share, args.count, options)
        return
    run(args.systems.split(","), [int(b) for b in args.bursts.split(",")], args.rounds, args.size, options,
        args.json)


if __name__ == "__main__":
    main()
