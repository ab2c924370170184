"""Quality gates: ruff (rule set in pyproject.toml) and ``mypy --strict nanopy`` run clean.

Each runs as a subprocess of the tool in this interpreter's environment; a tool
that is not installed skips its test (both are in the ``test`` extra).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]')")
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(600)
def test_mypy_strict_finds_nothing() -> None:
    done = _run("mypy", "--strict", "--no-incremental", "nanopy")
    assert done.returncode == 0, done.stdout + done.stderr
