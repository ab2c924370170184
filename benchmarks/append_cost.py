"""What a payload's append to a pipe's outbox costs, in place or through ``Outbox.queue``.

    .venv/bin/python benchmarks/append_cost.py [--small 100000] [--large 200000]

Counted by callgrind (load-proof, as ``instructions.py``): each form runs ``--small``
and ``--large`` appends; the difference over the extra appends is the cost of one.
The two per-message appends (``PipeDriver.transmit`` in a burst, ``queue_fan_out``'s
short path) are written out in place rather than calling ``Outbox.queue``, the one
append every other path takes: this is the figure behind that exception
(docs/architecture.md, "Deliberate exceptions"). Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import sys

from instructions import callgrind_total


def workload(form: str, n: int) -> None:
    """``n`` appends of a 64 B payload to a real outbox (emptied every 256, as a write would)."""
    from nanopy.pipe.outbox import Outbox

    box = Outbox()
    box.now = lambda: 1.0
    payload = b"x" * 64
    if form == "in-place":
        for _ in range(n):
            outbox = box.outbox
            outbox.append(payload)
            k = len(outbox)
            if k == 1:
                box.first_at = box.now()
            if k >= 256:
                outbox.clear()
    else:
        for _ in range(n):
            if box.queue([payload]) >= 256:
                box.outbox.clear()


def count(form: str, n: int) -> int:
    return callgrind_total([sys.executable, os.path.abspath(__file__), "--workload", form, str(n)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--workload", nargs=2, metavar=("FORM", "N"), help=argparse.SUPPRESS)
    p.add_argument("--small", type=int, default=100_000)
    p.add_argument("--large", type=int, default=200_000)
    args = p.parse_args(argv)
    if args.workload:
        workload(args.workload[0], int(args.workload[1]))
        return 0
    for form in ("in-place", "Outbox.queue"):
        per = (count(form, args.large) - count(form, args.small)) / (args.large - args.small)
        print(f"{form:<14} {per:8.0f} instructions per append")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
