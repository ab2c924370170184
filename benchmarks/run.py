"""Run the nanopy / pynng / pyzmq benchmark suite and print a comparison table.

    .venv/bin/python benchmarks/run.py            # default: 3 rounds, ~4-5 minutes
    .venv/bin/python benchmarks/run.py --quick    # 3 short rounds, ~2 minutes
    .venv/bin/python benchmarks/run.py --tests throughput --transports tcp --sizes 64
    .venv/bin/python benchmarks/run.py --plot chart.png   # also draw the comparison (matplotlib)
    # the zmtp column: nanopy<->nanopy over zmtp+tcp, nanopy<->pyzmq both ways, pyzmq<->pyzmq
    .venv/bin/python benchmarks/run.py --tests throughput --transports tcp,zmtp \
        --variants 'nanopy/sync,pyzmq/sync,nanopy>pyzmq/sync,pyzmq>nanopy/sync'

Every cell (test x transport x size) is measured for every variant in every
round, and the variants take turns (their order rotates between rounds), so load
from other jobs on a shared machine hits all systems alike. Figures are medians
over rounds; ratios compare nanopy with pyzmq and pynng from the same run. The
table goes to stdout, progress to stderr, all raw runs to
``benchmarks/results/bench-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import latency
import throughput
from _common import HERE, VARIANTS, loadavg, median, now_utc, variant_name, versions

TARGETS = [
    # (label, test, transport, size, api, versus, comparison, goal): the engine
    # redesign's goals (issue 11); PUB/SUB and ws have their own scripts.
    ("sync tcp 64 B throughput vs pyzmq", "throughput", "tcp", 64, "sync", "pyzmq/sync", ">=", 0.7),
    ("sync tcp 1 KiB throughput vs pyzmq", "throughput", "tcp", 1024, "sync", "pyzmq/sync", ">=", 0.8),
    ("sync inproc 64 B throughput vs pyzmq", "throughput", "inproc", 64, "sync", "pyzmq/sync", ">=", 0.7),
    ("sync tcp one-way latency vs pynng", "latency", "tcp", 64, "sync", "pynng/sync", "<=", 1.0),
    ("sync tcp one-way latency vs pyzmq", "latency", "tcp", 64, "sync", "pyzmq/sync", "<=", 2.0),
    ("sync ipc one-way latency vs pynng", "latency", "ipc", 64, "sync", "pynng/sync", "<=", 1.0),
    ("sync ipc one-way latency vs pyzmq", "latency", "ipc", 64, "sync", "pyzmq/sync", "<=", 2.0),
    ("trio tcp 64 B throughput vs pynng trio", "throughput", "tcp", 64, "trio", "pynng/trio", ">=", 20.0),
    # issue 36: a round trip below pyzmq's; send_batch + recv_batch against pyzmq's plain send/recv
    ("issue 36: sync tcp one-way latency vs pyzmq", "latency", "tcp", 64, "sync", "pyzmq/sync", "<=", 0.9),
    ("issue 36: sync tcp one-way latency vs pynng", "latency", "tcp", 64, "sync", "pynng/sync", "<=", 0.6),
    ("issue 36: sync ipc one-way latency vs pyzmq", "latency", "ipc", 64, "sync", "pyzmq/sync", "<=", 0.9),
    ("issue 36: sync ipc one-way latency vs pynng", "latency", "ipc", 64, "sync", "pynng/sync", "<=", 0.6),
    ("batch tcp 64 B throughput vs pyzmq", "throughput", "tcp", 64, "batch", "pyzmq/sync", ">=", 2.0),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short windows (a few seconds per cell in all)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median over them)")
    p.add_argument("--warmup", type=float, default=None, help="seconds before each timed window")
    p.add_argument("--duration", type=float, default=None, help="seconds of each timed window")
    p.add_argument("--tests", default="throughput,latency")
    p.add_argument("--transports", default="tcp,ipc,inproc")
    p.add_argument("--sizes", default="64,1024", help="throughput message sizes in bytes")
    p.add_argument("--variants", default=",".join(variant_name(*v) for v in VARIANTS),
                   help="system/api pairs, e.g. nanopy/sync,pyzmq/sync")
    p.add_argument("--max-rtts", type=int, default=200_000, help="cap on timed round trips per run")
    p.add_argument("--output", default=None, help="JSON output path (default benchmarks/results/...)")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw nanopy vs pyzmq and pynng per scenario (needs matplotlib: the bench extra)")
    args = p.parse_args(argv)
    if args.warmup is None:
        args.warmup = 0.2 if args.quick else 0.5
    if args.duration is None:
        args.duration = 0.4 if args.quick else 1.0
    return args


def plan(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    tests = [t.strip() for t in args.tests.split(",") if t.strip()]
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    cells: list[tuple[str, str, int]] = []
    for test in tests:
        if test == "throughput":
            cells += [(test, tr, size) for tr in transports for size in sizes]
        elif test == "latency":
            cells += [(test, tr, 64) for tr in transports if tr != "inproc"]
        else:
            raise SystemExit(f"unknown test {test!r} (throughput, latency)")
    return cells


def run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    variants = [tuple(v.split("/")) for v in args.variants.split(",") if v.strip()]
    cells = plan(args)
    runs: list[dict[str, Any]] = []
    total = args.rounds * sum(1 for test, tr, _ in cells for system, api in variants if _runs(system, api, test, tr))
    done = 0
    started = time.monotonic()
    for rnd in range(args.rounds):
        for ci, (test, transport, size) in enumerate(cells):
            # Rotate who goes first, per round and per cell.
            k = (rnd + ci) % len(variants)
            for system, api in variants[k:] + variants[:k]:
                if not _runs(system, api, test, transport):
                    continue
                t = time.monotonic()
                try:
                    if test == "throughput":
                        rec = throughput.measure(system, api, transport, size, args.warmup, args.duration)
                    else:
                        rec = latency.measure(system, api, transport, size, args.warmup, args.duration, args.max_rtts)
                except Exception as exc:  # noqa: BLE001 -- any failure is recorded, the suite goes on
                    rec = {"test": test, "system": system, "api": api, "transport": transport,
                           "size": size, "error": f"{type(exc).__name__}: {exc}"[:2000], "loadavg": loadavg()}
                rec["round"] = rnd
                rec["wall_s"] = time.monotonic() - t
                runs.append(rec)
                done += 1
                _progress(rec, done, total, time.monotonic() - started)
    return runs


def _runs(system: str, api: str, test: str, transport: str) -> bool:
    """Whether a variant has a run in a cell: a mixed pair (nanopy>pyzmq) speaks ZMTP,
    so zmtp throughput cells only; the ``batch`` api (nanopy) is a throughput loop."""
    if ">" in system and (transport != "zmtp" or test != "throughput"):
        return False
    return api != "batch" or test == "throughput"


def _progress(rec: dict[str, Any], done: int, total: int, elapsed: float) -> None:
    head = f"[{done}/{total} {elapsed:5.0f}s] r{rec['round']} {rec['test']:<10} {rec['transport']:<6} {rec['size']:>5} B {rec['system']}/{rec['api']:<5}"
    if "error" in rec:
        tail = f"ERROR {rec['error'][:300]}"
    elif rec["test"] == "throughput":
        tail = f"{rec['msgs_per_s']:>11,.0f} msg/s  cpu {rec['cpu_us_per_msg']:6.2f} us/msg  {'ok' if rec['complete'] else 'INCOMPLETE'}"
    else:
        tail = f"one-way {rec['one_way_us']:7.1f} us  p50 {rec['one_way_p50_us']:7.1f}  p99 {rec['one_way_p99_us']:7.1f}  ({rec['rtts']} rtts)"
    print(f"{head} {tail}  load {rec['loadavg']:.1f}", file=sys.stderr, flush=True)


# -- aggregation -----------------------------------------------------------------------------


def _ok(r: dict[str, Any]) -> bool:
    return "error" not in r and r.get("complete", False)


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (test, transport, size, variant): medians, ranges, ratios."""
    keys: list[tuple[str, str, int, str, str]] = []
    for r in runs:
        k = (r["test"], r["transport"], r["size"], r["system"], r["api"])
        if k not in keys:
            keys.append(k)
    # Stable order: tests and transports as first run, then size, then VARIANTS order.
    tests = list(dict.fromkeys(k[0] for k in keys))
    transports = list(dict.fromkeys(k[1] for k in keys))
    order = {v: i for i, v in enumerate(VARIANTS)}
    keys.sort(key=lambda k: (tests.index(k[0]), transports.index(k[1]), k[2], order.get((k[3], k[4]), 99)))
    rows = []
    for test, transport, size, system, api in keys:
        mine = [r for r in runs if (r["test"], r["transport"], r["size"], r["system"], r["api"]) == (test, transport, size, system, api)]
        good = [r for r in mine if _ok(r)]
        row: dict[str, Any] = {"test": test, "transport": transport, "size": size, "system": system,
                               "api": api, "variant": variant_name(system, api), "n": len(good), "runs": len(mine)}
        metric = "msgs_per_s" if test == "throughput" else "one_way_us"
        cpu = "cpu_us_per_msg" if test == "throughput" else "cpu_us_per_rtt"
        values = [r[metric] for r in good]
        row["metric"] = metric
        row["median"] = median(values)
        row["min"] = min(values) if values else float("nan")
        row["max"] = max(values) if values else float("nan")
        row["cpu_median"] = median([r[cpu] for r in good])
        if test == "throughput":
            row["mb_per_s"] = median([r["mb_per_s"] for r in good])
            row["sender_msgs_per_s"] = median([r["sender_msgs_per_s"] for r in good])
            if good and good[0].get("cpu_recv_us_per_msg") is not None:
                row["cpu_recv_median"] = median([r["cpu_recv_us_per_msg"] for r in good])
                row["cpu_send_median"] = median([r["cpu_send_us_per_msg"] for r in good])
        else:
            for extra in ("one_way_p50_us", "one_way_p99_us", "rtt_p50_us", "rtt_p99_us"):
                row[extra] = median([r[extra] for r in good])
        row["errors"] = [r["error"] for r in mine if "error" in r]
        row["incomplete"] = sum(1 for r in mine if "error" not in r and not r.get("complete"))
        rows.append(row)
    by_key = {(r["test"], r["transport"], r["size"], r["variant"]): r for r in rows}
    for row in rows:
        if row["system"] != "nanopy":
            continue
        for versus in ("pyzmq/sync", "pynng/sync", "pynng/trio"):
            other = by_key.get((row["test"], row["transport"], row["size"], versus))
            if other is None:
                continue
            row[f"ratio_vs_{versus}"] = row["median"] / other["median"] if other["median"] else float("nan")
            row[f"cpu_ratio_vs_{versus}"] = row["cpu_median"] / other["cpu_median"] if other["cpu_median"] else float("nan")
            row[f"paired_ratio_vs_{versus}"] = _paired(runs, row, versus)
    return rows


