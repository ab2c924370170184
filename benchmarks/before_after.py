"""A change's effect on speed: alternating runs of two checkouts, as ratios to pyzmq.

    .venv/bin/python benchmarks/before_after.py --before ../nanopy-before [--pairs 3] [--quick]
    .venv/bin/python benchmarks/before_after.py --before ../nanopy-before \
        --side portable=.:NANOPY_BACKEND=portable --quick

``--side NAME=CHECKOUT[:KEY=VALUE...]`` adds a third (fourth...) side, run in the same
rounds with those environment settings: the same code with another platform backend,
say. Its column shows its median ratio and its change against *after*.

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


def _run_suite(checkout: str, python: str, args: argparse.Namespace, env: dict[str, str] | None = None) -> dict[str, float]:
    """One run of the benchmarks in ``checkout`` (``env`` added to the environment): {cell: nanopy / pyzmq}."""
    ratios: dict[str, float] = {}
    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        if args.tests:
            ratios.update(_run_py(checkout, python, args))
        if args.pubsub:
            ratios.update(_pubsub_py(checkout, python, args.pubsub_n))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
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


def _noise(values: list[float]) -> float:
    """The spread of one side's ratios over its runs, in % of their median."""
    return (max(values) - min(values)) / median(values) * 100


def _table(runs: dict[str, list[dict[str, float]]]) -> str:
    cells = list(dict.fromkeys(cell for side in runs.values() for run in side for cell in run))
    extra = [name for name in runs if name not in ("before", "after")]
    head = f"{'cell (nanopy / pyzmq)':28} {'before':>8} {'after':>8} {'change':>8} {'noise b':>8} {'noise a':>8}"
    widths = {name: max(8, len(name)) for name in extra}
    lines = [head + "".join(f" {name:>{widths[name]}} {'vs after':>8} {'noise':>7}" for name in extra)]
    for cell in cells:
        values = {name: [run[cell] for run in side if cell in run] for name, side in runs.items()}
        if not all(values.values()):
            continue
        b, a = median(values["before"]), median(values["after"])
        line = (
            f"{cell:28} {b:8.3f} {a:8.3f} {(a / b - 1) * 100:+7.1f}% "
            f"{_noise(values['before']):7.1f}% {_noise(values['after']):7.1f}%"
        )
        for name in extra:
            m = median(values[name])
            line += f" {m:{widths[name]}.3f} {(m / a - 1) * 100:+7.1f}% {_noise(values[name]):6.1f}%"
        lines.append(line)
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
    p.add_argument("--side", action="append", default=[], metavar="NAME=CHECKOUT[:KEY=VALUE...]",
                   help="another side run in the same rounds, with these environment settings")
    args = p.parse_args(argv)
    sides: dict[str, tuple[str, str, dict[str, str]]] = {
        "before": (args.before, _python(args.before, args.before_python), {}),
        "after": (args.after, _python(args.after, args.after_python), {}),
    }
    for spec in args.side:
        name, _, rest = spec.partition("=")
        checkout, *settings = rest.split(":")
        if not name or not checkout or name in sides or not all("=" in kv for kv in settings):
            p.error(f"--side {spec!r}: give NAME=CHECKOUT[:KEY=VALUE...] with a new NAME")
        checkout = os.path.abspath(checkout)
        sides[name] = (checkout, _python(checkout, None), dict(kv.split("=", 1) for kv in settings))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    order = list(sides)
    for i in range(args.pairs):
        for side in order if i % 2 == 0 else order[::-1]:
            checkout, python, env = sides[side]
            print(f"round {i + 1}/{args.pairs}: {side} ({checkout}), load {os.getloadavg()[0]:.1f}", file=sys.stderr)
            runs[side].append(_run_suite(checkout, python, args, env))
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
