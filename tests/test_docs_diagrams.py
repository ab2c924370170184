"""Docs that cannot go stale: docs/protocols.md's state diagrams are the cores' tables.

* Each ``<!-- generated: NAME -->`` region of docs/protocols.md is exactly what
  nanopy.protocols._diagram draws from that table (the failure names the command
  that redraws it), and every table is drawn.
* The drawn tables are the ones the cores step through: each core is driven
  through every legal transition of its table, with the table swapped for a
  recording copy, and its misuse raises the table's own ProtocolError message.
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nanopy import ProtocolError, Timeout
from nanopy.core.base import PipeInfo
from nanopy.core.errors import WouldBlock
from nanopy.core.options import new_options
from nanopy.protocols import _common, _diagram, reqrep, survey
from nanopy.protocols._common import StateTable
from nanopy.protocols.reqrep import RESEND_TICKS, Rep0, Req0
from nanopy.protocols.survey import Respondent0, Surveyor0

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "protocols.md"


# -- the doc is what the tables draw --------------------------------------------------------


def test_protocols_doc_regions_are_drawn_from_the_tables() -> None:
    text = DOC.read_text(encoding="utf-8")
    names = _diagram.regions(text)
    assert sorted(names) == sorted(_diagram.TABLES), "each state table is drawn exactly once in docs/protocols.md"
    assert not _diagram.stale(text), (
        f"docs/protocols.md: the state diagrams of {_diagram.stale(text)} differ from the tables in the code; "
        f"redraw them with\n  {_diagram.COMMAND}"
    )


def test_check_and_write_find_and_fix_a_stale_region(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "protocols.md"
    good = DOC.read_text(encoding="utf-8")
    doc.write_text(good.replace("    sent --> queued: pipe_lost, resend\n", "    sent --> idle: resend\n"))
    assert _diagram.main(["--check", str(doc)]) == 1
    assert "stale REQUEST_TABLE" in capsys.readouterr().err
    assert _diagram.main(["--write", str(doc)]) == 0
    assert doc.read_text(encoding="utf-8") == good
    assert _diagram.main(["--check", str(doc)]) == 0


def test_an_unknown_table_name_is_an_error() -> None:
    text = "<!-- generated: NO_SUCH_TABLE -->\n<!-- end generated -->\n"
    with pytest.raises(KeyError, match="NO_SUCH_TABLE"):
        _diagram.rewrite(text)


def test_the_documented_command_runs() -> None:
    # The command the failure message names, as a contributor types it (read-only here).
    proc = subprocess.run([sys.executable, "-m", "nanopy.protocols._diagram", "--check", str(DOC)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", list(_diagram.TABLES))
def test_drawings_show_every_transition_and_error(name: str) -> None:
    table = _diagram.TABLES[name]
    arrows = re.findall(r"^    (\w+) --> (\w+): (.+)$", _diagram.mermaid(table), re.M)
    drawn = {(s, e.strip()): n for s, n, events in arrows for e in events.split(",")}
    assert drawn == {(str(s), str(e)): str(n) for (s, e), n in table.transitions.items()}
    assert f"[*] --> {table.initial}" in _diagram.mermaid(table)
    rows = [line.split("|")[1:-1] for line in _diagram.markdown(table).splitlines()[2:]]
    assert len(rows) == len(table.transitions) + len(table.messages)
    for message in table.messages.values():
        assert message in _diagram.markdown(table)


def test_state_names_mermaid_would_misread_are_refused() -> None:
    for state in ("end", "half-open"):
        with pytest.raises(ValueError, match="Mermaid"):
            _diagram.mermaid(StateTable("t", "idle", [("idle", "go", state, "")]))


# -- the tables are the ones the cores use -------------------------------------------------


class Recording(StateTable[Any, Any]):
    """A copy of a table that remembers every (state, event) a core steps through."""

    def __init__(self, table: StateTable[Any, Any]) -> None:
        rows = [(s, e, n, table.notes[(s, e)]) for (s, e), n in table.transitions.items()]
        super().__init__(table.name, table.initial, rows, table.messages)
        self.seen: set[tuple[str, str]] = set()

    def step(self, state: Any, event: Any) -> Any:
        self.seen.add((str(state), str(event)))
        return super().step(state, event)


def record(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> Recording:
    table = Recording(getattr(module, name))
    monkeypatch.setattr(module, name, table)
    return table


def every_pair(table: StateTable[Any, Any]) -> set[tuple[str, str]]:
    return {(str(s), str(e)) for s, e in [*table.transitions, *table.messages]}


def w(*words: int) -> bytes:
    return b"".join(struct.pack(">I", x) for x in words)


def core(cls: Any, **opts: Any) -> Any:
    options = new_options(cls.name)
    for key, value in opts.items():
        setattr(options, key, value)
    return cls(options)


def add(c: Any, pid: int, credit: int = 16) -> None:
    c.add_pipe(PipeInfo(pid, f"pipe{pid}", 8, 8), credit)


def test_req_core_steps_through_request_table(monkeypatch: pytest.MonkeyPatch) -> None:
    table = record(monkeypatch, reqrep, "REQUEST_TABLE")
    req = core(Req0)
    assert req.request_state(0) == table.initial
    add(req, 1, credit=1)
    a = req.start_request(b"a")  # idle -send-> queued -transmit-> sent (the pipe's one credit)
    assert req.request_state(a) == "sent"
    for _ in range(RESEND_TICKS + 1):
        req.timer_fired("resend-tick")  # sent -resend-> queued: no credit left to resend it
    assert req.request_state(a) == "queued"
    req.messages_received(1, [w(a) + b"A"])  # queued -reply-> done (to the first transmission)
    assert req.take_reply(a).body == b"A"  # done -take-> idle
    req.pipe_credit(1, 4)
    b = req.start_request(b"b")
    req.messages_received(1, [w(b) + b"B"])  # sent -reply-> done
    req.cancel_request(b)  # done -cancel-> idle
    c = req.start_request(b"c")
    req.cancel_request(c)  # sent -cancel-> idle
    d = req.start_request(b"d")
    req.remove_pipe(1)  # sent -pipe_lost-> queued (no pipe left to resend on)
    assert req.request_state(d) == "queued"
    req.cancel_request(d)  # queued -cancel-> idle
    with pytest.raises(ProtocolError) as err:
        req.recv()  # idle -take-> the table's error
    assert str(err.value) == table.messages[("idle", "take")]
    assert table.seen == every_pair(table)


@pytest.mark.parametrize("cls", [Rep0, Respondent0])
def test_replier_cores_step_through_replier_table(monkeypatch: pytest.MonkeyPatch, cls: Any) -> None:
    table = record(monkeypatch, _common, "REPLIER_TABLE")
    rep = core(cls)
    assert rep.state == table.initial
    add(rep, 1)
    rep.messages_received(1, [w(0x80000001) + b"q1", w(0x80000002) + b"q2", w(0x80000003) + b"q3"])
    rep.recv()  # idle -recv-> pending
    rep.recv()  # pending -recv-> pending (q1 abandoned)
    rep.send(b"a2")  # pending -send-> idle
    msg = rep.recv()
    rep.reply(msg._reply_to, b"a3")  # pending -answered-> idle
    assert rep.state == "idle"
    with pytest.raises(ProtocolError) as err:
        rep.send(b"nothing to answer")  # idle -send-> the table's error
    assert str(err.value) == table.messages[("idle", "send")]
    assert table.seen == every_pair(table)


def test_surveyor_core_steps_through_survey_table(monkeypatch: pytest.MonkeyPatch) -> None:
    table = record(monkeypatch, survey, "SURVEY_TABLE")
    sv = core(Surveyor0)
    assert sv.state == table.initial
    add(sv, 1)
    first = sv.start_survey(b"s1")  # idle -send-> active
    sid = sv.start_survey(b"s2")  # active -send-> active
    assert sid != first
    with pytest.raises(WouldBlock):
        sv.recv()  # active -recv-> active (nothing yet)
    sv.messages_received(1, [w(sid) + b"yes"])  # active -answer-> active
    sv.timer_fired(sid)  # active -deadline-> expired
    sid = sv.start_survey(b"s3")  # expired -send-> active
    sv.timer_fired(sid)
    with pytest.raises(Timeout):
        sv.recv()  # expired -recv-> idle
    with pytest.raises(ProtocolError) as err:
        sv.recv()  # idle -recv-> the table's error
    assert str(err.value) == table.messages[("idle", "recv")]
    assert table.seen == every_pair(table)
