"""PUB -> SUB over tcp, lossless: nanopy against pyzmq (sync APIs), subscribers in their own processes.

    .venv/bin/python benchmarks/pubsub.py                        # both scenarios
    .venv/bin/python benchmarks/pubsub.py --scenario one --n 200000
    .venv/bin/python benchmarks/pubsub.py --scenario ten --n 100000
    .venv/bin/python benchmarks/pubsub.py --method window        # the ack-window variant
    .venv/bin/python benchmarks/pubsub.py --scenario burst --bursts 1000,10000,100000,1000000

Scenarios (as the engine issue words them):

* ``one``: one PUB -> one SUB process, 1 KiB messages; the figure is the
  subscriber's receive rate from its first to its last message (the shape of the
  classic brokerless pub/sub benchmark).
* ``ten``: one PUB -> ten SUB processes, 64 B messages, ``--n`` (default
  1,000,000) messages each; the figure is the wall time from the first send until
  every subscriber has confirmed every message.
* ``burst`` (issue 36, the seed-004 shape): one PUB -> one SUB process, 1 KiB,
  bursts of ``--bursts`` messages; send and receive rate, mean and p99 latency
  and the peak messages in flight, nanopy against pyzmq and pynng in alternating
  rounds (``--rounds``). It lives in ``benchmarks/burst.py``, which says how it
  measures.

"Every one delivered": each subscriber checks that it saw every sequence number
in order and reports an error otherwise (the run then fails). Subscribers first
answer probe messages, so every subscription is in place before the timed part
starts. Two methods keep the feed lossless (by default PUB drops for a
subscriber that cannot keep up, in nanopy as in ZeroMQ):

* ``nodrop`` (default): each system's own lossless back-pressure, as documented
  by it. nanopy: ``overflow="block"`` on PUB and SUB (a SUB pipe whose queue is
  full stops being read; PUB waits until every pipe has room). ZeroMQ:
  ``XPUB_NODROP`` on the PUB with the default high-water marks (1000 each side;
  a blocking send waits at the mark instead of dropping). The publisher sends as
  fast as its slowest subscriber allows; subscribers only report at the end.
* ``window``: no back-pressure from the library; each subscriber reports its
  count on a PUSH -> PULL back channel every ``ACK_EVERY`` messages and the
  publisher keeps at most ``WINDOW`` messages ahead of the slowest one -- the same
  rule for both systems, below nanopy's default queue sizes; ZeroMQ's high-water
  marks are lifted (its PUB learns of reads only in steps, and dropped a message
  even within the window). This measures a round-trip-bound pace more than
  throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import burst  # noqa: E402 - the seed-004 scenario, next to this file

WINDOW = 400  # messages the publisher may run ahead of the slowest subscriber
ACK_EVERY = 100
SEQ = struct.Struct(">Q")


class _Nanopy:
    def __init__(self, method: str) -> None:
        import nanopy

        self.nanopy = nanopy
        # nodrop: nanopy's own lossless back-pressure on both sides
        self.opts = {"overflow": "block"} if method == "nodrop" else {}

    def pub(self) -> tuple[Any, str, Any, str]:
        pub = self.nanopy.Socket("pub", **self.opts)
        pull = self.nanopy.Socket("pull")
        return pub, pub.bind("tcp://127.0.0.1:0").url, pull, pull.bind("tcp://127.0.0.1:0").url

    def sub(self, pub_url: str, ack_url: str) -> tuple[Any, Any]:
        sub = self.nanopy.Socket("sub", connect=pub_url, **self.opts)
        sub.subscribe(b"")
        return sub, self.nanopy.Socket("push", connect=ack_url)

    def close(self, *socks: Any) -> None:
        for s in socks:
            s.close()


class _Zmq:
    def __init__(self, method: str) -> None:
        import zmq

        self.zmq = zmq
        self.ctx = zmq.Context()
        self.method = method

    def pub(self) -> tuple[Any, str, Any, str]:
        zmq = self.zmq
        pub = self.ctx.socket(zmq.PUB)
        if self.method == "nodrop":
            pub.setsockopt(zmq.XPUB_NODROP, 1)  # wait at the (default) high-water mark, never drop
        else:
            pub.setsockopt(zmq.SNDHWM, 0)  # the window bounds the queue; ZeroMQ's HWM accounting lags
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        pull = self.ctx.socket(zmq.PULL)
        ack = pull.bind_to_random_port("tcp://127.0.0.1")
        return pub, f"tcp://127.0.0.1:{port}", pull, f"tcp://127.0.0.1:{ack}"

    def sub(self, pub_url: str, ack_url: str) -> tuple[Any, Any]:
        zmq = self.zmq
        sub = self.ctx.socket(zmq.SUB)
        if self.method != "nodrop":
            sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub_url)
        push = self.ctx.socket(zmq.PUSH)
        push.connect(ack_url)
        return sub, push

    def close(self, *socks: Any) -> None:
        for s in socks:
            s.close(linger=1000)
        self.ctx.term()


SYSTEMS = {"nanopy": _Nanopy, "pyzmq": _Zmq}


def subscriber(system: str, method: str, sub_id: int, pub_url: str, ack_url: str, n: int) -> None:
    lib = SYSTEMS[system](method)
    sub, push = lib.sub(pub_url, ack_url)
    recv, send, unpack = sub.recv, push.send, SEQ.unpack_from
    ack_every = ACK_EVERY if method == "window" else n  # nodrop: report only at the end
    ready = False
    expected = 1
    t_first = t_last = 0.0
    while True:
        seq = unpack(recv())[0]
        if seq == 0:  # a probe: the subscription is in place
            if not ready:
                ready = True
                send(json.dumps({"id": sub_id, "ready": True}).encode())
            continue
        if seq != expected:
            send(json.dumps({"id": sub_id, "error": f"got {seq}, expected {expected}"}).encode())
            break
        if seq == 1:
            t_first = time.perf_counter()
        expected += 1
        if seq % ack_every == 0 or seq == n:
            if seq == n:
                t_last = time.perf_counter()
                rate = (n - 1) / (t_last - t_first) if t_last > t_first else 0.0
                send(json.dumps({"id": sub_id, "seq": seq, "done": True, "rate": rate}).encode())
                break
            send(json.dumps({"id": sub_id, "seq": seq}).encode())
    lib.close(sub, push)


def publish(system: str, method: str, subs: int, n: int, size: int) -> dict[str, Any]:
    lib = SYSTEMS[system](method)
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = time.process_time()
    pub, pub_url, pull, ack_url = lib.pub()
    script = os.path.abspath(__file__)
    procs = [
        subprocess.Popen([sys.executable, script, "--role", "sub", "--system", system, "--method", method,
                          "--id", str(i), "--pub", pub_url, "--ack", ack_url, "--n", str(n)])
        for i in range(subs)
    ]
    try:
        acked = [0] * subs
        ready: set[int] = set()
        probe = SEQ.pack(0).ljust(size, b"p")
        poll = getattr(pull, "poll", None)
        deadline = time.monotonic() + 60
        while len(ready) < subs:  # probe until every subscription is in place
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system}: subscribers not ready")
            pub.send(probe)
            while True:
                if system == "nanopy":
                    try:
                        note = json.loads(pull.recv(timeout=0.01))
                    except Exception:  # noqa: BLE001 - a Timeout: probe again
                        break
                else:
                    if not poll(10):
                        break
                    note = json.loads(pull.recv())
                ready.add(note["id"])
        pad = b"m" * (size - SEQ.size)
        send, recv, pack = pub.send, pull.recv, SEQ.pack
        rates: dict[int, float] = {}
        errors: list[str] = []
        t0 = time.perf_counter()
        if method == "nodrop":
            for seq in range(1, n + 1):  # the library holds the publisher back
                send(pack(seq) + pad)
        else:
            slowest = 0
            for seq in range(1, n + 1):
                while seq - slowest > WINDOW:
                    note = json.loads(recv())
                    if "error" in note:
                        raise RuntimeError(f"{system} subscriber {note['id']}: {note['error']}")
                    if "seq" in note:
                        acked[note["id"]] = note["seq"]
                        if note.get("done"):
                            rates[note["id"]] = note["rate"]
                        slowest = min(acked)
                send(pack(seq) + pad)
        while len(rates) < subs and not errors:
            note = json.loads(recv())
            if "error" in note:
                errors.append(f"subscriber {note['id']}: {note['error']}")
            elif note.get("done"):
                rates[note["id"]] = note["rate"]
        wall = time.perf_counter() - t0
        pub_cpu = time.process_time() - cpu0
        if errors:
            raise RuntimeError(f"{system}: " + "; ".join(errors))
        result = {"system": system, "method": method, "subs": subs, "n": n, "size": size, "wall_s": wall,
                  "recv_rate_min": min(rates.values()), "recv_rate_median": sorted(rates.values())[subs // 2],
                  "pub_cpu_s": pub_cpu}
    finally:
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        lib.close(pub, pull)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    # (includes the subscribers' start-up and probing: read it as an upper bound)
    result["subs_cpu_s"] = (children.ru_utime + children.ru_stime) - (children0.ru_utime + children0.ru_stime)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=["one", "ten", "both", "burst"], default="both")
    p.add_argument("--n", type=int, default=None, help="messages per subscriber")
    p.add_argument("--systems", default=None, help="default nanopy,pyzmq (burst: nanopy,pyzmq,pynng)")
    p.add_argument("--method", choices=["nodrop", "window"], default="nodrop",
                   help="how the feed is kept lossless (see the module docstring)")
    burst.add_arguments(p)
    p.add_argument("--role", default="pub", help=argparse.SUPPRESS)
    p.add_argument("--system", help=argparse.SUPPRESS)
    p.add_argument("--id", type=int, help=argparse.SUPPRESS)
    p.add_argument("--pub", help=argparse.SUPPRESS)
    p.add_argument("--ack", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "sub":
        subscriber(args.system, args.method, args.id, args.pub, args.ack, args.n)
        return
    if args.scenario == "burst":
        burst.run((args.systems or ",".join(burst.SYSTEMS)).split(","), [int(b) for b in args.bursts.split(",")],
                  args.rounds, args.size, burst.parse_options(args.nanopy_opt), args.json)
        return
    args.systems = args.systems or "nanopy,pyzmq"
    scenarios = {"one": (1, 1024, 200_000), "ten": (10, 64, 1_000_000)}
    chosen = ["one", "ten"] if args.scenario == "both" else [args.scenario]
    load = os.getloadavg()[0]
    how = "each system's own back-pressure" if args.method == "nodrop" else f"ack window {WINDOW}"
    print(f"PUB -> SUB over tcp, lossless ({how}), load {load:.1f}")
    for name in chosen:
        subs, size, n = scenarios[name]
        n = args.n or n
        results = {s: publish(s, args.method, subs, n, size) for s in args.systems.split(",")}
        for r in results.values():
            print(f"  {name:3} {r['system']:7} {subs:2} SUB x {n:,} msgs of {size} B: wall {r['wall_s']:7.2f} s"
                  f"  SUB rate median {r['recv_rate_median']:10,.0f} msg/s (min {r['recv_rate_min']:,.0f})"
                  f"  CPU pub {r['pub_cpu_s']:.2f} s, SUBs {r['subs_cpu_s']:.2f} s")
        if "nanopy" in results and "pyzmq" in results:
            a, b = results["nanopy"], results["pyzmq"]
            print(f"  {name:3} nanopy / pyzmq: receive rate {a['recv_rate_median'] / b['recv_rate_median']:.2f}x, "
                  f"wall time {a['wall_s'] / b['wall_s']:.2f}x")


if __name__ == "__main__":
    main()
