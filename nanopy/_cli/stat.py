"""``nanopy stat URL``: the live sockets of a running process, from its metrics endpoint.

The process serves its metrics with ``nanopy.metrics.serve("127.0.0.1:9464")``;
``nanopy stat http://127.0.0.1:9464`` reads them (the Prometheus text format)
and shows one row per socket: on a terminal as a table redrawn in place every
``--interval`` seconds, with message rates; otherwise (or with ``--once``) as
plain tables. It needs no extra package.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from .discover import _BOLD, _RESET, _UP_AND_CLEAR, _positive, _restored_signals, _stop_on_sigterm

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass
class SocketRow:
    """What the table shows of one socket."""

    socket: str
    protocol: str
    values: dict[str, float] = field(default_factory=dict)  # metric name (+ label) -> value
    drops: dict[str, float] = field(default_factory=dict)  # reason -> count


def parse(text: str) -> list[SocketRow]:
    """The ``nanopy_*`` series of a Prometheus text exposition, one row per socket."""
    rows: dict[tuple[str, str], SocketRow] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None or not match.group(1).startswith("nanopy_"):
            continue  # comments, blank lines, other libraries' metrics
        name, label_text, value_text = match.groups()
        labels = {k: re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], v)
                  for k, v in _LABEL.findall(label_text or "")}
        try:
            value = float(value_text)
        except ValueError:
            continue
        key = (labels.get("socket", "?"), labels.get("protocol", "?"))
        row = rows.setdefault(key, SocketRow(*key))
        if "reason" in labels:
            row.drops[labels["reason"]] = value
        elif "direction" in labels:
            row.values[f"{name}:{labels['direction']}"] = value
        else:
            row.values[name] = value
    return list(rows.values())


def _count(value: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= 10 * size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


def render_table(rows: Sequence[SocketRow], previous: dict[tuple[str, str], SocketRow] | None = None,
                 elapsed: float = 0.0) -> list[str]:
    """The table as lines of text (no colours); rates when an earlier sample is given."""
    header = ("SOCKET", "PROTO", "PIPES", "SENT", "RECV", "SENT/s", "RECV/s", "BYTES OUT", "BYTES IN",
              "DROPPED", "Q-IN", "Q-OUT", "ERRORS", "DROPS")
    table = [header]
    for row in rows:
        v = row.values
        sent, recv = v.get("nanopy_messages_sent_total", 0.0), v.get("nanopy_messages_received_total", 0.0)
        before = (previous or {}).get((row.socket, row.protocol))
        if before is not None and elapsed > 0:
            sent_rate = _count((sent - before.values.get("nanopy_messages_sent_total", 0.0)) / elapsed)
            recv_rate = _count((recv - before.values.get("nanopy_messages_received_total", 0.0)) / elapsed)
        else:
            sent_rate = recv_rate = "-"
        reasons = " ".join(f"{reason}={_count(n)}" for reason, n in row.drops.items() if n)
        table.append((
            row.socket, row.protocol, _count(v.get("nanopy_pipes", 0.0)), _count(sent), _count(recv),
            sent_rate, recv_rate, _count(v.get("nanopy_bytes_sent_total", 0.0)),
            _count(v.get("nanopy_bytes_received_total", 0.0)), _count(sum(row.drops.values())),
            _count(v.get("nanopy_queued_messages:in", 0.0)), _count(v.get("nanopy_queued_messages:out", 0.0)),
            _count(v.get("nanopy_protocol_errors_total", 0.0)), reasons,
        ))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in table]
    if len(table) == 1:
        lines.append("(no live sockets)")
    return lines


def _metrics_url(url: str) -> str:
    if "://" not in url:
        url = "http://" + url
    scheme, _, rest = url.partition("://")
    if "/" not in rest:
        url += "/metrics"
    return url


def fetch(url: str, timeout: float) -> list[SocketRow]:
    """Read and parse the endpoint once."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - the user's URL
        return parse(response.read().decode("utf-8", "replace"))


def main(argv: Sequence[str]) -> int:
    """``nanopy stat``; returns the exit status."""
    ap = argparse.ArgumentParser(
        prog="nanopy stat",
        description="Show the live sockets of a process that serves its metrics with "
                    "nanopy.metrics.serve(): counts, rates, queues and drops by reason.")
    ap.add_argument("url", help="the endpoint, e.g. http://127.0.0.1:9464 (/metrics is added when no path is given)")
    ap.add_argument("--interval", type=_positive, default=1.0, metavar="SEC", help="seconds between refreshes (1)")
    ap.add_argument("--once", action="store_true", help="print the table once and exit")
    ap.add_argument("--count", type=int, default=0, metavar="N", help="exit after N tables (0: until interrupted)")
    ap.add_argument("--timeout", type=_positive, default=5.0, metavar="SEC", help="seconds a read may take (5)")
    args = ap.parse_args(argv)
    url = _metrics_url(args.url)
    out = sys.stdout
    if args.once:
        try:
            rows = fetch(url, args.timeout)
        except (OSError, urllib.error.URLError) as exc:
            print(f"nanopy stat: can't read {url}: {exc}", file=sys.stderr)
            return 1
        out.write("\n".join(render_table(rows)) + "\n")
        out.flush()
        return 0
    with _restored_signals():
        return _watch(url, args, out)


def _watch(url: str, args: argparse.Namespace, out: TextIO) -> int:
    _stop_on_sigterm()
    live = out.isatty()
    height = 0
    previous: dict[tuple[str, str], SocketRow] | None = None
    last = 0.0
    shown = 0
    try:
        while True:
            now = time.monotonic()
            try:
                rows = fetch(url, args.timeout)
                lines = render_table(rows, previous, now - last)
                previous, last = {(r.socket, r.protocol): r for r in rows}, now
            except (OSError, urllib.error.URLError) as exc:
                lines = [f"can't read {url}: {exc}"]
            title = f"nanopy stat {url}  {time.strftime('%H:%M:%S')}"
            if live:
                text = "\n".join([f"{_BOLD}{title}{_RESET}", "", _BOLD + lines[0] + _RESET, *lines[1:]]) + "\n"
                out.write((_UP_AND_CLEAR.format(n=height) if height else "") + text)
                height = len(lines) + 2
            else:
                out.write("\n".join([title, *lines, ""]) + "\n")
            out.flush()
            shown += 1
            if args.count and shown >= args.count:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
