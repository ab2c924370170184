"""Where an idle round trip goes: the per-step split of a 64 B PAIR ping-pong.

    .venv/bin/python benchmarks/latency_steps.py steps [--transport tcp] [-n 5000]
    .venv/bin/python benchmarks/latency_steps.py echo URL N &   # two processes, for
    .venv/bin/python benchmarks/latency_steps.py ping URL N     # strace -c -f / py-spy

``steps`` runs ``instructions.ping_pong`` (an echo thread and the caller in one
process) under cProfile and sums, per step of the round trip, the calls and the
Python self time of the caller's thread per round trip. cProfile inflates every
call, so read the split and compare before with after, not the absolute figures;
``sock.send`` and the wait include the echo thread's turn (one GIL, in-process).

``echo`` / ``ping`` are the two processes of the wall-clock cell, with a fixed count of
round trips (100 unmeasured first), so ``strace -c -f`` counts divide by ``N``;
``ping`` prints its one-way latency and its CPU per round trip.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (step, substrings of "module:function" that belong to it); the first match wins
STEPS = [
    ("send: API (Socket.send)", ["messaging.py:send"]),
    ("send: pipe, lane, credit, counters", ["pipe/driver.py:", "outbox.py:", "round.py:credit",
                                            "base.py:pipe_credit", "round.py:_credit_back", "lanes.py:"]),
    ("send: frame", ["_stream.py:frame", "wire.py:encode_frame", "'pack'"]),
    ("send: write (sock.send; in-process it includes the echo's turn)", ["_stream.py:write_nowait",
                                                                        "'send' of '_socket"]),
    ("recv: API (Socket.recv, Waiting.call, runs)", ["messaging.py:recv", "_next_plain_body",
                                                     "runs.py:try_recv_body", "waiting.py:call"]),
    ("recv: read role (begin/end, role, waker, loop)", ["direct.py:recv", "_direct_begin", "_direct_end",
                                                        "_direct_done", "take_role", "release_role",
                                                        "direct.py:_waker", "in_engine_thread",
                                                        "socket.py:engine", "socket.py:_engine",
                                                        "direct.py:__init__", "_direct_wait", "_direct_steps"]),
    ("recv: wait (epoll, waker clear; includes the echo's turn)", ["'poll' of", "eventfd_read", "linux.py:clear"]),
    ("recv: read + decode", ["_direct_read", "read_nowait", "'recv' of '_socket", "wire.py:feed"]),
    ("recv: delivery + take (round, queues, runs)", ["_direct_round", "take_delivery", "messages_received",
                                                     "queues.py:", "priolist.py:", "runs.py:_pop_body", "hand_over",
                                                     "_fold_due", "_drain", "count_delivery", "round.py:"]),
]


def steps(transport: str, n: int) -> None:
    """Print the per-step table (markdown) of ``n`` round trips."""
    import instructions

    prof = cProfile.Profile()
    prof.enable()
    instructions.ping_pong(transport, n)
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    acc: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    other = 0.0
    for (path, _line, func), (_cc, calls, self_time, _cum, _callers) in stats.items():
        name = f"{path.split('nanopy/')[-1]}:{func}"
        for step, keys in STEPS:
            if any(k in name for k in keys):
                acc[step][0] += self_time / n * 1e6
                acc[step][1] += calls / n
                break
        else:
            if calls >= n // 2:  # per-message builtins (locks, len, ...): start-up is left out
                other += self_time / n * 1e6
    print("| step | calls/RT | self µs/RT (cProfile) |\n|---|---|---|")
    for step, _keys in STEPS:
        us, calls = acc[step]
        print(f"| {step} | {calls:.1f} | {us:.2f} |")
    print(f"| builtins called per message (locks, len, ...) | | {other:.2f} |")
    total = sum(v[0] for v in acc.values()) + other
    print(f"| total | {sum(v[1] for v in acc.values()):.1f} | {total:.2f} |")


def pingpong(role: str, url: str, n: int) -> None:
    """One side of a two-process ping-pong of ``n`` (+100) 64 B round trips."""
    import nanopy

    sock = nanopy.Socket("pair")
    if role == "echo":
        sock.bind(url)
        for _ in range(n + 100):
            sock.send(sock.recv())
        time.sleep(0.2)  # (let the last reply leave before close)
    else:
        sock.connect(url)
        msg = b"x" * 64
        for _ in range(100):
            sock.send(msg)
            sock.recv()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            sock.send(msg)
            sock.recv()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"one-way {wall / n / 2 * 1e6:.1f} us, CPU per round trip {cpu / n * 1e6:.1f} us")
    sock.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("what", choices=["steps", "echo", "ping"])
    p.add_argument("url", nargs="?", default="tcp://127.0.0.1:5590")
    p.add_argument("count", nargs="?", type=int, default=5000)
    p.add_argument("--transport", default="tcp")
    args = p.parse_args()
    if args.what == "steps":
        steps(args.transport, args.count)
    else:
        pingpong(args.what, args.url, args.count)


if __name__ == "__main__":
    main()
