"""Quality gates: ruff (rule set in pyproject.toml) and ``mypy --strict nanopy`` run clean.

Each runs as a subprocess of the tool in this interpreter's environment; a tool
that is not installed skips its test (both are in the ``test`` extra). The mypy
gate gives the same answer with and without every optional extra: it also runs
against environments that see every installed package but one extra's (and one
without any), as a venv holding only ``nanopy`` and mypy would.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

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


def _env_without(hidden: tuple[str, ...], dest: Path) -> Path:
    """A bare venv whose site-packages links every package installed here except ``hidden``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    python = dest / "bin" / "python"
    target = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip())
    for site_dir in [Path(p) for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]:
        for entry in site_dir.iterdir():
            name = entry.name.lower()
            if name.startswith(hidden) or name.endswith(".pth") or name.startswith("__editable__"):
                continue
            link = target / entry.name
            if not link.exists():
                link.symlink_to(entry)
    return python


#: the site-packages names each optional extra installs that nanopy imports
EXTRAS: dict[str, tuple[str, ...]] = {
    "ws": ("websockets",),
    "curve": ("nacl", "pynacl"),
    "spark": ("pyspark", "pyarrow", "py4j"),
    "prometheus": ("prometheus_client",),
    "otel": ("opentelemetry",),
    "portable": ("ifaddr",),
}
_EVERY_EXTRA = tuple(name for names in EXTRAS.values() for name in names)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "hidden",
    [_EVERY_EXTRA, ("pyspark", "py4j"), *EXTRAS.values()],
    ids=["without-every-extra", "pyarrow-without-pyspark", *(f"without-{extra}" for extra in EXTRAS)],
)
def test_mypy_strict_answer_does_not_depend_on_the_extras(hidden: tuple[str, ...], tmp_path: Path) -> None:
    python = _env_without(hidden, tmp_path / "venv")
    done = _run("mypy", "--strict", "--no-incremental", "--python-executable", str(python), "-p", "nanopy")
    assert done.returncode == 0, done.stdout + done.stderr
