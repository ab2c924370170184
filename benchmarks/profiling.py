"""Profile one benchmark cell with py-spy and show where the time goes per message.

    .venv/bin/pip install py-spy
    .venv/bin/python benchmarks/profile.py throughput --system nanopy --api sync --transport tcp
    .venv/bin/python benchmarks/profile.py latency --system nanopy --api sync --transport tcp

Both worker processes run under ``py-spy record`` (all threads, raw collapsed
stacks, 500 Hz, non-blocking). Import-time stacks are dropped; the rest are
attributed per thread, and each function's samples are turned into CPU
microseconds per message (per round trip for latency) using the run's message
count. Sampling adds overhead, so compare the shares, not the absolute rates.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import latency
import throughput

RATE = 500  # must match the rate in _common.spawn


def load(path: str) -> list[tuple[str, list[str], int]]:
    """(thread name, frames outermost first, samples) per distinct stack."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            frames = stack.split(";")
            if any("_find_and_load" in fr for fr in frames):
                continue  # imports at start-up
            thread = frames[0].split(": ", 1)[-1]
            out.append((thread, frames[1:], int(count)))
    return out


def report(path: str, messages: int, top: int) -> str:
    stacks = load(path)
    lines = [f"== {os.path.basename(path)}  ({messages:,} messages)"]
    per_thread = collections.Counter()
    for thread, _, n in stacks:
        per_thread[thread] += n
    total = sum(per_thread.values())

    def us(n: float) -> float:
        return n / RATE / messages * 1e6

    lines.append("threads: " + ", ".join(f"{t} {us(n):.2f} us/msg ({n / total:.0%})" for t, n in per_thread.most_common()))
    self_time = collections.Counter()
    incl = collections.Counter()
    for thread, frames, n in stacks:
        if frames:
            self_time[(thread, frames[-1])] += n
        for fr in set(frames):
            incl[(thread, fr)] += n
    lines.append(f"-- self time (top {top})")
    for (thread, fr), n in self_time.most_common(top):
        lines.append(f"  {us(n):7.2f} us/msg {n / total:6.1%}  [{thread[:14]}] {fr}")
    lines.append(f"-- inclusive time, nanopy and benchmark frames (top {top})")
    shown = 0
    for (thread, fr), n in incl.most_common():
        if "nanopy/" in fr or "throughput.py" in fr or "latency.py" in fr or "trio/" in fr or "pynng" in fr or "zmq" in fr:
            lines.append(f"  {us(n):7.2f} us/msg {n / total:6.1%}  [{thread[:14]}] {fr}")
            shown += 1
            if shown >= top:
                break
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("test", choices=["throughput", "latency"])
    p.add_argument("--system", default="nanopy")
    p.add_argument("--api", default="sync")
    p.add_argument("--transport", default="tcp")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--keep", default=None, help="directory for the raw py-spy files")
    args = p.parse_args()
    outdir = args.keep or tempfile.mkdtemp(prefix="npbench-prof-")
    os.makedirs(outdir, exist_ok=True)
    os.environ["NANOPY_BENCH_PYSPY"] = outdir
    if args.test == "throughput":
        rec = throughput.measure(args.system, args.api, args.transport, args.size, args.warmup, args.duration)
        messages = rec["sent"]
        print(f"{rec['msgs_per_s']:,.0f} msgs/s under the profiler, cpu {rec['cpu_us_per_msg']:.2f} us/msg, complete={rec['complete']}")
    else:
        rec = latency.measure(args.system, args.api, args.transport, args.size, args.warmup, args.duration)
        messages = rec["rtts"]
        print(f"one-way {rec['one_way_us']:.1f} us under the profiler, cpu {rec['cpu_us_per_rtt']:.1f} us/rtt")
    for name in sorted(os.listdir(outdir)):
        if name.startswith(f"{args.system}-{args.api}-"):
            print(report(os.path.join(outdir, name), messages, args.top))
            print()
    print(f"raw stacks: {outdir}")


if __name__ == "__main__":
    main()
