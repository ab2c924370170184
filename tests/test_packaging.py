"""The package a user gets: README's first command, the wheel, types, CI's command.

* README's first command, run as written in a copy of the repository, prints the
  demo's result and leaves a venv under 60 MB.
* ``.ci/run`` runs README's second command exactly.
* The wheel holds py.typed and the license; installed (not editable) into a clean
  venv it runs the ``nanopy`` command and a PUSH/PULL, and ``mypy --strict`` sees
  its types (``Socket.recv`` returns ``bytes``) through the installed package.

These tests use the package index (pip downloads trio, setuptools for the build),
as the README's commands do.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

import nanopy

ROOT = Path(__file__).resolve().parent.parent
VENV_LIMIT_MB = 60


def _readme_command(number: int) -> str:
    """The command line under README's ``# N.`` comment."""
    lines = (ROOT / "README.md").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"# {number}. "):
            for cmd in lines[i + 1:]:
                if cmd.strip() and not cmd.startswith("#"):
                    return cmd.strip()
    raise AssertionError(f"README.md has no command {number}")


def _source_copy(dest: Path) -> Path:
    """The repository's files as a fresh clone has them (tracked and new, no venv, no caches)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = raw.decode()
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _size_mb(path: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                total += os.stat(p).st_blocks * 512  # what du counts
    return total / 1e6


def _run(argv: list[str] | str, cwd: Path, timeout: float, **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]


def test_ci_runs_readme_command_2_exactly() -> None:
    command = _readme_command(2)
    assert command.endswith("pytest"), "pytest must come last so its summary line ends the CI log"
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    steps = [line for line in script if line.strip() and not line.lstrip().startswith("#")]
    assert steps[-1] == command


def test_supported_pythons_are_declared_and_each_one_tested() -> None:
    """Classifiers list what CI runs: 3.11 (the whole suite) and the quick tier on the
    others; the test extra alone must carry the suite (setuptools: plug-in tests)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pattern = r"Programming Language :: Python :: 3\.\d+"
    versions = sorted(c.rsplit(" ", 1)[1] for c in project["classifiers"] if re.fullmatch(pattern, c))
    assert versions == ["3.11", "3.12", "3.13"]
    assert any(dep.startswith("setuptools") for dep in project["optional-dependencies"]["test"])
    script = ROOT / ".ci" / "other-pythons-then"
    assert os.access(script, os.X_OK)
    assert " .ci/other-pythons-then .venv/bin/python -m pytest" in _readme_command(2)
    assert "for version in " + " ".join(versions[1:]) + "; do" in script.read_text()


def test_version_is_the_distribution_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert nanopy.__version__ == project["version"]
    assert "Typing :: Typed" in project["classifiers"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert (ROOT / "nanopy" / "py.typed").is_file()


@pytest.mark.timeout(600)
def test_readme_first_command(tmp_path: Path) -> None:
    command = _readme_command(1)
    assert "[spark]" not in command and "[all]" not in command
    repo = _source_copy(tmp_path / "nanopy")
    started = time.monotonic()
    proc = _run(["bash", "-euo", "pipefail", "-c", command], repo, timeout=540)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, f"command 1 failed:\n{proc.stdout}\n{proc.stderr}"
    assert "DEMO OK" in proc.stdout
    size = _size_mb(repo / ".venv")
    print(f"README command 1: {elapsed:.1f} s, venv {size:.1f} MB")
    assert size < VENV_LIMIT_MB, f"command 1 made a {size:.0f} MB venv (limit {VENV_LIMIT_MB} MB)"


# -- the wheel, in a clean venv ----------------------------------------------------------------


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, python of a clean venv where the wheel is installed, not editable)."""
    work = tmp_path_factory.mktemp("wheel")
    src = _source_copy(work / "src")
    dist = work / "dist"
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
                work, timeout=300)
    assert proc.returncode == 0, f"building the wheel failed:\n{proc.stdout}\n{proc.stderr}"
    (wheel,) = dist.glob("nanopy-*.whl")
    venv = work / "venv"
    proc = _run([sys.executable, "-m", "venv", str(venv)], work, timeout=120)
    assert proc.returncode == 0, proc.stderr
    python = venv / "bin" / "python"
    proc = _run([str(python), "-m", "pip", "install", "-q", str(wheel)], work, timeout=300)
    assert proc.returncode == 0, f"installing the wheel failed:\n{proc.stdout}\n{proc.stderr}"
    return wheel, python


@pytest.mark.timeout(600)
def test_wheel_contents(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "nanopy/py.typed" in names
    assert any(re.match(r"nanopy-[^/]+\.dist-info/(licenses/)?LICENSE$", n) for n in names), names
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/", "docs/")) for n in names)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    assert b"Classifier: Typing :: Typed" in metadata
    assert b"Provides-Extra: ws" in metadata
    # nanopy.metrics: the extras its error messages name
    assert b"Provides-Extra: prometheus" in metadata and b"Provides-Extra: otel" in metadata


SMOKE = """
import subprocess, sys, os
import nanopy

