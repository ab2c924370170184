"""``nanopy discover`` and ``nanopy announce``: service discovery from the shell.

``nanopy discover --bind tcp://0.0.0.0:5600`` runs a :class:`~nanopy.discovery.Discovery`
and shows the live providers: on a terminal as a table redrawn in place after every
survey, otherwise (or with ``--events``) as one line per change. ``--once`` waits
for the first surveys, prints the table (or JSON with ``--json``) and exits.

``nanopy announce NAME ADDRESS --connect URL`` runs an
:class:`~nanopy.discovery.Announcer` until interrupted.

With ``--beacon`` neither needs an address: ``nanopy discover --beacon`` binds a free
port and broadcasts beacons on the host's interfaces; ``nanopy announce NAME ADDRESS
--beacon`` follows every discovery service of its ``--group`` that it hears.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

# ANSI: cursor to the start of the line N lines up, then clear to the end of screen.
_UP_AND_CLEAR = "\x1b[{n}F\x1b[J"
_BOLD, _DIM, _RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


@contextlib.contextmanager
def _restored_signals() -> Iterator[None]:
    """Put SIGINT/SIGTERM handling back as it was afterwards, so calling a command's
    ``main`` in-process (tests, embedding) leaves the process's signals untouched."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _stop_on_sigterm() -> None:
    """Treat SIGTERM like Ctrl-C so the socket closes cleanly."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _ignore_interrupts() -> None:
    """While closing: a second Ctrl-C (or a group-wide signal) must not abort the cleanup."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def render_table(providers: Sequence[Any], now: float | None = None) -> list[str]:
    """The live table as lines of text (no colours)."""
    now = time.time() if now is None else now
    rows = [("NAME", "ADDRESS", "PRIO", "SEEN", "METADATA")]
    for p in providers:
        meta = json.dumps(dict(p.metadata), separators=(",", ":"), ensure_ascii=False) if p.metadata else ""
        rows.append((p.name, p.address, str(p.priority), f"{max(0.0, now - p.last_seen):.1f}s ago", meta))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for r in rows:
        lines.append("  ".join(r[i].ljust(widths[i]) for i in range(4)) + ("  " + r[4] if r[4] else "").rstrip())
    if len(rows) == 1:
        lines.append("(no live providers)")
    return [line.rstrip() for line in lines]


class _LiveTable:
    """Redraws the table in place on an ANSI terminal."""

    def __init__(self, out: TextIO, title: str) -> None:
        self.out = out
        self.title = title
        self.height = 0

    def draw(self, providers: Sequence[Any], rounds: int) -> None:
        lines = [f"{_BOLD}{self.title}{_RESET}  {_DIM}survey #{rounds}, {time.strftime('%H:%M:%S')}{_RESET}", ""]
        table = render_table(providers)
        lines.append(_BOLD + table[0] + _RESET)
        lines += table[1:]
        text = "\n".join(lines) + "\n"
        if self.height:
            text = _UP_AND_CLEAR.format(n=self.height) + text
        self.out.write(text)
        self.out.flush()
        self.height = len(lines)


def discover_main(argv: Sequence[str]) -> int:
    """``nanopy discover``; returns the exit status."""
    from .. import NanopyError
    from ..discovery import Discovery

    ap = argparse.ArgumentParser(prog="nanopy discover", description="Run a discovery service "
                                 "(SURVEYOR) and show the live service providers.")
    ap.add_argument("--bind", metavar="URL", help="address to bind the surveyor to (with --beacon: "
                    "default tcp://0.0.0.0:0, a free port on every interface)")
    ap.add_argument("--interval", type=_positive, default=1.0, metavar="SEC", help="seconds between surveys (1)")
    ap.add_argument("--deadline", type=_positive, metavar="SEC", help="seconds a survey waits for answers "
                    "(half the interval)")
    ap.add_argument("--misses", type=int, default=2, metavar="N", help="drop a provider after N missed surveys (2)")
    ap.add_argument("--events", action="store_true", help="print one line per change instead of a table")
    ap.add_argument("--once", action="store_true", help="print the table after a few surveys and exit")
    ap.add_argument("--wait", type=_positive, metavar="SEC", help="with --once: seconds to collect "
                    "(three intervals)")
    ap.add_argument("--json", action="store_true", help="with --once: print {name: [addresses]} as JSON")
    _beacon_arguments(ap)
    ap.add_argument("--beacon-to", action="append", metavar="HOST", help="with --beacon: send beacons to HOST "
                    "instead of every interface's broadcast address (repeatable; 127.255.255.255: loopback only)")
    args = ap.parse_args(argv)
    if args.bind is None and not args.beacon:
        ap.error("give --bind URL, or --beacon to be found without an address")
    if args.misses < 1:
        ap.error("--misses must be at least 1")
    if args.deadline is not None and args.deadline > args.interval:
        ap.error("--deadline must not exceed --interval")
    secret = _secret(ap, args)

    out = sys.stdout
    live = not args.once and not args.events and out.isatty()
    try:
        disco = Discovery(args.bind, interval=args.interval, deadline=args.deadline, misses=args.misses,
                          beacon=args.beacon, group=args.group, beacon_port=args.beacon_port,
                          beacon_to=args.beacon_to, secret=secret)
    except (NanopyError, OSError, ValueError) as exc:
        print(f"nanopy discover: can't bind {args.bind or 'a beacon address'}: {exc}", file=sys.stderr)
        return 3
    beacons = f", beacons to UDP port {args.beacon_port}{_group_text(args.group)}" if args.beacon else ""
    beacons += ", signed" if secret is not None else ""
    print(f"nanopy discover: surveying at {disco.url} every {disco.interval:g}s{beacons}", file=sys.stderr,
          flush=True)
    lock = threading.Lock()

    def on_change(name: str, address: str, added: bool) -> None:
        if live or args.once:
            return
        with lock:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            out.write(f"{stamp} {'+' if added else '-'} {name} {address}\n")
            out.flush()

    disco.on_change(on_change)
    with _restored_signals():
        return _show(args, disco, out, live)


