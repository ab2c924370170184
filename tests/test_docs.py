"""The documentation is true: every code block of README.md and docs/**/*.md runs.

Rules (docs/contributing.md says the same for authors):

* ```` ```python ```` blocks run as a script each (``sys.executable``, repository root
  as the working directory) and must exit 0 within the time limit.
* ```` ```sh ```` (``bash``, ``shell``) blocks run under ``bash -euo pipefail`` from
  the repository root; ``.venv/bin/`` is read as the running interpreter's bin
  directory, so the commands run against the package under test.
* ```` ```json ```` and ```` ```toml ```` blocks must parse.
* Blocks without a language, or marked ``text``/``console``, are pictures or
  synopses and are not run.
* A block that cannot run here (it installs software, takes minutes, needs a
  cluster) is preceded by ``<!-- docs-test: skip REASON -->``. The reason is
  required; keep such blocks few.

The same file checks that docs/api.md's option table is the one generated from
``nanopy.core.options`` and that help(nanopy.Socket) shows real defaults.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pydoc
import re
import signal
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

import nanopy
from nanopy.core.options import OPTION_TABLE, markdown_table

ROOT = Path(__file__).resolve().parent.parent
BLOCK_TIMEOUT = 150  # seconds for one block (a fresh interpreter; the Spark example starts a JVM)

SKIP_MARK = re.compile(r"<!--\s*docs-test:\s*skip\b(.*?)-->")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
RUN_LANGUAGES = {"python", "py", "python3", "sh", "bash", "shell"}
PARSE_LANGUAGES = {"json", "toml"}


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    skip_reason: str | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    """The fenced code blocks of one Markdown file, with their skip markers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        prev = start - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        mark = SKIP_MARK.search(lines[prev]) if prev >= 0 else None
        language = info.split()[0].lower() if info else ""
        found.append(Block(path, start + 1, language, "\n".join(body) + "\n",
                           mark.group(1).strip() if mark else None))
    return found


ALL_BLOCKS = [b for f in doc_files() for b in blocks_of(f)]
CHECKED = [b for b in ALL_BLOCKS if b.language in RUN_LANGUAGES | PARSE_LANGUAGES]


def test_blocks_found() -> None:
    # A broken parser would make every other test here vacuous.
    assert len([b for b in CHECKED if b.skip_reason is None]) >= 10
    readme_python = [b for b in CHECKED if b.path.name == "README.md" and b.language == "python"]
    assert len(readme_python) >= 3


def test_skip_markers_give_a_reason() -> None:
    for block in ALL_BLOCKS:
        if block.skip_reason is not None:
            assert len(block.skip_reason) >= 10, f"{block.id}: say why the block cannot run"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


#: a block that uses an optional extra runs only where it is installed (the ``test``
#: extra alone must give a green suite): text in the block -> (modules, extra)
NEEDS = {
    "-m sphinx": (("sphinx", "myst_parser"), "docs"),
    "nanopy.spark": (("pyspark", "pyarrow"), "spark"),
}


def missing_extra(code: str) -> str | None:
    """Why ``code`` cannot run here (an optional extra is not installed), or None."""
    for marker, (modules, extra) in NEEDS.items():
        if marker in code:
            absent = [m for m in modules if importlib.util.find_spec(m) is None]
            if absent:
                return f"needs {', '.join(absent)} (pip install -e '.[{extra}]')"
    return None


def test_blocks_needing_an_absent_extra_are_skipped_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(NEEDS, "import no_such_extra", (("no_such_extra",), "nope"))
    assert missing_extra("import no_such_extra\n") == "needs no_such_extra (pip install -e '.[nope]')"
    assert missing_extra("import nanopy\n") is None


@pytest.mark.timeout(BLOCK_TIMEOUT + 30)
@pytest.mark.parametrize("block", CHECKED, ids=[b.id for b in CHECKED])
def test_code_block(block: Block, tmp_path: Path) -> None:
    if block.skip_reason is not None:
        pytest.skip(f"marked in the doc: {block.skip_reason}")
    if (absent := missing_extra(block.code)) is not None:
        pytest.skip(absent)
    if block.language == "json":
        json.loads(block.code)
        return
    if block.language == "toml":
        tomllib.loads(block.code)
        return
    if block.language in ("sh", "bash", "shell"):
        bindir = str(Path(sys.executable).parent)
        script = block.code.replace(".venv/bin/", bindir + "/")
        argv = ["bash", "-euo", "pipefail", "-c", script]
    else:
        script_file = tmp_path / "block.py"
        script_file.write_text(block.code)
        argv = [sys.executable, str(script_file)]
    # Its own session, so a timeout ends the block's background jobs too.
    proc = subprocess.Popen(argv, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{block.id} did not finish in {BLOCK_TIMEOUT}s\n--- stdout\n{out}\n--- stderr\n{err}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, (
        f"{block.id} ({block.language}) exited {proc.returncode}\n--- code\n{block.code}"
        f"--- stdout\n{out}\n--- stderr\n{err}"
    )


# -- options: one table, three views ------------------------------------------------------


def test_api_doc_option_table_is_generated() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    m = re.search(r"<!-- option-table: begin.*?-->\n(.*?)\n<!-- option-table: end -->", text, re.S)
    assert m, "docs/api.md lost its option-table markers"
    assert m.group(1).strip() == markdown_table(), (
        "docs/api.md's option table differs from nanopy/core/options.py; regenerate it with\n"
        '  python -c "from nanopy.core.options import markdown_table; print(markdown_table())"'
    )


def test_socket_help_shows_every_option_and_no_object_reprs() -> None:
    text = pydoc.render_doc(nanopy.Socket, renderer=pydoc.plaintext)
    assert "object at 0x" not in text
    for spec in OPTION_TABLE:
        assert f"{spec.name} ({spec.type}, default {spec.default_text}" in text
        assert spec.doc[1:] in " ".join(text.split())


@pytest.mark.parametrize("spec", OPTION_TABLE, ids=[s.name for s in OPTION_TABLE])
def test_validation_messages_come_from_the_table(spec) -> None:  # type: ignore[no-untyped-def]
    sock = nanopy.Socket("pair")
    try:
        with pytest.raises(TypeError) as info:
            setattr(sock, spec.name, object())
        message = str(info.value)
        assert message.startswith(f"{spec.name} must be")
        if spec.unit == "seconds":
            assert "number of seconds" in message
        assert getattr(sock, spec.name) == (spec.default if spec.name != "name" else "pair")
    finally:
        sock.close()


def test_option_attribute_types_match_the_table() -> None:
    from nanopy.core.options import OptionAttributes

    declared = {name: str(kind) for name, kind in OptionAttributes.__annotations__.items()}
    assert declared == {spec.name: spec.type for spec in OPTION_TABLE}
    assert issubclass(nanopy.Socket, OptionAttributes)  # what type checkers see


def test_sub_recv_buffer_text_says_what_sub_does() -> None:
    doc = nanopy.Socket.__dict__["recv_buffer"].__doc__
    assert "SUB never stops reading" in doc and "oldest" in doc
