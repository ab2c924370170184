"""Draw nanopy against pyzmq and pynng, per scenario, from one benchmark run.

    .venv/bin/python benchmarks/run.py --plot chart.png            # run, then draw
    .venv/bin/python benchmarks/plot.py RESULTS.json chart.png     # draw a saved run

Two panels: PUSH -> PULL throughput (msgs/s, higher is better) and PAIR
ping-pong one-way latency (us, lower is better), one group of bars per
scenario (transport and size), one bar per system, the sync APIs. Each nanopy
bar carries its ratios (nanopy's figure divided by the other's) to pyzmq and
pynng from the same run. Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

SYSTEMS = [  # (variant, label, colour)
    ("nanopy/sync", "nanopy", "#2b6cb0"),
    ("pyzmq/sync", "pyzmq (libzmq, C)", "#a0aec0"),
    ("pynng/sync", "pynng (NNG, C)", "#ed8936"),
]


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def _scenarios(rows: list[dict[str, Any]], test: str) -> list[tuple[str, dict[str, float]]]:
    """[(label, {variant: median})] in the order the run measured them."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        if row["test"] != test or not row.get("n"):
            continue
        label = f"{row['transport']}\n{_size(row['size'])}" if test == "throughput" else row["transport"]
        out.setdefault(label, {})[row["variant"]] = row["median"]
    return [(label, values) for label, values in out.items() if "nanopy/sync" in values]


def _panel(ax: Any, scenarios: list[tuple[str, dict[str, float]]], title: str, unit: str,
           higher_is_better: bool) -> None:
    width = 0.8 / len(SYSTEMS)
    for i, (variant, label, colour) in enumerate(SYSTEMS):
        xs = [k + (i - (len(SYSTEMS) - 1) / 2) * width for k in range(len(scenarios))]
        ys = [values.get(variant, math.nan) for _, values in scenarios]
        ax.bar(xs, ys, width, label=label, color=colour)
    for k, (_, values) in enumerate(scenarios):
        mine = values["nanopy/sync"]
        notes = []
        for variant, short in (("pyzmq/sync", "zmq"), ("pynng/sync", "nng")):
            other = values.get(variant)
            if other:
                notes.append(f"{mine / other:.2f}x {short}")
        x = k - (len(SYSTEMS) - 1) / 2 * width
        ax.annotate("\n".join(notes), (x, mine), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=7, color=SYSTEMS[0][2])
    ax.set_xticks(range(len(scenarios)), [label for label, _ in scenarios], fontsize=8)
    better = "higher is better" if higher_is_better else "lower is better"
    ax.set_title(f"{title}\n({unit}, {better})", fontsize=9)
    ax.margins(y=0.35)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def plot(result: dict[str, Any], path: str) -> None:
    """Write the chart of one run (the JSON that ``run.py`` saves) to ``path`` (PNG)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plotting needs matplotlib: pip install 'nanopy[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    rows = result["summary"]
    throughput = _scenarios(rows, "throughput")
    latency = _scenarios(rows, "latency")
    panels = [p for p in (throughput, latency) if p]
    if not panels:
        raise SystemExit("nothing to plot: the run has no nanopy results")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 1.2, 3.8),
                             gridspec_kw={"width_ratios": [max(len(p), 2.6) for p in panels]})
    axes = list(axes) if len(panels) > 1 else [axes]
    ax_iter = iter(axes)
    if throughput:
        ax = next(ax_iter)
        _panel(ax, throughput, "PUSH → PULL throughput", "messages/s", True)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:.0f}k"))
    if latency:
        _panel(next(ax_iter), latency, "PAIR ping-pong, one way, 64 B", "µs", False)
    meta = result.get("meta", {})
    versions = meta.get("versions", {})
    stamp = " · ".join(f"{k} {v}" for k, v in versions.items() if k in ("nanopy", "pyzmq", "pynng", "python"))
    fig.suptitle(f"nanopy vs pyzmq and pynng, sync APIs, one run ({meta.get('started', '')[:16].replace('T', ' ')} UTC);"
                 " labels: nanopy ÷ other", fontsize=10)
    fig.text(0.5, 0.01, stamp + f" · {meta.get('machine', {}).get('nproc', '?')} cores · median of "
             f"{meta.get('args', {}).get('rounds', '?')} rounds", ha="center", fontsize=7, color="#555")
    axes[0].legend(fontsize=8, loc="upper right", frameon=False)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        plot(json.load(f), argv[1])
    print(f"chart: {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
