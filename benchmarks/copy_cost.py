"""What each fast-path copy kept in place saves against one shared call, in instructions.

    .venv/bin/python benchmarks/copy_cost.py [--small 100000] [--large 200000] [--case NAME]

Counted by callgrind (load-proof, as ``instructions.py``): each form of each case runs
``--small`` and ``--large`` operations; the difference over the extra ones is the cost
of one. Every case sets the code a hot path keeps written out ("in place") against
the folded alternative, the same work done by one shared function or method call.
These are the figures behind docs/architecture.md, "Deliberate exceptions":

* ``append``: a payload's append to a pipe's outbox (``PipeDriver.transmit`` in a
  burst, ``queue_fan_out``'s short path) against ``Outbox.queue``;
* ``recv-pop``: ``Socket.recv``'s lock-free pop of a run against calling
  ``ReceiveRuns.try_recv_body``, which starts with the same pop;
* ``run-pop``: the run pop written out in ``ReceiveRuns`` (``try_recv_body``,
  ``_pop_body``, ``recv_attempt``) against one shared pop method;
* ``transmit``: carrying out one TRANSMIT (``SendLanes.try_send``, ``Round.execute``,
  ``queue_fan_out``: look the pipe up, ``transmit``, hand back or credit) against one
  shared method; the pipe's ``transmit`` is a stub here, as it is the same in both.

Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from instructions import callgrind_total

CASES = ("append", "recv-pop", "run-pop", "transmit")


def append(form: str, n: int) -> None:
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


class _Core:
    body_queue = None

    def can_recv(self) -> bool:
        return False


class _RoundSide:
    """What ``ReceiveRuns`` reads of its round here (a plain class: attribute reads as fast as the real one's)."""

    def __init__(self) -> None:
        self.closed = False
        self.core = _Core()


class _SocketSide:
    """What ``Socket.recv`` reads of its ``SocketDriver``: the run, ``closed``, the bound fast path."""

    def __init__(self, runs: Any) -> None:
        self.run = runs.run
        self.closed = False
        self.try_recv_body = runs.try_recv_body


def _runs() -> Any:
    """A real ``ReceiveRuns`` over a stand-in round (only ``closed`` and the core are read)."""
    from nanopy.driver.runs import ReceiveRuns

    class Folded(ReceiveRuns):
        def pop_run(self) -> bytes | None:
            """The folded alternative: the one shared pop every copy would call."""
            run = self.run
            if run:
                try:
                    return run.popleft()
                except IndexError:
                    pass
            return None

    return Folded(_RoundSide())  # type: ignore[arg-type]


def recv_pop(form: str, n: int) -> None:
    """``n`` receives served by a run (refilled every 256, as taking a run would)."""
    runs = _runs()
    driver = _SocketSide(runs)
    bodies = [b"x" * 64] * 256
    run = runs.run
    if form == "in-place":  # Socket.recv's first step
        for _ in range(n):
            if not run:
                run.extend(bodies)
            if driver.run and not driver.closed:
                try:
                    driver.run.popleft()
                    continue
                except IndexError:
                    pass
    else:
        for _ in range(n):
            if not run:
                run.extend(bodies)
            driver.try_recv_body()


def run_pop(form: str, n: int) -> None:
    """``n`` pops of a run inside a ``ReceiveRuns`` method (refilled every 256)."""
    runs = _runs()
    bodies = [b"x" * 64] * 256
    run = runs.run
    if form == "in-place":
        for _ in range(n):
            if not run:
                run.extend(bodies)
            if run:
                try:
                    run.popleft()
                    continue
                except IndexError:
                    pass
    else:
        for _ in range(n):
            if not run:
                run.extend(bodies)
            runs.pop_run()


class _Pipe:
    def transmit(self, payload: bytes) -> int:
        return 0  # (written, no credit to give back: the usual outcome)


class _Round:
    """The pipes and the two outcomes a TRANSMIT may have besides the usual one."""

    def __init__(self) -> None:
        self.pipes: dict[int, _Pipe] = {1: _Pipe()}
        self.handed_back: list[bytes] = []
        self.credited: list[tuple[int, int]] = []

    def hand_back(self, payloads: list[bytes]) -> None:
        self.handed_back.extend(payloads)

    def credit(self, pid: int, n: int) -> None:
        self.credited.append((pid, n))

    def transmit_one(self, action: tuple[Any, int, bytes]) -> None:
        """The folded alternative: one TRANSMIT carried out by one shared method."""
        driver = self.pipes.get(action[1])
        if driver is None:
            self.hand_back([action[2]])
            return
        done = driver.transmit(action[2])
        if done:
            if done > 0:
                self.credit(action[1], done)
            else:
                self.hand_back([action[2]])


def transmit(form: str, n: int) -> None:
    """``n`` TRANSMITs of a 64 B payload to one pipe."""
    from nanopy.core.base import TRANSMIT

    r = _Round()
    action = (TRANSMIT, 1, b"x" * 64)
    if form == "in-place":  # as SendLanes.try_send writes it
        for _ in range(n):
            pid = action[1]
            driver = r.pipes.get(pid)
            if driver is None:
                r.hand_back([action[2]])
                continue
            done = driver.transmit(action[2])
            if done:
                if done > 0:
                    r.credit(pid, done)
                else:
                    r.hand_back([action[2]])
    else:
        for _ in range(n):
            r.transmit_one(action)


WORKLOADS = {"append": append, "recv-pop": recv_pop, "run-pop": run_pop, "transmit": transmit}
FOLDED = {"append": "Outbox.queue", "recv-pop": "try_recv_body", "run-pop": "pop method", "transmit": "method"}


def count(case: str, form: str, n: int) -> int:
    return callgrind_total([sys.executable, os.path.abspath(__file__), "--workload", case, form, str(n)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--workload", nargs=3, metavar=("CASE", "FORM", "N"), help=argparse.SUPPRESS)
    p.add_argument("--small", type=int, default=100_000)
    p.add_argument("--large", type=int, default=200_000)
    p.add_argument("--case", action="append", choices=CASES, help="one case (repeatable); default: all")
    args = p.parse_args(argv)
    if args.workload:
        case, form, n = args.workload
        WORKLOADS[case](form, int(n))
        return 0
    print(f"{'case':<10} {'in place':>9} {'folded':>9} {'saved':>7}  (instructions per operation; folded: one call)")
    for case in args.case or CASES:
        kept, folded = (
            (count(case, form, args.large) - count(case, form, args.small)) / (args.large - args.small)
            for form in ("in-place", "folded")
        )
        print(f"{case:<10} {kept:9.0f} {folded:9.0f} {folded - kept:7.0f}  ({FOLDED[case]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
