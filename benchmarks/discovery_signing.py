"""What signed discovery costs (issue 34): CPU per beacon, survey and answer, signed and not.

    .venv/bin/python benchmarks/discovery_signing.py [--n 20000]

Each figure is the median over 5 timed loops, in microseconds of process CPU time per
operation, on one core. "verify" includes the parse, the HMAC, the timestamp check and
the replay-table update (every beacon a new counter, as on the wire). A discovery
service signs one beacon per interface per interval and one survey per interval; an
announcer verifies every beacon it hears and signs one answer per survey.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from statistics import median

from nanopy.discovery import SURVEY, encode_answer
from nanopy.discovery.beacon import Beacon, decode_beacon, encode_beacon
from nanopy.discovery.signing import KIND_ANSWER, KIND_SURVEY, Signer, Verifier

KEY = os.urandom(32)


def _per_op(fn: Callable[[], object], n: int) -> float:
    runs = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(n):
            fn()
        runs.append((time.process_time() - start) / n * 1e6)
    return median(runs)


def measure(n: int) -> dict[str, float]:
    beacon = Beacon(os.urandom(8), 5600, 1.0, "tcp", "prod")
    signer = Signer(KEY, beacon.instance)
    unsigned = encode_beacon(beacon)
    # a fresh signed beacon for every verification (a replayed one would stop at the counter check)
    signed = [encode_beacon(beacon, signer) for _ in range(5 * n)]
    verifier = Verifier(KEY)
    beacons = iter(signed)
    answer = encode_answer("echo", "tcp://192.0.2.1:7000", priority=1, metadata={"zone": "ny"})
    nonce = os.urandom(16)
    announcer = Signer(KEY, b"a" * 8)
    answers = iter([announcer.sign(KIND_ANSWER, answer, nonce) for _ in range(5 * n)])
    answer_verifier = Verifier(KEY)
    return {
        "beacon v1: encode": _per_op(lambda: encode_beacon(beacon), n),
        "beacon v1: decode": _per_op(lambda: decode_beacon(unsigned), n),
        "beacon v2: encode + sign": _per_op(lambda: encode_beacon(beacon, signer), n),
        "beacon v2: decode + verify": _per_op(lambda: decode_beacon(next(beacons), verifier), n),
        "survey: sign": _per_op(lambda: signer.sign(KIND_SURVEY, SURVEY, nonce), n),
        "answer: sign": _per_op(lambda: signer.sign(KIND_ANSWER, answer, nonce), n),
        "answer: verify": _per_op(lambda: answer_verifier.open(KIND_ANSWER, next(answers), nonce), n),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000, help="operations per timed loop")
    args = ap.parse_args()
    for name, micros in measure(args.n).items():
        print(f"{name:28} {micros:7.2f} µs")


if __name__ == "__main__":
    main()
