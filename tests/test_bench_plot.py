"""benchmarks/run.py --plot: the chart is drawn from a run's results (no benchmark runs here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def _row(test: str, transport: str, size: int, variant: str, median: float) -> dict[str, Any]:
    system, api = variant.split("/")
    return {"test": test, "transport": transport, "size": size, "system": system, "api": api,
            "variant": variant, "median": median, "n": 3}


def test_plot_draws_each_scenario(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import plot

    rows = []
    for variant, rate, lat in (("nanopy/sync", 300e3, 90.0), ("pyzmq/sync", 700e3, 40.0),
                               ("pynng/sync", 25e3, 70.0)):
        rows += [_row("throughput", "tcp", 64, variant, rate), _row("throughput", "ipc", 1024, variant, rate / 2),
                 _row("latency", "tcp", 64, variant, lat)]
    result = {"summary": rows, "meta": {"started": "2026-11-24T00:00:00Z", "versions": {"nanopy": "0.1.0"},
                                        "args": {"rounds": 3}, "machine": {"nproc": 2}}}
    assert [label for label, _ in plot._scenarios(rows, "throughput")] == ["tcp\n64 B", "ipc\n1 KiB"]
    out = tmp_path / "chart.png"
    plot.plot(result, str(out))
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG") and 10_000 < len(data) < 300_000


def test_run_offers_plot() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--plot" in out.stdout


def test_committed_chart_is_small() -> None:
    chart = ROOT / "docs" / "images" / "performance.png"
    assert chart.read_bytes().startswith(b"\x89PNG")
    assert chart.stat().st_size < 200_000
