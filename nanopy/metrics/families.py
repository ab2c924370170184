"""The metric families nanopy exports, derived from :class:`~nanopy.core.stats.SocketStats`.

The rule (docs/metrics.md, "A new counter"), so a counter added to SocketStats is
exported by both exporters and ``serve`` without another edit:

* a number is a counter ``nanopy_<field>`` (``_total`` in the text format), or a
  gauge if it is in ``GAUGE_FIELDS`` (nanopy/core/stats.py);
* a ``Mapping[str, int]`` is one counter with a ``reason`` label, a series per key;
* its HELP is its line in SocketStats' docstring; its OpenTelemetry name is
  ``nanopy.<field>``, its unit follows its name (bytes, messages, pipes, ...).

Exceptions, kept here: the fields that kept their names from before the rule
(:data:`NAMES`), ``queued_in``/``queued_out`` as one gauge with a ``direction``
label (:data:`JOINED`), and the sums of other counters, not exported twice
(:data:`NOT_EXPORTED`).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ..core.stats import GAUGE_FIELDS, SocketStats
from ..socket.series import Series

#: field -> (Prometheus name, OpenTelemetry name): names from before the rule
NAMES = {
    "messages_sent": ("nanopy_messages_sent", "nanopy.messages.sent"),
    "messages_received": ("nanopy_messages_received", "nanopy.messages.received"),
    "bytes_sent": ("nanopy_bytes_sent", "nanopy.bytes.sent"),
    "bytes_received": ("nanopy_bytes_received", "nanopy.bytes.received"),
    "drops": ("nanopy_messages_dropped", "nanopy.messages.dropped"),
}
#: HELP lines better said than the field's docstring line
HELP = {"drops": "Messages the socket discarded, by reason (docs/metrics.md lists the reasons)."}
#: fields exported as one family with a label: field -> (Prometheus name, OpenTelemetry name, labels, help)
JOINED = {
    "queued_in": ("nanopy_queued_messages", "nanopy.queued", {"direction": "in"},
                  "Messages queued: in = received, not taken yet; out = sent, not written yet."),
    "queued_out": ("nanopy_queued_messages", "nanopy.queued", {"direction": "out"}, ""),
}
#: sums of exported counters: ``dropped`` (and its older name) of ``drops``,
#: ``reconnect_attempts`` of ``dial_failures`` and the dialer's ``handshake_failures``
NOT_EXPORTED = frozenset({"messages_dropped", "dropped", "reconnect_attempts"})

#: one field a family reads: (field, labels that tell its samples apart, the reasons
#: a Mapping field always has -- None for a number)
Part = tuple[str, tuple[tuple[str, str], ...], tuple[str, ...] | None]


@dataclass(frozen=True)
class Family:
    """One exported metric.

    Attributes:
        name: its Prometheus family name (a counter's without ``_total``).
        otel: its OpenTelemetry instrument name.
        kind: ``"counter"`` or ``"gauge"``.
        unit: its UCUM unit, as OpenTelemetry wants it.
        help: one line on what it counts.
        parts: the SocketStats fields it reads (:data:`Part`); a Mapping field adds
            the label ``reason``.
    """

    name: str
    otel: str
    kind: str
    unit: str
    help: str
    parts: tuple[Part, ...]

    def values(self, series: Series) -> Iterator[tuple[dict[str, str], int]]:
        """The family's samples in one series: (labels beyond socket and protocol, value)."""
        counters = series.counters
        for field, labels, reasons in self.parts:
            if self.kind == "gauge":
                yield dict(labels), series.gauges.get(field, 0)
            elif reasons is not None:
                # every reason, zeros included, then any other the sockets counted
                for reason in dict.fromkeys([*reasons, *(r for f, r in counters if f == field)]):
                    yield {**dict(labels), "reason": reason}, counters.get((field, reason), 0)
            else:
                yield dict(labels), counters.get((field, ""), 0)


def field_help(cls: type[SocketStats] = SocketStats) -> dict[str, str]:
    """Each field's line in the class docstring ("Attributes:"), continuation lines joined."""
    section = inspect.cleandoc(cls.__doc__ or "").partition("Attributes:")[2]
    found: dict[str, str] = {}
    field = None
    for line in section.splitlines():
        start = re.match(r"    (\w+): (.*)", line)
        if start:
            field = start[1]
            found[field] = start[2].strip()
        elif field is not None and line.startswith("        "):
            found[field] += " " + line.strip()
    return found


def _unit(field: str) -> str:
    if "bytes" in field:
        return "By"
    if "messages" in field or field == "drops" or field.startswith("queued"):
        return "{message}"
    if "pipes" in field or field.endswith("connects"):
        return "{pipe}"
    if field.endswith(("errors", "failures")):
        return "{error}"
    return "{event}"


def families_of(cls: type[SocketStats]) -> tuple[Family, ...]:
    """The families the rule makes of ``cls``'s fields (SocketStats, or a subclass in a test)."""
    docs = field_help(cls)
    blank = cls()
    joined: dict[str, list[Part]] = {}
    families: list[Family | str] = []  # (a joined family's name marks its place)
    for f in dataclasses.fields(cls):
        field = f.name
        if field in NOT_EXPORTED:
            continue
        kind = "gauge" if field in GAUGE_FIELDS else "counter"
        if field in JOINED:
            name = JOINED[field][0]
            if name not in joined:
                joined[name] = []
                families.append(name)
            joined[name].append((field, tuple(JOINED[field][2].items()), None))
            continue
        default = getattr(blank, field)
        if not isinstance(default, (int, Mapping)) or isinstance(default, bool):
            continue  # (not a number: nothing to export)
        name, otel = NAMES.get(field, (f"nanopy_{field}", f"nanopy.{field}"))
        text = (HELP.get(field) or docs.get(field) or f"SocketStats.{field}.").replace("``", "")
        reasons = tuple(default) if isinstance(default, Mapping) else None
        families.append(Family(name, otel, kind, _unit(field), text[:1].upper() + text[1:], ((field, (), reasons),)))
    out = []
    for item in families:
        if isinstance(item, str):
            parts = tuple(joined[item])
            first = JOINED[parts[0][0]]
            kind = "gauge" if all(p[0] in GAUGE_FIELDS for p in parts) else "counter"
            out.append(Family(item, first[1], kind, _unit(parts[0][0]), first[3], parts))
        else:
            out.append(item)
    return tuple(out)


#: every exported family, in the order of the SocketStats fields
FAMILIES = families_of(SocketStats)