assert "site-packages" in nanopy.__file__, nanopy.__file__   # the installed copy, not the source tree
with nanopy.Socket("pull", recv_timeout=10.0) as pull, nanopy.Socket("push") as push:
    ep = pull.bind("tcp://127.0.0.1:0")
    push.connect(ep.url)
    push.send(b"from the wheel")
    assert pull.recv() == b"from the wheel"
    # the console script, talking to this process
    cli = os.path.join(os.path.dirname(sys.executable), "nanopy")
    subprocess.run([cli, "cat", "--push", "--connect", ep.url, "--data", "from the cli"], check=True, timeout=30)
    assert pull.recv() == b"from the cli"
print("SMOKE OK", nanopy.__version__)
"""


@pytest.mark.timeout(600)
def test_installed_wheel_runs_cli_and_push_pull(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, python = installed
    help_run = _run([str(python.parent / "nanopy"), "--help"], tmp_path, timeout=60)
    assert help_run.returncode == 0 and "cat" in help_run.stdout, help_run.stdout + help_run.stderr
    smoke = _run([str(python), "-c", SMOKE], tmp_path, timeout=120)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert f"SMOKE OK {nanopy.__version__}" in smoke.stdout


USER_SCRIPT = """
import nanopy

def fetch(url: str) -> bytes:
    with nanopy.Socket(nanopy.REQ, recv_timeout=1.0) as sock:
        sock.send_timeout = 0.5                 # options are typed attributes
        assert sock.send_buffer + 1 > 1
        sock.connect(url)
        reply = sock.request(b"hello")
        data = sock.recv(timeout=0.5)
        reveal_type(data)
        return reply + data
"""

USER_BUG = """
import nanopy

def fetch() -> str:
    with nanopy.Socket("pull") as sock:
        return sock.recv()      # bytes, not str: mypy must say so
"""


@pytest.mark.timeout(600)
def test_mypy_strict_sees_the_installed_types(installed: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    _, python = installed
    (tmp_path / "user.py").write_text(USER_SCRIPT)
    (tmp_path / "bug.py").write_text(USER_BUG)
    base = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-executable", str(python)]
    ok = _run([*base, "user.py"], tmp_path, timeout=300)
    assert re.search(r'Revealed type is "(builtins\.)?bytes"', ok.stdout), ok.stdout + ok.stderr
    assert "error" not in ok.stdout, ok.stdout  # a correct script passes --strict
    bad = _run([*base, "bug.py"], tmp_path, timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert 'Incompatible return value type (got "bytes", expected "str")' in bad.stdout, bad.stdout


def test_nanopy_bench_says_which_extra_gives_the_comparison() -> None:
    proc = _run([sys.executable, "-m", "nanopy", "bench", "--transport", "inproc", "--seconds", "0.2"],
                ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "nanopy[bench]" in proc.stderr and "benchmarks/run.py" in proc.stderr
    assert "nanopy[bench]" not in proc.stdout  # stdout is the table alone
