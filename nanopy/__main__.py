"""The ``nanopy`` command (also ``python -m nanopy``).

Subcommands are looked up in :data:`COMMANDS` and imported only when used, so a
subcommand that needs extra packages costs nothing to the others.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# name -> ("module:function", one-line summary); the function takes the remaining
# arguments and returns the exit status.
COMMANDS: dict[str, tuple[str, str]] = {
    "cat": ("nanopy._cli.cat:main", "nanocat-compatible peer: send and print messages"),
    "discover": ("nanopy._cli.discover:discover_main", "run a discovery service and show the live table"),
    "announce": ("nanopy._cli.discover:announce_main", "announce a service to discovery services"),
    "bench": ("nanopy._cli.bench:main", "throughput and latency benchmarks"),
    "stat": ("nanopy._cli.stat:main", "show the live sockets of a process serving nanopy.metrics"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: nanopy COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "Run 'nanopy COMMAND --help' for a command's options."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nanopy`` console script; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        (sys.stdout if args else sys.stderr).write(usage())
        return 0 if args else 1
    if args[0] in ("-V", "--version"):
        from . import __version__

        print(f"nanopy {__version__}")
        return 0
    entry = COMMANDS.get(args[0])
    if entry is None:
        sys.stderr.write(f"nanopy: unknown command {args[0]!r}\n\n" + usage())
        return 1
    module_name, _, func_name = entry[0].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        sys.stderr.write(f"nanopy: the {args[0]!r} command is not available in this installation\n")
        return 1
    return int(getattr(module, func_name)(args[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
