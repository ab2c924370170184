"""The state diagrams of docs/protocols.md, drawn from the cores' state tables.

Each :class:`~nanopy.protocols._common.StateTable` a core steps through is drawn
twice: as a Mermaid ``stateDiagram-v2`` (GitHub and the docs site render it) and
as a Markdown table of every transition, plus the misuse errors, which reads
anywhere. The drawings live in docs/protocols.md between marker comments::

    <!-- generated: REQUEST_TABLE ... -->
    ...
    <!-- end generated -->

Regenerate them after changing a table::

    python -m nanopy.protocols._diagram --write docs/protocols.md

``--check`` exits 1 when a region is stale (tests/test_docs_diagrams.py runs the
same comparison). Nothing here runs when a socket does.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import REPLIER_TABLE, StateTable
from .reqrep import REQUEST_TABLE
from .survey import SURVEY_TABLE

#: the tables the docs may draw, by the name their markers use
TABLES: dict[str, StateTable[Any, Any]] = {
    "REQUEST_TABLE": REQUEST_TABLE,
    "REPLIER_TABLE": REPLIER_TABLE,
    "SURVEY_TABLE": SURVEY_TABLE,
}

COMMAND = "python -m nanopy.protocols._diagram --write docs/protocols.md"
END = "<!-- end generated -->"
REGION = re.compile(r"^<!-- generated: (?P<name>\w+)\b.*?-->\n(?P<body>.*?)^" + re.escape(END) + "$", re.S | re.M)


# (Mermaid reads these, and any name with other characters than [a-z_], as syntax)
_MERMAID_WORDS = {"end", "state", "note", "as", "direction", "class", "classdef", "style", "fork", "join", "choice"}


def mermaid(table: StateTable[Any, Any]) -> str:
    """A Mermaid ``stateDiagram-v2``: one arrow per (state, next state) pair,
    labelled with its events in table order."""
    bad = sorted(s for s in table.states() if not re.fullmatch(r"[a-z_]+", s) or s in _MERMAID_WORDS)
    if bad:
        raise ValueError(f"{table.name}: state names {bad} cannot be Mermaid state ids")
    arrows: dict[tuple[str, str], list[str]] = {}
    for (state, event), new in table.transitions.items():
        arrows.setdefault((str(state), str(new)), []).append(str(event))
    lines = ["stateDiagram-v2", f"    [*] --> {table.initial}"]
    lines += [f"    {state} --> {new}: {', '.join(events)}" for (state, new), events in arrows.items()]
    return "\n".join(lines)


def markdown(table: StateTable[Any, Any]) -> str:
    """A Markdown table: every legal transition in table order, then the pairs
    that raise a ProtocolError of their own (with its message)."""
    rows = [("state", "event", "next", "what happens")]
    for (state, event), new in table.transitions.items():
        rows.append((str(state), f"`{event}`", str(new), table.notes[(state, event)]))
    for (state, event), message in table.messages.items():
        rows.append((str(state), f"`{event}`", "*error*", f"`ProtocolError`: {message}"))
    for row in rows:
        if any("|" in cell or "\n" in cell for cell in row):
            raise ValueError(f"{table.name}: a cell would break the Markdown table: {row}")
    widths = [max(len(row[i]) for row in rows) for i in range(3)]  # (the last column runs on)

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join([*(c.ljust(w) for c, w in zip(cells, widths, strict=False)), cells[3]]) + " |"

    out = [line(rows[0]), "|" + "|".join("-" * (w + 2) for w in [*widths, len(rows[0][3])]) + "|"]
    out += [line(row) for row in rows[1:]]
    return "\n".join(out)


def render(name: str) -> str:
    """The body of the generated region for table ``name`` (between the markers)."""
    table = TABLES.get(name)
    if table is None:
        raise KeyError(f"no state table named {name!r} (known: {', '.join(TABLES)})")
    return (
        f"```mermaid\n{mermaid(table)}\n```\n\n{markdown(table)}\n\n"
        "Any other (state, event) pair raises `ProtocolError`.\n"
    )


def stale(text: str) -> list[str]:
    """The names of the regions in ``text`` that differ from what their tables render."""
    return [m["name"] for m in REGION.finditer(text) if m["body"] != render(m["name"])]


def rewrite(text: str) -> str:
    """``text`` with every generated region drawn afresh from its table."""
    return REGION.sub(lambda m: text[m.start() : m.start("body")] + render(m["name"]) + END, text)


def regions(text: str) -> list[str]:
    return [m["name"] for m in REGION.finditer(text)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nanopy.protocols._diagram",
        description="Draw the protocol state tables into a Markdown file's generated regions.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the regions in place")
    mode.add_argument("--check", action="store_true", help="exit 1 if a region is stale")
    parser.add_argument("file", nargs="?", default="docs/protocols.md", type=Path)
    args = parser.parse_args(argv)
    text = args.file.read_text(encoding="utf-8")
    if not regions(text):
        print(f"{args.file}: no '<!-- generated: NAME -->' regions", file=sys.stderr)
        return 1
    if args.write:
        new = rewrite(text)
        if new != text:
            args.file.write_text(new, encoding="utf-8")
        print(f"{args.file}: drew {', '.join(regions(text))}")
        return 0
    if args.check:
        old = stale(text)
        if old:
            print(f"{args.file}: stale {', '.join(old)}; run: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    for name in regions(text):
        print(render(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
