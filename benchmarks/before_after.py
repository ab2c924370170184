"""A change's effect on speed: alternating runs of two checkouts, as ratios to pyzmq.

    .venv/bin/python benchmarks/before_after.py --before ../nanopy-before [--pairs 3] [--quick]

Each checkout runs its own ``benchmarks/run.py`` and ``benchmarks/pubsub.py`` with its
own Python (``<checkout>/.venv/bin/python`` unless ``--before-python`` /
``--after-python`` say otherwise), in pairs whose order alternates (before-after,
after-before, ...), so load that drifts during the session falls on both alike.
Every figure is nanopy's ratio to pyzmq *from the same run*: absolute rates on a
shared machine say little, the ratio to a C library measured beside it says more.

The table gives, per cell, the median ratio before and after, the change, and the
noise: the spread (max - min) of the ratios of one checkout over its runs. A change
smaller than the noise is not a change. Raw results go to
``benchmarks/results/before-after-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from statistics import median

PUBSUB_LINE = re.compile(r"^\s*(\w+) nanopy / pyzmq: receive rate ([0-9.]+)x")


def _python(checkout: str, given: str | None) -> str:
    return given or os.path.join(checkout, ".venv", "bin", "python")


def _run_suite(checkout: str, python: str, args: argparse.Namespace) -> dict[str, float]:
    """One run of the benchmarks in ``checkout``: {cell: nanopy / pyzmq}."""
    ratios: dict[str, float] = {}
    if args.tests:
        ratios.update(_run_py(checkout, python, args))
    if args.pubsub:
        ratios.update(_pubsub_py(checkout, python, args.pubsub_n))
    return ratios


def _run_py(checkout: str, python: str, args: argparse.Namespace) -> dict[str, float]:
    ratios: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        cmd = [python, "benchmarks/run.py", "--output", out, "--variants", "nanopy/sync,nanopy/trio,pyzmq/sync"]
        cmd += ["--tests", args.tests]
        if args.quick:
            cmd.append("--quick")
        subprocess.run(cmd, cwd=checkout, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            for row in json.load(f)["summary"]:
                ratio = row.get("ratio_vs_pyzmq/sync")
                if ratio is not None:
                    ratios[f"{row['test']} {row['transport']} {row['size']} B {row['api']}"] = ratio
    return ratios


def _pubsub_py(checkout: str, python: str, pubsub_n: int | None) -> dict[str, float]:
    ratios: dict[str, float] = {}
    cmd = [python, "benchmarks/pubsub.py", "--scenario", "both"]
    if pubsub_n:
        cmd += ["--n", str(pubsub_n)]
    text = subprocess.run(cmd, cwd=checkout, check=True, capture_output=True, text=True).stdout
    for line in text.splitlines():
        match = PUBSUB_LINE.match(line)
        if match:
            ratios[f"pubsub {match.group(1)}"] = float(match.group(2))
    return ratios


def _table(runs: dict[str, list[dict[str, float]]]) -> str:
    cells = list(dict.fromkeys(cell for side in runs.values() for run in side for cell in run))
    lines = [
        f"{'cell (nanopy / pyzmq)':28} {'before':>8} {'after':>8} {'change':>8} {'noise b':>8} {'noise a':>8}"
    ]
    for cell in cells:
        before = [run[cell] for run in runs["before"] if cell in run]
        after = [run[cell] for run in runs["after"] if cell in run]
        if not before or not after:
            continue
        b, a = median(before), median(after)
        lines.append(
            f"{cell:28} {b:8.3f} {a:8.3f} {(a / b - 1) * 100:+7.1f}% "
            f"{(max(before) - min(before)) / b * 100:7.1f}% {(max(after) - min(after)) / a * 100:7.1f}%"
        )
    lines.append("(latency cells: lower is better; every other cell: higher is better)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--before", required=True, help="checkout of the code before the change")
    p.add_argument("--after", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument("--before-python")
    p.add_argument("--after-python")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="run.py --quick (short windows)")
    p.add_argument("--pubsub-n", type=int, help="messages per subscriber in pubsub.py")
    p.add_argument("--tests", default="throughput,latency", help="run.py's tests ('' for none)")
    p.add_argument("--no-pubsub", dest="pubsub", action="store_false", help="skip pubsub.py")
    args = p.parse_args(argv)
    sides = {
        "before": (args.before, _python(args.before, args.before_python)),
        "after": (args.after, _python(args.after, args.after_python)),
    }
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for i in range(args.pairs):
        for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
            checkout, python = sides[side]
            print(f"pair {i + 1}/{args.pairs}: {side} ({checkout}), load {os.getloadavg()[0]:.1f}", file=sys.stderr)
            runs[side].append(_run_suite(checkout, python, args))
    print(_table(runs))
    os.makedirs(os.path.join(args.after, "benchmarks", "results"), exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = os.path.join(args.after, "benchmarks", "results", f"before-after-{stamp}.json")
    with open(path, "w") as f:
        json.dump({"sides": sides, "runs": runs}, f, indent=1)
    print(f"raw results: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
