"""Command-line parsing with nanocat's rules.

nanocat does not use getopt: each option *provides* some capability bits (a socket
type, "can send", an endpoint, data ...), may *conflict* with bits already provided
and may *require* bits by the end of the command line. Long options may be
abbreviated to any unambiguous prefix and take ``--opt=value`` or ``--opt value``;
short flags cluster (``-AQ``) and short options take ``-L5555`` or ``-L 5555``.

This module implements those rules over a table of :class:`Flag` entries, so the
``cat`` command accepts exactly the command lines nanocat accepts (plus a few
clearly marked nanopy extensions that never steal one of nanocat's abbreviations).
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Capability bits (nanocat's masks).
SOCK = 1
WRITABLE = 2
READABLE = 4
SUB = 8
DATA = 16
ENDPOINT = 32


class UsageError(Exception):
    """A bad command line; ``code`` is the exit status (1, or 2 for an unreadable file)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class HelpRequested(Exception):
    """``--help``: the caller prints the help text and exits 0."""


@dataclass(frozen=True)
class Flag:
    """One command-line option.

    ``apply(config, value)`` stores the option; ``value`` is ``None`` for flags
    without an argument (those have an empty ``metavar``).
    """

    long: str
    short: str
    metavar: str
    apply: Callable[[Any, str | None], None]
    group: str
    help: str
    provides: int = 0
    conflicts: int = 0
    requires: int = 0
    extension: bool = False  # nanopy-only option

    @property
    def takes_arg(self) -> bool:
        return bool(self.metavar)

    def label(self) -> str:
        return f"--{self.long}" + (f"/-{self.short}" if self.short else "")


_FLOAT_RE = re.compile(
    r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)", re.IGNORECASE
)
_HEXFLOAT_RE = re.compile(r"[+-]?0x(?:[0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(?:p[+-]?\d+)?", re.IGNORECASE)


def parse_seconds(text: str) -> float:
    """Parse a float like C ``strtof`` (leading blanks allowed, nothing after the number)."""
    s = text.lstrip(" \t\n\r\f\v")
    if _FLOAT_RE.fullmatch(s):
        return float(s)
    if _HEXFLOAT_RE.fullmatch(s):
        sign = -1.0 if s.startswith("-") else 1.0
        body = s.lstrip("+-")
        if "p" not in body.lower():
            body += "p0"
        return sign * float.fromhex(body)
    raise ValueError(text)


