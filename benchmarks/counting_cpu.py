"""CPU per message of nanopy's send and receive paths, before and after a change, in one process.

    .venv/bin/python benchmarks/counting_cpu.py --base-commit 3074b9b --rounds 14

Finer than the throughput benchmarks on a loaded machine: each run is one fresh
process that sends ``--n`` 64 B messages as fast as it can into receivers that do
not read yet (buffers large enough to hold everything), then drains them, and
reports its process CPU time per message for each half. Scenarios: ``inproc``
(PUSH -> PULL), ``tcp`` (PUSH -> PULL over loopback; the engine thread reads
while the sender sends) and ``pubsub`` (PUB -> 10 inproc SUBs). The two builds
(``--base-commit`` and ``--new-commit``, archived with ``git archive``) alternate
within each round; the report gives the minimum and median over rounds and the
paired ratio new / base (median [min..max]).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(scenario: str, n: int) -> None:
    import nanopy
    import nanopy.testing

    msg = b"m" * 64
    if scenario == "pubsub":
        tx = nanopy.Socket("pub", send_buffer=10**6)
        url = tx.bind("inproc://counting").url
        rx = [nanopy.Socket("sub", recv_buffer=10**7, connect=url) for _ in range(10)]
        for sub in rx:
            sub.subscribe(b"")
    else:
        rx = [nanopy.Socket("pull", recv_buffer=10**7)]
        url = rx[0].bind("inproc://counting" if scenario == "inproc" else "tcp://127.0.0.1:0").url
        tx = nanopy.Socket("push", send_buffer=10**6, connect=url)
    nanopy.testing.wait_pipes(tx, len(rx))
    c0 = time.process_time()
    send = tx.send
    for _ in range(n):
        send(msg)
    c1 = time.process_time()
    for sock in rx:
        got = 0
        while got < n:
            got += len(sock.recv_batch(100_000, timeout=30))
    c2 = time.process_time()
    print((c1 - c0) / n * 1e6, (c2 - c1) / n * 1e6, flush=True)
    os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-commit", required=True)
    p.add_argument("--new-commit", default="HEAD")
    p.add_argument("--rounds", type=int, default=14)
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--scenarios", default="inproc,tcp,pubsub")
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return
    scenarios = args.scenarios.split(",")
    results: dict[tuple[str, str], dict[int, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="nanopy-counting-") as top:
        trees = {}
        for name, commit in (("base", args.base_commit), ("new", args.new_commit)):
            trees[name] = os.path.join(top, name)
            os.mkdir(trees[name])
            archive = subprocess.run(["git", "-C", ROOT, "archive", commit], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", trees[name]], input=archive.stdout, check=True)
        for rnd in range(args.rounds):
            for scenario in scenarios:
                for build in ("base", "new") if rnd % 2 == 0 else ("new", "base"):
                    out = subprocess.run(
                        [sys.executable, os.path.abspath(__file__), "--base-commit", "-", "--worker", scenario,
                         str(args.n)],
                        env=dict(os.environ, PYTHONPATH=trees[build]), capture_output=True, text=True, timeout=600,
                    )
                    try:
                        send, recv = map(float, out.stdout.split())
                    except ValueError:
                        print(f"{scenario} {build}: failed: {out.stderr[-400:]}", file=sys.stderr)
                        continue
                    results.setdefault((scenario, build), {})[rnd] = (send, recv)
                    print(f"round {rnd} {scenario} {build}: send {send:.3f} recv {recv:.3f} us/msg",
                          file=sys.stderr, flush=True)
    print("CPU per message (us): min and median over rounds; paired ratio new / base")
    for scenario in scenarios:
        base, new = results.get((scenario, "base"), {}), results.get((scenario, "new"), {})
        for label, pick in (("send", lambda r: r[0]), ("recv", lambda r: r[1]), ("both", lambda r: r[0] + r[1])):
            b = [pick(r) for r in base.values()]
            n = [pick(r) for r in new.values()]
            ratios = sorted(pick(new[k]) / pick(base[k]) for k in new if k in base)
            if not ratios:
                continue
            print(f"{scenario:7} {label:4} base {min(b):.3f} / {statistics.median(b):.3f}  "
                  f"new {min(n):.3f} / {statistics.median(n):.3f}  "
                  f"ratio {statistics.median(ratios):.3f} [{ratios[0]:.3f}..{ratios[-1]:.3f}]")


if __name__ == "__main__":
    main()