def _paired(runs: list[dict[str, Any]], row: dict[str, Any], versus: str) -> float:
    """Median over rounds of the within-round ratio (cancels slow load drift)."""
    metric = row["metric"]
    ratios = []
    for rnd in sorted({r["round"] for r in runs}):
        a = b = None
        for r in runs:
            if r["round"] != rnd or not _ok(r) or (r["test"], r["transport"], r["size"]) != (row["test"], row["transport"], row["size"]):
                continue
            v = variant_name(r["system"], r["api"])
            if v == row["variant"]:
                a = r[metric]
            elif v == versus:
                b = r[metric]
        if a is not None and b:
            ratios.append(a / b)
    return median(ratios)


def check_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    by_key = {(r["test"], r["transport"], r["size"], r["variant"]): r for r in rows}
    for label, test, transport, size, api, versus, cmp, goal in TARGETS:
        row = by_key.get((test, transport, size, f"nanopy/{api}"))
        if row is None or f"ratio_vs_{versus}" not in row:
            continue
        ratio = row[f"ratio_vs_{versus}"]
        met = ratio >= goal if cmp == ">=" else ratio <= goal
        out.append({"target": label, "goal": f"{cmp} {goal}x", "ratio": ratio,
                    "paired_ratio": row[f"paired_ratio_vs_{versus}"],
                    "cpu_ratio": row[f"cpu_ratio_vs_{versus}"], "met": met})
    return out