def _show(args: argparse.Namespace, disco: Any, out: Any, live: bool) -> int:
    _stop_on_sigterm()
    try:
        if args.once:
            time.sleep(args.wait if args.wait is not None else 3 * disco.interval)
            if args.json:
                out.write(json.dumps(disco.services(), indent=2, sort_keys=True) + "\n")
            else:
                out.write("\n".join(render_table(disco.providers())) + "\n")
            out.flush()
            return 0
        table = _LiveTable(out, f"nanopy discover {disco.url}") if live else None
        while True:
            if table is not None:
                table.draw(disco.providers(), disco.rounds)
            time.sleep(disco.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        _ignore_interrupts()
        disco.close()
        _report_drops("nanopy discover", "answers", disco.stats()["dropped"])


def _report_drops(prog: str, what: str, dropped: dict[str, int]) -> None:
    """On exit, one stderr line saying what a signed group dropped (nothing when nothing was)."""
    reasons = ", ".join(f"{reason} {count}" for reason, count in dropped.items() if count)
    if reasons:
        print(f"{prog}: dropped {what} that did not verify: {reasons}", file=sys.stderr, flush=True)


def _beacon_arguments(ap: argparse.ArgumentParser) -> None:
    """The options ``discover`` and ``announce`` share."""
    from ..discovery import DEFAULT_BEACON_PORT

    ap.add_argument("--beacon", action="store_true", help="zero configuration: find each other by UDP beacons")
    ap.add_argument("--group", default="", help="with --beacon: only this group's beacons count (default: none)")
    ap.add_argument("--beacon-port", type=int, default=DEFAULT_BEACON_PORT, metavar="PORT",
                    help=f"with --beacon: UDP port of the beacons ({DEFAULT_BEACON_PORT})")
    ap.add_argument("--secret-file", metavar="PATH", help="sign and verify beacons, surveys and answers "
                    "with the group secret in PATH (mode 600; see docs/security.md)")


def _secret(ap: argparse.ArgumentParser, args: argparse.Namespace) -> bytes | None:
    """The secret of ``--secret-file`` (exits with a usage error when it is unusable)."""
    from ..discovery.signing import load_secret

    if args.secret_file is None:
        return None
    try:
        return load_secret(args.secret_file)
    except (OSError, ValueError) as exc:
        ap.error(f"--secret-file: {exc}")


def _group_text(group: str) -> str:
    return f", group {group!r}" if group else ""


def _meta_item(text: str) -> tuple[str, Any]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)  # numbers, true/false, JSON objects...
    except json.JSONDecodeError:
        return key, value  # ...anything else is a string


def announce_main(argv: Sequence[str]) -> int:
    """``nanopy announce``; returns the exit status."""
    from .. import NanopyError
    from ..discovery import Announcer

    ap = argparse.ArgumentParser(prog="nanopy announce", description="Answer discovery surveys "
                                 "(RESPONDENT) with a service's name and address until interrupted.")
    ap.add_argument("name", help="service name")
    ap.add_argument("address", help="address clients use to reach the service")
    ap.add_argument("--connect", action="append", default=[], metavar="URL",
                    help="discovery address (repeatable; may be combined with --beacon)")
    ap.add_argument("--priority", type=int, default=8, help="1 (preferred) .. 16; default 8")
    ap.add_argument("--meta", action="append", type=_meta_item, default=[], metavar="KEY=VALUE",
                    help="metadata entry (repeatable; VALUE is JSON or a string)")
    _beacon_arguments(ap)
    ap.add_argument("--beacon-bind", action="append", metavar="HOST", help="with --beacon: listen for beacons "
                    "on HOST (repeatable; default 0.0.0.0 and ::; 127.255.255.255: loopback only)")
    args = ap.parse_args(argv)
    if not args.connect and not args.beacon:
        ap.error("give --connect URL, or --beacon to find discovery services without an address")
    secret = _secret(ap, args)
    try:
        ann = Announcer(args.name, args.address, args.connect, priority=args.priority, metadata=dict(args.meta),
                        beacon=args.beacon, group=args.group, beacon_port=args.beacon_port, secret=secret,
                        **({"beacon_bind": args.beacon_bind} if args.beacon_bind else {}))
    except (TypeError, ValueError) as exc:
        ap.error(str(exc))
    except (NanopyError, OSError) as exc:
        print(f"nanopy announce: {exc}", file=sys.stderr)
        return 3
    targets = [*args.connect, *([f"beacons on UDP port {args.beacon_port}{_group_text(args.group)}"]
                                if args.beacon else [])]
    signed = " (signed)" if secret is not None else ""
    print(f"nanopy announce: {args.name} at {args.address} -> {', '.join(targets)}{signed}", file=sys.stderr,
          flush=True)
    stop = threading.Event()
    with _restored_signals():
        _stop_on_sigterm()
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
        finally:
            _ignore_interrupts()
            ann.close()
            stats = ann.stats()
            _report_drops("nanopy announce", "beacons", stats["beacons_dropped"])
            _report_drops("nanopy announce", "surveys", stats["surveys_dropped"])
    return 0
