"""The conformance kit checked itself: every rule catches a transport that breaks it.

For each rule, a planted defect (tests/defective.py: a small broken variant of tcp,
inproc or the example plug-in) fails ``check_transport`` naming that rule; the
docs list exactly the kit's rules; options and reports behave as documented.
The built-in transports passing the whole kit is tests/test_conformance.py's
``test_check_transport``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from defective import DEFECTS, Defective, WriteAllHoards

import nanopy.transports
from nanopy.testing import check_transport, free_port, local_url
from nanopy.testing.conformance import RULES, RULES_BY_ID, STEPS, ConformanceError

DOCS = Path(__file__).resolve().parent.parent / "docs" / "transports.md"


@pytest.fixture
def planted(request: pytest.FixtureRequest) -> Iterator[str]:
    """Register the defect of rule ``request.param`` under a scheme of its own."""
    rule = request.param
    defect, base = DEFECTS[rule]
    scheme = f"kit-{rule.lower()}"
    nanopy.transports.register(scheme, defect(scheme, base))
    try:
        yield rule
    finally:
        nanopy.transports.unregister(scheme)


#: what each planted defect's failure says (the check that caught it, not a stray error)
CAUGHT_BY = {
    "T1": "left port 0 in Listener.url",
    "T2": "a second Listener.aclose() raised RuntimeError",
    "T3": "with nobody listening returned a connection",
    "T4": "a payload of type bytearray, not bytes",
    "T5": "a push dialer completed its handshake with a pair listener",
    "T6": "a 1048576-byte message bind -> connect did not arrive",
    "T7": "the next connection after a cancelled accept() failed",
    "T8": "the listener's end of a connection whose dialer was cancelled",
    "T9": "read by receive() calls cut short again and again",
    "T10": "for a peer that reads nothing without waiting (unbounded memory",
    "T11": "a send() waiting for a peer that reads nothing, after its cancellation: not done within 2 s",
    "T12": "cut by write_nowait() after 8388864 of 8388864 units",
    "T13": "a second aclose() of a connection never handshaken raised RuntimeError",
    "T14": "raised RemoteProtocolError (peer closed the connection), not EOFError or OSError",
    "T15": "a FIN inside a message raised EOFError",
    "T16": "a payload over recv_max_size was delivered at the accepting end",
    "T17": "16 dialers' pipes not reached",
    "T18": "the dialer reconnecting after a rebind not reached",
    "C1": "fileno() of a closed connection is 1000, not -1",
    "C2": "a payload reached the sink while paused() was true",
    "C3": "a subscription made after the pipe: no round delivered the probe",
    "C4": "silence_blamed() after an ordinary close by the peer is 'silent for too long'",
    "C5": "check_protocol('bus') raised ValueError",
    "C6": "kernel_socket() is not a connected socket",
    "C7": "waiting_for_room is false while a write waits",
    "C8": "unwritten_bytes() after a write cut by a reset is 0",
    "C9": "a clean exchange counted drops",
    "C10": "keepalive ending a silent peer's pipe: not done within",
    "C11": "moved from 1 to 0 with a write, and the hook was not called",
}


@pytest.mark.parametrize("planted", list(CAUGHT_BY), indirect=True)
def test_planted_defect_fails_its_rule(planted: str) -> None:
    rule = RULES_BY_ID[planted]
    with pytest.raises(ConformanceError) as caught:
        # (T10's defect compresses what it piles up: a smaller limit is reached sooner)
        limit = 8 << 20 if planted == "T10" else 32 << 20
        check_transport(f"kit-{planted.lower()}", rules=[planted], timeout=1.5, buffer_limit=limit)
    assert caught.value.rule is rule
    text = str(caught.value)
    assert text.startswith(f"[{rule.title}] kit-{planted.lower()}: ")
    assert CAUGHT_BY[planted] in caught.value.detail
    assert '"Conformance rules"' in text and rule.section in text


def test_every_checked_rule_has_a_planted_defect() -> None:
    assert set(DEFECTS) == set(CAUGHT_BY)
    assert set(STEPS) == set(DEFECTS)


@pytest.mark.parametrize("planted", ["T10", "T13"], indirect=True)
def test_the_issues_planted_defects_fail_the_whole_kit(planted: str) -> None:
    """The two defects issue 33 found passing the old kit fail the full run (keep_going)."""
    with pytest.raises(ConformanceError) as caught:
        check_transport(f"kit-{planted.lower()}", keep_going=True, timeout=1.5, buffer_limit=8 << 20)
    assert planted in {f.rule.id for f in caught.value.failures}


def test_a_channel_whose_write_all_never_waits_fails_t10() -> None:
    """The pipe writes a channel through write_all, not send: T10 stalls that path."""
    nanopy.transports.register("kit-hoard", WriteAllHoards("kit-hoard", "tcp"))
    try:
        with pytest.raises(ConformanceError, match=r"^\[T10 stalled reader\] kit-hoard: .*unbounded memory"):
            check_transport("kit-hoard", rules=["T10"], timeout=3)
    finally:
        nanopy.transports.unregister("kit-hoard")


def test_docs_list_every_rule() -> None:
    """docs/transports.md's "Conformance rules" table has one row per rule, same id and name."""
    text = DOCS.read_text()
    section = text.split("## Conformance rules", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", section, re.M)
    assert [(rid, name.strip()) for rid, name in rows] == [(r.id, r.name) for r in RULES]
    for rule in RULES:  # (each names a section that exists)
        heading = rule.section.split(":")[0]
        assert f"## {heading}" in text, rule


def test_rule_selection_and_report() -> None:
    report = check_transport("inproc", rules=["T4", "c1"], skip=["T4"])
    assert report.passed == [] and list(report.skipped) == ["C1"]
    with pytest.raises(ValueError, match="no conformance rule T99"):
        check_transport("inproc", rules=["T99"])


@pytest.mark.parametrize("base", ["tcp", "inproc", "tcp+zlib"])
def test_an_unbroken_variant_passes(base: str) -> None:
    """The control: the defect harness alone breaks nothing, so each failure above is its defect's."""
    scheme = f"kit-{base.replace('+', '-')}"
    nanopy.transports.register(scheme, Defective(scheme, base))
    try:
        report = check_transport(scheme, timeout=5)
    finally:
        nanopy.transports.unregister(scheme)
    assert report.passed and set(report.passed) | set(report.skipped) == set(STEPS)


@pytest.mark.parametrize("scheme", ["tcp", "ipc"])
def test_a_given_url_is_bound_by_each_step(scheme: str) -> None:
    """``url=`` (the kit's first keyword): each step binds it first; a second listener in
    a step gets a fresh address."""
    url = f"tcp://127.0.0.1:{free_port()}" if scheme == "tcp" else local_url("ipc", "given")
    report = check_transport(scheme, url=url, skip=["C10"])
    assert not set(STEPS) - {"C10"} - set(report.passed) - set(report.skipped)
