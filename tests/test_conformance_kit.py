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
from defective import DEFECTS, Defective

import nanopy.transports
from nanopy.testing import check_transport
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


@pytest.mark.parametrize("planted", sorted(DEFECTS, key=lambda r: (r[0], int(r[1:]))), indirect=True)
def test_planted_defect_fails_its_rule(planted: str) -> None:
    rule = RULES_BY_ID[planted]
    with pytest.raises(ConformanceError) as caught:
        check_transport(f"kit-{planted.lower()}", rules=[planted], timeout=3)
    assert caught.value.rule is rule
    text = str(caught.value)
    assert text.startswith(f"[{rule.title}] kit-{planted.lower()}: ")
    assert '"Conformance rules"' in text and rule.section in text


def test_every_checked_rule_has_a_planted_defect() -> None:
    assert set(STEPS) - set(DEFECTS) <= {"C3"}  # (C3: no variant of a filtering transport yet)


@pytest.mark.parametrize("planted", ["T10", "T13"], indirect=True)
def test_the_issues_planted_defects_fail_the_whole_kit(planted: str) -> None:
    """The two defects issue 33 found passing the old kit fail the full run (keep_going)."""
    with pytest.raises(ConformanceError) as caught:
        check_transport(f"kit-{planted.lower()}", keep_going=True, timeout=1.5)
    assert planted in {f.rule.id for f in caught.value.failures}


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


def test_defective_passthrough_passes() -> None:
    """The defect harness itself breaks nothing: an unpatched variant passes the raw rules."""
    nanopy.transports.register("kit-none", Defective("kit-none", "tcp"))
    try:
        report = check_transport("kit-none", rules=["T1", "T4", "T9", "T12", "T13", "T15"], timeout=3)
    finally:
        nanopy.transports.unregister("kit-none")
    assert report.passed == ["T1", "T4", "T9", "T12", "T13", "T15"]