# -- output -----------------------------------------------------------------------------------


def _fmt(v: float, digits: int = 0) -> str:
    if math.isnan(v):
        return "-"
    if digits == 0:
        return f"{v:,.0f}"
    return f"{v:,.{digits}f}"


def _ratio(row: dict[str, Any], versus: str) -> str:
    v = row.get(f"ratio_vs_{versus}")
    return "" if v is None or math.isnan(v) else f"{v:.2f}x"


def _cpu_ratio(row: dict[str, Any], versus: str) -> str:
    v = row.get(f"cpu_ratio_vs_{versus}")
    return "" if v is None or math.isnan(v) else f"{v:.2f}x"


def _split(row: dict[str, Any]) -> str:
    if "cpu_recv_median" not in row:
        return "(1 proc)"
    return f"{row['cpu_recv_median']:.2f}+{row['cpu_send_median']:.2f}"


def _same_api_nng(row: dict[str, Any]) -> str:
    return "pynng/trio" if row["api"] == "trio" else "pynng/sync"  # (batch: against pynng's sync loop)


def render(rows: list[dict[str, Any]], targets: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    add(f"nanopy benchmark  {meta['started']}  rounds={meta['args']['rounds']} warmup={meta['args']['warmup']}s "
        f"window={meta['args']['duration']}s  load {meta['load_start']:.1f} -> {meta['load_end']:.1f}")
    src = meta.get("source") or {}
    add("  " + "  ".join(f"{k} {v}" for k, v in meta["versions"].items())
        + (f"  commit {src.get('commit')}{' (nanopy/ modified)' if src.get('nanopy_dirty') else ''}" if src else ""))
    add("")
    tp = [r for r in rows if r["test"] == "throughput"]
    if tp:
        add("PUSH -> PULL throughput, at the receiver (median of rounds; min-max; CPU = both ends per message, "
            "recv+send = each process's share)")
        add("x ratios: nanopy / other (higher is better for msgs/s, lower is better for CPU); "
            "'vs pynng' compares the same api (sync with sync, trio with trio)")
        hdr = f"{'transport':<9} {'size':>5}  {'variant':<12} {'msgs/s':>10} {'min-max':>21} {'MB/s':>7} {'CPU us/msg':>10} {'recv+send':>11}  {'vs pyzmq':>8} {'vs pynng':>8}  {'CPU vs zmq':>10} {'CPU vs nng':>10}  {'ok':>4}"
        add(hdr)
        add("-" * len(hdr))
        last = None
        for r in tp:
            cell = (r["transport"], r["size"])
            if last is not None and cell != last:
                add("")
            last = cell
            add(f"{r['transport']:<9} {r['size']:>5}  {r['variant']:<12} {_fmt(r['median']):>10} "
                f"{_fmt(r['min']) + '-' + _fmt(r['max']):>21} {_fmt(r['mb_per_s'], 1):>7} {_fmt(r['cpu_median'], 2):>10} {_split(r):>11}  "
                f"{_ratio(r, 'pyzmq/sync'):>8} {_ratio(r, _same_api_nng(r)):>8}  "
                f"{_cpu_ratio(r, 'pyzmq/sync'):>10} {_cpu_ratio(r, _same_api_nng(r)):>10}  {r['n']}/{r['runs']:<2}")
        add("")
    lat = [r for r in rows if r["test"] == "latency"]
    if lat:
        add("PAIR ping-pong, 64 B, two processes: one-way latency = round trip / 2 in us (median of rounds; lower is better)")
        hdr = f"{'transport':<9} {'variant':<12} {'mean':>8} {'min-max':>15} {'p50':>8} {'p99':>8} {'CPU us/rtt':>10}  {'vs pyzmq':>8} {'vs pynng':>8}  {'CPU vs zmq':>10} {'CPU vs nng':>10}  {'ok':>4}"
        add(hdr)
        add("-" * len(hdr))
        last = None
        for r in lat:
            if last is not None and r["transport"] != last:
                add("")
            last = r["transport"]
            add(f"{r['transport']:<9} {r['variant']:<12} {_fmt(r['median'], 1):>8} "
                f"{_fmt(r['min'], 1) + '-' + _fmt(r['max'], 1):>15} {_fmt(r['one_way_p50_us'], 1):>8} {_fmt(r['one_way_p99_us'], 1):>8} "
                f"{_fmt(r['cpu_median'], 1):>10}  {_ratio(r, 'pyzmq/sync'):>8} {_ratio(r, _same_api_nng(r)):>8}  "
                f"{_cpu_ratio(r, 'pyzmq/sync'):>10} {_cpu_ratio(r, _same_api_nng(r)):>10}  {r['n']}/{r['runs']:<2}")
        add("")
    if targets:
        add("Targets (issues 11, 36): ratio of medians; paired = median of per-round ratios; CPU = CPU-per-message ratio")
        for t in targets:
            add(f"  {'MET ' if t['met'] else 'MISS'} {t['target']:<40} goal {t['goal']:<7} got {t['ratio']:.2f}x "
                f"(paired {t['paired_ratio']:.2f}x, CPU {t['cpu_ratio']:.2f}x)")
        add("")
    problems = [(r["variant"], r["test"], r["transport"], r["size"], r["errors"], r["incomplete"]) for r in rows if r["errors"] or r["incomplete"]]
    if problems:
        add("Failed or incomplete runs:")
        for variant, test, transport, size, errors, incomplete in problems:
            add(f"  {variant} {test} {transport} {size} B: {incomplete} incomplete; {'; '.join(e[:200] for e in errors)}")
    return "\n".join(lines)


def source_state() -> dict[str, Any]:
    """The git commit measured, and whether nanopy/ had uncommitted changes."""
    import subprocess

    root = os.path.dirname(HERE)
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10, check=False).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "nanopy"],
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit, "nanopy_dirty": bool(dirty)}


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"platform": platform.platform(), "nproc": os.cpu_count(),
                            "python": sys.executable, "switchinterval": sys.getswitchinterval()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    meta: dict[str, Any] = {"started": now_utc(), "args": vars(args), "versions": versions(),
                            "machine": machine(), "source": source_state(), "load_start": loadavg()}
    runs = run_all(args)
    meta["finished"] = now_utc()
    meta["load_end"] = loadavg()
    rows = summarize(runs)
    targets = check_targets(rows)
    print(render(rows, targets, meta))
    out = args.output or os.path.join(HERE, "results", f"bench-{meta['started'].replace(':', '')}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    result = {"meta": meta, "summary": rows, "targets": targets, "runs": runs}
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"\nJSON: {out}")
    if args.plot:
        import plot

        plot.plot(json.loads(json.dumps(result, default=str)), args.plot)
        print(f"chart: {args.plot}")
    return 0 if all(r["n"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
