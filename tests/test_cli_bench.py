"""``nanopy bench`` runs end to end and prints a figure per transport."""

from __future__ import annotations

import subprocess
import sys


def test_bench_prints_a_row_per_transport() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nanopy", "bench", "--seconds", "0.3", "--transport", "inproc", "--transport", "ipc"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()[1:]]
    assert [r[0] for r in rows] == ["inproc", "ipc"]
    for row in rows:
        assert float(row[1].replace(",", "")) > 0  # msgs/s
        assert float(row[2]) > 0  # one-way latency in us


def test_bench_rejects_bad_size() -> None:
    out = subprocess.run([sys.executable, "-m", "nanopy", "bench", "--size", "0"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "--size" in out.stderr