class Parser:
    """Parse a command line against a table of :class:`Flag` entries.

    Args:
        prog: the program name used in messages (``"nanopy cat"``).
        flags: the option table, in help order.
        required: bits that must be provided by the end (nanocat: a socket type
            and an endpoint).
    """

    def __init__(self, prog: str, flags: Sequence[Flag], required: int) -> None:
        self.prog = prog
        self.flags = list(flags)
        self.required = required

    # -- lookup -------------------------------------------------------------------
    def _match_long(self, name: str) -> Flag:
        for pool in ([f for f in self.flags if not f.extension], [f for f in self.flags if f.extension]):
            exact = [f for f in pool if f.long == name]
            if exact:
                return exact[0]
            hits = [f for f in pool if f.long.startswith(name)]
            if len(hits) == 1:
                return hits[0]
            if len(hits) > 1:
                names = ", ".join("--" + f.long for f in hits)
                raise UsageError(f"{self.prog}: ambiguous option --{name}: could be {names}")
        raise UsageError(f"{self.prog}: unknown option --{name} (see --help)")

    def _match_short(self, char: str) -> Flag:
        for f in self.flags:
            if f.short == char:
                return f
        raise UsageError(f"{self.prog}: unknown option -{char} (see --help)")

    # -- parsing ------------------------------------------------------------------
    def parse(self, argv: Sequence[str], config: Any) -> Any:
        """Fill ``config`` from ``argv`` (without the program name) and return it.

        Raises:
            HelpRequested: ``--help`` / ``-h`` was given.
            UsageError: the command line is not acceptable.
        """
        provided = 0
        used: list[Flag] = []
        args = list(argv)
        i = 0

        def take(flag: Flag, value: str | None) -> None:
            nonlocal provided
            if provided & flag.conflicts:
                clash = [u for u in used if u.provides & flag.conflicts]
                names = ", ".join(u.label() for u in clash) or flag.label()
                raise UsageError(f"{self.prog}: option {flag.label()} conflicts with {names}")
            provided |= flag.provides
            used.append(flag)
            flag.apply(config, value)

        while i < len(args):
            arg = args[i]
            i += 1
            if arg.startswith("--"):
                if arg == "--":
                    continue  # nanocat skips a bare "--"
                name, eq, inline = arg[2:].partition("=")
                flag = self._match_long(name)
                if eq:
                    if not flag.takes_arg:
                        raise UsageError(f"{self.prog}: option --{flag.long} does not take a value")
                    take(flag, inline)
                elif flag.takes_arg:
                    if i >= len(args):
                        raise UsageError(f"{self.prog}: option --{flag.long} requires an argument ({flag.metavar})")
                    take(flag, args[i])
                    i += 1
                else:
                    take(flag, None)
            elif arg == "-":
                continue  # nanocat reads a lone "-" as an empty cluster of short flags
            elif arg.startswith("-"):
                pos = 1
                while pos < len(arg):
                    flag = self._match_short(arg[pos])
                    pos += 1
                    if not flag.takes_arg:
                        take(flag, None)
                        continue
                    if pos < len(arg):
                        take(flag, arg[pos:])
                    elif i < len(args):
                        take(flag, args[i])
                        i += 1
                    else:
                        raise UsageError(
                            f"{self.prog}: option -{flag.short} (--{flag.long}) requires an argument ({flag.metavar})"
                        )
                    break
            else:
                raise UsageError(f"{self.prog}: unexpected argument {arg!r} (see --help)")

        seen: set[str] = set()
        for flag in used:
            if flag.long in seen:
                continue
            seen.add(flag.long)
            if flag.requires and (provided & flag.requires) != flag.requires:
                options = self._providers(flag.requires)
                raise UsageError(f"{self.prog}: option {flag.label()} requires one of: {options}")
        missing = self.required & ~provided
        if missing:
            raise UsageError(f"{self.prog}: at least one of these is required: {self._providers(missing)}")
        return config

    def _providers(self, mask: int) -> str:
        return ", ".join(f.label() for f in self.flags if f.provides & mask)

    # -- help ----------------------------------------------------------------------
    def help_text(self, summary: str) -> str:
        lines = [f"Usage: {self.prog} SOCKET-TYPE ENDPOINT... [options]", "", summary]
        group = None
        for f in self.flags:
            if f.group != group:
                group = f.group
                lines += ["", f"{group}:"]
            head = f"  --{f.long}" + (f",-{f.short}" if f.short else "") + (f" {f.metavar}" if f.metavar else "")
            if len(head) < 26:
                lines.append(f"{head:<26}{f.help}")
            else:
                lines += [head, f"{'':<26}{f.help}"]
        return "\n".join(lines) + "\n"


# -- helpers for building flag tables -----------------------------------------------------


def seconds_option(attr: str, long: str) -> Callable[[Any, str | None], None]:
    def apply(config: Any, value: str | None) -> None:
        assert value is not None
        try:
            number = parse_seconds(value)
        except ValueError:
            raise UsageError(f"nanopy cat: option --{long} needs a number of seconds, got {value!r}") from None
        if math.isnan(number):
            raise UsageError(f"nanopy cat: option --{long} needs a number of seconds, got {value!r}")
        # "inf" is accepted like strtof does; a billion seconds is forever enough
        # and keeps sleeps and lock timeouts within their limits.
        setattr(config, attr, min(number, 1e9))

    return apply


def read_data_file(path: str) -> bytes:
    """``--file PATH``: the file's bytes; ``-`` reads stdin (exit 2 on failure, like nanocat)."""
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise UsageError(f"nanopy cat: cannot read file {path!r}: {exc.strerror or exc}", code=2) from None


def as_arg_bytes(value: str) -> bytes:
    """The original bytes of a command-line argument (as C's ``argv`` sees them)."""
    return os.fsencode(value)
