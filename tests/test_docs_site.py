"""The documentation site (Sphinx + MyST, docs/conf.py) builds without a warning.

Its API reference lists every name in ``nanopy.__all__`` with its docstring, the
performance page shows the benchmark chart, and every public callable documents
its arguments, return value and errors (Google style: Args/Returns/Raises).
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nanopy

ROOT = Path(__file__).resolve().parent.parent


def _require(module: str) -> None:
    # Part of the "docs" extra (in "all"); CI must have it, a developer may not.
    if os.environ.get("CI"):
        __import__(module)
    else:
        pytest.importorskip(module)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _require("sphinx")
    _require("myst_parser")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(out / "doctrees"), str(ROOT / "docs"), str(out / "html")],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert proc.returncode == 0, f"sphinx build failed or warned:\n{proc.stdout}\n{proc.stderr}"
    return out / "html"


@pytest.mark.timeout(300)
def test_site_builds_without_warnings(site: Path) -> None:
    for page in ("index", "reference", "api", "performance"):
        assert (site / f"{page}.html").is_file()
    # Every guide in docs/ is a page of the site (none is left out of the toctree).
    for md in (ROOT / "docs").glob("*.md"):
        assert (site / f"{md.stem}.html").is_file(), f"{md.name} is not part of the site"


@pytest.mark.timeout(300)
def test_reference_lists_every_public_name(site: Path) -> None:
    html = (site / "reference.html").read_text()
    missing = [name for name in nanopy.__all__ if f'id="nanopy.{name}"' not in html]
    assert not missing, f"not in the API reference: {missing}"
    text = re.sub(r"<[^>]+>", "", html)
    # Docstrings are there, including the option table's part of Socket's.
    assert "A scalability-protocols socket." in text
    assert "recv_buffer" in text and "SUB never stops reading" in " ".join(text.split())
    assert "object at 0x" not in text


@pytest.mark.timeout(300)
def test_performance_page_shows_the_chart(site: Path) -> None:
    html = (site / "performance.html").read_text()
    images = re.findall(r'<img[^>]+src="([^"]+\.png)"', html)
    assert images, "docs/performance.md shows no chart"
    for src in images:
        assert (site / src).is_file(), f"{src} is not in the built site"


@pytest.mark.timeout(300)
def test_protocols_page_draws_the_state_diagrams(site: Path) -> None:
    # The Mermaid fences generated from the protocol tables (nanopy.protocols._diagram)
    # become diagrams; their transition tables follow them as HTML tables.
    _require("sphinxcontrib.mermaid")
    from nanopy.protocols._diagram import TABLES

    html = (site / "protocols.html").read_text()
    assert html.count('class="mermaid"') == len(TABLES)
    assert "stateDiagram-v2" in html and "pipe_lost, resend" in html


# -- docstrings -------------------------------------------------------------------------------

# Made by nanopy, never by users: their constructors' arguments are not API (the class
# docstrings list the attributes instead).
MADE_BY_NANOPY = {"Endpoint", "Message", "Peer", "Pipe", "PipeStats", "SocketStats"}


def _public_callables() -> Iterator[tuple[str, Any]]:
    for name in nanopy.__all__:
        obj = getattr(nanopy, name)
        if isinstance(obj, str):
            continue
        yield name, obj
        if not inspect.isclass(obj):
            continue
        for klass in obj.__mro__:
            if not klass.__module__.startswith("nanopy"):
                continue
            for attr, value in vars(klass).items():
                if not attr.startswith("_") and (callable(value) or isinstance(value, property)):
                    yield f"{name}.{attr}", getattr(obj, attr) if not isinstance(value, property) else value


def test_every_public_name_has_a_docstring() -> None:
    missing = [q for q, obj in _public_callables() if not inspect.getdoc(obj)]
    assert not missing, f"public names without a docstring: {missing}"


def test_public_callables_document_args_returns_raises() -> None:
    problems = []
    for qual, obj in _public_callables():
        if isinstance(obj, property) or (inspect.isclass(obj) and issubclass(obj, BaseException)):
            continue
        doc = inspect.getdoc(obj) or ""
        if inspect.isclass(obj):
            if qual in MADE_BY_NANOPY:
                if "Attributes:" not in doc:
                    problems.append(f"{qual}: no Attributes section")
                continue
            target = obj.__init__
        else:
            target = obj
        try:
            sig = inspect.signature(target)
        except (TypeError, ValueError):
            continue
        params = [p for p in sig.parameters if p not in ("self", "cls")]
        if qual.split(".")[0] in MADE_BY_NANOPY and "Engine side" in doc:
            continue  # driven by the engine, not called by users
        if params and "Args:" not in doc:
            problems.append(f"{qual}: no Args section")
        returns = sig.return_annotation
        if not inspect.isclass(obj) and returns not in ("None", None, inspect.Signature.empty) \
                and "Returns:" not in doc:
            problems.append(f"{qual}: no Returns section")
    assert not problems, "\n".join(problems)


def test_blocking_and_async_calls_document_their_errors() -> None:
    for name in ("send", "recv", "recv_msg", "asend", "arecv", "arecv_msg", "request", "arequest",
                 "bind", "connect", "subscribe", "survey"):
        doc = inspect.getdoc(getattr(nanopy.Socket, name)) or ""
        assert "Raises:" in doc and "Closed" in doc, f"Socket.{name} does not say what it raises"
