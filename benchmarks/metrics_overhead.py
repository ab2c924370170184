"""What drop accounting and metrics cost: the same benchmarks on three builds, interleaved.

    .venv/bin/python benchmarks/metrics_overhead.py --base-commit 3074b9b --rounds 5

Variants, each in fresh worker processes:

* ``base``: the code before drop accounting (``git archive`` of ``--base-commit``
  into a temporary directory, put first on ``PYTHONPATH``);
* ``new``: ``--new-commit`` (default HEAD, archived the same way), no metrics registered;
* ``metrics``: the same code, with every worker process calling
  ``nanopy.metrics.register_prometheus()`` and ``instrument()`` (an OpenTelemetry
  SDK meter provider with an in-memory reader) at start-up and a thread scraping
  both once a second (a ``sitecustomize`` module on ``PYTHONPATH``).

Cells: PUSH -> PULL throughput (sync; tcp, ipc: two processes; inproc: two
threads), PAIR ping-pong latency over tcp, and PUB -> 10 SUB over tcp
(benchmarks/pubsub.py, scenario ``ten``: the fan-out lane). The variants take
turns within each round and their order rotates, so outside load hits them
alike. The report gives, per cell, each variant's median and min-max over the
rounds and the paired ratios (the median over rounds of variant / base within
the same round) with their spread. Throughput and latency come from
benchmarks/throughput.py and latency.py, unchanged.
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
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import latency  # noqa: E402
import throughput  # noqa: E402

# Loaded by every worker of the "metrics" variant: metrics registered and scraped at 1 Hz.
HOOK = '''
import threading, time
try:
    import nanopy.metrics as _m
    from prometheus_client import REGISTRY, generate_latest
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
except ImportError:
    pass
else:
    _m.register_prometheus()
    _reader = InMemoryMetricReader()
    _m.instrument(MeterProvider(metric_readers=[_reader]))

    def _scrape():
        while True:
            time.sleep(1.0)
            generate_latest(REGISTRY)
            _reader.get_metrics_data()

    threading.Thread(target=_scrape, daemon=True).start()
'''

VARIANTS = ("base", "new", "metrics")
CELLS = (
    ("throughput", "tcp", 64),
    ("throughput", "ipc", 64),
    ("throughput", "inproc", 64),
    ("throughput", "tcp", 1024),
    ("latency", "tcp", 64),
    ("pubsub10", "tcp", 64),
)
_WALL = re.compile(r"wall\s+([\d.]+) s.*CPU pub ([\d.]+) s")


def _env(variant: str, trees: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = trees[variant] if variant != "metrics" else trees["hook"] + os.pathsep + trees["new"]
    return env


def _pubsub(variant: str, trees: dict[str, str], env: dict[str, str], n: int) -> dict[str, Any]:
    tree = trees["base" if variant == "base" else "new"]
    out = subprocess.run(
        [sys.executable, os.path.join(tree, "benchmarks", "pubsub.py"), "--scenario", "ten", "--n", str(n),
         "--systems", "nanopy"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    match = _WALL.search(out.stdout)
    if out.returncode or match is None:
        raise RuntimeError(f"pubsub.py failed: {out.stdout[-500:]} {out.stderr[-1500:]}")
    wall, cpu = float(match.group(1)), float(match.group(2))
    return {"value": 10 * n / wall, "unit": "msg/s delivered", "cpu_us_per_msg": cpu / n * 1e6}


def measure(cell: tuple[str, str, int], variant: str, trees: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    test, transport, size = cell
    env = _env(variant, trees)
    if test == "pubsub10":
        return _pubsub(variant, trees, env, args.pubsub_n)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # (the workers inherit it)
    try:
        if test == "throughput":
            r = throughput.measure("nanopy", "sync", transport, size, args.warmup, args.duration)
            if not r.get("complete"):
                raise RuntimeError("incomplete run")
            return {"value": r["msgs_per_s"], "unit": "msg/s", "cpu_us_per_msg": r["cpu_us_per_msg"]}
        r = latency.measure("nanopy", "sync", transport, size, args.warmup, args.duration)
        return {"value": r["one_way_us"], "unit": "us one-way", "cpu_us_per_msg": r.get("cpu_us_per_rtt")}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-commit", required=True, help="the commit to compare against (before the change)")
    p.add_argument("--new-commit", default="HEAD", help="the commit measured as new (default HEAD)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--duration", type=float, default=1.0)
    p.add_argument("--pubsub-n", type=int, default=200_000, help="messages per subscriber in the pubsub cell")
    p.add_argument("--cells", default=",".join(f"{t}/{tr}/{s}" for t, tr, s in CELLS))
    p.add_argument("--output", default=None, help="JSON lines of every run")
    args = p.parse_args()
    cells = [(t, tr, int(s)) for t, tr, s in (c.split("/") for c in args.cells.split(","))]
    with tempfile.TemporaryDirectory(prefix="nanopy-overhead-") as top:
        trees = {name: os.path.join(top, name) for name in ("base", "new", "hook")}
        for name, commit in (("base", args.base_commit), ("new", args.new_commit)):
            os.mkdir(trees[name])
            archive = subprocess.run(["git", "-C", ROOT, "archive", commit], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", trees[name]], input=archive.stdout, check=True)
        os.mkdir(trees["hook"])
        with open(os.path.join(trees["hook"], "sitecustomize.py"), "w") as f:
            f.write(HOOK)
        runs: list[dict[str, Any]] = []
        out = open(args.output, "w") if args.output else None
        try:
            for rnd in range(args.rounds):
                for ci, cell in enumerate(cells):
                    k = (rnd + ci) % len(VARIANTS)
                    for variant in VARIANTS[k:] + VARIANTS[:k]:
                        try:
                            res = measure(cell, variant, trees, args)
                        except Exception as exc:  # noqa: BLE001 - recorded and left out
                            res = {"error": f"{type(exc).__name__}: {exc}"}
                        rec = {"round": rnd, "cell": "/".join(map(str, cell)), "variant": variant,
                               "load": os.getloadavg()[0], "t": time.time(), **res}
                        runs.append(rec)
                        if out:
                            out.write(json.dumps(rec) + "\n")
                            out.flush()
                        print(json.dumps(rec), file=sys.stderr, flush=True)
        finally:
            if out:
                out.close()
    report(runs, cells)


def report(runs: list[dict[str, Any]], cells: list[tuple[str, str, int]]) -> None:
    print(f"{'cell':22} {'variant':8} {'median':>12} {'min':>12} {'max':>12}  "
          "paired ratio vs base, median [min..max]: figure; CPU per message")
    for cell in cells:
        name = "/".join(map(str, cell))
        by = {v: {r["round"]: r for r in runs if r["cell"] == name and r["variant"] == v and "value" in r}
              for v in VARIANTS}
        for v in VARIANTS:
            vals = [r["value"] for r in by[v].values()]
            if not vals:
                print(f"{name:22} {v:8} (no successful run)")
                continue
            unit = next(iter(by[v].values()))["unit"]
            ratio = _ratios(by, v, "value") + "; " + _ratios(by, v, "cpu_us_per_msg") if v != "base" else ""
            print(f"{name:22} {v:8} {_median(vals):12.1f} {min(vals):12.1f} {max(vals):12.1f}  {ratio}  ({unit})")


def _ratios(by: dict[str, dict[int, dict[str, Any]]], variant: str, key: str) -> str:
    """The paired ratios variant / base of ``key`` (same round), as median [min..max]."""
    ratios = [r[key] / by["base"][rnd][key] for rnd, r in by[variant].items()
              if rnd in by["base"] and r.get(key) and by["base"][rnd].get(key)]
    if not ratios:
        return "-"
    return f"{_median(ratios):.3f} [{min(ratios):.3f}..{max(ratios):.3f}]"


if __name__ == "__main__":
    main()
